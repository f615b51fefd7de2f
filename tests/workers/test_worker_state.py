"""The sans-IO worker state machine on hand-made responses."""

from __future__ import annotations

import pytest

from coordinator.units import Unit
from coordinator.workers.assignors import IncrementalCooperativeAssignor, units_to_wire
from coordinator.workers.state import Phase, WorkerConfig, WorkerState
from protocol.errors import ErrorCode
from protocol.messages import (
    ConnectGroupHeartbeatResponse,
    ConnectGroupInstallAssignmentResponse,
    ConnectGroupPrepareAssignmentResponse,
)
from protocol.messages.connect_group_heartbeat_response import Assignment
from protocol.messages.connect_group_prepare_assignment_response import Member, MemberAssignor

from .helpers import units

CONFIG = WorkerConfig(group_id="g", worker_url="http://w1:8083", member_id="w1",
                      rebalance_timeout_ms=30_000, session_timeout_ms=10_000)


def response(epoch: int = 5, error: ErrorCode = ErrorCode.NONE,
             assigned: frozenset[Unit] | None = None,
             interval: int = 3_000) -> ConnectGroupHeartbeatResponse:
    assignment = None
    if assigned is not None:
        assignment = Assignment(error=0, assigned=units_to_wire(assigned), version=1,
                                metadata=b"")
    return ConnectGroupHeartbeatResponse(
        throttle_time_ms=0, error_code=int(error),
        error_message=None if error == ErrorCode.NONE else error.name,
        member_epoch=epoch, heartbeat_interval_ms=interval, assignment=assignment)


def joined(assigned: frozenset[Unit] = frozenset(), now: int = 0) -> WorkerState:
    state = WorkerState(CONFIG, [IncrementalCooperativeAssignor()])
    state.heartbeat_request(now)
    state.on_heartbeat_response(response(epoch=5, assigned=assigned), now)
    return state


def test_join_sends_every_field_then_only_changes() -> None:
    state = WorkerState(CONFIG, [IncrementalCooperativeAssignor()])
    join = state.heartbeat_request(0)
    assert join.member_epoch == 0 and join.member_id == "w1"
    assert join.worker_url == "http://w1:8083" and join.rebalance_timeout_ms == 30_000
    assert join.client_assignors is not None and join.client_assignors[0].name == \
        "incremental-cooperative"
    assert join.owned_connectors_and_tasks is None  # a join may not carry units

    actions = state.on_heartbeat_response(response(epoch=5, assigned=units("A", "A-0")), 0)
    assert actions.start == units("A", "A-0") and not actions.stop
    assert state.phase is Phase.MEMBER and state.member_epoch == 5
    assert state.next_wakeup_ms == 3_000

    # The owned set changed (from the coordinator's empty view after a join): only it goes.
    request = state.heartbeat_request(3_000)
    assert request.member_epoch == 5
    assert (request.worker_url, request.rebalance_timeout_ms, request.client_assignors,
            request.instance_id) == (None, -1, None, None)
    assert request.owned_connectors_and_tasks == units_to_wire(units("A", "A-0"))
    state.on_heartbeat_response(response(epoch=5), 3_000)

    # Nothing changed: a bare heartbeat.
    request = state.heartbeat_request(6_000)
    assert request.owned_connectors_and_tasks is None and request.client_assignors is None


def test_revocation_stops_first_and_acknowledges_at_once() -> None:
    state = joined(units("A", "A-0", "B"))
    state.heartbeat_request(3_000)
    actions = state.on_heartbeat_response(response(epoch=5, assigned=units("A")), 3_000)
    assert actions.stop == units("A-0", "B") and not actions.start
    assert state.owned == units("A")
    assert state.next_wakeup_ms == 3_000  # at once
    request = state.heartbeat_request(3_000)
    assert request.owned_connectors_and_tasks == units_to_wire(units("A"))


def test_errors_make_the_next_heartbeat_send_every_field() -> None:
    state = joined(units("A"))
    state.heartbeat_request(3_000)
    actions = state.on_heartbeat_response(
        response(error=ErrorCode.COORDINATOR_NOT_AVAILABLE), 3_000)
    assert not actions.stop  # units keep running while the session lasts
    assert state.next_wakeup_ms == 3_100  # backoff
    request = state.heartbeat_request(3_100)
    assert request.member_epoch == 5
    assert request.worker_url == CONFIG.worker_url and request.client_assignors is not None
    assert request.owned_connectors_and_tasks == units_to_wire(units("A"))


def test_backoff_grows_and_resets() -> None:
    state = joined()
    waits = []
    now = 0
    for _ in range(8):
        state.heartbeat_request(now)
        state.on_heartbeat_failed(now)
        waits.append(state.next_wakeup_ms - now)
        now = state.next_wakeup_ms
    assert waits == [100, 200, 400, 800, 1_600, 3_200, 5_000, 5_000]
    state.heartbeat_request(now)
    state.on_heartbeat_response(response(), now)
    assert state.retry_backoff_ms() == 0


@pytest.mark.parametrize("error", [ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.FENCED_MEMBER_EPOCH])
def test_fenced_or_unknown_stops_everything_and_rejoins(error: ErrorCode) -> None:
    state = joined(units("A", "B-0"))
    state.heartbeat_request(3_000)
    actions = state.on_heartbeat_response(response(error=error), 3_000)
    assert actions.stop == units("A", "B-0") and state.owned == frozenset()
    assert state.phase is Phase.JOINING
    rejoin = state.heartbeat_request(3_000)
    assert rejoin.member_epoch == 0 and rejoin.member_id == "w1"
    assert rejoin.worker_url is not None and rejoin.rebalance_timeout_ms == 30_000


@pytest.mark.parametrize("error", [ErrorCode.UNSUPPORTED_ASSIGNOR, ErrorCode.INVALID_REQUEST,
                                   ErrorCode.FENCED_INSTANCE_ID])
def test_fatal_errors_stop_everything(error: ErrorCode) -> None:
    state = joined(units("A"))
    state.heartbeat_request(3_000)
    actions = state.on_heartbeat_response(response(error=error), 3_000)
    assert actions.stop == units("A") and actions.fatal is not None
    assert error.name in actions.fatal
    assert state.phase is Phase.FAILED
    with pytest.raises(RuntimeError):
        state.heartbeat_request(3_000)


def test_session_loss_stops_units_before_the_coordinator_could_move_them() -> None:
    state = joined(units("A"), now=1_000)  # sent at 1000: the coordinator saw it later
    assert state.session_deadline_ms == 11_000
    state.heartbeat_request(4_000)
    state.on_heartbeat_failed(4_000)
    assert not state.check_session(10_999).stop
    actions = state.check_session(11_000)
    assert actions.stop == units("A") and state.phase is Phase.JOINING
    assert state.session_deadline_ms is None


def test_an_answer_to_a_request_from_before_the_session_was_lost_is_ignored() -> None:
    state = joined(units("A"))
    state.heartbeat_request(9_000)  # in flight when the session ends
    state.check_session(10_000)
    actions = state.on_heartbeat_response(response(epoch=5, assigned=units("A", "B")), 10_500)
    assert not actions.start and state.phase is Phase.JOINING


def test_compute_assignment_prepare_and_install() -> None:
    state = joined()
    state.heartbeat_request(3_000)
    actions = state.on_heartbeat_response(response(error=ErrorCode.COMPUTE_ASSIGNMENT), 3_000)
    assert actions.compute_assignment and state.compute_due
    prepare = state.prepare_request()
    assert (prepare.member_id, prepare.member_epoch) == ("w1", 5)
    assert not state.compute_due
    prepared = ConnectGroupPrepareAssignmentResponse(
        throttle_time_ms=0, error_code=0, group_epoch=7, assignor_name="incremental-cooperative",
        connectors_and_tasks=units_to_wire(units("A", "A-0")),
        members=(Member(member_id="w1", member_epoch=5, worker_url="http://w1:8083",
                        assignor=MemberAssignor(version=2, reason=0, metadata=b""),
                        target=units_to_wire(frozenset())),))
    install = state.on_prepare_response(prepared, 3_000)
    assert install is not None
    assert (install.group_epoch, install.member_epoch, install.error) == (7, 5, 0)
    assert [m.member_id for m in install.members] == ["w1"]
    state.on_install_response(ConnectGroupInstallAssignmentResponse(throttle_time_ms=0,
                                                                    error_code=0))
    assert state.assignors[0].memory.known["w1"][1] == units("A", "A-0")


def test_fenced_prepare_retries_after_the_next_heartbeat() -> None:
    state = joined()
    state.heartbeat_request(3_000)
    state.on_heartbeat_response(response(error=ErrorCode.COMPUTE_ASSIGNMENT), 3_000)
    state.prepare_request()
    fenced = ConnectGroupPrepareAssignmentResponse(
        throttle_time_ms=0, error_code=int(ErrorCode.FENCED_MEMBER_EPOCH), group_epoch=-1,
        assignor_name="", connectors_and_tasks=units_to_wire(frozenset()), members=())
    assert state.on_prepare_response(fenced, 3_000) is None
    assert not state.compute_due
    state.heartbeat_request(6_000)
    actions = state.on_heartbeat_response(response(epoch=6), 6_000)
    assert actions.compute_assignment


def test_other_prepare_errors_give_up_the_round() -> None:
    state = joined()
    state.heartbeat_request(3_000)
    state.on_heartbeat_response(response(error=ErrorCode.COMPUTE_ASSIGNMENT), 3_000)
    state.prepare_request()
    unknown = ConnectGroupPrepareAssignmentResponse(
        throttle_time_ms=0, error_code=int(ErrorCode.UNKNOWN_MEMBER_ID), group_epoch=-1,
        assignor_name="", connectors_and_tasks=units_to_wire(frozenset()), members=())
    assert state.on_prepare_response(unknown, 3_000) is None
    state.heartbeat_request(6_000)
    assert not state.on_heartbeat_response(response(), 6_000).compute_assignment


def test_leave_requests() -> None:
    state = joined(units("A"))
    with pytest.raises(RuntimeError):
        state.leave_request()  # units first
    assert state.stop_all() == units("A")
    leave = state.leave_request()
    assert leave is not None and leave.member_epoch == -1

    static = WorkerState(WorkerConfig(group_id="g", worker_url="u", member_id="m",
                                      instance_id="i-1"))
    join = static.heartbeat_request(0)
    assert join.instance_id == "i-1" and join.client_assignors is None
    static.on_heartbeat_response(response(), 0)
    leave = static.leave_request()
    assert leave is not None and (leave.member_epoch, leave.instance_id) == (-2, "i-1")

    never_joined = WorkerState(CONFIG)
    assert never_joined.leave_request() is None


def test_server_assignor_and_client_assignors_are_exclusive() -> None:
    with pytest.raises(ValueError):
        WorkerState(WorkerConfig(group_id="g", worker_url="u", server_assignor="balanced"),
                    [IncrementalCooperativeAssignor()])
    state = WorkerState(WorkerConfig(group_id="g", worker_url="u", server_assignor="balanced"))
    join = state.heartbeat_request(0)
    assert join.server_assignor == "balanced" and join.client_assignors is None


def test_member_ids_default_to_distinct_uuids() -> None:
    first = WorkerConfig(group_id="g", worker_url="u")
    second = WorkerConfig(group_id="g", worker_url="u")
    assert first.member_id != second.member_id and len(first.member_id) == 36


def test_the_assignor_deadline_wakes_the_worker_to_ask_for_a_rebalance() -> None:
    assignor = IncrementalCooperativeAssignor(5_000)
    state = WorkerState(CONFIG, [assignor])
    state.heartbeat_request(0)
    state.on_heartbeat_response(response(), 0)
    state.heartbeat_request(0)
    state.on_heartbeat_response(response(), 0)
    assignor.memory = assignor.memory.__class__(departed={"http://x": units("B")},
                                                deadline_ms=1_000)
    assert state.next_wakeup_ms == 1_000
    request = state.heartbeat_request(1_000)
    assert request.client_assignors is not None and request.client_assignors[0].reason == 1
    state.on_heartbeat_response(response(), 1_000)
    assert state.next_wakeup_ms == 4_000


def test_a_rebalance_timeout_below_the_session_timeout() -> None:
    config = WorkerConfig(group_id="g", worker_url="u", member_id="m",
                          rebalance_timeout_ms=2_000, session_timeout_ms=10_000)
    state = WorkerState(config)
    state.heartbeat_request(500)
    state.on_heartbeat_response(response(assigned=units("A", "B")), 600)
    # While heartbeats are answered only the session timeout counts.
    assert state.session_deadline_ms == 10_500
    # An unanswered request may have carried a revocation: the rebalance timeout runs.
    state.heartbeat_request(3_600)
    state.on_heartbeat_failed(3_700)
    state.heartbeat_request(3_800)
    state.on_heartbeat_failed(3_900)
    assert state.session_deadline_ms == 5_600
    state.heartbeat_request(4_000)
    state.on_heartbeat_response(response(), 4_100)
    assert state.session_deadline_ms == 14_000
    # A revocation runs it until an answered heartbeat has carried the acknowledgement.
    state.heartbeat_request(7_000)
    state.on_heartbeat_response(response(assigned=units("A")), 7_100)
    assert state.session_deadline_ms == 9_000
    state.heartbeat_request(7_100)
    state.on_heartbeat_response(response(), 7_200)
    assert state.session_deadline_ms == 17_100
