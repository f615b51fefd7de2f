"""Every validation rule and error code of the protocol (docs/protocol.md), against the core."""

from __future__ import annotations

from typing import Any

import pytest

from coordinator.config import ServerConfig
from coordinator.core import group as group_module
from coordinator.core.result import ASSIGNOR_TIMER, REVOCATION_TIMER, SESSION_TIMER
from protocol.errors import ApiError, ErrorCode

from .context import Context, client_assignor, units, wire_units

G = "g"


def joined(*workers: str, **kwargs: Any) -> Context:
    ctx = Context(**kwargs)
    ctx.put_connector(G, "A", 2)
    for worker in workers:
        assert ctx.join(G, worker).error_code in (ErrorCode.NONE, ErrorCode.COMPUTE_ASSIGNMENT)
    return ctx


def settle(ctx: Context, *workers: str) -> None:
    """Heartbeat until stable, installing a round-robin assignment when asked."""
    for _ in range(6):
        for worker in workers:
            view = ctx.member_view(G, worker)
            response = ctx.heartbeat(G, worker, view.member_epoch,
                                     owned=wire_units(view.assigned))
            if response.error_code == ErrorCode.COMPUTE_ASSIGNMENT:
                def spread(prepared: Any) -> dict[str, Any]:
                    ids = sorted(m.member_id for m in prepared.members)
                    out: dict[str, set[Any]] = {m: set() for m in ids}
                    for i, unit in enumerate(sorted(wire_units(prepared.connectors_and_tasks))):
                        out[ids[i % len(ids)]].add(unit)
                    return out
                ctx.compute_and_install(G, worker, response.member_epoch, spread)
    assert ctx.describe(G).group_state == "STABLE"


# --- INVALID_REQUEST, one message per rule ------------------------------------------------

JOIN = dict(worker_url="http://w:8083", rebalance_timeout_ms=30_000,
            client_assignors=[client_assignor()])

INVALID = [
    ("", "w", 0, JOIN, "GroupId must be non-empty"),
    (G, "", 0, JOIN, "MemberId must be non-empty"),
    (G, "w", -3, {}, "MemberEpoch must be >= -2"),
    (G, "w", 0, {**JOIN, "instance_id": ""}, "InstanceId, if provided, must be non-empty"),
    (G, "w", -2, {}, "only allowed with an InstanceId"),
    (G, "w", 0, {**JOIN, "rebalance_timeout_ms": -1}, "RebalanceTimeoutMs must be larger"),
    (G, "w", 0, {**JOIN, "worker_url": None}, "WorkerUrl must be set when joining"),
    (G, "w", 0, {**JOIN, "worker_url": ""}, "WorkerUrl, if provided, must be non-empty"),
    (G, "w", 3, {"rebalance_timeout_ms": 0}, "RebalanceTimeoutMs must be -1 (unchanged) or > 0"),
    (G, "w", 0, {**JOIN, "server_assignor": "balanced"}, "cannot be used together"),
    (G, "w", 0, {**JOIN, "client_assignors": None, "server_assignor": ""},
     "ServerAssignor, if provided, must be non-empty"),
    (G, "w", 0, {**JOIN, "client_assignors": [client_assignor(name="")]},
     "Assignor.Name must be non-empty"),
    (G, "w", 0, {**JOIN, "client_assignors": [client_assignor(low=-2, high=1, version=0)]},
     "Assignor.MinimumVersion must be >= -1"),
    (G, "w", 0, {**JOIN, "client_assignors": [client_assignor(low=2, high=1, version=1)]},
     "Assignor.MaximumVersion must be >= 0 and >= Assignor.MinimumVersion"),
    (G, "w", 0, {**JOIN, "client_assignors": [client_assignor(low=1, high=2, version=3)]},
     "Assignor.Version must be within"),
    (G, "w", 0, {**JOIN, "client_assignors": [client_assignor(), client_assignor()]},
     "listed more than once"),
    (G, "w", 0, {**JOIN, "owned": units("A")}, "a joining member (MemberEpoch 0) may not own"),
    (G, "w", 3, {"owned": {("A", -5)}}, "task ids must be >= 0"),
    (G, "w", 3, {"owned": {("", 0)}}, "connector names must be non-empty"),
]


@pytest.mark.parametrize(("group", "member", "epoch", "fields", "message"), INVALID,
                         ids=[case[-1] for case in INVALID])
def test_invalid_request(group: str, member: str, epoch: int, fields: dict[str, Any],
                         message: str) -> None:
    ctx = joined()
    before = len(ctx.log)
    response = ctx.heartbeat(group, member, epoch, **fields)
    assert response.error_code == ErrorCode.INVALID_REQUEST
    assert message in response.error_message
    assert len(ctx.log) == before


def test_unknown_member_and_unknown_group() -> None:
    ctx = joined("w1")
    assert ctx.heartbeat(G, "nobody", 3).error_code == ErrorCode.UNKNOWN_MEMBER_ID
    response = ctx.heartbeat("no-group", "w1", 3)
    assert response.error_code == ErrorCode.UNKNOWN_MEMBER_ID
    assert "does not exist" in response.error_message


def test_fenced_member_epoch_removes_the_member() -> None:
    ctx = joined("w1", "w2")
    settle(ctx, "w1", "w2")
    epoch = ctx.describe(G).group_epoch
    response = ctx.heartbeat(G, "w2", 99)
    assert response.error_code == ErrorCode.FENCED_MEMBER_EPOCH
    assert {m.member_id for m in ctx.describe(G).members} == {"w1"}
    assert ctx.describe(G).group_epoch == epoch + 1
    # It rejoins with the same id and epoch 0.
    assert ctx.join(G, "w2").error_code in (ErrorCode.NONE, ErrorCode.COMPUTE_ASSIGNMENT)


def test_lost_response_is_accepted_not_fenced() -> None:
    ctx = joined("w1")
    settle(ctx, "w1")
    ctx.join(G, "w2")
    settle(ctx, "w1", "w2")
    view = ctx.member_view(G, "w1")
    # Force a new epoch: a connector change, then w1 moves to it but "loses" the response.
    ctx.put_connector(G, "B", 0)
    response = ctx.heartbeat(G, "w1", view.member_epoch)
    if response.error_code == ErrorCode.COMPUTE_ASSIGNMENT:
        ctx.compute_and_install(G, "w1", response.member_epoch, lambda p: {
            "w1": wire_units(view.assigned), "w2": units("B")})
        response = ctx.heartbeat(G, "w1", view.member_epoch)
    new_epoch = ctx.member_view(G, "w1").member_epoch
    assert new_epoch > view.member_epoch
    # The worker retries with its old epoch and a subset of its assignment: accepted.
    response = ctx.heartbeat(G, "w1", view.member_epoch, owned=wire_units(view.assigned))
    assert response.error_code == ErrorCode.NONE
    assert response.member_epoch == new_epoch
    assert response.assignment is not None
    # With units it was never given, the same old epoch is fenced.
    response = ctx.heartbeat(G, "w1", view.member_epoch,
                             owned=wire_units(view.assigned) | units("B"))
    assert response.error_code == ErrorCode.FENCED_MEMBER_EPOCH


def new_target_where_w1_keeps_its_units() -> tuple[Context, Any]:
    """A stable group of w1 and w2, then a new target epoch (connector B added) in which
    w1 keeps what it runs and w2 gets B; returns w1's view from before."""
    ctx = joined("w1")
    settle(ctx, "w1")
    ctx.join(G, "w2")
    settle(ctx, "w1", "w2")
    view = ctx.member_view(G, "w1")
    keep = wire_units(view.assigned)
    ctx.put_connector(G, "B", 0)
    response = ctx.heartbeat(G, "w1", view.member_epoch)
    assert response.error_code == ErrorCode.COMPUTE_ASSIGNMENT
    ctx.compute_and_install(G, "w1", response.member_epoch,
                            lambda p: {"w1": keep, "w2": units("B")})
    return ctx, view


def test_assignment_is_sent_when_it_changed_not_with_every_new_epoch() -> None:
    """A worker moved to a new target epoch with the units it runs is told
    the epoch only; one that is given other units is told them."""
    ctx, view = new_target_where_w1_keeps_its_units()
    response = ctx.heartbeat(G, "w1", view.member_epoch)
    assert response.error_code == ErrorCode.NONE
    assert response.member_epoch > view.member_epoch
    assert response.assignment is None  # same units: the new epoch is all it needs
    assert ctx.member_view(G, "w1").member_epoch == response.member_epoch
    # w2 gives up its part of A, then is given B: told each time.
    w2 = ctx.member_view(G, "w2")
    response = ctx.heartbeat(G, "w2", w2.member_epoch, owned=wire_units(w2.assigned))
    assert response.assignment is not None
    assert wire_units(response.assignment.assigned) == frozenset()
    response = ctx.heartbeat(G, "w2", response.member_epoch, owned=frozenset())
    assert response.assignment is not None
    assert wire_units(response.assignment.assigned) == units("B")
    # A stable heartbeat at the new epoch: nothing to tell.
    epoch = ctx.member_view(G, "w1").member_epoch
    assert ctx.heartbeat(G, "w1", epoch).assignment is None


def test_a_member_moved_to_a_new_epoch_with_its_units_converts_none(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """After each new target epoch every member moves to it, most with the units they
    run: the record written for that reuses the wire form of the member's units, and its
    replay the set they stand for (no conversion either way)."""
    ctx, view = new_target_where_w1_keeps_its_units()
    member = ctx.core.store.groups[G].members["w1"]
    held = member.current.assigned
    conversions: list[str] = []
    for name in ("_convert", "units_from_record"):
        real = getattr(group_module, name)
        monkeypatch.setattr(group_module, name,
                            lambda value, real=real, name=name: conversions.append(name)
                            or real(value))
    written = len(ctx.log)
    response = ctx.heartbeat(G, "w1", view.member_epoch)
    assert response.error_code == ErrorCode.NONE and response.member_epoch > view.member_epoch
    assert len(ctx.log) > written  # its current assignment at the new epoch
    assert member.current.epoch == response.member_epoch
    assert member.current.assigned is held
    assert conversions == []


def test_compute_assignment_is_a_complete_response() -> None:
    ctx = joined()
    response = ctx.join(G, "w1")
    assert response.error_code == ErrorCode.COMPUTE_ASSIGNMENT
    assert response.error_message
    assert response.member_epoch == 1
    assert response.heartbeat_interval_ms == 3_000
    assert response.assignment is not None


def test_prepare_rules() -> None:
    ctx = joined("w1", "w2")
    assert ctx.prepare("", "w1", 1).error_code == ErrorCode.INVALID_REQUEST
    assert ctx.prepare(G, "", 1).error_code == ErrorCode.INVALID_REQUEST
    assert ctx.prepare(G, "w1", -1).error_code == ErrorCode.INVALID_REQUEST
    assert ctx.prepare("nope", "w1", 1).error_code == ErrorCode.GROUP_ID_NOT_FOUND
    assert ctx.prepare(G, "nobody", 1).error_code == ErrorCode.UNKNOWN_MEMBER_ID
    assert ctx.prepare(G, "w1", 7).error_code == ErrorCode.FENCED_MEMBER_EPOCH
    response = ctx.prepare(G, "w2", 1)  # w2 is not the chosen worker
    assert response.error_code == ErrorCode.UNKNOWN_MEMBER_ID
    assert "not the worker chosen" in response.error_message
    assert ctx.prepare(G, "w1", 1).error_code == ErrorCode.NONE


def test_install_validation_against_prepared_metadata() -> None:
    ctx = joined("w1", "w2")
    prepared = ctx.prepare(G, "w1", 1)
    epoch = prepared.group_epoch
    cases = [
        ({"w1": units("A", "Z")}, "which the group does not run"),
        ({"w1": units("A"), "w2": units("A")}, "more than one member"),
        ({"w1": units("A"), "w9": units()}, "was not in the group"),
    ]
    for assignment, message in cases:
        before = len(ctx.log)
        response = ctx.install(G, "w1", 1, epoch, assignment)
        assert response.error_code == ErrorCode.INVALID_ASSIGNMENT
        assert message in response.error_message
        assert len(ctx.log) == before
    response = ctx.install(G, "w1", 1, epoch + 5, {"w1": units("A")})
    assert response.error_code == ErrorCode.INVALID_ASSIGNMENT
    assert ctx.install(G, "w2", 1, epoch, {}).error_code == ErrorCode.UNKNOWN_MEMBER_ID
    # Units left out stay unassigned on purpose and are shown as such.
    assert ctx.install(G, "w1", 1, epoch, {"w1": units("A")}).error_code == ErrorCode.NONE
    assert ctx.core.unassigned_units(G) == units("A-0", "A-1")


def test_install_error_keeps_target_and_reports_it() -> None:
    ctx = joined("w1")
    settle(ctx, "w1")
    target = ctx.member_view(G, "w1").target
    ctx.put_connector(G, "B", 1)
    response = ctx.heartbeat(G, "w1", ctx.member_view(G, "w1").member_epoch)
    assert response.error_code == ErrorCode.COMPUTE_ASSIGNMENT
    prepared = ctx.prepare(G, "w1", response.member_epoch)
    response = ctx.install(G, "w1", response.member_epoch, prepared.group_epoch, {}, error=3)
    assert response.error_code == ErrorCode.NONE
    assert ctx.member_view(G, "w1").target == target
    response = ctx.heartbeat(G, "w1", ctx.member_view(G, "w1").member_epoch)
    assert response.assignment is not None and response.assignment.error == 3


def test_unsupported_assignor() -> None:
    ctx = joined()
    response = ctx.join(G, "w1", server_assignor="no-such")
    assert response.error_code == ErrorCode.UNSUPPORTED_ASSIGNOR
    assert ctx.join(G, "w1", assignors=[client_assignor(low=1, high=2)]).error_code \
        == ErrorCode.COMPUTE_ASSIGNMENT
    assert ctx.join(G, "w2", assignors=[client_assignor(low=0, high=1, version=1)]).error_code \
        == ErrorCode.UNSUPPORTED_ASSIGNOR
    # A worker whose range covers both would make it work; it becomes the chosen worker.
    assert ctx.join(G, "w3", assignors=[client_assignor(low=0, high=3)]).error_code \
        == ErrorCode.COMPUTE_ASSIGNMENT
    assert ctx.core.store.groups[G].chosen_member == "w3"
    assert ctx.join(G, "w2", assignors=[client_assignor(low=0, high=1, version=1)]).error_code \
        == ErrorCode.NONE


def test_worker_selection_by_version_cover_and_stickiness() -> None:
    ctx = joined()
    ctx.join(G, "a", assignors=[client_assignor(low=1, high=5)])
    ctx.join(G, "b", assignors=[client_assignor(low=3, high=4)])
    ctx.join(G, "c", assignors=[client_assignor(low=2, high=4)])
    assert ctx.core.store.groups[G].chosen_member == "a"
    ctx.join(G, "0", assignors=[client_assignor(low=1, high=5)])
    assert ctx.core.store.groups[G].chosen_member == "a"  # kept while it qualifies


def test_chosen_worker_timeout_picks_another() -> None:
    ctx = joined("w1", "w2")
    assert ctx.core.store.groups[G].chosen_member == "w1"
    assert (ASSIGNOR_TIMER, G, "") in ctx.timers
    for _ in range(11):  # w1 never computes; both keep their sessions alive
        ctx.advance(3_000)
        ctx.heartbeat(G, "w1", 1)
        ctx.heartbeat(G, "w2", 1)
    assert ctx.core.store.groups[G].chosen_member == "w2"
    assert ctx.heartbeat(G, "w2", 1).error_code == ErrorCode.COMPUTE_ASSIGNMENT


def test_session_timeout_removes_member() -> None:
    ctx = joined("w1", "w2")
    assert (SESSION_TIMER, G, "w1") in ctx.timers
    for _ in range(4):
        ctx.advance(3_000)
        ctx.heartbeat(G, "w2", ctx.member_view(G, "w2").member_epoch)
    assert [m.member_id for m in ctx.describe(G).members] == ["w2"]


def test_revocation_timeout_fences() -> None:
    ctx = joined("w1")
    settle(ctx, "w1")
    ctx.join(G, "w2")
    response = ctx.heartbeat(G, "w1", ctx.member_view(G, "w1").member_epoch)
    ctx.compute_and_install(G, "w1", response.member_epoch,
                            lambda p: {"w1": units("A"), "w2": units("A-0", "A-1")})
    response = ctx.heartbeat(G, "w1", ctx.member_view(G, "w1").member_epoch)
    assert ctx.member_view(G, "w1").member_state == "UNREVOKED"
    assert (REVOCATION_TIMER, G, "w1") in ctx.timers
    members = ctx.core.store.groups[G].members
    for _ in range(11):  # w1 keeps heartbeating but never releases
        ctx.advance(3_000)
        if "w1" not in members:
            break
        ctx.heartbeat(G, "w1", ctx.member_view(G, "w1").member_epoch,
                      owned=units("A", "A-0", "A-1"))
        ctx.heartbeat(G, "w2", ctx.member_view(G, "w2").member_epoch)
    assert "w1" not in ctx.core.store.groups[G].members


def test_a_member_that_rejoins_while_revoking_has_no_revocation_timer_left() -> None:
    """Epoch 0 from a known member drops what it held: it has nothing left to release, so
    its revocation deadline goes, as a coordinator replaying the log would have none."""
    ctx = joined("w1")
    settle(ctx, "w1")
    ctx.join(G, "w2")
    response = ctx.heartbeat(G, "w1", ctx.member_view(G, "w1").member_epoch)
    ctx.compute_and_install(G, "w1", response.member_epoch,
                            lambda p: {"w1": units("A"), "w2": units("A-0", "A-1")})
    ctx.heartbeat(G, "w1", ctx.member_view(G, "w1").member_epoch)
    assert (REVOCATION_TIMER, G, "w1") in ctx.timers
    ctx.join(G, "w1")
    assert ctx.member_view(G, "w1").member_state != "UNREVOKED"
    assert (REVOCATION_TIMER, G, "w1") not in ctx.timers


def test_static_membership() -> None:
    ctx = joined()
    ctx.join(G, "m1", instance_id="i1")
    settle(ctx, "m1")
    epoch = ctx.describe(G).group_epoch
    held = ctx.member_view(G, "m1").assigned
    # The instance id is held by an active member.
    assert ctx.join(G, "m2", instance_id="i1").error_code == ErrorCode.UNRELEASED_INSTANCE_ID
    # A request naming another member's instance id is fenced.
    ctx.join(G, "x", instance_id="i2")
    assert ctx.heartbeat(G, "x", 1, instance_id="i1").error_code == ErrorCode.FENCED_INSTANCE_ID
    ctx.heartbeat(G, "x", -1, instance_id="i2")
    settle(ctx, "m1")
    epoch = ctx.describe(G).group_epoch
    # Temporary leave keeps the assignment, no rebalance.
    epoch_before_leave = ctx.member_view(G, "m1").member_epoch
    held = ctx.member_view(G, "m1").assigned
    response = ctx.heartbeat(G, "m1", -2, instance_id="i1")
    assert response.member_epoch == -2
    assert ctx.describe(G).group_epoch == epoch
    # A new member id with the same instance takes over, no rebalance.
    response = ctx.join(G, "m2", instance_id="i1", worker_url="http://m1:8083")
    assert response.error_code == ErrorCode.NONE
    assert wire_units(response.assignment.assigned) == wire_units(held)
    assert response.member_epoch == epoch_before_leave
    assert ctx.describe(G).group_epoch == epoch
    assert [m.member_id for m in ctx.describe(G).members] == ["m2"]


def test_static_temporary_leave_expires_with_session() -> None:
    ctx = joined()
    ctx.join(G, "m1", instance_id="i1")
    settle(ctx, "m1")
    epoch = ctx.describe(G).group_epoch
    ctx.heartbeat(G, "m1", -2, instance_id="i1")
    ctx.advance(10_001)
    assert ctx.describe(G).members == ()
    assert ctx.describe(G).group_epoch == epoch + 1


def test_batch_removal_of_static_members() -> None:
    ctx = joined()
    ctx.join(G, "m1", instance_id="i1")
    ctx.join(G, "m2", instance_id="i2")
    ctx.join(G, "d", client=True)
    epoch = ctx.describe(G).group_epoch
    result = ctx.apply(ctx.core.remove_static_members(
        G, [("i1", None), ("i2", "wrong"), ("i9", None)], ctx.now))
    codes = [m["error_code"] for m in result["members"]]
    assert codes == [0, ErrorCode.FENCED_INSTANCE_ID, ErrorCode.UNKNOWN_MEMBER_ID]
    assert {m.member_id for m in ctx.describe(G).members} == {"m2", "d"}
    assert ctx.describe(G).group_epoch == epoch + 1


def test_group_max_size() -> None:
    ctx = joined("w1", config=ServerConfig(assignment_interval_ms=0, max_size=1,
                                            server_assignors=("round-robin",)))
    assert ctx.join(G, "w2").error_code == ErrorCode.GROUP_MAX_SIZE_REACHED


def test_epoch_bumps_on_each_trigger() -> None:
    ctx = joined("w1")
    settle(ctx, "w1")

    def bumps(action: Any) -> int:
        before = ctx.describe(G).group_epoch
        action()
        return ctx.describe(G).group_epoch - before

    epoch = lambda: ctx.member_view(G, "w1").member_epoch  # noqa: E731
    assert bumps(lambda: ctx.join(G, "w2")) == 1
    assert bumps(lambda: ctx.heartbeat(G, "w1", epoch(), client_assignors=[
        client_assignor(), client_assignor(name="eager", low=0, high=0)])) == 1
    assert bumps(lambda: ctx.heartbeat(G, "w1", epoch(),
                                       client_assignors=[client_assignor(reason=2)])) == 1
    assert bumps(lambda: ctx.heartbeat(G, "w1", epoch(), client_assignors=[
        client_assignor(reason=2, metadata=b"x")])) == 1
    assert bumps(lambda: ctx.heartbeat(G, "w1", epoch(), rebalance_timeout_ms=5_000)) == 0
    assert bumps(lambda: ctx.put_connector(G, "B", 3)) == 1
    assert bumps(lambda: ctx.put_connector(G, "B", 3)) == 0
    assert bumps(lambda: ctx.put_connector(G, "B", 1)) == 1
    assert bumps(lambda: ctx.apply(ctx.core.delete_connector(G, "B", ctx.now))) == 1
    assert bumps(lambda: ctx.heartbeat(G, "w2", -1)) == 1


def test_groups_empty_delete_and_describe() -> None:
    ctx = joined("w1")
    with pytest.raises(ApiError) as error:
        ctx.core.delete_group(G, ctx.now)
    assert error.value.code == ErrorCode.NON_EMPTY_GROUP
    ctx.heartbeat(G, "w1", -1)
    assert ctx.describe(G).group_state == "EMPTY"
    ctx.apply(ctx.core.delete_group(G, ctx.now))
    described = ctx.describe(G)
    assert described.error_code == ErrorCode.GROUP_ID_NOT_FOUND
    assert described.group_state == "DEAD"
    assert ctx.replayed().group_ids() == []
    with pytest.raises(ApiError):
        ctx.core.describe_group("")


def test_server_side_round_robin_end_to_end() -> None:
    ctx = Context(ServerConfig(assignment_interval_ms=0, server_assignors=("round-robin",)))
    ctx.put_connector(G, "A", 3)
    r1 = ctx.join(G, "w1", server_assignor="round-robin")
    assert r1.error_code == ErrorCode.NONE
    # The run is offloaded: the target is there on the next heartbeat.
    assert r1.member_epoch == 1 and wire_units(r1.assignment.assigned) == frozenset()
    r1 = ctx.heartbeat(G, "w1", 1)
    assert wire_units(r1.assignment.assigned) == units("A", "A-0", "A-1", "A-2")
    ctx.join(G, "w2", server_assignor="round-robin")
    settle(ctx, "w1", "w2")
    held = [wire_units(m.assigned) for m in ctx.describe(G).members]
    assert held[0] | held[1] == units("A", "A-0", "A-1", "A-2")
    assert held[0] and held[1] and not held[0] & held[1]


def test_assignment_interval_batches_runs() -> None:
    ctx = Context(ServerConfig(assignment_interval_ms=1_000, server_assignors=("round-robin",)))
    ctx.put_connector(G, "A", 3)
    ctx.join(G, "w1", server_assignor="round-robin")
    first = ctx.describe(G).assignment_epoch
    ctx.join(G, "w2", server_assignor="round-robin")
    ctx.join(G, "w3", server_assignor="round-robin")
    assert ctx.describe(G).assignment_epoch == first  # within the interval: no run yet
    ctx.advance(1_000)
    runs = [r for r in ctx.log if type(r.key).__name__ == "ConnectGroupTargetAssignmentMetadataKey"]
    assert ctx.describe(G).assignment_epoch == ctx.describe(G).group_epoch
    assert len(runs) == 3  # the group's creation, w1's join, one run for both later joins


def test_rollback_restores_the_state_before_a_change() -> None:
    ctx = joined("w1")
    settle(ctx, "w1")
    before = ctx.core.describe_group(G)
    changes = [ctx.core.heartbeat(_join_request("w2"), ctx.now)]
    changes.append(ctx.core.put_connector(G, "B", 2, ctx.now))
    view = ctx.member_view(G, "w1")
    changes.append(ctx.core.heartbeat(_heartbeat_request("w1", view.member_epoch), ctx.now))
    changes.append(ctx.core.heartbeat(_heartbeat_request("w1", view.member_epoch, leave=True),
                                      ctx.now))
    assert ctx.core.describe_group(G) != before
    for result in reversed(changes):
        ctx.core.rollback(result)
    assert ctx.core.describe_group(G) == before
    assert ctx.core.store.groups[G].owners == {
        unit: "w1" for unit in ctx.core.store.groups[G].members["w1"].current.held}


def _join_request(member: str) -> Any:
    from protocol.messages import ConnectGroupHeartbeatRequest

    return ConnectGroupHeartbeatRequest(
        group_id=G, member_id=member, member_epoch=0, worker_url="http://x",
        rebalance_timeout_ms=1000, client_assignors=(client_assignor(),))


def _heartbeat_request(member: str, epoch: int, leave: bool = False) -> Any:
    from protocol.messages import ConnectGroupHeartbeatRequest

    return ConnectGroupHeartbeatRequest(group_id=G, member_id=member,
                                        member_epoch=-1 if leave else epoch)


class _NoScanDict(dict):  # type: ignore[type-arg]
    """A members map that fails the test if anything walks over it."""

    def _scan(self, *args: Any) -> Any:
        raise AssertionError("a stable heartbeat scanned the group")

    __iter__ = values = items = keys = _scan  # type: ignore[assignment]


def test_stable_heartbeat_never_scans_the_group() -> None:
    ctx = Context(ServerConfig(assignment_interval_ms=0))
    ctx.put_connector(G, "A", 40)
    members = [f"w{i}" for i in range(20)]
    for member in members:
        ctx.join(G, member, server_assignor="balanced")
    for _ in range(3):
        for member in members:
            view = ctx.core.store.groups[G].members[member].current
            ctx.heartbeat(G, member, view.epoch, owned=view.assigned)
    group = ctx.core.store.groups[G]
    assert group.state == "STABLE"
    group.members = _NoScanDict(group.members)
    for member in members:
        current = dict.__getitem__(group.members, member).current
        response = ctx.heartbeat(G, member, current.epoch, owned=current.assigned)
        assert response.error_code == ErrorCode.NONE
        assert ctx.last is not None and ctx.last.records == []
