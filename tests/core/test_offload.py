"""Offloaded assignor runs in the core: batched, one in flight per group, missed changes."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.assignors.api import AssignmentResult
from coordinator.assignors.transport import SpecPacker, compact, run_packed
from coordinator.config import ServerConfig
from coordinator.core.group import target_member_record
from coordinator.core.reconcile import TargetPart
from coordinator.core.result import MappingChange, expand
from coordinator.units import Unit, units_of
from protocol.errors import ErrorCode
from protocol.messages import ConnectGroupDescribeRequest

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


def test_a_landing_told_only_what_changed_drops_a_part_of_a_non_member() -> None:
    # The core drops a member's target part when it removes the member, but a log may
    # hold a part of someone who is no member (written elsewhere, say). A run that lands
    # on the group as its spec saw it must drop that part, as the full landing does.
    ctx = offload_context()
    for member in ("w1", "w2"):
        ctx.join(G, member, server_assignor=RR)
        ctx.finish_job(ctx.jobs.pop())
    ctx.core.store.replay(target_member_record(G, "ghost", TargetPart(frozenset({("A", 9)}))))
    ctx.put_connector(G, "A", 4)
    (run,) = ctx.jobs
    outcome = compact(run.spec, ctx.assignors[RR].assign(run.spec))
    assert outcome.verified and outcome.outsiders == ("ghost",)
    group = ctx.core.store.groups[G]
    targets_before = group.target_changes
    ctx.finish_job(ctx.jobs.pop(), outcome)
    assert group.target.keys() == {"w1", "w2"}
    assert group.target_changes > targets_before  # (landed, not dropped as stale)
    dropped = [r for r in ctx.last.records if getattr(r.key, "member_id", None) == "ghost"]
    assert [r.value for r in dropped] == [None]


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
    """What the runtime does: pack, run in the worker, compact, apply the compact result."""
    packed = SpecPacker().pack(ctx.assignors[job.assignor], job.spec)
    ctx.finish_job(job, run_packed(pickle.loads(pickle.dumps(packed))))


def finish_expanded(ctx: Context, job: Any) -> None:
    """The pool transport, with the full result rebuilt before it is applied."""
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
    again, _change = ctx.core._member_specs(group)
    assert all(again[m] is second.spec.members[m] for m in ("w1", "w2"))


# --- landing a compact result: the same records as the full result, whatever happened ---

# What starts the run whose result lands (the spec is taken then).
BEFORE = ("connector resized", "static member joined", "member left",
          "client-side target, then server mode")
MEANWHILE = (None, "member joined", "member left", "static member replaced",
             "connector resized", "connector deleted", "worker url changed", "member heartbeat")


def _reconcile(ctx: Context) -> None:
    """Every member heartbeats until it runs its target (a few rounds suffice here)."""
    for _ in range(3):
        for member in ctx.describe(G).members:
            ctx.heartbeat(G, member.member_id, member.member_epoch,
                          owned=wire_units(member.assigned))


def _set_up(ctx: Context, members: int, static: list[bool], before: str) -> None:
    client_first = before == "client-side target, then server mode"
    ctx.put_connector(G, "B", 5)
    for index in range(members):
        ctx.join(G, f"w{index}", instance_id=f"i{index}" if static[index] else None,
                 client=client_first, server_assignor=None if client_first else RR)
    while ctx.jobs:
        ctx.finish_job(ctx.jobs.pop(0))
    if client_first:  # parts with a version
        chooser = ctx.describe(G).members[0]
        ctx.compute_and_install(G, chooser.member_id, chooser.member_epoch, lambda prepared: {
            member.member_id: units("A") if index == 0 else frozenset()
            for index, member in enumerate(prepared.members)})
    _reconcile(ctx)
    if client_first:  # the first to switch starts the run (the others change metadata)
        for index in range(members):
            ctx.heartbeat(G, f"w{index}", ctx.member_view(G, f"w{index}").member_epoch,
                          server_assignor=RR)
    elif before == "static member joined":  # in the spec, without a part yet
        ctx.join(G, "s-new", instance_id="i-new", server_assignor=RR)
    elif before == "member left":  # its part is in the spec's previous target
        ctx.heartbeat(G, "w0", -1)
    if not ctx.jobs:
        ctx.put_connector(G, "A", 4)  # starts the run


def _meanwhile(ctx: Context, what: str | None) -> None:
    if what == "member joined":
        ctx.join(G, "late", server_assignor=RR)
        return
    members = ctx.describe(G).members
    if what is None or not members:
        return
    first = members[0]
    static = [m for m in members if m.instance_id is not None]
    if what == "member left":
        ctx.heartbeat(G, first.member_id, -1)
    elif what == "static member replaced" and static:
        leaving = static[-1]  # the newest: without a part when it joined just before
        ctx.heartbeat(G, leaving.member_id, -2, instance_id=leaving.instance_id)
        ctx.join(G, f"{leaving.member_id}-again", instance_id=leaving.instance_id,
                 server_assignor=RR)
    elif what == "connector resized":
        ctx.put_connector(G, "B", 7)
    elif what == "connector deleted":
        ctx.apply(ctx.core.delete_connector(G, "A", ctx.now))
    elif what == "worker url changed":
        ctx.heartbeat(G, first.member_id, first.member_epoch, worker_url="http://moved:8083")
    elif what == "member heartbeat":
        ctx.heartbeat(G, first.member_id, first.member_epoch)


RESULTS = ("the assignor's own", "everyone's previous part", "all to the first member",
           "drawn")


def _result(kind: str, data: st.DataObject, ctx: Context, spec: Any) -> AssignmentResult:
    """A result of the given kind for `spec`; "drawn" gives each member (and a stranger)
    its previous part, units not given yet or nothing, in any order, and may break the
    rules (a unit given twice or unknown)."""
    everything = sorted(units_of(spec.connectors))
    if kind == "the assignor's own":
        result: AssignmentResult = ctx.assignors[RR].assign(spec)
        return result
    if kind == "everyone's previous part":
        order = data.draw(st.permutations(list(spec.previous_target)), label="order")
        return AssignmentResult({member_id: spec.previous_target[member_id]
                                 for member_id in order})
    if kind == "all to the first member":
        return AssignmentResult({next(iter(spec.members)): frozenset(everything)})
    named = list(dict.fromkeys([*spec.members, *spec.previous_target, "stranger"]))
    free = [unit for unit in everything
            if not any(unit in part for part in spec.previous_target.values())]
    target: dict[str, frozenset[Unit]] = {}
    for member_id in data.draw(st.permutations(named), label="order"):
        choice = data.draw(st.sampled_from(["previous", "new", "left out"]), label=member_id)
        if choice == "previous" and member_id in spec.previous_target:
            target[member_id] = spec.previous_target[member_id]
        elif choice == "new":
            part = data.draw(st.frozensets(st.sampled_from(everything), max_size=4)
                             if data.draw(st.booleans(), label="any units")
                             else st.frozensets(st.sampled_from(free or everything), max_size=3))
            if data.draw(st.integers(0, 9), label="unknown unit") == 0:
                part |= {("ghost", 0)}
            target[member_id] = part
    rerun_at_ms = data.draw(st.none() | st.integers(0, 2_000_000), label="rerun at")
    return AssignmentResult(target, state=b"s", rerun_at_ms=rerun_at_ms)


def _land_three_ways(contexts: list[Context], result: AssignmentResult) -> None:
    """Land each context's pending run: with the full result, as the worker's compact
    result, and as that compact result expanded again."""
    direct, compacted, expanded = contexts
    jobs = [ctx.jobs.pop() for ctx in contexts]
    spec = jobs[0].spec
    direct.finish_job(jobs[0], result)
    compact_result = compact(spec, result)
    compacted.finish_job(jobs[1], compact_result)
    expanded.apply(expanded.core.complete_assignor_run(
        jobs[2], expand(spec, compact_result), expanded.now, compact_result.verified))
    for ctx in (compacted, expanded):
        # The same records; a compact landing writes the changed members' parts in the
        # result's order, not the group's (records of different members commute).
        assert sorted(map(repr, ctx.log)) == sorted(map(repr, direct.log))
        assert ctx.log[-1] == direct.log[-1]  # the target's metadata, last
        assert ctx.last is not None and direct.last is not None
        assert ctx.last.events == direct.last.events
        assert ctx.timers == direct.timers
        assert ctx.describe(G) == direct.describe(G)
        assert ctx.replayed().describe(  # the counters the landing goes by replay too
            ConnectGroupDescribeRequest(group_ids=(G,)), ctx.now).groups[0] == ctx.describe(G)


@pytest.mark.parametrize("kind", RESULTS)
@pytest.mark.parametrize("meanwhile", MEANWHILE)
@pytest.mark.parametrize("before", BEFORE)
@settings(max_examples=3)
@given(data=st.data())
def test_a_compact_result_lands_exactly_like_the_full_result(
        before: str, meanwhile: str | None, kind: str, data: st.DataObject) -> None:
    # The runtime hands the core the worker's compact result; when nothing about the group
    # changed in flight, the core applies only the changed members (`_apply_changes`).
    # Whatever the result and whatever happened meanwhile, the records, events, timers and
    # state must be those of applying the full result; so for the next run, whose result
    # is of the same kind. The last landing's undo records must restore the state from
    # before it (who is reconciled included).
    members = data.draw(st.integers(2 if before == "member left" else 1, 4), label="members")
    static = data.draw(st.lists(st.booleans(), min_size=members, max_size=members))
    contexts = [offload_context() for _ in range(3)]
    for ctx in contexts:
        _set_up(ctx, members, static, before)
    result = _result(kind, data, contexts[0], contexts[0].jobs[-1].spec)
    for ctx in contexts:
        _meanwhile(ctx, meanwhile)
    _land_three_ways(contexts, result)
    for ctx in contexts:
        while ctx.jobs:  # a run started by what happened meanwhile: the assignor's own
            ctx.finish_job(ctx.jobs.pop(0))
        _reconcile(ctx)
        ctx.put_connector(G, "B", 6)
    if all(ctx.jobs for ctx in contexts):
        result = _result(kind, data, contexts[0], contexts[0].jobs[-1].spec)
        before_landing = [(ctx.describe(G), set(ctx.core.store.groups[G].unreconciled))
                          for ctx in contexts]
        _land_three_ways(contexts, result)
        for ctx, (described, unreconciled) in zip(contexts, before_landing, strict=True):
            assert ctx.last is not None
            for record in ctx.last.undo:
                ctx.core.store.replay(record)
            assert ctx.describe(G) == described
            assert ctx.core.store.groups[G].unreconciled == unreconciled


def test_a_run_started_by_a_landing_that_was_rolled_back_lands_like_the_full_result() -> None:
    # A landing starts the next run in the same change when the group moved on meanwhile.
    # If that change's records then fail to reach the log, the runtime rolls it back while
    # the next run is in flight: only the target changed (no member, metadata or
    # connector), and the next run's result must still land as the full result would.
    contexts = [offload_context() for _ in range(2)]
    for ctx in contexts:
        _set_up(ctx, 3, [False, False, False], "connector resized")
        first = ctx.jobs.pop()
        ctx.put_connector(G, "B", 7)  # in flight: the landing starts the next run
        ctx.finish_job(first)
        assert ctx.last is not None and len(ctx.jobs) == 1
        ctx.core.rollback(ctx.last)  # its records were not written
    direct, compacted = contexts
    job = direct.jobs.pop()
    result = direct.assignors[RR].assign(job.spec)
    direct.finish_job(job, result)
    job = compacted.jobs.pop()
    compacted.finish_job(job, compact(job.spec, result))
    assert compacted.last is not None and direct.last is not None
    assert compacted.last.records == direct.last.records
    assert compacted.last.events == direct.last.events
    assert compacted.describe(G) == direct.describe(G)


def specs_from_scratch(core: Any) -> dict[str, tuple[Any, ...]]:
    group = core.store.groups[G]
    return {m: (m, member.metadata.instance_id if member.metadata else None,
                member.metadata.worker_url if member.metadata else "",
                group.target[m].units if m in group.target else frozenset())
            for m, member in group.members.items()}


def previous_from_scratch(group: Any) -> dict[str, frozenset[Unit]]:
    return {**group.departed_parts, **{m: part.units for m, part in group.target.items()}}


def as_fields(specs: dict[str, Any]) -> dict[str, tuple[Any, ...]]:
    return {m: (s.member_id, s.instance_id, s.worker_url, s.current_target)
            for m, s in specs.items()}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["join", "leave", "url", "resize", "land", "undo"]),
                          st.sampled_from(["w1", "w2", "w3"]), st.integers(0, 6)),
                max_size=14))
def test_member_specs_kept_between_runs_are_those_built_from_scratch(
        steps: list[tuple[str, str, int]]) -> None:
    """The core keeps members' specs and the previous target between runs and rebuilds
    only the entries whose metadata or target changed: whatever happened, they are the
    ones built anew, at run time and after a replay of the log."""
    ctx = offload_context()
    ctx.last = None  # (not the group's creation)
    for action, member, number in steps:
        present = member in ctx.core.store.groups[G].members
        if action == "join" and not present:
            ctx.join(G, member, server_assignor=RR, instance_id=f"i-{member}"
                     if number % 2 else None)
        elif action == "leave" and present:
            ctx.heartbeat(G, member, -1)
        elif action == "url" and present:
            ctx.heartbeat(G, member, ctx.member_view(G, member).member_epoch,
                          worker_url=f"http://{member}:{number}")
        elif action == "resize":
            ctx.put_connector(G, "A", number)
        elif action == "land" and ctx.jobs:
            ctx.finish_job(ctx.jobs.pop(0))
        elif action == "undo" and ctx.last is not None and not ctx.last.jobs:
            ctx.core.rollback(ctx.last)  # as if its records never reached the log
            del ctx.log[len(ctx.log) - len(ctx.last.records):]
            ctx.last = None
        group = ctx.core.store.groups[G]
        # What the group keeps is bounded by its members, whether or not a run follows.
        # (A member that left stays in the cache, marked stale, until the next spec.)
        cache = group.spec_cache
        assert cache.stale_members <= group.members.keys() | cache.member_specs.keys()
        assert cache.member_specs.keys() <= group.members.keys() | cache.stale_members
        if number % 3:  # (not at every step: what is kept between specs is what is tested)
            specs, _change = ctx.core._member_specs(group)
            assert as_fields(specs) == specs_from_scratch(ctx.core)
            assert list(specs) == list(group.members)  # (a whole pack is smaller so)
            assert ctx.core._previous_target(group)[0] == previous_from_scratch(group)
    group = ctx.core.store.groups[G]
    assert as_fields(ctx.core._member_specs(group)[0]) == specs_from_scratch(ctx.core)
    assert ctx.core._previous_target(group)[0] == previous_from_scratch(group)
    replayed = ctx.replayed()
    assert as_fields(replayed._member_specs(replayed.store.groups[G])[0]) == \
        specs_from_scratch(replayed)


def differs_only_at(mapping: Any, base: Any, change: MappingChange,
                    by_value: bool = False) -> bool:
    """Is `mapping` `base` with at most the change's keys added, replaced or removed?"""
    if change.version == change.base:
        return mapping is base
    told = set(change.keys)
    rest = (mapping.keys() | base.keys()) - told
    return all(key in mapping and key in base
               and (mapping[key] == base[key] if by_value
                    else mapping[key] is base[key]) for key in rest)


def spec_mappings(run: Any) -> tuple[tuple[str, Any, Any, bool], ...]:
    changes, spec = run.changes, run.spec
    return (("members", spec.members, changes.members, False),
            ("previous", spec.previous_target, changes.previous_target, False),
            ("connectors", spec.connectors, changes.connectors, True))


def told_truly(run: Any, versions: dict[tuple[str, int], Any], cache: Any) -> bool:
    """Checks a run's changes against the mappings earlier specs got by version, then
    notes this spec's mappings under the versions the group's cache gave them."""
    truly = all(change is None or (
        (kind, change.base) in versions
        and differs_only_at(mapping, versions[kind, change.base], change, by_value))
        for kind, mapping, change, by_value in spec_mappings(run))
    for kind, mapping, cached, version in (
            ("members", run.spec.members, cache.member_specs, cache.member_specs_version),
            ("previous", run.spec.previous_target, cache.previous_target,
             cache.previous_target_version),
            ("connectors", run.spec.connectors, cache.connectors, cache.connectors_version)):
        if cached is mapping:
            versions[kind, version] = mapping
    return truly


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["join", "leave", "url", "resize A", "resize B",
                                           "delete B", "land", "undo"]),
                          st.sampled_from(["w1", "w2", "w3"]), st.integers(0, 6)),
                max_size=16))
def test_a_run_tells_truly_what_changed_since_an_earlier_spec(
        steps: list[tuple[str, str, int]]) -> None:
    """Each run's spec may name, per mapping, the keys that differ from a mapping of an
    earlier spec; the packer relies on it, so every other key must hold the very same
    object (for connectors, the same task count), whatever happened in between."""
    ctx = offload_context()
    ctx.last = None
    versions: dict[tuple[str, int], Any] = {}
    for action, member, number in steps:
        group = ctx.core.store.groups[G]
        present = member in group.members
        if action == "join" and not present:
            ctx.join(G, member, server_assignor=RR)
        elif action == "leave" and present:
            ctx.heartbeat(G, member, -1)
        elif action == "url" and present:
            ctx.heartbeat(G, member, ctx.member_view(G, member).member_epoch,
                          worker_url=f"http://{member}:{number}")
        elif action.startswith("resize"):
            ctx.put_connector(G, action[-1], number)
        elif action == "delete B" and "B" in group.connectors:
            ctx.apply(ctx.core.delete_connector(G, "B", ctx.now))
        elif action == "land" and ctx.jobs:
            ctx.finish_job(ctx.jobs.pop(0))
        elif action == "undo" and ctx.last is not None and not ctx.last.jobs:
            ctx.core.rollback(ctx.last)
            del ctx.log[len(ctx.log) - len(ctx.last.records):]
            ctx.last = None
        for run in ctx.last.jobs if ctx.last is not None else ():
            assert told_truly(run, versions, ctx.core.store.groups[G].spec_cache)


def test_a_resize_tells_its_connector_and_the_parts_that_landed_against_the_spec_before(
        ) -> None:
    ctx = offload_context()
    for member in ("w1", "w2", "w3"):
        ctx.join(G, member, server_assignor=RR)
        while ctx.jobs:
            ctx.finish_job(ctx.jobs.pop(0))
    for member in ("w1", "w2", "w3"):  # everyone at the target: specs as they will stay
        ctx.heartbeat(G, member, ctx.member_view(G, member).member_epoch)
    ctx.put_connector(G, "A", 4)
    (first,) = ctx.jobs
    ctx.finish_job(ctx.jobs.pop())
    landed = {m for m, units in first.spec.previous_target.items()
              if ctx.core.store.groups[G].target[m].units != units}
    assert landed  # (round-robin deals the new task to someone)
    ctx.put_connector(G, "A", 3)
    (second,) = ctx.jobs
    assert second.changes.connectors is not None and first.changes.connectors is not None
    assert second.changes.connectors.base == first.changes.connectors.version
    assert tuple(second.changes.connectors.keys) == ("A",)
    assert second.changes.previous_target is not None
    assert first.changes.previous_target is not None
    assert second.changes.previous_target.base == first.changes.previous_target.version
    assert set(second.changes.previous_target.keys) == landed
    # A member's spec carries its target part: those that landed are built again.
    assert second.changes.members is not None
    assert first.changes.members is not None
    assert second.changes.members.base == first.changes.members.version
    assert set(second.changes.members.keys) == landed
    versions = {(kind, change.version): mapping
                for kind, mapping, change, _by_value in spec_mappings(first)
                if change is not None}
    assert told_truly(second, versions, ctx.core.store.groups[G].spec_cache)


def test_a_connector_change_rolled_back_restores_the_connectors_and_their_record() -> None:
    # The undo of a connectors record is the record they were replayed from (not built
    # again from every connector): after any sequence of changes and roll-backs, it is
    # the record the connectors would make.
    from coordinator.core.group import connectors_record

    ctx = offload_context()
    group = ctx.core.store.groups[G]
    for name, tasks in (("B", 4), ("A", 5), ("C", 1)):
        ctx.put_connector(G, name, tasks)
        before = dict(group.connectors)
        assert ctx.core.store.current_record(connectors_record(G, {}).key) == \
            connectors_record(G, before)
        ctx.put_connector(G, name, tasks + 1)
        assert ctx.last is not None
        ctx.core.rollback(ctx.last)
        assert group.connectors == before
    deleted = ctx.apply(ctx.core.delete_connector(G, "B", ctx.now))
    ctx.core.rollback(ctx.last)
    assert deleted is not None and group.connectors == {"A": 5, "B": 4, "C": 1}


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["put", "delete", "undo"]),
                          st.sampled_from(["A", "B", "C", "D"]), st.integers(0, 4)),
                max_size=16))
def test_a_resize_writes_the_record_the_connectors_make(
        steps: list[tuple[str, str, int]]) -> None:
    """A resize builds the connectors record from the last one by changing one entry (and
    its bytes, and its replay the connectors map): whatever came before, it is the record
    and the bytes built from every connector, and the state is the one replay makes."""
    from coordinator.core.group import connectors_record
    from protocol.records import encode_value

    ctx = offload_context()
    ctx.last = None  # (not the group's creation)
    group = ctx.core.store.groups[G]
    for action, name, tasks in steps:
        if action == "put":
            ctx.put_connector(G, name, tasks)
        elif action == "delete" and name in group.connectors and len(group.connectors) > 1:
            ctx.apply(ctx.core.delete_connector(G, name, ctx.now))
        elif action == "undo" and ctx.last is not None:
            ctx.core.rollback(ctx.last)  # as if its records never reached the log
            del ctx.log[len(ctx.log) - len(ctx.last.records):]
            ctx.last = None
            continue
        written = [r for r in (ctx.last.records if ctx.last else [])
                   if r.key == connectors_record(G, {}).key]
        for record in written:
            assert record == connectors_record(G, group.connectors)
            if record.encoded is not None:
                assert record.encoded == encode_value(record.value)
        assert group.connectors == {c.name: c.tasks for c in group.connectors_value.connectors}
    assert ctx.replayed().store.groups[G].connectors == group.connectors


def test_a_spec_lists_the_members_in_the_group_s_order_after_several_joined() -> None:
    # Kept between runs, the members' specs of a spec are still in the group's order when
    # several joined since the last one (pickle writes a run packed whole a third smaller
    # so: neighbours in that order share connectors).
    ctx = offload_context()
    ctx.join(G, "w0", server_assignor=RR)
    ctx.finish_job(ctx.jobs.pop())
    for index in range(1, 8):  # while w1's run is in flight, six more join
        ctx.join(G, f"w{index}", server_assignor=RR)
    ctx.finish_job(ctx.jobs.pop())
    (job,) = ctx.jobs
    assert list(job.spec.members) == [f"w{index}" for index in range(8)]
    assert list(job.spec.members) == list(ctx.core.store.groups[G].members)


class CountingTarget(dict[str, Any]):
    """A group's target that counts the parts looked up one by one."""

    lookups = 0

    def get(self, key: str, default: Any = None) -> Any:
        CountingTarget.lookups += 1
        return super().get(key, default)

    def __getitem__(self, key: str) -> Any:
        CountingTarget.lookups += 1
        return super().__getitem__(key)


def test_a_compact_result_on_an_unchanged_group_looks_only_at_the_members_it_changed() -> None:
    ctx = offload_context()
    members = [f"w{index}" for index in range(40)]
    for member in members:
        ctx.join(G, member, server_assignor=RR)
    while ctx.jobs:
        ctx.finish_job(ctx.jobs.pop(0))
    _reconcile(ctx)
    ctx.put_connector(G, "A", 4)  # one more task: one member's part changes
    (job,) = ctx.jobs
    ctx.jobs.clear()
    result = compact(job.spec, ctx.assignors[job.assignor].assign(job.spec))
    assert 0 < len(result.changed) < 5
    group = ctx.core.store.groups[G]
    group.target = CountingTarget(group.target)
    CountingTarget.lookups = 0
    ctx.finish_job(job, result)
    # (Replaying a written part looks it up too; going over the members would be 40.)
    assert CountingTarget.lookups <= 3 * len(result.changed), "the landing went over every member"
    assert ctx.describe(G).assignment_epoch == ctx.describe(G).group_epoch
    assert {member: part.units for member, part in group.target.items()} == {
        member: part.units for member, part in ctx.replayed().store.groups[G].target.items()}


def test_member_specs_keep_the_members_order_when_a_member_comes_back() -> None:
    # w1 leaves and comes back (static) before the next spec: it is last among the
    # members now, and its spec must be too.
    test_member_specs_kept_between_runs_are_those_built_from_scratch.hypothesis.inner_test(
        [("join", "w1", 0), ("join", "w2", 1), ("leave", "w1", 0), ("join", "w1", 1)])
