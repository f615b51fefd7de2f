"""Which worker ran which unit, from when to when: the check that no unit ever ran twice.

One :class:`UnitRegistry` is shared by every simulated worker of a process. Each start and
stop also takes a sequence number, so "stopped before the other started" is decided by the
order in which things happened, not by clock readings that may be equal.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

from coordinator.units import Unit, format_unit


@dataclass(slots=True)
class UnitRun:
    unit: Unit
    worker: str
    started_ms: float
    start_seq: int
    stopped_ms: float | None = None
    stop_seq: int | None = None

    @property
    def running(self) -> bool:
        return self.stop_seq is None

    def overlaps(self, other: UnitRun) -> bool:
        """Both ran at some common moment (in happened-before order)."""
        self_end = self.stop_seq if self.stop_seq is not None else float("inf")
        other_end = other.stop_seq if other.stop_seq is not None else float("inf")
        return self.start_seq < other_end and other.start_seq < self_end

    def __str__(self) -> str:
        end = "now" if self.stopped_ms is None else f"{self.stopped_ms:.0f}"
        return f"{format_unit(self.unit)} on {self.worker} [{self.started_ms:.0f}, {end}]"


@dataclass(frozen=True, slots=True)
class Overlap:
    first: UnitRun
    second: UnitRun

    def __str__(self) -> str:
        return f"{self.first} overlaps {self.second}"


class UnitRegistry:
    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        self._clock = clock
        self._sequence = itertools.count()
        self._runs: list[UnitRun] = []
        self._running: dict[tuple[Unit, str], UnitRun] = {}

    def _now(self, now_ms: float | None) -> float:
        if now_ms is not None:
            return now_ms
        return self._clock() if self._clock is not None else 0.0

    def started(self, unit: Unit, worker: str, now_ms: float | None = None) -> UnitRun:
        if (unit, worker) in self._running:
            raise RuntimeError(f"{format_unit(unit)} is already running on {worker}")
        run = UnitRun(unit, worker, self._now(now_ms), next(self._sequence))
        self._runs.append(run)
        self._running[unit, worker] = run
        return run

    def stopped(self, unit: Unit, worker: str, now_ms: float | None = None) -> UnitRun:
        run = self._running.pop((unit, worker), None)
        if run is None:
            raise RuntimeError(f"{format_unit(unit)} is not running on {worker}")
        run.stopped_ms = self._now(now_ms)
        run.stop_seq = next(self._sequence)
        return run

    @property
    def runs(self) -> list[UnitRun]:
        return list(self._runs)

    def running_on(self, worker: str) -> frozenset[Unit]:
        return frozenset(unit for unit, holder in self._running if holder == worker)

    def running(self) -> dict[Unit, list[str]]:
        """Each running unit with the workers running it (more than one is a bug)."""
        holders: dict[Unit, list[str]] = {}
        for unit, worker in self._running:
            holders.setdefault(unit, []).append(worker)
        return holders

    def overlaps(self) -> list[Overlap]:
        """Every pair of runs of the same unit that were running at the same time."""
        by_unit: dict[Unit, list[UnitRun]] = {}
        for run in self._runs:
            by_unit.setdefault(run.unit, []).append(run)
        found: list[Overlap] = []
        for runs in by_unit.values():
            for index, first in enumerate(runs):
                found.extend(Overlap(first, second) for second in runs[index + 1:]
                             if first.overlaps(second))
        return found
