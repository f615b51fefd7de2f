"""Scheduling derived from replayed state: a fenced member that rejoins gets its units back
whichever way the run lands, and the release time of held-back units survives a restart."""

from __future__ import annotations

import pytest

from coordinator.assignors.transport import compact
from coordinator.config import ServerConfig
from coordinator.core.result import ASSIGNMENT_TIMER, TimerSet
from protocol.errors import ErrorCode

from .context import Context, wire_units

G = "g"
BALANCED = "balanced"


def balanced_context(delay_ms: int = 0) -> Context:
    config = ServerConfig(assignment_interval_ms=0, server_assignors=(BALANCED,),
                          scheduled_rebalance_max_delay_ms=delay_ms)
    ctx = Context(config, run_jobs=False)
    ctx.put_connector(G, "A", 4)
    return ctx


def land(ctx: Context, compact_result: bool) -> None:
    """Finish every run in flight as the worker pool does (the compact form) or inline."""
    while ctx.jobs:
        job = ctx.jobs.pop(0)
        outcome = ctx.assignors[job.assignor].assign(job.spec)
        ctx.finish_job(job, compact(job.spec, outcome) if compact_result else outcome)


def settle(ctx: Context, members: list[str], compact_result: bool = True) -> None:
    """Heartbeat every member until the group is stable (releasing what it must)."""
    for _ in range(10):
        land(ctx, compact_result)
        for member in members:
            view = ctx.member_view(G, member)
            ctx.heartbeat(G, member, view.member_epoch, owned=wire_units(view.assigned))
        land(ctx, compact_result)
        if ctx.core.store.groups[G].state == "STABLE":
            return
    raise AssertionError(f"not stable: {ctx.describe(G)}")


@pytest.mark.parametrize("compact_result", [True, False])
@pytest.mark.parametrize("workers", [["w1"], ["w1", "w2"]])
def test_a_fenced_member_that_rejoins_gets_units_back(compact_result: bool,
                                                      workers: list[str]) -> None:
    ctx = balanced_context()
    for member in workers:
        ctx.join(G, member, server_assignor=BALANCED)
        land(ctx, compact_result)
    settle(ctx, workers, compact_result)
    before = ctx.member_view(G, "w1")
    assert wire_units(before.target)
    # A stale epoch fences w1 (its target part goes); it rejoins with epoch 0, same id.
    response = ctx.heartbeat(G, "w1", before.member_epoch + 5)
    assert response.error_code == ErrorCode.FENCED_MEMBER_EPOCH
    land(ctx, compact_result)
    ctx.join(G, "w1", server_assignor=BALANCED)
    settle(ctx, workers, compact_result)
    group = ctx.core.store.groups[G]
    assigned = sum(len(part.units) for part in group.target.values())
    assert assigned == group.unit_count, "units left unassigned after the rejoin"
    assert group.target["w1"].units, "the rejoined member got nothing"
    # A restart replays the same target.
    fresh = ctx.replayed().store.groups[G]
    assert {m: p.units for m, p in fresh.target.items()} == \
        {m: p.units for m, p in group.target.items()}


def test_the_release_of_held_units_is_re_armed_after_a_restart() -> None:
    ctx = balanced_context(delay_ms=60_000)
    for member in ("w1", "w2"):
        ctx.join(G, member, server_assignor=BALANCED)
        land(ctx, True)
    settle(ctx, ["w1", "w2"])
    ctx.heartbeat(G, "w2", -1)  # w2 leaves: its units are held back for the delay
    land(ctx, True)
    group = ctx.core.store.groups[G]
    assert sum(len(p.units) for p in group.target.values()) < group.unit_count
    deadline = group.rerun_at_ms
    assert deadline is not None and deadline > ctx.now
    restarted = ctx.replayed()
    timers = {op.key: op.deadline_ms for op in restarted.timers_after_load(ctx.now + 1_000)
              if isinstance(op, TimerSet)}
    assert timers.get((ASSIGNMENT_TIMER, G, "")) == deadline
