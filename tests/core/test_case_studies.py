"""The Connect rebalance design's case studies, run against the core with client-side assignment.

Connectors: A with tasks 0, 1 and B with task 0 (the design's AC0, AT1, AT2, BC0, BT1).
Epochs are higher than the design's: epoch 1 is reserved (docs/protocol.md) and creating each
connector through the admin API is a change of its own.
"""

from __future__ import annotations

from protocol.errors import ErrorCode

from .context import Context, client_assignor, units, wire_units

ALL = units("A", "A-0", "A-1", "B", "B-0")
G = "connect-cluster"


def new_group() -> Context:
    ctx = Context()
    ctx.put_connector(G, "A", 2)
    ctx.put_connector(G, "B", 1)
    assert ctx.describe(G).group_epoch == 3
    assert ctx.describe(G).group_state == "EMPTY"
    return ctx


def w1_joins(ctx: Context) -> None:
    response = ctx.join(G, "W1")
    # The join bumps the group epoch; before any target W1 gets the reserved epoch 1.
    assert ctx.describe(G).group_epoch == 4
    assert response.member_epoch == 1
    assert wire_units(response.assignment.assigned) == frozenset()
    # W1 is the only worker, so it is chosen to compute the assignment.
    assert response.error_code == ErrorCode.COMPUTE_ASSIGNMENT
    assert ctx.describe(G).group_state == "ASSIGNING"

    prepared = ctx.compute_and_install(G, "W1", 1, lambda p: {"W1": ALL})
    assert prepared.group_epoch == 4
    assert [m.member_id for m in prepared.members] == ["W1"]
    assert wire_units(prepared.connectors_and_tasks) == ALL
    assert ctx.describe(G).assignment_epoch == 4

    # Nothing to revoke: W1 moves straight to the target epoch with everything.
    response = ctx.heartbeat(G, "W1", 1, owned=())
    assert response.error_code == ErrorCode.NONE
    assert response.member_epoch == 4
    assert wire_units(response.assignment.assigned) == ALL
    assert ctx.describe(G).group_state == "STABLE"


def test_w1_joins() -> None:
    ctx = new_group()
    w1_joins(ctx)
    # A further heartbeat from the stable member changes nothing and sends no assignment.
    before = len(ctx.log)
    response = ctx.heartbeat(G, "W1", 4)
    assert response.assignment is None
    assert response.member_epoch == 4
    assert len(ctx.log) == before


def w2_joins(ctx: Context) -> None:
    response = ctx.join(G, "W2")
    assert ctx.describe(G).group_epoch == 5
    # W2 reaches the current target epoch with nothing: its part of target 4 is empty.
    assert response.member_epoch == 4
    assert wire_units(response.assignment.assigned) == frozenset()
    assert response.error_code == ErrorCode.NONE  # W1 stays the chosen worker

    response = ctx.heartbeat(G, "W1", 4)
    assert response.error_code == ErrorCode.COMPUTE_ASSIGNMENT
    ctx.compute_and_install(
        G, "W1", 4, lambda p: {"W1": units("A", "A-0", "A-1"), "W2": units("B", "B-0")}
    )
    assert ctx.describe(G).assignment_epoch == 5

    # W2 moves to epoch 5 but may not have B and B-0 until W1 releases them.
    response = ctx.heartbeat(G, "W2", 4)
    assert response.member_epoch == 5
    assert wire_units(response.assignment.assigned) == frozenset()
    assert ctx.member_view(G, "W2").member_state == "UNRELEASED"

    # W1 is asked to release B and B-0 and stays at epoch 4 meanwhile.
    response = ctx.heartbeat(G, "W1", 4)
    assert response.member_epoch == 4
    assert wire_units(response.assignment.assigned) == units("A", "A-0", "A-1")
    assert ctx.member_view(G, "W1").member_state == "UNREVOKED"
    assert wire_units(ctx.member_view(G, "W1").pending_revocation) == units("B", "B-0")

    # W1 acknowledges by leaving them out of what it owns: it moves to epoch 5.
    response = ctx.heartbeat(G, "W1", 4, owned=units("A", "A-0", "A-1"))
    assert response.member_epoch == 5
    assert ctx.member_view(G, "W1").member_state == "STABLE"

    # Only now does W2 get them.
    response = ctx.heartbeat(G, "W2", 5)
    assert response.member_epoch == 5
    assert wire_units(response.assignment.assigned) == units("B", "B-0")
    assert ctx.describe(G).group_state == "STABLE"


def test_w2_joins() -> None:
    ctx = new_group()
    w1_joins(ctx)
    w2_joins(ctx)


def three_workers() -> Context:
    """W1 [A, A-0], W2 [B, B-0], W3 [A-1], all stable (the design's epoch-35 set-up)."""
    ctx = new_group()
    w1_joins(ctx)
    ctx.join(G, "W2")
    ctx.join(G, "W3")
    ctx.heartbeat(G, "W1", 4)
    ctx.compute_and_install(G, "W1", 4, lambda p: {
        "W1": units("A", "A-0"), "W2": units("B", "B-0"), "W3": units("A-1")})
    ctx.heartbeat(G, "W1", 4)
    ctx.heartbeat(G, "W1", 4, owned=units("A", "A-0"))
    for worker in ("W2", "W3"):
        epoch = ctx.member_view(G, worker).member_epoch
        ctx.heartbeat(G, worker, epoch)
        ctx.heartbeat(G, worker, ctx.member_view(G, worker).member_epoch)
    assert ctx.describe(G).group_state == "STABLE"
    return ctx


def keep_alive(ctx: Context, *workers: str) -> None:
    for worker in workers:
        ctx.heartbeat(G, worker, ctx.member_view(G, worker).member_epoch)


def test_worker_leaving() -> None:
    ctx = three_workers()
    epoch = ctx.describe(G).group_epoch
    # W2 stops heartbeating; W1 and W3 keep going until W2's session expires.
    for _ in range(4):
        ctx.advance(3_000)
        keep_alive(ctx, "W1", "W3")
    assert {m.member_id for m in ctx.describe(G).members} == {"W1", "W3"}
    assert ctx.describe(G).group_epoch == epoch + 1

    # The chosen worker keeps the assignment as it is: W2's units stay unassigned.
    response = ctx.heartbeat(G, "W1", ctx.member_view(G, "W1").member_epoch)
    assert response.error_code == ErrorCode.COMPUTE_ASSIGNMENT
    ctx.compute_and_install(G, "W1", response.member_epoch, lambda p: {
        "W1": units("A", "A-0"), "W3": units("A-1")})
    assert ctx.core.unassigned_units(G) == units("B", "B-0")
    keep_alive(ctx, "W1", "W3")
    keep_alive(ctx, "W1", "W3")
    assert ctx.describe(G).group_state == "STABLE"
    assert ctx.member_view(G, "W1").member_epoch == epoch + 1

    # After its delay the client assignor asks for a rebalance through its Reason field.
    ctx.advance(2_000)
    ctx.heartbeat(G, "W1", epoch + 1, client_assignors=[client_assignor(reason=1)])
    assert ctx.describe(G).group_epoch == epoch + 2
    response = ctx.heartbeat(G, "W1", epoch + 1)
    assert response.error_code == ErrorCode.COMPUTE_ASSIGNMENT
    ctx.compute_and_install(G, "W1", epoch + 1, lambda p: {
        "W1": units("A", "A-0", "B"), "W3": units("B-0", "A-1")})
    for _ in range(2):
        keep_alive(ctx, "W1", "W3")
    assert ctx.describe(G).group_state == "STABLE"
    assert wire_units(ctx.member_view(G, "W1").assigned) == units("A", "A-0", "B")
    assert wire_units(ctx.member_view(G, "W3").assigned) == units("B-0", "A-1")
    assert ctx.member_view(G, "W3").member_epoch == epoch + 2


def test_worker_bounce() -> None:
    ctx = three_workers()
    epoch = ctx.describe(G).group_epoch
    w2_epoch = ctx.member_view(G, "W2").member_epoch
    for _ in range(4):
        ctx.advance(3_000)
        keep_alive(ctx, "W1", "W3")
    response = ctx.heartbeat(G, "W1", ctx.member_view(G, "W1").member_epoch)
    ctx.compute_and_install(G, "W1", response.member_epoch, lambda p: {
        "W1": units("A", "A-0"), "W3": units("A-1")})
    keep_alive(ctx, "W1", "W3")

    # W2 comes back with the epoch it last knew: it is no longer a member.
    response = ctx.heartbeat(G, "W2", w2_epoch)
    assert response.error_code == ErrorCode.UNKNOWN_MEMBER_ID
    response = ctx.join(G, "W2")
    assert ctx.describe(G).group_epoch == epoch + 2

    # The chosen worker sees the delay in progress and gives W2 its units back.
    response = ctx.heartbeat(G, "W1", ctx.member_view(G, "W1").member_epoch)
    assert response.error_code == ErrorCode.COMPUTE_ASSIGNMENT
    ctx.compute_and_install(G, "W1", response.member_epoch, lambda p: {
        "W1": units("A", "A-0"), "W2": units("B", "B-0"), "W3": units("A-1")})
    for _ in range(2):
        keep_alive(ctx, "W1", "W2", "W3")
    described = ctx.describe(G)
    assert described.group_state == "STABLE"
    assert {m.member_id: m.member_epoch for m in described.members} == {
        "W1": epoch + 2, "W2": epoch + 2, "W3": epoch + 2}
    assert wire_units(ctx.member_view(G, "W2").assigned) == units("B", "B-0")
