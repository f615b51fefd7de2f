"""How long the coordinator's event loop is held by one step of one task, for benches.

`python -m bench.loopsteps OUT serve ARGS...` runs `connect-coordinator serve ARGS` with a
trio Instrument (:class:`LoopSteps`) timing every task step twice:

* in CPU time of the loop's thread (`time.thread_time`): what the step itself cost, whatever
  else the machine runs meanwhile, so a figure that a shared, loaded machine does not move;
* in wall time: what the step cost the other tasks, waits for the GIL (held by the listener's
  or the assignors' threads) and for a CPU included;

and how much of the longest step (in CPU time) the cyclic collector took.

Only the longest step of each BUCKET_S of `time.monotonic` (one clock for every process of
the machine) is kept, and written to OUT as JSON when the coordinator exits: a bench tells
which steps fell in which of its windows by their bucket.
"""

from __future__ import annotations

import gc
import json
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import trio

BUCKET_S = 0.1


class LoopSteps(trio.abc.Instrument):
    """The longest task step per bucket of `time.monotonic`, in thread CPU and wall time."""

    def __init__(self, bucket_s: float = BUCKET_S) -> None:
        self.bucket_s = bucket_s
        # bucket -> [longest CPU s, its task's name, longest wall s, its task's name,
        #            the cyclic collector's CPU s within the longest CPU step]
        self.buckets: dict[int, list[Any]] = {}
        self._cpu = 0.0
        self._wall = 0.0
        self._loop_thread = threading.get_ident()
        self._collecting_since = 0.0
        self._collected = 0.0  # the collector's CPU time in the loop thread, this step

    def before_run(self) -> None:
        self._loop_thread = threading.get_ident()
        gc.callbacks.append(self._collector)

    def after_run(self) -> None:
        gc.callbacks.remove(self._collector)

    def _collector(self, phase: str, info: dict[str, int]) -> None:
        if threading.get_ident() != self._loop_thread:
            return
        if phase == "start":
            self._collecting_since = time.thread_time()
        else:
            self._collected += time.thread_time() - self._collecting_since

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self._collected = 0.0
        self._wall = time.monotonic()
        self._cpu = time.thread_time()

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        cpu = time.thread_time() - self._cpu
        now = time.monotonic()
        wall = now - self._wall
        bucket = self.buckets.setdefault(int(now / self.bucket_s), [0.0, "", 0.0, "", 0.0])
        if cpu > bucket[0]:
            bucket[0], bucket[1], bucket[4] = cpu, task.name, self._collected
        if wall > bucket[2]:
            bucket[2], bucket[3] = wall, task.name

    def to_json(self) -> dict[str, Any]:
        return {"bucket_s": self.bucket_s,
                "buckets": {str(key): value for key, value in self.buckets.items()}}


def longest(recorded: dict[str, Any], start: float, end: float) -> dict[str, Any]:
    """The longest steps of the buckets wholly between monotonic `start` and `end`."""
    bucket_s = float(recorded["bucket_s"])
    within: Iterable[list[Any]] = [
        value for key, value in recorded["buckets"].items()
        if start <= int(key) * bucket_s and (int(key) + 1) * bucket_s <= end]
    nothing: list[Any] = [0.0, "", 0.0, "", 0.0]
    cpu = max(within, key=lambda value: value[0], default=nothing)
    wall = max(within, key=lambda value: value[2], default=nothing)
    return {"loop_step_cpu_ms": round(cpu[0] * 1000, 2), "loop_step_cpu_task": cpu[1],
            "loop_step_gc_ms": round(cpu[4] * 1000, 2),
            "loop_step_wall_ms": round(wall[2] * 1000, 2)}


def main(argv: list[str] | None = None) -> int:
    from coordinator import cli

    argv = list(sys.argv[1:] if argv is None else argv)
    out, rest = Path(argv[0]), argv[1:]
    cli.skip_optional_test_imports()
    args = cli.build_parser().parse_args(rest)
    steps = LoopSteps()
    try:
        return cli._serve(args, instruments=(steps,))
    finally:
        out.write_text(json.dumps(steps.to_json()))


if __name__ == "__main__":
    sys.exit(main())
