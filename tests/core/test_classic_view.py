"""What each worker of a classic group holds, as the admin API shows it: read from the
Connect bytes the group keeps (allocation in the JoinGroup metadata, then the leader's
incremental assignment: minus revoked, plus assigned)."""

from __future__ import annotations

from coordinator.connect_protocol import (
    SESSIONED_VERSION,
    ConnectAssignment,
    WorkerMetadata,
    encode_assignment,
    encode_worker_metadata,
)
from coordinator.core.classic.engine import JOIN, SYNC
from coordinator.core.classic.view import member_views
from tests.core.classic_context import ClassicContext


def _metadata(url: str, *held: tuple[str, int]) -> tuple[tuple[str, bytes], ...]:
    allocation = ConnectAssignment(SESSIONED_VERSION, assigned=frozenset(held)) \
        if held else None
    blob = encode_worker_metadata(WorkerMetadata(SESSIONED_VERSION, url, 5, allocation))
    return (("sessioned", blob),)


def _assignment(assigned: set[tuple[str, int]],
                revoked: frozenset[tuple[str, int]] = frozenset()) -> bytes:
    return encode_assignment(ConnectAssignment(
        SESSIONED_VERSION, assigned=frozenset(assigned), revoked=frozenset(revoked)))


def _holds(ctx: ClassicContext) -> dict[str, frozenset[tuple[str, int]]]:
    return {view.worker_url: view.holds for view in member_views(ctx.group())}


def test_a_worker_holds_its_allocation_minus_revoked_plus_assigned() -> None:
    ctx = ClassicContext()
    a = ctx.new_member(protocols=_metadata("http://a/"))
    answer = ctx.take(JOIN, a)
    generation = answer.generation
    ctx.sync(a, generation, assignments={a: _assignment({("c", -1), ("c", 0), ("c", 1)})})
    assert _holds(ctx) == {"http://a/": {("c", -1), ("c", 0), ("c", 1)}}

    # A second worker: both rejoin, each with what it holds; while the join phase runs,
    # a worker holds its allocation.
    b = ctx.new_member(protocols=_metadata("http://b/"))
    ctx.join(a, protocols=_metadata("http://a/", ("c", -1), ("c", 0), ("c", 1)))
    assert _holds(ctx) == {"http://a/": {("c", -1), ("c", 0), ("c", 1)}, "http://b/": set()}
    generation = ctx.take(JOIN, a).generation
    ctx.take(JOIN, b)
    ctx.sync(b, generation)
    ctx.sync(a, generation, assignments={a: _assignment(set(), revoked=frozenset({("c", 1)})),
                                         b: _assignment(set())})
    assert ctx.take(SYNC, b) is not None
    assert _holds(ctx) == {"http://a/": {("c", -1), ("c", 0)}, "http://b/": set()}


def test_a_member_not_synced_in_this_generation_holds_only_its_allocation() -> None:
    ctx = ClassicContext()
    a = ctx.new_member(protocols=_metadata("http://a/", ("c", 0)))
    generation = ctx.take(JOIN, a).generation
    assert _holds(ctx) == {"http://a/": {("c", 0)}}  # joined, no SyncGroup yet
    ctx.sync(a, generation, assignments={a: _assignment({("c", 1)})})
    assert _holds(ctx) == {"http://a/": {("c", 0), ("c", 1)}}


def test_bytes_that_are_not_connects_hold_nothing() -> None:
    ctx = ClassicContext()
    a = ctx.new_member()  # the context's default metadata: not Connect's layout
    ctx.take(JOIN, a)
    [view] = member_views(ctx.group())
    assert view.worker_url == "" and view.holds == frozenset()
