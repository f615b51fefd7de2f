"""A Connect worker's side of the protocol, sans-IO: responses in, requests and actions out.

:class:`WorkerState` knows nothing of sockets or clocks: the caller passes ``now_ms`` and
carries out the :class:`Actions` it gets back. The rules (docs/protocol.md, "Heartbeats",
"Reconciliation" and "Errors"):

* Join with epoch 0 and every field; afterwards send only the fields that changed since
  the last heartbeat the coordinator answered, and every field again after any error.
* Reconcile like a Connect worker: the response's ``Assignment`` is the full set the worker
  may run. Units no longer in it are stopped first; the caller must finish stopping them
  before it sends anything else, and the next heartbeat goes out at once to acknowledge.
  Newly assigned units are started.
* UNKNOWN_MEMBER_ID / FENCED_MEMBER_EPOCH: stop everything and rejoin (same id, epoch 0).
* COORDINATOR_LOAD_IN_PROGRESS / COORDINATOR_NOT_AVAILABLE / NOT_COORDINATOR, transport
  failures: retry with exponential backoff; units keep running until the session is lost.
* No successful heartbeat for the session timeout (or the rebalance timeout, if shorter):
  stop everything on our own (the coordinator will have removed or fenced us and may give
  our units to someone else) and rejoin.
* COMPUTE_ASSIGNMENT: Prepare, run the assignor, Install. FENCED_MEMBER_EPOCH from either
  means "retry after the next heartbeat"; any other error gives up this round.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from coordinator.connect_protocol import (
    ConnectAssignment,
    ConnectProtocolError,
    decode_assignment,
)
from coordinator.units import Unit
from coordinator.workers.assignors import (
    ASSIGNMENT_FAILED,
    AssignmentPlan,
    ClientSideAssignor,
    GroupView,
    Leader,
    units_from_wire,
    units_to_wire,
)
from protocol.errors import ErrorCode
from protocol.messages import (
    ConnectGroupHeartbeatRequest,
    ConnectGroupHeartbeatResponse,
    ConnectGroupInstallAssignmentRequest,
    ConnectGroupInstallAssignmentResponse,
    ConnectGroupPrepareAssignmentRequest,
    ConnectGroupPrepareAssignmentResponse,
)

JOIN_EPOCH = 0
LEAVE_EPOCH = -1
STATIC_LEAVE_EPOCH = -2
DEFAULT_HEARTBEAT_INTERVAL_MS = 3_000
EMPTY: frozenset[Unit] = frozenset()

RETRIABLE = frozenset({
    ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
    ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_COORDINATOR,
    ErrorCode.UNKNOWN_SERVER_ERROR,
    # The instance id's previous holder has not left yet; it will, or its session ends.
    ErrorCode.UNRELEASED_INSTANCE_ID,
})
REJOIN = frozenset({ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.FENCED_MEMBER_EPOCH})


class Phase(enum.Enum):
    JOINING = "joining"  # the next heartbeat joins (epoch 0)
    MEMBER = "member"
    LEFT = "left"
    FAILED = "failed"  # a fatal error: the worker gives up


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    group_id: str
    worker_url: str
    member_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    instance_id: str | None = None
    rebalance_timeout_ms: int = 60_000
    # The coordinator does not tell its session timeout; keep this at or below the group's.
    session_timeout_ms: int = 10_000
    server_assignor: str | None = None
    retry_backoff_ms: int = 100
    retry_backoff_max_ms: int = 5_000
    # Heartbeat at this pace instead of the coordinator's HeartbeatIntervalMs (None: obey
    # the coordinator). For load generators such as `bench heartbeats`; 0: back to back.
    heartbeat_interval_override_ms: int | None = None

    def __post_init__(self) -> None:
        if not self.group_id or not self.worker_url or not self.member_id:
            raise ValueError("group_id, worker_url and member_id must be non-empty")
        if self.rebalance_timeout_ms <= 0 or self.session_timeout_ms <= 0:
            raise ValueError("timeouts must be positive")
        override = self.heartbeat_interval_override_ms
        if override is not None and override < 0:
            raise ValueError("heartbeat_interval_override_ms must be >= 0")


@dataclass(frozen=True, slots=True)
class Actions:
    """What the caller must do, in this order: stop, then start, then act on the rest."""

    stop: frozenset[Unit] = EMPTY
    start: frozenset[Unit] = EMPTY
    compute_assignment: bool = False
    fatal: str | None = None


NOTHING = Actions()


@dataclass(slots=True)
class _InFlight:
    sent_ms: int
    generation: int
    fields: dict[str, Any]


class WorkerState:
    """One worker's membership, epoch, running units and what the coordinator knows of it."""

    def __init__(self, config: WorkerConfig,
                 assignors: Sequence[ClientSideAssignor] = ()) -> None:
        if config.server_assignor is not None and assignors:
            raise ValueError("a worker offers a server assignor or client assignors, not both")
        self.config = config
        self.assignors = list(assignors)
        self.phase = Phase.JOINING
        self.member_epoch = JOIN_EPOCH
        self.owned: frozenset[Unit] = EMPTY  # the units this worker runs now
        self.heartbeat_interval_ms = DEFAULT_HEARTBEAT_INTERVAL_MS
        self.assignment_error = 0
        self.assignment_version = 0
        self.assignment_metadata = b""
        self.last_error: tuple[ErrorCode | int, str | None] | None = None
        self._acked: dict[str, Any] = {}  # the field values the coordinator has
        self._full = True  # send every field in the next heartbeat
        self._generation = 0  # bumped whenever we drop our membership; stale answers are ignored
        self._in_flight: _InFlight | None = None
        self._last_success_sent_ms: int | None = None
        self._revocation_sent_ms: int | None = None  # a revocation not yet acknowledged
        self._first_unanswered_sent_ms: int | None = None
        self._next_heartbeat_ms = 0
        self._failures = 0
        self._compute_due = False
        self._retry_compute = False
        self._plan: tuple[ClientSideAssignor, AssignmentPlan] | None = None

    # ------------------------------------------------------------------ views
    @property
    def member_id(self) -> str:
        return self.config.member_id

    @property
    def next_wakeup_ms(self) -> int:
        """When the next heartbeat should go out (early if an assignor wants to ask for
        a rebalance)."""
        wake = self._next_heartbeat_ms
        if self.phase is Phase.MEMBER:
            for assignor in self.assignors:
                at = assignor.wake_at_ms()
                if at is not None:
                    wake = min(wake, at)
        return wake

    @property
    def session_deadline_ms(self) -> int | None:
        """When the units must be stopped if no heartbeat succeeds before then.

        Deadlines count from when a request was sent, never later than when the coordinator
        saw it. Besides the session timeout: the coordinator fences a member that has not
        acknowledged a revocation within its rebalance timeout, and then frees all its
        units. So the rebalance timeout also runs from a revocation whose acknowledgement
        has not been answered yet, and from the first unanswered request (its lost answer
        may have carried a revocation).
        """
        if self.phase is not Phase.MEMBER or self._last_success_sent_ms is None:
            return None
        config = self.config
        deadline = self._last_success_sent_ms + config.session_timeout_ms
        for since in (self._revocation_sent_ms, self._first_unanswered_sent_ms):
            if since is not None:
                deadline = min(deadline, since + config.rebalance_timeout_ms)
        return deadline

    @property
    def compute_due(self) -> bool:
        return self._compute_due and self.phase is Phase.MEMBER

    @property
    def connect_assignment(self) -> ConnectAssignment | None:
        """The Connect assignment metadata the coordinator last sent (None if unreadable)."""
        if not self.assignment_metadata:
            return None
        try:
            return decode_assignment(self.assignment_metadata)
        except ConnectProtocolError:
            return None

    def retry_backoff_ms(self) -> int:
        """The wait before retrying after `failures` consecutive failures."""
        if self._failures == 0:
            return 0
        backoff = self.config.retry_backoff_ms * 2 ** min(self._failures - 1, 20)
        return int(min(backoff, self.config.retry_backoff_max_ms))

    # ------------------------------------------------------------------ heartbeat
    def _desired(self, now_ms: int) -> dict[str, Any]:
        config = self.config
        client = None
        if self.assignors:
            client = tuple(a.advertised(config.worker_url, now_ms) for a in self.assignors)
        return {
            "instance_id": config.instance_id,
            "worker_url": config.worker_url,
            "rebalance_timeout_ms": config.rebalance_timeout_ms,
            "server_assignor": config.server_assignor,
            "client_assignors": client,
            "owned": self.owned,
        }

    def heartbeat_request(self, now_ms: int) -> ConnectGroupHeartbeatRequest:
        if self.phase in (Phase.LEFT, Phase.FAILED):
            raise RuntimeError(f"the worker has {self.phase.value}; it sends no heartbeats")
        desired = self._desired(now_ms)
        joining = self.phase is Phase.JOINING
        if joining:
            desired["owned"] = EMPTY  # a join may not carry units (and we run none)
        send = {name: value for name, value in desired.items()
                if joining or self._full or self._acked.get(name, object()) != value}
        self._in_flight = _InFlight(now_ms, self._generation, desired)
        owned = send.get("owned")
        return ConnectGroupHeartbeatRequest(
            group_id=self.config.group_id,
            member_id=self.member_id,
            member_epoch=JOIN_EPOCH if joining else self.member_epoch,
            instance_id=send.get("instance_id"),
            worker_url=send.get("worker_url"),
            rebalance_timeout_ms=send.get("rebalance_timeout_ms", -1),
            server_assignor=send.get("server_assignor"),
            client_assignors=send.get("client_assignors"),
            owned_connectors_and_tasks=None if joining or owned is None
            else units_to_wire(owned),
        )

    def on_heartbeat_response(self, response: ConnectGroupHeartbeatResponse,
                              now_ms: int) -> Actions:
        in_flight, self._in_flight = self._in_flight, None
        if in_flight is None or in_flight.generation != self._generation \
                or self.phase in (Phase.LEFT, Phase.FAILED):
            return NOTHING  # an answer to a request from before we dropped our membership
        code = _code(response.error_code)
        if code in (ErrorCode.NONE, ErrorCode.COMPUTE_ASSIGNMENT):
            return self._accepted(response, code, in_flight, now_ms)
        self.last_error = (code, response.error_message)
        self._full = True
        if code in REJOIN:
            return self._drop_membership(now_ms, rejoin_at_ms=now_ms)
        if code in RETRIABLE:
            self._failures += 1
            self._next_heartbeat_ms = now_ms + self.retry_backoff_ms()
            return NOTHING
        stop = self.owned
        self._give_up()
        return Actions(stop=stop, fatal=f"{_name(code)}: {response.error_message}")

    def _accepted(self, response: ConnectGroupHeartbeatResponse, code: ErrorCode | int,
                  in_flight: _InFlight, now_ms: int) -> Actions:
        self.phase = Phase.MEMBER
        self.member_epoch = response.member_epoch
        if self.config.heartbeat_interval_override_ms is not None:
            self.heartbeat_interval_ms = self.config.heartbeat_interval_override_ms
        elif response.heartbeat_interval_ms > 0:
            self.heartbeat_interval_ms = response.heartbeat_interval_ms
        self._acked = dict(in_flight.fields)
        self._full = False
        self._failures = 0
        self._last_success_sent_ms = in_flight.sent_ms
        self._first_unanswered_sent_ms = None
        self._revocation_sent_ms = None  # this request carried our acknowledgement, if any
        self.last_error = None
        stop = start = EMPTY
        assignment = response.assignment
        if assignment is not None:
            assigned = units_from_wire(assignment.assigned)
            stop = self.owned - assigned
            start = assigned - self.owned
            self.owned = assigned
            if stop:
                self._revocation_sent_ms = in_flight.sent_ms
            self.assignment_error = assignment.error
            self.assignment_version = assignment.version
            self.assignment_metadata = assignment.metadata
        # After a revocation, acknowledge at once (docs/protocol.md, "Reconciliation" 2).
        self._next_heartbeat_ms = now_ms if stop else now_ms + self.heartbeat_interval_ms
        compute = code == ErrorCode.COMPUTE_ASSIGNMENT or self._retry_compute
        self._retry_compute = False
        self._compute_due = compute
        return Actions(stop=stop, start=start, compute_assignment=compute)

    def on_heartbeat_failed(self, now_ms: int) -> Actions:
        """The heartbeat got no answer (connection lost, timed out): retry with backoff."""
        in_flight, self._in_flight = self._in_flight, None
        if in_flight is not None and self._first_unanswered_sent_ms is None:
            self._first_unanswered_sent_ms = in_flight.sent_ms
        self._full = True
        self._failures += 1
        self._next_heartbeat_ms = now_ms + self.retry_backoff_ms()
        return NOTHING

    def check_session(self, now_ms: int) -> Actions:
        """Stop everything if no heartbeat succeeded within the session timeout."""
        deadline = self.session_deadline_ms
        if deadline is None or now_ms < deadline:
            return NOTHING
        self.last_error = (ErrorCode.NONE, "no successful heartbeat within the session "
                                           "(or rebalance) timeout")
        return self._drop_membership(now_ms, rejoin_at_ms=self._next_heartbeat_ms)

    def _drop_membership(self, now_ms: int, rejoin_at_ms: int) -> Actions:
        stop = self.owned
        self.owned = EMPTY
        self.phase = Phase.JOINING
        self.member_epoch = JOIN_EPOCH
        self._generation += 1
        self._in_flight = None
        self._full = True
        self._acked = {}
        self._last_success_sent_ms = None
        self._revocation_sent_ms = self._first_unanswered_sent_ms = None
        self._compute_due = self._retry_compute = False
        self._plan = None
        self._next_heartbeat_ms = max(now_ms, rejoin_at_ms)
        return Actions(stop=stop)

    def _give_up(self) -> None:
        self.owned = EMPTY
        self.phase = Phase.FAILED
        self._generation += 1
        self._compute_due = self._retry_compute = False

    # ------------------------------------------------------------------ leaving
    def leave_request(self) -> ConnectGroupHeartbeatRequest | None:
        """The leave heartbeat, once the caller stopped every unit (None if not a member).

        A static member leaves temporarily (-2): the coordinator keeps its assignment for
        the session timeout, so a restart with the same instance id takes it over.
        """
        if self.owned:
            raise RuntimeError("stop every unit before leaving the group")
        was_member = self.phase is Phase.MEMBER
        self.phase = Phase.LEFT
        self._generation += 1
        if not was_member:
            return None
        static = self.config.instance_id is not None
        return ConnectGroupHeartbeatRequest(
            group_id=self.config.group_id, member_id=self.member_id,
            member_epoch=STATIC_LEAVE_EPOCH if static else LEAVE_EPOCH,
            instance_id=self.config.instance_id)

    def stop_all(self) -> frozenset[Unit]:
        """For shutting down: every unit to stop (they count as stopped from now on)."""
        stop, self.owned = self.owned, EMPTY
        return stop

    # ------------------------------------------------------------------ client-side assignment
    def prepare_request(self) -> ConnectGroupPrepareAssignmentRequest:
        self._compute_due = False
        return ConnectGroupPrepareAssignmentRequest(
            group_id=self.config.group_id, member_id=self.member_id,
            member_epoch=self.member_epoch)

    def on_prepare_response(self, response: ConnectGroupPrepareAssignmentResponse,
                            now_ms: int) -> ConnectGroupInstallAssignmentRequest | None:
        """The Install request to send, or None when this round is over."""
        code = _code(response.error_code)
        if code != ErrorCode.NONE:
            self.last_error = (code, response.error_message)
            # The protocol: FENCED_MEMBER_EPOCH means retry with the epoch of the next heartbeat.
            self._retry_compute = code == ErrorCode.FENCED_MEMBER_EPOCH
            return None
        view = GroupView.from_prepare(response)
        assignor = next((a for a in self.assignors if a.name == view.assignor_name), None)
        leader = Leader(self.member_id, self.config.worker_url)
        if assignor is None:
            plan = AssignmentPlan(view.group_epoch, {}, error=ASSIGNMENT_FAILED)
        else:
            try:
                plan = assignor.assign(view, now_ms, leader)
            except Exception:  # the assignor failed: report it, the current target stays
                plan = AssignmentPlan(view.group_epoch, {}, error=ASSIGNMENT_FAILED)
            self._plan = (assignor, plan)
        return plan.install_request(self.config.group_id, self.member_id, self.member_epoch)

    def on_install_response(self, response: ConnectGroupInstallAssignmentResponse) -> None:
        planned, self._plan = self._plan, None
        code = _code(response.error_code)
        if code == ErrorCode.NONE:
            if planned is not None and planned[1].error == 0:
                planned[0].installed(planned[1])
            return
        self.last_error = (code, response.error_message)
        self._retry_compute = code == ErrorCode.FENCED_MEMBER_EPOCH

    def on_assignment_call_failed(self) -> None:
        """Prepare or Install got no answer: give up this round; the coordinator asks again."""
        self._plan = None


def _code(value: int) -> ErrorCode | int:
    try:
        return ErrorCode(value)
    except ValueError:
        return value


def _name(code: ErrorCode | int) -> str:
    return code.name if isinstance(code, ErrorCode) else f"error {code}"

