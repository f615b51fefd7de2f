"""Garbage-collector settings for a long-running coordinator.

CPython's cyclic collector is what most hurts heartbeat latency here: with the default
thresholds a young collection runs every 700 allocations and a full one walks every tracked
object, which for a group of 1,000 members and 50,000 units takes 30-50 ms, while the event
loop waits. The coordinator's state is not cyclic (frozensets of tuples, plain dataclasses)
and is freed by reference counting, so the collector can run far less often:

* young collections every 50,000 allocations instead of 700;
* the state loaded from the log is moved out of the collector's sight (`gc.freeze`);
* full collections come from a timer, not from allocation counts, so their pause is
  predictable and bounded by what was created since the last one.

`bench heartbeats --assignor-load` shows the effect (BENCHMARKS.md).
"""

from __future__ import annotations

import gc
import time

import structlog
import trio

log = structlog.get_logger("coordinator.memory")

YOUNG_THRESHOLD = 50_000
MIDDLE_THRESHOLD = 50
# Full collections by count are left to the 25% rule of CPython plus this high bar...
OLD_THRESHOLD = 1_000
# ...and to this timer.
FULL_COLLECTION_EVERY_S = 600.0


def tune_collector() -> None:
    gc.set_threshold(YOUNG_THRESHOLD, MIDDLE_THRESHOLD, OLD_THRESHOLD)


def freeze_loaded_state() -> None:
    """After the log is loaded: collect once, then keep what survived out of later scans."""
    started = time.perf_counter()
    gc.collect()
    gc.freeze()
    log.info("gc_frozen", objects=gc.get_freeze_count(),
             ms=round((time.perf_counter() - started) * 1000, 1))


async def collect_periodically(every_s: float = FULL_COLLECTION_EVERY_S) -> None:
    while True:
        await trio.sleep(every_s)
        started = time.perf_counter()
        found = gc.collect()
        log.info("gc_collected", unreachable=found,
                 ms=round((time.perf_counter() - started) * 1000, 1))
