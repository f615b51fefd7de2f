"""Seed 004 in the core: offloaded assignor runs, one in flight per group, missed changes."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

import pytest

from coordinator.assignors.api import AssignmentResult
from coordinator.assignors.transport import SpecPacker, expand, run_packed
from coordinator.config import ServerConfig
from protocol.errors import ErrorCode

from .context import Context, units, wire_units

G = "g"
RR = "round-robin"


def offload_context(interval_ms: int = 0) -> Context:
    config = ServerConfig(assignment_interval_ms=interval_ms, server_assignors=(RR,))
    ctx = Context(config, run_jobs=False)
    ctx.put_connector(G, "A", 3)
    return ctx


def test_heartbeats_are_answered_while_a_run_is_in_flight() -> None:
    ctx = offload_context()
    ctx.join(G, "w1", server_assignor=RR)
    assert len(ctx.jobs) == 1
    for _ in range(3):
        response = ctx.heartbeat(G, "w1", 1)
        assert response.error_code == ErrorCode.NONE and response.member_epoch == 1
    ctx.join(G, "w2", server_assignor=RR)
    assert len(ctx.jobs) == 1  # at most one run per group in flight
    ctx.finish_job(ctx.jobs.pop())
    # The result landed at the epoch it was computed for; the newer epoch starts a run.
    assert ctx.describe(G).assignment_epoch == ctx.describe(G).group_epoch - 1
    assert len(ctx.jobs) == 1
    ctx.finish_job(ctx.jobs.pop())
    assert ctx.describe(G).assignment_epoch == ctx.describe(G).group_epoch


def test_member_gone_during_run_loses_its_part() -> None:
    ctx = offload_context()
    ctx.join(G, "w1", server_assignor=RR)
    ctx.finish_job(ctx.jobs.pop())
    ctx.join(G, "w2", server_assignor=RR)
    job = ctx.jobs.pop()
    assert set(job.spec.members) == {"w1", "w2"}
    ctx.heartbeat(G, "w2", -1)
    ctx.finish_job(job)
    target = {m.member_id: wire_units(m.target) for m in ctx.describe(G).members}
    assert set(target) == {"w1"}
    assert ctx.core.store.groups[G].target.keys() == {"w1"}


def test_replaced_static_member_gets_the_part() -> None:
    ctx = offload_context()
    ctx.join(G, "m1", instance_id="i1", server_assignor=RR)
    job = ctx.jobs.pop()
    ctx.heartbeat(G, "m1", -2, instance_id="i1")
    ctx.join(G, "m2", instance_id="i1", server_assignor=RR, worker_url="http://m1:8083")
    ctx.finish_job(job)
    assert wire_units(ctx.member_view(G, "m2").target) == units("A", "A-0", "A-1", "A-2")


def test_deleted_group_drops_the_result() -> None:
    ctx = offload_context()
    ctx.join(G, "w1", server_assignor=RR)
    job = ctx.jobs.pop()
    ctx.heartbeat(G, "w1", -1)
    ctx.jobs.clear()
    ctx.apply(ctx.core.delete_group(G, ctx.now))
    before = len(ctx.log)
    ctx.finish_job(job)
    assert len(ctx.log) == before
    assert ctx.core.group_ids() == []


def test_failed_or_timed_out_run_keeps_the_target_and_retries() -> None:
    ctx = offload_context(interval_ms=1_000)
    ctx.join(G, "w1", server_assignor=RR)
    ctx.finish_job(ctx.jobs.pop())
    before = ctx.describe(G)
    ctx.join(G, "w2", server_assignor=RR)
    ctx.advance(1_000)
    ctx.finish_job(ctx.jobs.pop(), TimeoutError("assignor run exceeded 30000 ms"))
    assert ctx.describe(G).assignment_epoch == before.assignment_epoch
    assert not ctx.jobs  # no immediate retry, even with heartbeats arriving
    ctx.heartbeat(G, "w2", 1)
    assert not ctx.jobs
    assert ctx.heartbeat(G, "w1", before.members[0].member_epoch).error_code == ErrorCode.NONE
    ctx.advance(1_000)  # retried after the interval
    assert len(ctx.jobs) == 1
    ctx.finish_job(ctx.jobs.pop())
    assert ctx.describe(G).assignment_epoch == ctx.describe(G).group_epoch


def test_assignor_giving_a_unit_twice_is_rejected() -> None:
    ctx = offload_context()
    ctx.join(G, "w1", server_assignor=RR)
    ctx.join(G, "w2", server_assignor=RR)
    job = ctx.jobs.pop()
    bad = AssignmentResult(target={"w1": units("A"), "w2": units("A")})
    ctx.finish_job(job, bad)
    assert ctx.core.store.groups[G].target == {}


def test_inline_when_offload_is_disabled_for_the_group() -> None:
    ctx = offload_context()
    ctx.apply(ctx.core.set_group_config(G, {"connect.assignor.offload.enable": False}, ctx.now))
    response = ctx.join(G, "w1", server_assignor=RR)
    assert not ctx.jobs
    assert wire_units(response.assignment.assigned) == units("A", "A-0", "A-1", "A-2")


def finish_through_the_pool_transport(ctx: Context, job: Any) -> None:
    """What the runtime does: pack, run in the worker, compact, expand, apply verified."""
    packed = SpecPacker().pack(ctx.assignors[job.assignor], job.spec)
    compact_result = run_packed(pickle.loads(pickle.dumps(packed)))
    ctx.apply(ctx.core.complete_assignor_run(job, expand(job.spec, compact_result), ctx.now,
                                             compact_result.verified))


def _missed_changes(ctx: Context, finish: Callable[[Context, Any], None],
                    meanwhile: str) -> None:
    ctx.join(G, "m1", instance_id="i1", server_assignor=RR)
    ctx.join(G, "w2", server_assignor=RR)
    finish(ctx, ctx.jobs.pop())
    ctx.join(G, "w3", server_assignor=RR)
    job = ctx.jobs.pop()
    if meanwhile == "member left":
        ctx.heartbeat(G, "w2", -1)
    elif meanwhile == "connector deleted":
        ctx.apply(ctx.core.delete_connector(G, "A", ctx.now))
    elif meanwhile == "static member replaced":
        ctx.heartbeat(G, "m1", -2, instance_id="i1")
        ctx.join(G, "m9", instance_id="i1", server_assignor=RR, worker_url="http://m1:8083")
    finish(ctx, job)


@pytest.mark.parametrize("meanwhile", ["nothing", "member left", "connector deleted",
                                       "static member replaced"])
def test_the_pool_transport_lands_runs_exactly_like_a_direct_result(meanwhile: str) -> None:
    direct, packed = offload_context(), offload_context()
    for ctx in (direct, packed):
        ctx.put_connector(G, "B", 20)
    _missed_changes(direct, lambda ctx, job: ctx.finish_job(job), meanwhile)
    _missed_changes(packed, finish_through_the_pool_transport, meanwhile)
    assert packed.describe(G) == direct.describe(G)
    assert packed.log == direct.log


def test_member_specs_follow_the_members_and_are_reused_while_unchanged() -> None:
    ctx = offload_context()
    for member in ("w1", "w2"):
        ctx.join(G, member, server_assignor=RR, worker_url=f"http://{member}:8083")
    while ctx.jobs:
        ctx.finish_job(ctx.jobs.pop())
    ctx.put_connector(G, "A", 4)
    first = ctx.jobs.pop()
    ctx.finish_job(first)
    ctx.heartbeat(G, "w2", ctx.member_view(G, "w2").member_epoch,
                  worker_url="http://moved:8083")  # new metadata: a new entry for w2
    while ctx.jobs:
        ctx.finish_job(ctx.jobs.pop())
    ctx.put_connector(G, "A", 5)
    second = ctx.jobs.pop()
    group = ctx.core.store.groups[G]
    for member_id, spec in second.spec.members.items():  # each as the group has it now
        metadata = group.members[member_id].metadata
        assert (spec.member_id, spec.instance_id, spec.worker_url, spec.current_target) == (
            member_id, metadata.instance_id, metadata.worker_url,
            group.target[member_id].units)
    assert second.spec.members["w2"].worker_url == "http://moved:8083"
    assert second.spec.members["w2"] is not first.spec.members["w2"]
    # Asked again with nothing changed, every entry is the very same object.
    again = ctx.core._member_specs(group)
    assert all(again[m] is second.spec.members[m] for m in ("w1", "w2"))
