"""Garbage-collector settings for a long-running coordinator.

CPython's cyclic collector is what most hurts heartbeat latency here. With the default
thresholds a young collection runs every 700 allocations, and a full one walks every tracked
object: for a group of 1,000 members and 50,000 units that is 30-50 ms during which the
event loop waits, and an assignor result landing allocates enough to set one off every few
runs. Yet the coordinator's state is not cyclic (frozensets of tuples, plain dataclasses) and
is freed by reference counting; measured under `bench heartbeats --assignor-load`, the
collections of young objects find about 2 objects of cyclic garbage a second. So `serve`:

* loads the log with young collections every 50,000 allocations instead of 700 (the
  replay itself runs with the collector off, and freezes what it allocated: `LogReplayer`);
* then collects once what the load did not freeze and moves what survived (the server's
  own objects) out of the collector's sight (`gc.freeze`);
* then turns automatic collection off and collects on a timer, once a minute, and freezes
  what survived: each collection walks only what was allocated since the last collection
  or freeze and is still alive (4 ms for 12,819 objects in a probe run under `bench
  heartbeats --assignor-load`), instead of the whole heap (30-50 ms: falling inside an
  assignor run, a dozen heartbeats waited for it);
* in between, checked twice a second, once YOUNG_LIMIT objects allocated since the last
  collection or freeze are still alive, freezes them without walking them (`gc.freeze` moves the
  young generation's list as a whole): they are new state, not garbage. A collection of
  them took 6-22 ms, several times a 30 s window under that bench (its in-flight windows
  allocate faster: every member of the big group moving to a new epoch), and those
  pauses made the window's slowest heartbeats (a `gc.collect` probe, BENCHMARKS.md).
  Smaller, more frequent collections do not help: about 7,000 objects are always young
  and alive (every connection's task makes new coroutines each time it waits for data),
  and each collection walks them again;
* but only while the last collection found little cyclic garbage: at most GARBAGE_PER_S
  a second since the freeze before it (collections of young objects found about 2 a
  second under that bench, 24-28 each). When one finds
  more (a client whose requests leave cycles behind, say), the coordinator collects at
  YOUNG_LIMIT instead, and the next check is a full pass, for what was frozen meanwhile;
* cyclic garbage among frozen objects (frozen young, or alive at a collection and dropped
  in a cycle later) waits for the full pass: every half hour, a collection unfreezes
  everything first, one pause of a few tens of milliseconds.

The figures are in BENCHMARKS.md ("Heartbeat p99 while a 1,000 x 50,000 run is in flight").
"""

from __future__ import annotations

import gc
import math
import time

import structlog
import trio

log = structlog.get_logger("coordinator.memory")

LOAD_YOUNG_THRESHOLD = 50_000
COLLECTION_EVERY_S = 60.0
FULL_COLLECTION_EVERY = 30  # a full pass every 30 x COLLECTION_EVERY_S: half an hour
YOUNG_LIMIT = 5_000  # young objects still alive: frozen (or collected, see above)
CHECK_EVERY_S = 0.5
# Cyclic garbage a collection finds, per second since the last freeze: at or below this,
# freezing young objects without a walk keeps at most this many a second until the full
# pass (collections of young objects found about 2 a second under `bench heartbeats
# --assignor-load`).
GARBAGE_PER_S = 100


def tune_collector() -> None:
    """Before loading the log: collect young objects far less often."""
    gc.set_threshold(LOAD_YOUNG_THRESHOLD, 50, 1_000)


def freeze_loaded_state() -> None:
    """After loading: collect once, keep the survivors out of later scans, and leave
    collections to `collect_periodically`."""
    started = time.perf_counter()
    gc.collect()
    gc.freeze()
    gc.disable()
    log.info("gc_frozen", objects=gc.get_freeze_count(),
             ms=round((time.perf_counter() - started) * 1000, 1),
             collection_every_s=COLLECTION_EVERY_S,
             full_collection_every_s=COLLECTION_EVERY_S * FULL_COLLECTION_EVERY)


async def collect_periodically(every_s: float = COLLECTION_EVERY_S,
                               full_every: int = FULL_COLLECTION_EVERY,
                               young_limit: int = YOUNG_LIMIT,
                               check_every_s: float = CHECK_EVERY_S) -> None:
    """Collect what is newer than the last collection every `every_s` seconds and freeze
    the survivors; in between, freeze `young_limit` such objects as soon as they are alive
    (checked every `check_every_s`), or collect them while the last collection found more
    than GARBAGE_PER_S cyclic garbage a second. Every `full_every` x `every_s` seconds, and
    after such a finding if any were frozen unwalked, unfreeze everything first (a full
    pass)."""
    check_s = min(check_every_s, every_s)
    last = last_full = last_freeze = trio.current_time()
    garbage_scarce = True  # what the log load left was collected and frozen
    frozen_unwalked = False  # young objects frozen without a walk since the last full pass
    try:
        while True:
            await trio.sleep(check_s)
            now = trio.current_time()
            young = gc.get_count()[0]  # tracked objects allocated and not freed since
            full = now - last_full >= every_s * full_every - 1e-9
            timed = full or now - last >= every_s - 1e-9
            if not timed:
                if young < young_limit:
                    continue
                if garbage_scarce:
                    gc.freeze()  # no walk: moves the young generation's list as it is
                    frozen_unwalked, last_freeze = True, now
                    log.debug("gc_young_frozen", young=young)
                    continue
            started = time.perf_counter()
            if full:
                gc.unfreeze()
                last_full = now
            found = gc.collect()
            gc.freeze()
            if timed:
                last = now
            if full:
                frozen_unwalked = False
            else:  # it walked what was allocated since the last freeze
                garbage_scarce = found <= GARBAGE_PER_S * (now - last_freeze)
                if frozen_unwalked and not garbage_scarce:
                    last_full = -math.inf  # garbage may have been frozen too: look there
            last_freeze = now
            elapsed_ms = (time.perf_counter() - started) * 1000
            log.debug("gc_collected", full=full, young=young, unreachable=found,
                      ms=round(elapsed_ms, 1))
    finally:
        gc.unfreeze()
        gc.enable()  # the server is stopping: back to the interpreter's own schedule
