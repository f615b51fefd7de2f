"""Pure-Python math of the capacity report: histogram quantiles, spreads, the projection.

Spark does the heavy per-sample work; what reaches these helpers is already small (a few
buckets, a handful of totals), so they stay plain Python and easy to unit-test.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Figure:
    """One number of the report; ``value`` is None when it could not be computed."""

    name: str
    value: float | None
    unit: str = ""
    missing_reason: str = ""
    note: str = ""

    @property
    def missing(self) -> bool:
        return self.value is None

    def as_row(self) -> dict[str, Any]:
        return {
            "figure": self.name,
            "value": self.value,
            "unit": self.unit,
            "status": "missing" if self.missing else "ok",
            "missing_reason": self.missing_reason if self.missing else "",
            "note": self.note,
        }


def present(name: str, value: float | None, unit: str = "", *, missing_reason: str = "",
            note: str = "") -> Figure:
    """A Figure that is missing (with a reason) when value is None or not finite."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return Figure(name, None, unit, missing_reason or "not enough data", note)
    return Figure(name, float(value), unit, "", note)


def parse_le(text: str) -> float:
    """A histogram bucket's upper bound as Prometheus writes it ("0.005", "+Inf")."""
    return float(text.strip())


def histogram_quantile(quantile: float, buckets: Iterable[tuple[float, float]]) -> float | None:
    """The quantile of a cumulative histogram, interpolated linearly inside its bucket.

    ``buckets`` are (upper bound, cumulative count) pairs, the +Inf bucket included. Follows
    Prometheus' histogram_quantile: the first bucket starts at 0, a rank that lands in the
    +Inf bucket answers the highest finite bound, and no observations answer None.
    """
    if not 0.0 <= quantile <= 1.0:
        raise ValueError(f"quantile must be within [0, 1], got {quantile}")
    ordered = sorted(buckets, key=lambda bucket: bucket[0])
    if not ordered or not math.isinf(ordered[-1][0]):
        return None
    # Counts taken from deltas can dip by scrape jitter; a running max keeps them cumulative.
    cumulative: list[tuple[float, float]] = []
    running = 0.0
    for upper, count in ordered:
        running = max(running, count)
        cumulative.append((upper, running))
    total = cumulative[-1][1]
    if total <= 0:
        return None
    rank = quantile * total
    previous_upper, previous_count = 0.0, 0.0
    for index, (upper, count) in enumerate(cumulative):
        if count >= rank and count > previous_count:
            if math.isinf(upper):
                return cumulative[index - 1][0] if index > 0 else None
            if index == 0 and upper <= 0:
                return upper
            fraction = (rank - previous_count) / (count - previous_count)
            return previous_upper + (upper - previous_upper) * fraction
        previous_upper, previous_count = upper, count
    return cumulative[-2][0] if len(cumulative) > 1 else None


@dataclass(frozen=True)
class Spread:
    """How units are spread over workers: min, median, max and imbalance (max / mean)."""

    count: int
    minimum: float | None
    median: float | None
    maximum: float | None
    mean: float | None
    imbalance: float | None


def spread(values: Sequence[float]) -> Spread:
    """Min/median/max/imbalance of per-worker counts; imbalance is None when the mean is 0."""
    if not values:
        return Spread(0, None, None, None, None, None)
    ordered = sorted(values)
    middle = len(ordered) // 2
    median = ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
    mean = sum(ordered) / len(ordered)
    imbalance = ordered[-1] / mean if mean > 0 else None
    return Spread(len(ordered), ordered[0], median, ordered[-1], mean, imbalance)


# What BENCHMARKS.md measured one coordinator to carry (the heartbeats bench, 2 shared
# cores): 7,506 heartbeats/s back to back, 3,569/s paced at a p99 of 19.5 ms, at 57-76 us
# of the coordinator's CPU per heartbeat.
BENCHMARKED_HEARTBEATS_PER_SECOND = 7_506.0
BENCHMARKED_PACED_HEARTBEATS_PER_SECOND = 3_569.0
BENCHMARKED_PACED_P99_MS = 19.5

LATENCY_MODEL = (
    "Latency is not scaled: a heartbeat's p99 does not grow in proportion to load (it stays "
    "flat while the coordinator keeps up, then climbs as requests queue), so the run's "
    "steady p99 is only checked against its budget. BENCHMARKS.md measured "
    f"{BENCHMARKED_PACED_HEARTBEATS_PER_SECOND:,.0f} heartbeats/s paced at a p99 of "
    f"{BENCHMARKED_PACED_P99_MS:g} ms: the latency of a projected load is not measured here."
)
CPU_MODEL = (
    "Capacity is the CPU budget over the cost of a worker: max workers = CPU budget / "
    "(heartbeats per worker per second x coordinator CPU seconds per heartbeat), the cost "
    "per heartbeat being the run's CPU over its heartbeats (idle cost included, so a small "
    "run overstates it and the figure errs low). The heartbeats/s this implies is capped "
    f"at the {BENCHMARKED_HEARTBEATS_PER_SECOND:,.0f}/s BENCHMARKS.md measured back to back "
    "(57-76 us of coordinator CPU per heartbeat): no projection goes beyond what was "
    "measured."
)


@dataclass(frozen=True)
class CapacityProjection:
    """How many more workers (and groups of average size) fit under the limits."""

    members_now: float | None
    cpu_cores_now: float | None
    cpu_limit_cores: float
    cpu_cores_per_member: float | None
    heartbeats_per_member_per_second: float | None
    cpu_seconds_per_heartbeat: float | None
    max_members_by_cpu: float | None
    p99_now_ms: float | None
    p99_limit_ms: float
    max_members_by_latency: float | None
    max_members: float | None
    limited_by: str
    additional_workers: int | None
    average_group_size: float | None
    additional_groups: int | None
    models: list[str] = field(default_factory=lambda: [CPU_MODEL, LATENCY_MODEL])
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def project_capacity(
    *,
    members_now: float | None,
    cpu_cores_now: float | None,
    heartbeats_per_second: float | None,
    p99_now_ms: float | None,
    average_group_size: float | None,
    cpu_limit_cores: float = 0.8,
    p99_limit_ms: float = 5.0,
) -> CapacityProjection:
    """Linear headroom model: see CPU_MODEL and LATENCY_MODEL for the assumptions."""
    notes: list[str] = []
    usable_members = members_now is not None and members_now > 0
    if not usable_members:
        notes.append("no members measured: nothing to scale from")

    cpu_per_member = None
    max_by_cpu = None
    if usable_members and cpu_cores_now is not None and cpu_cores_now > 0:
        assert members_now is not None
        cpu_per_member = cpu_cores_now / members_now
        max_by_cpu = cpu_limit_cores / cpu_per_member
    elif cpu_cores_now is None:
        notes.append("CPU not measured (process_cpu_seconds_total missing)")

    heartbeats_per_member = None
    cpu_per_heartbeat = None
    if usable_members and heartbeats_per_second is not None:
        assert members_now is not None
        heartbeats_per_member = heartbeats_per_second / members_now
        if cpu_cores_now is not None and heartbeats_per_second > 0:
            cpu_per_heartbeat = cpu_cores_now / heartbeats_per_second

    # Latency bounds nothing (LATENCY_MODEL): it is compared with its budget, not scaled.
    max_by_latency = None
    if p99_now_ms is None:
        notes.append("p99 latency not measured (request_duration_seconds missing)")
    max_by_throughput = None
    if heartbeats_per_member:
        max_by_throughput = BENCHMARKED_HEARTBEATS_PER_SECOND / heartbeats_per_member

    bounds = {
        name: bound
        for name, bound in (("cpu", max_by_cpu), ("measured throughput", max_by_throughput))
        if bound is not None
    }
    if "cpu" not in bounds:
        bounds = {}  # the throughput cap caps the CPU figure; alone it says nothing
    if not bounds:
        max_members = None
        limited_by = "unknown"
    else:
        limited_by = min(bounds, key=lambda name: bounds[name])
        max_members = bounds[limited_by]

    additional_workers = None
    additional_groups = None
    if max_members is not None and members_now is not None:
        # A fraction of a worker cannot be added; past the limit there is no headroom.
        additional_workers = max(0, math.floor(max_members - members_now + 1e-9))
        if max_members < members_now:
            notes.append(f"already over the {limited_by} limit")
        if average_group_size is not None and average_group_size > 0:
            additional_groups = math.floor(additional_workers / average_group_size + 1e-9)
    return CapacityProjection(
        members_now=members_now,
        cpu_cores_now=cpu_cores_now,
        cpu_limit_cores=cpu_limit_cores,
        cpu_cores_per_member=cpu_per_member,
        heartbeats_per_member_per_second=heartbeats_per_member,
        cpu_seconds_per_heartbeat=cpu_per_heartbeat,
        max_members_by_cpu=max_by_cpu,
        p99_now_ms=p99_now_ms,
        p99_limit_ms=p99_limit_ms,
        max_members_by_latency=max_by_latency,
        max_members=max_members,
        limited_by=limited_by,
        additional_workers=additional_workers,
        average_group_size=average_group_size,
        additional_groups=additional_groups,
        notes=notes,
    )
