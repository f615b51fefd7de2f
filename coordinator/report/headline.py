"""The report's headline: one sentence a reader can trust, and the reasons behind it.

A capacity figure scales what a *steady* run measured (see ``figures.project_capacity``).
A run that was short, or disturbed by rebalances (chaos, rejoining workers), measured
something else: its heartbeat latency is set by the few heartbeats that changed the group
and waited for the log. So the headline gives a capacity figure only for a run with a
steady part long enough to measure (time in which no group rebalanced; the job scales from
that part's latency), none for a run the simulator disrupted, says why not otherwise, and
never states a maximum below what ran.

Pure Python, no Spark: the job hands over a few totals.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from coordinator.report.figures import (
    BENCHMARKED_HEARTBEATS_PER_SECOND,
    BENCHMARKED_PACED_HEARTBEATS_PER_SECOND,
    BENCHMARKED_PACED_P99_MS,
    CapacityProjection,
)

# Rebalances every run has: workers joining at the start, leaving at the end, connectors
# being created, and the delayed re-run after a worker left. Any other trigger means the
# group was disturbed while it ran (a session lost, a member fenced, a revocation late...).
ROUTINE_TRIGGERS = frozenset({"member_joined", "member_left", "connectors_changed",
                              "delayed_rebalance"})
DEFAULT_MIN_STEADY_SECONDS = 60.0
MIN_SCRAPES = 5


@dataclass(frozen=True)
class RunFacts:
    """What the recording (and the simulator, when given) say about the run."""

    window_seconds: float
    scrapes: int
    members_max: float | None  # the workers that ran (of the reported group, if one)
    heartbeats_per_second: float | None
    heartbeat_p99_ms: float | None
    rebalances_by_trigger: Mapping[str, float] = field(default_factory=dict)
    simulation: Mapping[str, Any] | None = None
    projection: CapacityProjection | None = None
    min_steady_seconds: float = DEFAULT_MIN_STEADY_SECONDS
    # The part of the recording in which no group was rebalancing (None: not known, take
    # the whole recording); heartbeat_p99_ms is then the one measured in that part.
    steady_seconds: float | None = None
    # Members of every group at most: what the joins counted by trigger are compared with.
    all_members_max: float | None = None


@dataclass(frozen=True)
class Headline:
    """``kind``: capacity, over_budget, disturbed, too_short, failed or no_data."""

    kind: str
    text: str
    reasons: list[str]

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "text": self.text, "reasons": list(self.reasons)}


def _count(value: float) -> str:
    return f"{value:,.0f}" if value == int(value) else f"{value:,.1f}"


def _workers(members: float) -> str:
    return f"{_count(members)} worker{'' if members == 1 else 's'}"


def disruptions(facts: RunFacts) -> list[str]:
    """The simulator's disruptions, as one reason (none: it disrupted nothing)."""
    applied = (facts.simulation or {}).get("disruptions") or []
    if not applied:
        return []
    kinds: dict[str, int] = {}
    for disruption in applied:
        kinds[str(disruption.get("kind"))] = kinds.get(str(disruption.get("kind")), 0) + 1
    listed = ", ".join(f"{kind} {count}" for kind, count in sorted(kinds.items()))
    return [f"the simulator disrupted the group {len(applied)} times ({listed})"]


def unusual_rebalances(facts: RunFacts) -> list[str]:
    """Rebalances a steady run does not have, each kind one short sentence."""
    reasons = []
    unusual = {trigger: count for trigger, count in facts.rebalances_by_trigger.items()
               if count > 0 and trigger not in ROUTINE_TRIGGERS}
    if unusual:
        listed = ", ".join(f"{trigger} {_count(count)}"
                           for trigger, count in sorted(unusual.items()))
        reasons.append(f"{_count(sum(unusual.values()))} rebalances other than joins, "
                       f"leaves and connector changes ({listed})")
    joined = facts.rebalances_by_trigger.get("member_joined", 0.0)
    members = facts.all_members_max if facts.all_members_max is not None else facts.members_max
    if members is not None and joined > members + 0.5:
        reasons.append(f"workers joined {_count(joined)} times for at most "
                       f"{_workers(members)} (rejoins)")
    return reasons


def make_headline(facts: RunFacts) -> Headline:
    simulation = facts.simulation or {}
    violations = simulation.get("violations") or []
    if violations:
        return Headline("failed", f"{len(violations)} connector(s) or task(s) ran on two "
                        "workers at once: see the simulation table; no capacity figure "
                        "for a run that broke that rule.", [])
    if simulation and simulation.get("converged") is False:
        return Headline("failed", "The group did not converge by the end of the run (see "
                        "the simulation table): no capacity figure.", [])
    members = facts.members_max
    if not members or not facts.heartbeats_per_second:
        return Headline("no_data", "No capacity figure: no worker heartbeated while the "
                        "metrics were recorded.", [])
    ran = (f"{_workers(members)} ran for {facts.window_seconds:,.0f} s at "
           f"{facts.heartbeats_per_second:,.1f} heartbeats/s")
    short = []
    if facts.window_seconds < facts.min_steady_seconds:
        short.append(f"the recording lasted {facts.window_seconds:,.0f} s, less than the "
                     f"{facts.min_steady_seconds:,.0f} s a capacity figure needs")
    elif facts.steady_seconds is not None and facts.steady_seconds < facts.min_steady_seconds:
        short.append(f"no group was rebalancing for {facts.steady_seconds:,.0f} s of the "
                     f"{facts.window_seconds:,.0f} s recorded, less than the "
                     f"{facts.min_steady_seconds:,.0f} s a capacity figure needs")
    if facts.scrapes < MIN_SCRAPES:
        short.append(f"it holds {facts.scrapes} scrapes, fewer than {MIN_SCRAPES}")
    # Rebalances outside the steady part do not touch a figure scaled from that part; they
    # disturb the run when there is no such part to scale from.
    unusual = unusual_rebalances(facts)
    disturbed = disruptions(facts) + (unusual if short or facts.steady_seconds is None
                                      else [])
    if disturbed:
        return Headline(
            "disturbed",
            f"{ran}, but the run was disturbed, so its latency is that of rebalances, not "
            "of steady load: no capacity figure. Record a steady run (no --chaos) of the "
            "size you plan for.", disturbed + short)
    if short:
        return Headline("too_short", f"{ran}: too short for a capacity figure. Record a "
                        f"steady run of at least {facts.min_steady_seconds:,.0f} s.", short)
    projection = facts.projection
    if projection is None or projection.max_members is None:
        notes = list(projection.notes) if projection else []
        return Headline("no_data", f"{ran}, steadily; the capacity projection could not be "
                        "made: " + ("; ".join(notes) or "not enough data") + ".", notes)
    aside = [f"outside the steady part: {reason}" for reason in unusual]
    over = over_budget(projection)
    if over:
        return Headline("over_budget", f"{ran}, steadily, but its {' and '.join(over)}: no "
                        "headroom under that budget (see --p99-limit-ms and --cpu-limit).",
                        aside)
    within = within_budget(projection)
    fit = math.floor(projection.max_members + 1e-9)
    if fit <= members:
        # The model scales from the mean number of workers, which can be below the most
        # that ran: a figure under what ran would be false, none is given.
        return Headline("capacity", f"{ran}, steadily, with its {within}; the CPU model "
                        "gives no figure beyond what ran.", aside)
    per_worker = projection.heartbeats_per_member_per_second or 0.0
    per_heartbeat_us = (projection.cpu_seconds_per_heartbeat or 0.0) * 1e6
    if projection.limited_by == "measured throughput":
        bound = (f"the {BENCHMARKED_HEARTBEATS_PER_SECOND:,.0f} heartbeats/s BENCHMARKS.md "
                 "measured one coordinator to answer (the CPU budget would allow more)")
    else:
        bound = f"the {projection.cpu_limit_cores:g} core CPU budget"
    return Headline(
        "capacity",
        f"{ran}, steadily, with its {within} (while no group rebalanced). At "
        f"{per_worker:,.2f} heartbeats/s per worker and {per_heartbeat_us:,.0f} us of "
        f"coordinator CPU per heartbeat (idle cost included), about {fit:,} workers fit "
        f"({fit - math.ceil(members):,} more than ran) within {bound}: "
        f"{fit * per_worker:,.0f} heartbeats/s. That is a CPU figure; the latency at that "
        "load is not measured here (BENCHMARKS.md: "
        f"{BENCHMARKED_PACED_HEARTBEATS_PER_SECOND:,.0f}/s paced at p99 "
        f"{BENCHMARKED_PACED_P99_MS:g} ms).", aside)


def over_budget(projection: CapacityProjection) -> list[str]:
    """Each figure the model scaled from that is above its budget, as a true comparison."""
    over = []
    p99 = projection.p99_now_ms
    if p99 is not None and p99 > projection.p99_limit_ms:
        over.append(f"heartbeat p99 {p99:,.2f} ms is above the "
                    f"{projection.p99_limit_ms:g} ms budget")
    cores = projection.cpu_cores_now
    if cores is not None and cores > projection.cpu_limit_cores:
        over.append(f"CPU use {cores:,.2f} cores is above the "
                    f"{projection.cpu_limit_cores:g} core budget")
    return over


def within_budget(projection: CapacityProjection) -> str:
    parts = []
    if projection.p99_now_ms is not None:
        parts.append(f"heartbeat p99 {projection.p99_now_ms:,.2f} ms within the "
                     f"{projection.p99_limit_ms:g} ms budget")
    if projection.cpu_cores_now is not None:
        parts.append(f"CPU use {projection.cpu_cores_now:,.2f} cores within the "
                     f"{projection.cpu_limit_cores:g} core budget")
    return " and ".join(parts)
