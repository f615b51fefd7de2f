"""The sans-IO connect-group coordinator: request + now in; response, records, timers out.

Every state change is a Record, applied at once through `GroupStore.replay` (the same
function that loads the log at start-up) and handed back so the shell can persist it
before answering. Nothing here knows of sockets, clocks or disks.

A heartbeat from a stable member touches only that member: validation, an epoch check,
a session timer, and a reconciliation that returns at once. Work proportional to the group
(assignor selection, target computation) happens only when the group epoch moves.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from coordinator.assignors.api import (
    AssignmentResult,
    AssignmentSpec,
    MemberSpec,
    ServerAssignor,
)
from coordinator.config import ConfigError, GroupConfig, ServerConfig, parse_group_config
from coordinator.core import describe as describing
from coordinator.core.classic import conversion
from coordinator.core.classic.bridge import JOIN_WAIT_TIMER, SYNC_WAIT_TIMER, ClassicBridge
from coordinator.core.classic.engine import CLASSIC_TIMERS, ClassicEngine
from coordinator.core.group import (
    AssignorInfo,
    Group,
    GroupStore,
    Member,
    MemberMetadata,
    PreparedAssignment,
    computed_by,
    configuration_record,
    connectors_record,
    current_assignment_record,
    deadlines_record,
    group_metadata_record,
    group_type_record,
    member_metadata_record,
    resized_connectors_record,
    target_member_record,
    target_metadata_record,
    units_to_wire,
)
from coordinator.core.reconcile import (
    EMPTY,
    EMPTY_TARGET,
    CurrentAssignment,
    MemberState,
    TargetPart,
    reconcile,
)
from coordinator.core.result import (
    ASSIGNMENT_TIMER,
    ASSIGNOR_TIMER,
    CLIENT_MODE,
    EXPIRY_TIMER,
    REVOCATION_TIMER,
    SERVER_MODE,
    SESSION_TIMER,
    TRIGGER_ADMIN_REMOVAL,
    TRIGGER_ASSIGNORS_CHANGED,
    TRIGGER_CONNECTORS_CHANGED,
    TRIGGER_DELAYED_REBALANCE,
    TRIGGER_MEMBER_FENCED,
    TRIGGER_MEMBER_JOINED,
    TRIGGER_MEMBER_LEFT,
    TRIGGER_METADATA_CHANGED,
    TRIGGER_REVOCATION_TIMEOUT,
    TRIGGER_SESSION_TIMEOUT,
    TRIGGER_UNITS_RELEASED,
    AssignorRun,
    CompactResult,
    Event,
    MappingChange,
    Record,
    Result,
    SpecChanges,
    TimerCancel,
    TimerClearGroup,
    TimerKey,
    TimerOp,
    TimerSet,
    expand,
)
from coordinator.core.validation import (
    JOIN_EPOCH,
    LEAVE_EPOCH,
    STATIC_LEAVE_EPOCH,
    CheckedHeartbeat,
    CheckedInstall,
    check_group_count,
    check_group_units,
    invalid,
    validate_assignment_caller,
    validate_heartbeat,
    validate_install,
)
from coordinator.units import Unit
from protocol.errors import ApiError, ErrorCode
from protocol.messages import (
    ConnectGroupDescribeRequest,
    ConnectGroupHeartbeatRequest,
    ConnectGroupHeartbeatResponse,
    ConnectGroupInstallAssignmentRequest,
    ConnectGroupInstallAssignmentResponse,
    ConnectGroupPrepareAssignmentRequest,
    ConnectGroupPrepareAssignmentResponse,
)
from protocol.messages.connect_group_describe_response import DescribedGroup
from protocol.messages.connect_group_heartbeat_response import Assignment
from protocol.messages.connect_group_prepare_assignment_response import Member as PreparedMember
from protocol.messages.connect_group_prepare_assignment_response import MemberAssignor

# The reserved empty target every new group starts with: joiners get epoch 1.
INITIAL_EPOCH = 1

# Why a member was removed -> the trigger of the group epoch bump that follows.
_REMOVAL_TRIGGERS = {
    "leave": TRIGGER_MEMBER_LEFT,
    "fenced": TRIGGER_MEMBER_FENCED,
    "session_timeout": TRIGGER_SESSION_TIMEOUT,
    "revocation_timeout": TRIGGER_REVOCATION_TIMEOUT,
}


@dataclass(slots=True)
class _Change:
    """Collects what one operation emits; records are replayed the moment they are added."""

    store: GroupStore
    records: list[Record] = field(default_factory=list)
    timers: list[TimerOp] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    undo: list[Record] = field(default_factory=list)
    jobs: list[AssignorRun] = field(default_factory=list)
    releases: list[tuple[Any, Any]] = field(default_factory=list)
    # Groups a new-protocol member left in this change (a downgrade may follow).
    connect_member_left: set[str] = field(default_factory=set)

    def write(self, record: Record) -> None:
        self.undo.append(self.store.current_record(record.key))
        self.store.replay(record)
        self.records.append(record)

    def event(self, name: str, group: Group, member_id: str | None = None, **fields: Any) -> None:
        fields.setdefault("group_epoch", group.epoch)
        fields.setdefault("assignment_epoch", group.assignment_epoch)
        fields.setdefault("group_type", "connect")
        if member_id is not None:
            # A member the bridge just added has no bridge record yet: the bridge marks
            # its events itself (ClassicBridge.join).
            bridged = self.store.classic.bridged.get((group.group_id, member_id))
            fields.setdefault("protocol", "connect" if bridged is None else "classic")
            if bridged is not None:
                fields.setdefault("classic_protocol", bridged.protocol_name)
        self.events.append(Event(name, group.group_id, member_id, fields))

    def result(self, response: Any) -> Result[Any]:
        self.undo.reverse()
        return Result(response, self.records, self.timers, self.events, self.undo, self.jobs,
                      self.releases)


def _assignment_changed(before: CurrentAssignment, after: CurrentAssignment) -> bool:
    """Whether a worker told `before` must be told `after` (its units, error, version or
    metadata differ)."""
    return (
        (after.assigned is not before.assigned and after.assigned != before.assigned)
        or after.error != before.error
        or after.version != before.version
        or after.metadata != before.metadata
    )


def _timer(kind: str, group_id: str, member_id: str = "") -> TimerKey:
    return (kind, group_id, member_id)


class InstallCaller(NamedTuple):
    """Who an assignment request says it is from (its first three fields)."""

    group_id: str
    member_id: str
    member_epoch: int


class GroupCoordinator:
    """All connect groups of this coordinator. See the module docstring."""

    def __init__(self, config: ServerConfig, assignors: Mapping[str, ServerAssignor]) -> None:
        missing = [name for name in config.server_assignors if name not in assignors]
        if missing:
            raise ConfigError(
                f"group.connect.server.assignors names unknown assignor(s) {missing}; "
                f"known: {sorted(assignors)}"
            )
        if not config.server_assignors:
            raise ConfigError("group.connect.server.assignors must name at least one assignor")
        self.config = config
        self.assignors = dict(assignors)
        self.store = GroupStore()
        self._run_ids = 0
        # Classic groups: an engine of their own, on the same store and log.
        self.classic = ClassicEngine(config, self.store.classic,
                                     other_type=lambda group_id: group_id in self.store.groups)
        self.classic.bridge = ClassicBridge(self, self.store.classic)
        self.classic.connect_records = self.store  # (replays both types' records)
        self.classic.connect_gives_way = self.gives_way
        self.classic.connect_give_way = self.give_way
        self.classic.classic_joiner_type = self.classic_joiner_type
        self.classic.check_room = self.check_room
        self.classic.forget_settings = self._forget_settings
        self.classic.has_settings = \
            lambda group_id: group_id in self.store.settings or group_id in self.store.types

    # ------------------------------------------------------------------ records
    def replay(self, record: Record) -> None:
        self.store.replay(record)

    def rollback(self, result: Result[Any]) -> None:
        """Undo the records of a change that could not be made durable (newest first).

        Only records are undone here (and the bridged requests the change answered wait
        again: their answers were never sent; one it held is forgotten: the shell answers
        it with the error); the shell then calls `reschedule` for the groups the change
        touched, so that their timers and runs are derived from what is left.
        """
        for record in result.undo:
            self.store.replay(record)
        self.classic.bridge.forget_held(result)
        if result.releases:
            self.classic.bridge.restore_parked(result.releases)

    def timers_after_load(self, now_ms: int) -> list[TimerOp]:
        """After start-up replay: every group's timers, derived from its replayed state."""
        return self.reschedule([*self.store.groups, *self.store.classic.groups], now_ms)

    def reschedule(self, group_ids: Sequence[str], now_ms: int) -> list[TimerOp]:
        """The one rule for scheduling state, after a load and after a rollback alike.

        Each group's transient state (a client-side assignment in progress, the run in
        flight, retry pauses, caches) is dropped, and its timers are those a coordinator
        that had just replayed the log would arm: a session timer per member, a
        revocation timer per member still releasing units, the assignment timer when a
        new target is due or when the assignor asked to run again (a durable deadline).
        A run in flight is abandoned: its result is never applied, and a new run starts
        when the assignment timer fires. The shell cancels the groups' timers first.
        """
        operations: list[TimerOp] = []
        for group_id in group_ids:
            operations.append(TimerClearGroup(group_id))
            group = self.store.groups.get(group_id)
            if group is None:
                continue
            group.forget_transient_state()
            session = self._session_timeout(group)
            for member in group.members.values():
                operations.append(TimerSet(_timer(SESSION_TIMER, group_id, member.member_id),
                                           now_ms + session))
                if member.current.state is MemberState.UNREVOKED:
                    operations.append(TimerSet(
                        _timer(REVOCATION_TIMER, group_id, member.member_id),
                        now_ms + self._rebalance_timeout(member)))
            if group.members and group.epoch > group.assignment_epoch:
                operations.append(TimerSet(_timer(ASSIGNMENT_TIMER, group_id), now_ms))
            elif group.rerun_at_ms is not None:
                operations.append(TimerSet(_timer(ASSIGNMENT_TIMER, group_id),
                                           max(now_ms, group.rerun_at_ms)))
            if group.expire_at_ms is not None:
                operations.append(TimerSet(_timer(EXPIRY_TIMER, group_id),
                                           max(now_ms, group.expire_at_ms)))
        # Classic groups by the same rule: their phase deadlines as recorded, fresh sessions.
        operations.extend(self.classic.timers(now_ms, group_ids))
        operations.extend(self.classic.bridge.wait_timers(group_ids, now_ms))
        return operations

    # ------------------------------------------------------------------ config
    def _session_timeout(self, group: Group) -> int:
        value = group.config.session_timeout_ms
        return value if value > 0 else self.config.session_timeout_ms

    def _heartbeat_interval(self, group: Group) -> int:
        value = group.config.heartbeat_interval_ms
        return value if value > 0 else self.config.heartbeat_interval_ms

    def _assignment_interval(self, group: Group) -> int:
        value = group.config.assignment_interval_ms
        return value if value >= 0 else self.config.assignment_interval_ms

    def _scheduled_delay(self, group: Group) -> int:
        value = group.config.scheduled_rebalance_max_delay_ms
        return value if value >= 0 else self.config.scheduled_rebalance_max_delay_ms

    @staticmethod
    def _rebalance_timeout(member: Member) -> int:
        return member.metadata.rebalance_timeout_ms if member.metadata else 60_000

    # ------------------------------------------------------------------ heartbeat
    def heartbeat(self, request: ConnectGroupHeartbeatRequest, now_ms: int,
                  checked: CheckedHeartbeat | None = None, *,
                  compute_now: bool = False) -> Result[ConnectGroupHeartbeatResponse]:
        """`checked`: `check_heartbeat(request)`, done beforehand off the event loop for a
        large request; the answer is the same with or without it. `compute_now`: a chosen
        worker that must compute a pending assignment is told so even inside the
        assignment interval (a classic leader's JoinGroup: the only moment it can assign
        in its round)."""
        change = _Change(self.store)
        try:
            response = self._heartbeat(request, now_ms, change, checked, compute_now)
            self._maybe_downgrade(change, now_ms)
        except ApiError as error:
            response = ConnectGroupHeartbeatResponse(
                throttle_time_ms=0,
                error_code=int(error.code),
                error_message=error.message,
                member_epoch=0,
                heartbeat_interval_ms=0,
                assignment=None,
            )
        return change.result(response)

    def _heartbeat(
        self, request: Any, now_ms: int, change: _Change,
        checked: CheckedHeartbeat | None = None, compute_now: bool = False,
    ) -> ConnectGroupHeartbeatResponse:
        if checked is not None and checked.request is request:
            owned = checked.owned
        else:
            owned = validate_heartbeat(request)
        epoch = request.member_epoch
        group_id = request.group_id
        member_id = request.member_id
        group = self.store.groups.get(group_id)
        if group is None:
            if epoch != JOIN_EPOCH:
                raise ApiError(
                    ErrorCode.UNKNOWN_MEMBER_ID,
                    f"group {group_id} does not exist, so has no member {member_id}",
                )
            self._check_assignors(None, request, member_id)
            classic = self.store.classic.groups.get(group_id)
            if classic is not None and classic.active():
                # The first new-protocol join to a classic group with members: upgrade.
                group = conversion.upgrade(self, classic, request, change, now_ms)
            else:
                self.check_room(group_id)
                self.classic.give_up_empty(group_id, change)
                group = self._create_group(group_id, change)

        if epoch == LEAVE_EPOCH:
            member = self._existing_member(group, request)
            self._remove_member(group, member.member_id, change, now_ms, reason="leave")
            self._maybe_new_target(group, change, now_ms)
            return self._response(group, None, LEAVE_EPOCH, assignment=None)
        if epoch == STATIC_LEAVE_EPOCH:
            member = self._existing_member(group, request)
            self._leave_temporarily(group, member, change, now_ms)
            return self._response(group, None, STATIC_LEAVE_EPOCH, assignment=None)

        if epoch == JOIN_EPOCH:
            member, joined = self._join(group, request, change, now_ms)
        else:
            member = self._existing_member(group, request)
            self._check_epoch(group, member, epoch, owned, change, now_ms)
            joined = False
            self._update_metadata(group, member, request, change)

        if group.epoch > group.assignment_epoch:
            self._maybe_new_target(group, change, now_ms)

        before = member.current
        self._reconcile(group, member, owned, change, now_ms)
        after = member.current
        change.timers.append(
            TimerSet(
                _timer(SESSION_TIMER, group_id, member.member_id),
                now_ms + self._session_timeout(group),
            )
        )

        # (docs/protocol.md) On join, when it changed, or on request after an error. A new
        # member epoch alone is not a change (every member of a group moves to each new
        # target epoch, most keeping their units); a member that did not hear of the epoch
        # it is at (a lost answer) is told everything again.
        send_assignment = (
            joined
            or request.member_epoch != before.epoch
            or (after is not before and _assignment_changed(before, after))
            or (
                owned is not None
                and (owned != after.assigned or request.rebalance_timeout_ms != -1)
            )
        )
        assignment = None
        if send_assignment:
            part = (
                group.target.get(member.member_id, EMPTY_TARGET)
                if after.epoch == group.assignment_epoch
                else None
            )
            assignment = Assignment(
                error=after.error,
                assigned=member.wire_of(after.assigned),
                version=part.version if part else after.version,
                metadata=part.metadata if part else after.metadata,
            )
        return self._response(group, member, after.epoch, assignment, now_ms, change,
                              compute_now)

    def _response(
        self,
        group: Group,
        member: Member | None,
        member_epoch: int,
        assignment: Assignment | None,
        now_ms: int = 0,
        change: _Change | None = None,
        compute_now: bool = False,
    ) -> ConnectGroupHeartbeatResponse:
        error_code = ErrorCode.NONE
        message = None
        if (
            member is not None
            and change is not None
            and self._should_compute(group, member, now_ms, compute_now)
        ):
            error_code = ErrorCode.COMPUTE_ASSIGNMENT
            message = (
                f"compute the target assignment of group {group.group_id} "
                f"for group epoch {group.epoch}"
            )
            if group.compute_requested_ms is None:
                group.compute_requested_ms = now_ms
                change.timers.append(
                    TimerSet(
                        _timer(ASSIGNOR_TIMER, group.group_id),
                        now_ms + self._rebalance_timeout(member),
                    )
                )
                change.event("compute_assignment_requested", group, member.member_id)
        return ConnectGroupHeartbeatResponse(
            throttle_time_ms=0,
            error_code=int(error_code),
            error_message=message,
            member_epoch=member_epoch,
            heartbeat_interval_ms=self._heartbeat_interval(group),
            assignment=assignment,
        )

    def check_room(self, group_id: str) -> None:
        """Refuses a group `group_id` that would be a new one past
        `group.coordinator.max.groups`: connect and classic groups count together, and a
        group that changes type takes no new place. Called before any record is written."""
        if group_id not in self.store.groups and group_id not in self.store.classic.groups:
            check_group_count(self.group_count(), self.config.max_groups)

    def group_count(self) -> int:
        """Groups of both types."""
        return len(self.store.groups) + len(self.store.classic.groups)

    def _create_group(self, group_id: str, change: _Change) -> Group:
        """(the caller has checked `check_room` before its first record)"""
        change.write(group_metadata_record(group_id, INITIAL_EPOCH))
        change.write(target_metadata_record(group_id, INITIAL_EPOCH, 0, None, -1, b""))
        group = self.store.groups[group_id]
        change.event("group_created", group)
        return group

    def _existing_member(self, group: Group, request: Any) -> Member:
        member = group.members.get(request.member_id)
        if member is None:
            raise ApiError(
                ErrorCode.UNKNOWN_MEMBER_ID,
                f"group {group.group_id} has no member {request.member_id}",
            )
        self._check_instance(group, member.member_id, request.instance_id, member)
        return member

    @staticmethod
    def _check_instance(
        group: Group, member_id: str, instance_id: str | None, member: Member | None
    ) -> None:
        if instance_id is None:
            return
        holder = group.instances.get(instance_id)
        if holder is not None and holder != member_id:
            raise ApiError(
                ErrorCode.FENCED_INSTANCE_ID,
                f"instance id {instance_id} belongs to member {holder}, not {member_id}",
            )
        own = member.metadata.instance_id if member and member.metadata else None
        if member is not None and own is not None and own != instance_id:
            raise ApiError(
                ErrorCode.FENCED_INSTANCE_ID,
                f"member {member_id} joined with instance id {own}, not {instance_id}",
            )

    def _check_epoch(
        self,
        group: Group,
        member: Member,
        epoch: int,
        owned: frozenset[Unit] | None,
        change: _Change,
        now_ms: int,
    ) -> None:
        current = member.current
        if epoch == current.epoch and current.epoch > 0:
            return
        lost_response = (
            current.epoch > 0
            and epoch == current.previous_epoch
            and owned is not None
            and owned <= current.assigned
        )
        if lost_response:
            return
        self._remove_member(
            group, member.member_id, change, now_ms, reason="fenced", sent_epoch=epoch
        )
        self._maybe_new_target(group, change, now_ms)
        raise ApiError(
            ErrorCode.FENCED_MEMBER_EPOCH,
            f"member {member.member_id} sent epoch {epoch} but its epoch is {current.epoch}; "
            "it was removed from the group and must rejoin with epoch 0",
        )

    def _join(
        self, group: Group, request: Any, change: _Change, now_ms: int
    ) -> tuple[Member, bool]:
        member_id = request.member_id
        instance_id = request.instance_id
        existing = group.members.get(member_id)
        self._check_assignors(group, request, member_id)
        if instance_id is not None:
            holder_id = group.instances.get(instance_id)
            if holder_id is not None and holder_id != member_id:
                holder = group.members[holder_id]
                if holder.current.epoch != STATIC_LEAVE_EPOCH:
                    raise ApiError(
                        ErrorCode.UNRELEASED_INSTANCE_ID,
                        f"instance id {instance_id} is still held by active member {holder_id}",
                    )
                return self._replace_static(group, holder, request, change, now_ms), True
            if (
                existing is not None
                and existing.metadata
                and existing.metadata.instance_id not in (None, instance_id)
            ):
                raise ApiError(
                    ErrorCode.FENCED_INSTANCE_ID,
                    f"member {member_id} joined with instance id "
                    f"{existing.metadata.instance_id}, not {instance_id}",
                )
        if existing is not None:
            # Epoch 0 from a known member: it dropped everything and starts again (§5.1).
            dropped = existing.current.held
            if dropped or existing.current.epoch != 0:
                change.write(
                    current_assignment_record(group.group_id, member_id, CurrentAssignment())
                )
                # Nothing left to release: no revocation deadline (as a load derives).
                change.timers.append(
                    TimerCancel(_timer(REVOCATION_TIMER, group.group_id, member_id)))
                self._second_round(group, dropped, change)
            change.event("member_rejoined", group, member_id)
            self._update_metadata(group, existing, request, change)
            return existing, True
        if len(group.members) >= self.config.max_size:
            raise ApiError(
                ErrorCode.GROUP_MAX_SIZE_REACHED,
                f"group {group.group_id} already has the maximum of {self.config.max_size} members",
            )
        metadata = self._metadata_from(None, request)
        change.write(member_metadata_record(group.group_id, member_id, metadata))
        change.write(current_assignment_record(group.group_id, member_id, CurrentAssignment()))
        self._bump(group, change, trigger=TRIGGER_MEMBER_JOINED, member_id=member_id)
        self._note_idleness(group, change, now_ms)
        change.event(
            "member_joined",
            group,
            member_id,
            instance_id=instance_id,
            worker_url=metadata.worker_url,
        )
        return group.members[member_id], True

    def _replace_static(
        self, group: Group, old: Member, request: Any, change: _Change, now_ms: int
    ) -> Member:
        """A new member id takes over a temporarily departed static member, no rebalance."""
        group_id = group.group_id
        new_id = request.member_id
        current = old.current
        part = group.target.get(old.member_id)
        old_metadata = old.metadata
        self._remove_member(group, old.member_id, change, now_ms, reason="replaced", bump=False)
        metadata = self._metadata_from(old_metadata, request)
        change.write(member_metadata_record(group_id, new_id, metadata))
        if part is not None:
            change.write(target_member_record(group_id, new_id, part))
        restored = replace(
            current, epoch=current.previous_epoch, previous_epoch=current.previous_epoch
        )
        change.write(current_assignment_record(group_id, new_id, restored))
        if old_metadata is None or metadata.assignment_inputs_differ(old_metadata):
            self._bump(group, change, trigger=TRIGGER_METADATA_CHANGED, member_id=new_id)
        change.event(
            "static_member_replaced",
            group,
            new_id,
            replaced=old.member_id,
            instance_id=metadata.instance_id,
            member_epoch=restored.epoch,
        )
        return group.members[new_id]

    def _leave_temporarily(
        self, group: Group, member: Member, change: _Change, now_ms: int
    ) -> None:
        current = member.current
        if current.epoch != STATIC_LEAVE_EPOCH:
            change.write(
                current_assignment_record(
                    group.group_id,
                    member.member_id,
                    replace(current, epoch=STATIC_LEAVE_EPOCH, previous_epoch=current.epoch),
                )
            )
        # Its units stay put until the session times out or the instance comes back.
        change.timers.append(
            TimerSet(
                _timer(SESSION_TIMER, group.group_id, member.member_id),
                now_ms + self._session_timeout(group),
            )
        )
        change.timers.append(
            TimerCancel(_timer(REVOCATION_TIMER, group.group_id, member.member_id))
        )
        if group.chosen_member == member.member_id:
            group.chosen_member = None
            group.compute_requested_ms = None
        change.event("member_left_temporarily", group, member.member_id, member_epoch=current.epoch)

    @staticmethod
    def _metadata_from(old: MemberMetadata | None, request: Any) -> MemberMetadata:
        """The member's metadata after this request (unset request fields keep old values)."""
        client = (
            tuple(
                AssignorInfo(
                    a.name, a.minimum_version, a.maximum_version, a.reason, a.version, a.metadata
                )
                for a in request.client_assignors
            )
            if request.client_assignors is not None
            else (old.client_assignors if old else ())
        )
        server = (
            request.server_assignor
            if request.server_assignor is not None
            else (old.server_assignor if old else None)
        )
        if request.client_assignors is not None and request.server_assignor is None:
            server = None  # switching to client-side assignment drops the server choice
        if request.server_assignor is not None:
            client = ()
        return MemberMetadata(
            instance_id=request.instance_id
            if request.instance_id is not None
            else (old.instance_id if old else None),
            worker_url=request.worker_url
            if request.worker_url is not None
            else (old.worker_url if old else ""),
            rebalance_timeout_ms=request.rebalance_timeout_ms
            if request.rebalance_timeout_ms > 0
            else (old.rebalance_timeout_ms if old else 60_000),
            server_assignor=server,
            client_assignors=client,
        )

    def _update_metadata(self, group: Group, member: Member, request: Any, change: _Change) -> None:
        old = member.metadata
        new = self._metadata_from(old, request)
        if new == old:
            return
        if old is not None and (
            new.server_assignor != old.server_assignor
            or new.client_assignors != old.client_assignors
        ):
            self._check_assignors(group, request, member.member_id)
        change.write(member_metadata_record(group.group_id, member.member_id, new))
        if old is None or new.assignment_inputs_differ(old):
            trigger = (
                TRIGGER_ASSIGNORS_CHANGED
                if old and new.worker_url == old.worker_url
                else TRIGGER_METADATA_CHANGED
            )
            self._bump(group, change, trigger=trigger, member_id=member.member_id)

    def _check_assignors(self, group: Group | None, request: Any, member_id: str) -> None:
        """UNSUPPORTED_ASSIGNOR: an unknown server assignor, or client ranges nobody covers."""
        if (
            request.server_assignor is not None
            and request.server_assignor not in self.config.server_assignors
        ):
            raise ApiError(
                ErrorCode.UNSUPPORTED_ASSIGNOR,
                f"server assignor {request.server_assignor!r} is not supported; "
                f"this coordinator offers {list(self.config.server_assignors)}",
            )
        if request.client_assignors is None:
            return
        member = group.members.get(member_id) if group is not None else None
        old = member.metadata if member is not None else None
        new = self._metadata_from(old, request)
        if group is not None and old is not None and old.same_assignor_choice(new):
            # The group's choice and who covers it read nothing else of this member.
            mode, name, covered = self._group_choice(group)
        else:
            metadata = (
                {m.member_id: m.metadata for m in group.members.values()
                 if m.metadata is not None}
                if group
                else {}
            )
            metadata[member_id] = new
            mode, name = self._select_mode(metadata)
            covered = mode != CLIENT_MODE or _covering_members(metadata, name) != []
        if not covered:
            raise ApiError(
                ErrorCode.UNSUPPORTED_ASSIGNOR,
                f"no worker's version range for client assignor {name!r} covers "
                "every member's range",
            )

    def _bump(
        self, group: Group, change: _Change, trigger: str, member_id: str | None = None
    ) -> None:
        change.write(group_metadata_record(group.group_id, group.epoch + 1))
        change.event("group_epoch_bumped", group, member_id, trigger=trigger)

    def _remove_member(
        self,
        group: Group,
        member_id: str,
        change: _Change,
        now_ms: int,
        reason: str,
        bump: bool = True,
        **fields: Any,
    ) -> None:
        group_id = group.group_id
        member = group.members[member_id]
        if (group_id, member_id) not in self.store.classic.bridged:
            change.connect_member_left.add(group_id)
        if member_id in group.target:
            if reason != "replaced":
                group.departed_parts[member_id] = group.target[member_id].units
            change.write(target_member_record(group_id, member_id, None))
        change.write(current_assignment_record(group_id, member_id, None))
        change.write(member_metadata_record(group_id, member_id, None))
        change.timers.append(TimerCancel(_timer(SESSION_TIMER, group_id, member_id)))
        change.timers.append(TimerCancel(_timer(REVOCATION_TIMER, group_id, member_id)))
        if group.chosen_member == member_id:
            group.chosen_member = None
            group.compute_requested_ms = None
            change.timers.append(TimerCancel(_timer(ASSIGNOR_TIMER, group_id)))
        change.event(
            f"member_removed_{reason}",
            group,
            member_id,
            member_epoch=member.current.epoch,
            **fields,
        )
        if bump:
            self._bump(group, change, trigger=_REMOVAL_TRIGGERS[reason], member_id=member_id)
        self._note_idleness(group, change, now_ms)

    def _reconcile(
        self,
        group: Group,
        member: Member,
        owned: frozenset[Unit] | None,
        change: _Change,
        now_ms: int,
    ) -> None:
        before = member.current
        owners = group.owners
        target = group.target.get(member.member_id, EMPTY_TARGET)
        after = reconcile(
            member.member_id,
            before,
            group.assignment_epoch,
            target,
            group.assignment_error,
            owned,
            owners.get,
        )
        if after is before:
            return
        if after.assigned is target.units and target.wire is not None \
                and after.assigned is not before.assigned:
            member.assigned_wire = (target.units, target.wire)  # reached its target: no new form
        change.write(current_assignment_record(group.group_id, member.member_id, after, member))
        self._second_round(group, before.held - after.held, change)
        key = _timer(REVOCATION_TIMER, group.group_id, member.member_id)
        if after.state is MemberState.UNREVOKED:
            if before.state is not MemberState.UNREVOKED:
                change.timers.append(TimerSet(key, now_ms + self._rebalance_timeout(member)))
                change.event(
                    "member_revoking",
                    group,
                    member.member_id,
                    member_epoch=after.epoch,
                    revoking=len(after.pending_revocation),
                )
        elif before.state is MemberState.UNREVOKED:
            change.timers.append(TimerCancel(key))
        if after.epoch != before.epoch:
            change.event(
                "member_reached_epoch",
                group,
                member.member_id,
                member_epoch=after.epoch,
                state=after.state.name,
                assigned=len(after.assigned),
            )

    def _second_round(self, group: Group, released: frozenset[Unit], change: _Change) -> None:
        """Connect's own (classic) leader revokes a unit in one round and hands it out in
        the next, which the revoking worker's rejoin starts; a new-protocol member does not
        rejoin, so its release of units nobody's target names starts that round (the group
        epoch rises). Needed wherever a worker computes the assignment (no one else would
        hand those units out), and in a group that takes its units from its installs,
        which knows a unit only while a target names it or a member holds it."""
        if not released:
            return
        if group.units_source != "installs" and (
                self._group_mode(group)[0] != CLIENT_MODE
                or group.epoch > group.assignment_epoch):  # (the pending round hands them out)
            return
        for part in group.target.values():
            released -= part.units
        for other in group.members.values():
            released -= other.current.held
        if released:
            self._bump(group, change, trigger=TRIGGER_UNITS_RELEASED)

    # ------------------------------------------------------------------ targets
    def _select_mode(self, metadata: Mapping[str, MemberMetadata]) -> tuple[str, str]:
        """Server-side if anyone names one, else a common client assignor (docs/protocol.md)."""
        configured = self.config.server_assignors
        wanted = Counter(m.server_assignor for m in metadata.values() if m.server_assignor)
        if wanted:
            order = {name: index for index, name in enumerate(configured)}
            name = max(wanted, key=lambda n: (wanted[n], -order.get(n, len(order))))
            return SERVER_MODE, name
        lists = [m.client_assignors for m in metadata.values()]
        if lists and all(lists):
            common = set.intersection(*({a.name for a in assignors} for assignors in lists))
            if common:
                # Precedence: the lowest summed position over the members' lists.
                def rank(name: str) -> tuple[int, str]:
                    return (
                        sum(
                            next(i for i, a in enumerate(assignors) if a.name == name)
                            for assignors in lists
                        ),
                        name,
                    )

                return CLIENT_MODE, min(common, key=rank)
        return SERVER_MODE, configured[0]

    def _group_mode(self, group: Group) -> tuple[str, str]:
        mode, name, _covered = self._group_choice(group)
        return mode, name

    def _group_choice(self, group: Group) -> tuple[str, str, bool]:
        """The group's assignment mode and assignor, and whether some member's version
        range for a client assignor covers everyone's: computed over the members once per
        change of their assignor choices (a classic worker's rejoin with a new allocation
        is new metadata, not a new choice: in a group of 1,000 each rejoin would otherwise
        go over every member, three times)."""
        mode, name, covering = self._cached_choice(group)
        return mode, name, mode != CLIENT_MODE or bool(covering)

    def _cached_choice(self, group: Group) -> tuple[str, str, tuple[str, ...]]:
        """`_group_choice`, with the members covering a client assignor's ranges."""
        cached = group.mode_cache
        if cached is not None and cached[0] == group.assignor_changes:
            return cached[1], cached[2], cached[3]
        metadata = {
            m.member_id: m.metadata for m in group.members.values() if m.metadata is not None
        }
        mode, name = self._select_mode(metadata)
        covering = tuple(_covering_members(metadata, name)) if mode == CLIENT_MODE else ()
        group.mode_cache = (group.assignor_changes, mode, name, covering)
        return mode, name, covering

    def lowest_top_version(self, group: Group, assignor: str, default: int) -> int:
        """The lowest of the members' highest versions of client assignor `assignor`
        (`default` for a member that does not list it, and for a group without members):
        worked out once per change of the members' assignor choices, as `_group_choice`."""
        key = (group.assignor_changes, assignor, default)
        cached = group.top_version_cache
        if cached is not None and cached[0] == key:
            return cached[1]
        lowest = min(
            (max((a.maximum_version for a in m.metadata.client_assignors if a.name == assignor),
                 default=default)
             for m in group.members.values() if m.metadata is not None),
            default=default)
        group.top_version_cache = (key, lowest)
        return lowest

    def _interval_left(self, group: Group, now_ms: int) -> int:
        """Milliseconds until the assignment interval allows another run (0: now)."""
        if group.last_assignment_ms < 0:
            return 0
        return max(0, group.last_assignment_ms + self._assignment_interval(group) - now_ms)

    def _maybe_new_target(self, group: Group, change: _Change, now_ms: int) -> None:
        if group.epoch <= group.assignment_epoch or not group.members:
            return
        wait = max(self._interval_left(group, now_ms), group.retry_after_ms - now_ms)
        if wait > 0:
            change.timers.append(TimerSet(_timer(ASSIGNMENT_TIMER, group.group_id), now_ms + wait))
            return
        mode, name = self._group_mode(group)
        if mode == CLIENT_MODE:
            # The choice only needs revisiting when the members changed (a new group epoch).
            if group.chosen_member is None or group.chosen_epoch != group.epoch:
                self._choose_worker(group, name, change, exclude=None)
                group.chosen_epoch = group.epoch
            return
        self._run_server_assignor(group, name, change, now_ms)

    def _choose_worker(
        self, group: Group, assignor: str, change: _Change, exclude: str | None
    ) -> None:
        mode, name, covering = self._cached_choice(group)
        if (mode == CLIENT_MODE and name == assignor
                and all(m.current.epoch != STATIC_LEAVE_EPOCH for m in group.members.values())):
            candidates = list(covering)  # (every epoch bump asks: no need to look again)
        else:
            metadata = {
                m.member_id: m.metadata
                for m in group.members.values()
                if m.metadata is not None and m.current.epoch != STATIC_LEAVE_EPOCH
            }
            candidates = _covering_members(metadata, assignor)
        if exclude is not None and len(candidates) > 1:
            candidates = [c for c in candidates if c != exclude]
        if group.chosen_member in candidates:
            return  # stickiness: the previous chooser keeps the job while it qualifies
        chosen = candidates[0] if candidates else None
        if group.chosen_member is None:
            # (as after a load or a rollback) The worker that computed the current target
            # keeps the job: Connect's assignor forgets its previous assignment when
            # another worker takes it over.
            assigner = computed_by(group)
            if assigner is not None and assigner in candidates:
                chosen = assigner
        if chosen != group.chosen_member:
            group.chosen_member = chosen
            group.compute_requested_ms = None
            change.event("assignor_worker_chosen", group, chosen, assignor=assignor)

    def _should_compute(self, group: Group, member: Member, now_ms: int,
                        now: bool = False) -> bool:
        if group.chosen_member != member.member_id or group.epoch <= group.assignment_epoch:
            return False
        if self._group_mode(group)[0] != CLIENT_MODE:
            return False
        return now or self._interval_left(group, now_ms) == 0

    def _offload(self, group: Group) -> bool:
        override = group.config.assignor_offload_enable
        return self.config.assignor_offload_enable if override is None else override

    @staticmethod
    def _member_specs(group: Group) -> tuple[dict[str, MemberSpec], MappingChange | None]:
        """Every member's spec, in the members' order: the last spec's, or a copy with
        those of members whose metadata or target changed since built again (and those
        who left dropped); and how it differs from the last (None when it was built in
        the members' order instead: the packer then compares every entry)."""
        cache, members, target = group.spec_cache, group.members, group.target
        specs, stale, version = cache.member_specs, cache.stale_members, \
            cache.member_specs_version
        if not stale:  # nobody joined, left or changed since the last run's spec
            return specs, MappingChange(version, version, ())
        fresh: dict[str, MemberSpec] = {}
        for member_id in stale:
            member = members.get(member_id)
            if member is None:
                continue
            metadata = member.metadata
            instance_id = metadata.instance_id if metadata else None
            worker_url = metadata.worker_url if metadata else ""
            units = target.get(member_id, EMPTY_TARGET).units
            spec = specs.get(member_id)
            if (spec is None or spec.current_target is not units
                    or spec.worker_url != worker_url or spec.instance_id != instance_id):
                spec = MemberSpec(member_id, instance_id, worker_url, units)
            fresh[member_id] = spec
        change: MappingChange | None = None
        new_version = cache.next_version()
        if fresh.keys() <= specs.keys() and not cache.rejoined:
            change = MappingChange(version, new_version, tuple(stale))
            gone = [member_id for member_id in stale if member_id not in members]
            specs = {**specs, **fresh}  # (a copy at C speed)
            for member_id in gone:
                specs.pop(member_id, None)
        else:
            # Someone joined (or came back): in the members' order, a run packed whole
            # for a pool process is smaller (547 kB instead of 937 for 1,000 members:
            # neighbours share connectors, and pickle writes a name once).
            specs = {member_id: fresh[member_id] if member_id in fresh else specs[member_id]
                     for member_id in members}
        stale.clear()
        cache.rejoined = False
        cache.member_specs, cache.member_specs_version = specs, new_version
        return specs, change

    @staticmethod
    def _previous_target(group: Group
                         ) -> tuple[Mapping[str, frozenset[Unit]], MappingChange | None]:
        """The group's previous target for a run's spec: the last spec's, or a copy of it
        with the parts replayed since replaced (a resize of a big group's connector then
        goes over none of its members); and how it differs from the last (None when
        built anew)."""
        cache, target = group.spec_cache, group.target
        if group.departed_parts:  # (rare: members left since the last run)
            cache.previous_target = None
            cache.changed_targets.clear()
            return {**group.departed_parts,
                    **{member_id: part.units for member_id, part in target.items()}}, None
        view, changed, version = cache.previous_target, cache.changed_targets, \
            cache.previous_target_version
        change: MappingChange | None = None
        if view is None:
            view = {member_id: part.units for member_id, part in target.items()}
            version = cache.next_version()
        elif changed:
            new_version = cache.next_version()
            change = MappingChange(version, new_version, tuple(changed))
            version = new_version
            view = dict(view)
            for member_id in changed:
                part = target.get(member_id)
                if part is None:
                    view.pop(member_id, None)
                else:
                    view[member_id] = part.units
        else:
            change = MappingChange(version, version, ())
        changed.clear()
        cache.previous_target, cache.previous_target_version = view, version
        return view, change

    @staticmethod
    def _connectors_change(group: Group) -> MappingChange | None:
        """How the group's connectors differ from those the last spec took: the names
        resized since (None when they were replaced some other way, or no spec took
        them yet)."""
        cache = group.spec_cache
        base, resized, version = cache.connectors, cache.resized, cache.connectors_version
        change: MappingChange | None = None
        if base is not None and resized is not None:
            if resized:
                new_version = cache.next_version()
                change = MappingChange(version, new_version, tuple(resized))
                version = new_version
            else:
                change = MappingChange(version, version, ())
        else:
            version = cache.next_version()
        cache.connectors, cache.resized, cache.connectors_version = \
            group.connectors, set(), version
        return change

    def _run_server_assignor(self, group: Group, name: str, change: _Change, now_ms: int) -> None:
        if group.assignor_run is not None:
            return  # at most one run per group in flight; its result triggers the next
        members, members_change = self._member_specs(group)
        previous, previous_change = self._previous_target(group)
        spec = AssignmentSpec(
            group_id=group.group_id,
            members=members,
            connectors=group.connectors,  # replaced, never changed in place, by replay
            previous_target=previous,
            previous_state=group.assignor_state if group.assignor_name == name else b"",
            now_ms=now_ms,
            scheduled_rebalance_max_delay_ms=self._scheduled_delay(group),
        )
        self._run_ids += 1
        run = AssignorRun(self._run_ids, group.group_id, name, group.epoch, now_ms, spec,
                          group.metadata_changes, group.target_changes,
                          SpecChanges(members_change, previous_change,
                                      self._connectors_change(group)))
        if self._offload(group):
            # Offloaded: the run goes to the worker pool; heartbeats go on meanwhile.
            group.assignor_run = run
            change.jobs.append(run)
            change.event("assignor_run_started", group, None, assignor=name, run=run.run_id)
            return
        try:
            result: AssignmentResult | BaseException = self.assignors[name].assign(spec)
        except Exception as error:  # a plug-in assignor must not take the coordinator down
            result = error
        self._apply_run(group, run, result, change, now_ms)

    def complete_assignor_run(
        self,
        run: AssignorRun,
        outcome: AssignmentResult | CompactResult | BaseException,
        now_ms: int,
        verified: bool = False,
    ) -> Result[None]:
        """An offloaded run landed (or failed, or timed out): apply it.

        `verified`: the worker checked that every unit is one of the spec's and is given at
        most once, so those checks need not be repeated here (a `CompactResult` says so
        itself). A run the group no longer waits for (deleted, reset by a rollback or a
        restart) changes nothing.
        """
        change = _Change(self.store)
        group = self.store.groups.get(run.group_id)
        if (group is None or group.assignor_run is None
                or group.assignor_run.run_id != run.run_id or run.group_epoch > group.epoch):
            return change.result(None)
        group.assignor_run = None
        if isinstance(outcome, CompactResult):
            if self._lands_as_changes(group, run, outcome):
                self._install_changes(group, run, outcome, change, now_ms)
                self._after_run(group, run, outcome.rerun_at_ms, change, now_ms)
                self._maybe_new_target(group, change, now_ms)
                return change.result(None)
            verified = outcome.verified
            outcome = expand(run.spec, outcome)
        self._apply_run(group, run, outcome, change, now_ms, verified)
        self._maybe_new_target(group, change, now_ms)
        return change.result(None)

    @staticmethod
    def _lands_as_changes(group: Group, run: AssignorRun, outcome: CompactResult) -> bool:
        """Whether the members a compact result names as changed are the only ones whose
        part differs from the group's target: the result is checked and names every
        member, and the group's members, metadata and target are still its spec's (by
        the change counters replay keeps), with no client-side versions to drop. Departed
        members' parts make the spec's previous target differ from the group's: a member
        that came back with the id of one of them has no part yet, whatever it was given."""
        return (outcome.verified and outcome.unchanged is None
                and not group.departed_parts
                and outcome.outsiders is not None
                and group.metadata_changes == run.metadata_changes
                and group.target_changes == run.target_changes
                and not group.versioned_parts
                and len(run.spec.members) == len(group.members)
                and run.spec.connectors == group.connectors
                and all(member_id in group.members for member_id in outcome.changed))

    def _install_changes(self, group: Group, run: AssignorRun, outcome: CompactResult,
                         change: _Change, now_ms: int) -> None:
        """`_install_target` for a result `_lands_as_changes`, in time proportional to
        what changed: the same records, without comparing every member's part."""
        group_id = group.group_id
        for member_id, units in outcome.changed.items():
            change.write(target_member_record(group_id, member_id, TargetPart(units)))
        target = group.target
        self._end_target_install(group, change, run.group_epoch,
                                 [m for m in outcome.outsiders or () if m in target], 0,
                                 run.assignor, now_ms, outcome.state, SERVER_MODE,
                                 outcome.assigned)

    def _apply_run(
        self,
        group: Group,
        run: AssignorRun,
        outcome: AssignmentResult | BaseException,
        change: _Change,
        now_ms: int,
        verified: bool = False,
    ) -> None:
        name = run.assignor
        if isinstance(outcome, BaseException):
            retry_at = now_ms + max(1_000, self._assignment_interval(group))
            group.retry_after_ms = retry_at  # not before then, however often we are asked
            change.event(
                "assignor_failed", group, None, assignor=name, error=repr(outcome), run=run.run_id
            )
            change.timers.append(TimerSet(_timer(ASSIGNMENT_TIMER, group.group_id), retry_at))
            return
        # A verified result over the connectors the group still has needs no filtering:
        # each member's set is kept as it is (the same object, cheap to compare).
        trusted = verified and run.spec.connectors == group.connectors
        units = None if trusted else group.units
        parts: dict[str, TargetPart] = {}
        seen: set[Unit] = set()
        for member_id, member_units in outcome.target.items():
            owner = member_id
            if owner not in group.members:
                # Missed changes: a replaced static member hands its part to the
                # new instance; a member that is gone loses its part.
                spec_member = run.spec.members.get(member_id)
                instance = spec_member.instance_id if spec_member else None
                owner = group.instances.get(instance, "") if instance else ""
                if owner not in group.members:
                    continue
            if units is None:
                # A member whose units did not change keeps its part object: the landing
                # of a big group's run builds and compares only what changed.
                # (A server-side part has no version or metadata.)
                old = group.target.get(owner)
                if old is not None and old.units is member_units and not (
                        old.version or old.metadata):
                    parts[owner] = old
                else:
                    parts[owner] = TargetPart(frozenset(member_units))
                continue
            kept = member_units & units  # units deleted meanwhile are dropped
            if not seen.isdisjoint(kept):
                change.event(
                    "assignor_failed",
                    group,
                    None,
                    assignor=name,
                    error="assignor gave a unit to two members",
                    run=run.run_id,
                )
                return
            seen |= kept
            parts[owner] = TargetPart(frozenset(kept))
        self._install_target(
            group, change, run.group_epoch, parts, 0, name, now_ms, outcome.state, SERVER_MODE
        )
        self._after_run(group, run, outcome.rerun_at_ms, change, now_ms)

    def _after_run(self, group: Group, run: AssignorRun, rerun_at_ms: int | None,
                   change: _Change, now_ms: int) -> None:
        if group.departed_parts:
            for member_id in run.spec.previous_target:
                group.departed_parts.pop(member_id, None)
        if rerun_at_ms is not None:
            change.timers.append(
                TimerSet(_timer(ASSIGNMENT_TIMER, group.group_id), max(rerun_at_ms, now_ms))
            )
        if rerun_at_ms != group.rerun_at_ms:
            change.write(deadlines_record(group.group_id, rerun_at_ms, group.expire_at_ms))

    def _install_target(
        self,
        group: Group,
        change: _Change,
        epoch: int,
        parts: Mapping[str, TargetPart],
        error: int,
        assignor: str | None,
        now_ms: int,
        state: bytes,
        mode: str,
    ) -> None:
        group_id = group.group_id
        target = group.target
        for member_id in group.members:
            new = parts.get(member_id, EMPTY_TARGET)
            old = target.get(member_id)
            if old is not new and old != new:
                change.write(target_member_record(group_id, member_id, new))
        self._end_target_install(group, change, epoch,
                                 [m for m in group.target if m not in group.members], error,
                                 assignor, now_ms, state, mode,
                                 sum(len(p.units) for p in parts.values()))

    def _end_target_install(self, group: Group, change: _Change, epoch: int,
                            not_members: list[str], error: int, assignor: str | None,
                            now_ms: int, state: bytes, mode: str, assigned: int) -> None:
        """The end of installing a target: parts of those no longer members dropped, the
        target metadata written, the event told."""
        group_id = group.group_id
        for member_id in not_members:
            change.write(target_member_record(group_id, member_id, None))
        change.write(target_metadata_record(group_id, epoch, error, assignor, now_ms, state))
        change.event(
            "target_installed",
            group,
            None,
            mode=mode,
            assignor=assignor,
            error=error,
            assigned=assigned,
            unassigned=group.known_unit_count() - assigned,
        )

    # ------------------------------------------------------------------ client-side flow
    def _assignment_caller(self, request: Any) -> tuple[Group, Member]:
        group = self.store.groups.get(request.group_id)
        if group is None:
            raise ApiError(ErrorCode.GROUP_ID_NOT_FOUND, f"group {request.group_id} does not exist")
        member = group.members.get(request.member_id)
        if member is None:
            raise ApiError(
                ErrorCode.UNKNOWN_MEMBER_ID,
                f"group {group.group_id} has no member {request.member_id}",
            )
        if request.member_epoch != member.current.epoch:
            raise ApiError(
                ErrorCode.FENCED_MEMBER_EPOCH,
                f"member epoch {request.member_epoch} is not the member's current "
                f"epoch {member.current.epoch}",
            )
        if group.chosen_member != member.member_id:
            raise ApiError(
                ErrorCode.UNKNOWN_MEMBER_ID,
                f"member {member.member_id} is not the worker chosen to compute the "
                f"assignment of group {group.group_id}",
            )
        return group, member

    def install_refusal(self, group_id: str, member_id: str, member_epoch: int
                        ) -> ApiError | None:
        """The error an Install from this caller gets whatever it lists (None: the caller
        may install). The shell asks before decoding a large Install's assignment, so that
        one from a member that may not install costs nothing proportional to its size."""
        caller = InstallCaller(group_id, member_id, member_epoch)
        try:
            validate_assignment_caller(caller)
            self._assignment_caller(caller)
        except ApiError as error:
            return error
        return None

    def prepare_assignment(
        self, request: ConnectGroupPrepareAssignmentRequest, now_ms: int
    ) -> Result[ConnectGroupPrepareAssignmentResponse]:
        change = _Change(self.store)
        try:
            validate_assignment_caller(request)
            group, _member = self._assignment_caller(request)
            mode, name = self._group_mode(group)
            if mode != CLIENT_MODE:
                raise ApiError(
                    ErrorCode.UNKNOWN_MEMBER_ID, f"group {group.group_id} is assigned on the server"
                )
            members = []
            for m in sorted(group.members.values(), key=lambda m: m.member_id):
                md = m.metadata
                info = (
                    next((a for a in md.client_assignors if a.name == name), None) if md else None
                )
                members.append(
                    PreparedMember(
                        member_id=m.member_id,
                        member_epoch=m.current.epoch,
                        instance_id=md.instance_id if md else None,
                        worker_url=md.worker_url if md else "",
                        assignor=MemberAssignor(
                            version=info.version if info else 0,
                            reason=info.reason if info else 0,
                            metadata=info.metadata if info else b"",
                        ),
                        target=units_to_wire(group.target.get(m.member_id, EMPTY_TARGET).units),
                    )
                )
            from_installs = group.units_source == "installs"
            group.prepared = PreparedAssignment(
                group.epoch, frozenset(group.members), None if from_installs else group.units,
                name, {m.member_id: m.current.held for m in group.members.values()},
            )
            change.event("assignment_prepared", group, request.member_id, assignor=name)
            response = ConnectGroupPrepareAssignmentResponse(
                throttle_time_ms=0,
                error_code=0,
                error_message=None,
                group_epoch=group.epoch,
                assignor_name=name,
                connectors_and_tasks=units_to_wire(group.known_units()),
                members=tuple(members),
            )
        except ApiError as error:
            response = ConnectGroupPrepareAssignmentResponse(
                throttle_time_ms=0,
                error_code=int(error.code),
                error_message=error.message,
                group_epoch=-1,
                assignor_name="",
                connectors_and_tasks=units_to_wire(EMPTY),
                members=(),
            )
        return change.result(response)

    def install_assignment(
        self, request: ConnectGroupInstallAssignmentRequest, now_ms: int,
        checked: CheckedInstall | None = None,
    ) -> Result[ConnectGroupInstallAssignmentResponse]:
        """`checked`: `check_install(request)`, done beforehand off the event loop for a
        large assignment; the answer is the same with or without it."""
        change = _Change(self.store)
        try:
            self._install(request, change, now_ms, checked)
            response = ConnectGroupInstallAssignmentResponse(
                throttle_time_ms=0, error_code=0, error_message=None
            )
        except ApiError as error:
            response = ConnectGroupInstallAssignmentResponse(
                throttle_time_ms=0, error_code=int(error.code), error_message=error.message
            )
        return change.result(response)

    def _install(
        self, request: Any, change: _Change, now_ms: int, checked: CheckedInstall | None
    ) -> None:
        if checked is None or checked.request is not request:
            checked = None
            parts_in = validate_install(request)
        else:
            parts_in = checked.parts
        group, _caller = self._assignment_caller(request)
        prepared = group.prepared
        if prepared is None or prepared.group_epoch != request.group_epoch:
            handed = "nothing" if prepared is None else f"group epoch {prepared.group_epoch}"
            raise ApiError(
                ErrorCode.INVALID_ASSIGNMENT,
                f"GroupEpoch {request.group_epoch} was not handed out by "
                f"ConnectGroupPrepareAssignment (it handed out {handed})",
            )
        if request.group_epoch <= group.assignment_epoch:
            raise ApiError(
                ErrorCode.INVALID_ASSIGNMENT,
                f"group epoch {request.group_epoch} is not newer than the target "
                f"assignment's epoch {group.assignment_epoch}",
            )
        if request.error != 0:
            # The assignor failed: keep the current target, tell the members the error.
            parts = {mid: part for mid, part in group.target.items() if mid in group.members}
            self._finish_install(group, change, request, parts, request.error, prepared, now_ms)
            return
        # With the request checked beforehand, three set operations show it is sound; the
        # walk below runs only without them or to name what is wrong.
        sound = (
            checked is not None
            and not checked.overlapping
            and (prepared.units is None or checked.units <= prepared.units)
            and parts_in.keys() <= prepared.member_ids
        )
        seen: set[Unit] = set()
        for member_id, (units, _version, _metadata) in () if sound else parts_in.items():
            if member_id not in prepared.member_ids:
                raise ApiError(
                    ErrorCode.INVALID_ASSIGNMENT,
                    f"member {member_id} was not in the group at epoch {prepared.group_epoch}",
                )
            # (a group that takes its units from its installs runs whatever they name)
            unknown = units - prepared.units if prepared.units is not None else EMPTY
            if unknown:
                raise ApiError(
                    ErrorCode.INVALID_ASSIGNMENT,
                    f"member {member_id} is given {_describe_units(unknown)}, which "
                    "the group does not run",
                )
            twice = units & seen
            if twice:
                raise ApiError(
                    ErrorCode.INVALID_ASSIGNMENT,
                    f"{_describe_units(twice)} is given to more than one member",
                )
            seen |= units
        # Members that left since Prepare lose their part (a new assignment follows).
        wires = {member.member_id: member.assigned for member in request.members}
        parts = {
            mid: TargetPart(units, version, metadata, wires[mid])
            for mid, (units, version, metadata) in parts_in.items()
            if mid in group.members
        }
        self._finish_install(group, change, request, parts, 0, prepared, now_ms)

    def _finish_install(
        self,
        group: Group,
        change: _Change,
        request: Any,
        parts: Mapping[str, TargetPart],
        error: int,
        prepared: PreparedAssignment,
        now_ms: int,
    ) -> None:
        self._install_target(
            group,
            change,
            request.group_epoch,
            parts,
            error,
            prepared.assignor_name,
            now_ms,
            b"",
            CLIENT_MODE,
        )
        group.prepared = None
        group.compute_requested_ms = None
        change.timers.append(TimerCancel(_timer(ASSIGNOR_TIMER, group.group_id)))
        if error == 0 and prepared.held:
            self._orphans_round(group, parts, prepared, change)
        self._maybe_new_target(group, change, now_ms)

    def _orphans_round(self, group: Group, parts: Mapping[str, TargetPart],
                       prepared: PreparedAssignment, change: _Change) -> None:
        """Units the worker was shown held it hands to nobody, to hand out once released
        (Connect revokes in one round, assigns in the next). Released since Prepare, no
        one's release or rejoin is left to start that next round: it starts now."""
        orphans = frozenset().union(*prepared.held.values())
        for part in parts.values():
            orphans -= part.units
        for member in group.members.values():
            orphans -= member.current.held
        if orphans:
            self._bump(group, change, trigger=TRIGGER_UNITS_RELEASED)

    def _maybe_downgrade(self, change: _Change, now_ms: int) -> None:
        """After a change in which new-protocol members left: a group left with only
        classic members becomes a classic group (when the policy allows)."""
        if not change.connect_member_left:
            return
        for group_id in sorted(change.connect_member_left):
            group = self.store.groups.get(group_id)
            if group is not None and conversion.should_downgrade(self, group):
                conversion.downgrade(self, group, change, now_ms)
        change.connect_member_left.clear()

    # ------------------------------------------------------------------ timers
    def on_timer(self, key: TimerKey, now_ms: int) -> Result[None]:
        kind, group_id, member_id = key
        if kind in CLASSIC_TIMERS:
            return self.classic.on_timer(key, now_ms)
        if kind == SYNC_WAIT_TIMER:
            bridged: Result[None] = self.classic.bridge.on_sync_wait_timer(group_id, member_id,
                                                                           now_ms)
            return bridged
        if kind == JOIN_WAIT_TIMER:
            joined: Result[None] = self.classic.bridge.on_join_wait_timer(group_id, member_id,
                                                                          now_ms)
            return joined
        change = _Change(self.store)
        group = self.store.groups.get(group_id)
        if group is None:
            return change.result(None)
        if kind == SESSION_TIMER:
            if member_id in group.members:
                self._remove_member(group, member_id, change, now_ms, reason="session_timeout")
                self._maybe_new_target(group, change, now_ms)
        elif kind == REVOCATION_TIMER:
            member = group.members.get(member_id)
            if member is not None and member.current.state is MemberState.UNREVOKED:
                self._remove_member(group, member_id, change, now_ms, reason="revocation_timeout")
                self._maybe_new_target(group, change, now_ms)
        elif kind == ASSIGNOR_TIMER:
            chosen = group.chosen_member
            if chosen is not None and group.epoch > group.assignment_epoch:
                change.event("assignor_timed_out", group, chosen)
                group.compute_requested_ms = None
                group.prepared = None
                mode, name = self._group_mode(group)
                if mode == CLIENT_MODE:
                    self._choose_worker(group, name, change, exclude=chosen)
        elif kind == EXPIRY_TIMER:
            expire_at = group.expire_at_ms
            if expire_at is not None and now_ms >= expire_at and not group.members \
                    and not group.connectors:
                change.event("group_expired", group,
                             retention_ms=self.config.empty_group_retention_ms)
                self._delete(group, change)
                self._forget_settings(group_id, change)
        elif kind == ASSIGNMENT_TIMER:
            rerun = group.rerun_at_ms
            if (
                rerun is not None
                and now_ms >= rerun
                and group.epoch == group.assignment_epoch
                and group.members
            ):
                change.write(deadlines_record(group_id, None, group.expire_at_ms))
                self._bump(group, change, trigger=TRIGGER_DELAYED_REBALANCE)
            self._maybe_new_target(group, change, now_ms)
        if group_id in self.store.groups:  # a member gone, a successor chosen: held requests
            for released in self.classic.bridge.settle(group, member_id, now_ms):
                change.records.extend(released.records)
                change.undo.extend(reversed(released.undo))
                change.timers.extend(released.timers)
                change.events.extend(released.events)
                change.releases.extend(released.releases)
        self._maybe_downgrade(change, now_ms)
        return change.result(None)

    # ------------------------------------------------------------------ describe
    def describe(self, request: ConnectGroupDescribeRequest, now_ms: int,
                 version: int = describing.NEWEST_VERSION) -> Any:
        return describing.response([self.describe_snapshot(group_id, version)
                                    for group_id in request.group_ids], version)

    def describe_snapshot(self, group_id: str, version: int = describing.NEWEST_VERSION
                          ) -> describing.Snapshot | tuple[str, ApiError]:
        """What describing `group_id` in `version` reads, taken now
        (coordinator/core/describe.py), or the error to describe it with. Version 0 finds
        no classic group."""
        group = self.store.groups.get(group_id) if group_id else None
        if group is None:
            if version >= 1 and group_id in self.classic.store.groups:
                return self.classic.describe_snapshot(group_id)
            return group_id, describing.not_found(group_id)
        assignor = group.assignor_name
        if group.members:
            assignor = self._group_mode(group)[1]
        bridged = self.classic.store.bridged
        told = {member_id: value.protocol_name for member_id in group.members
                if (value := bridged.get((group_id, member_id))) is not None}
        return describing.snapshot(group, assignor, group.known_units(), told)

    def describe_group(self, group_id: str) -> DescribedGroup:
        taken = self.describe_snapshot(group_id)
        if isinstance(taken, tuple):
            raise taken[1]
        described: DescribedGroup = describing.build(taken)
        return described

    def unassigned_units(self, group_id: str) -> frozenset[Unit]:
        """Units in no member's target (e.g. left out on purpose by a client assignor)."""
        group = self.store.groups.get(group_id)
        if group is None:
            return EMPTY
        targeted: set[Unit] = set()
        for part in group.target.values():
            targeted |= part.units
        return group.known_units() - targeted

    def group_ids(self) -> list[str]:
        return sorted(self.store.groups)

    def groups_by_state(self) -> dict[str, int]:
        counts = dict.fromkeys(("EMPTY", "ASSIGNING", "RECONCILING", "STABLE"), 0)
        for group in self.store.groups.values():
            counts[group.state] += 1
        return counts

    def member_count(self) -> int:
        return self.store.member_total

    # ------------------------------------------------------------------ admin
    def _group_or_create(self, group_id: str, change: _Change) -> Group:
        if not group_id:
            raise ApiError(ErrorCode.INVALID_GROUP_ID, "group id must be non-empty")
        group = self.store.groups.get(group_id)
        if group is None:
            self.check_room(group_id)
            self.classic.give_up_empty(group_id, change)  # (raises if it has members)
            group = self._create_group(group_id, change)
        return group

    def _existing_group(self, group_id: str) -> Group:
        group = self.store.groups.get(group_id)
        if group is None:
            raise ApiError(ErrorCode.GROUP_ID_NOT_FOUND, f"group {group_id} does not exist")
        return group

    def put_connector(
        self, group_id: str, connector: str, tasks: int, now_ms: int
    ) -> Result[dict[str, Any]]:
        if not connector:
            raise invalid("connector name must be non-empty")
        if isinstance(tasks, bool) or not isinstance(tasks, int) or not 0 <= tasks <= 100_000:
            raise invalid(f"tasks must be an integer between 0 and 100000, got {tasks!r}")
        if self.store.type_override(group_id) == "classic":
            raise invalid(f"group {group_id} is set to {CLASSIC_GROUP_TYPE_KEY}=classic, and "
                          "only a connect group runs connectors set through the admin API: "
                          "set the type to connect (or null) first")
        existing = self.store.groups.get(group_id)
        check_group_units(existing.connectors if existing is not None else {}, connector,
                          tasks, self.config.max_group_units, self.config.max_frame_bytes)
        change = _Change(self.store)
        group = self._group_or_create(group_id, change)
        changed = group.connectors.get(connector) != tasks
        if changed:
            if connector in group.connectors:
                change.write(resized_connectors_record(group, connector, tasks))
            else:
                connectors = dict(group.connectors)
                connectors[connector] = tasks
                change.write(connectors_record(group_id, connectors))
            self._bump(group, change, trigger=TRIGGER_CONNECTORS_CHANGED)
            change.event("connector_set", group, None, connector=connector, tasks=tasks)
            self._maybe_new_target(group, change, now_ms)
        self._note_idleness(group, change, now_ms)
        return change.result(
            {
                "group": group_id,
                "connector": connector,
                "tasks": tasks,
                "changed": changed,
                "group_epoch": group.epoch,
            }
        )

    def delete_connector(
        self, group_id: str, connector: str, now_ms: int
    ) -> Result[dict[str, Any]]:
        group = self._existing_group(group_id)
        if connector not in group.connectors:
            raise ApiError(
                ErrorCode.GROUP_ID_NOT_FOUND, f"group {group_id} has no connector {connector}"
            )
        change = _Change(self.store)
        connectors = dict(group.connectors)
        del connectors[connector]
        change.write(connectors_record(group_id, connectors))
        self._bump(group, change, trigger=TRIGGER_CONNECTORS_CHANGED)
        change.event("connector_deleted", group, None, connector=connector)
        self._maybe_new_target(group, change, now_ms)
        self._note_idleness(group, change, now_ms)
        return change.result(
            {"group": group_id, "connector": connector, "deleted": True, "group_epoch": group.epoch}
        )

    def remove_static_members(
        self, group_id: str, members: Sequence[tuple[str, str | None]], now_ms: int
    ) -> Result[dict[str, Any]]:
        group = self._existing_group(group_id)
        change = _Change(self.store)
        answers = []
        removed = 0
        for instance_id, member_id in members:
            holder = group.instances.get(instance_id) if instance_id else None
            code, message = ErrorCode.NONE, None
            if holder is None:
                code = ErrorCode.UNKNOWN_MEMBER_ID
                message = f"group {group_id} has no static member with instance id {instance_id!r}"
            elif member_id is not None and member_id != holder:
                code = ErrorCode.FENCED_INSTANCE_ID
                message = f"instance id {instance_id} belongs to member {holder}, not {member_id}"
            else:
                self._remove_member(
                    group, holder, change, now_ms, reason="admin_removal", bump=False
                )
                removed += 1
            answers.append(
                {
                    "instance_id": instance_id,
                    "member_id": member_id or holder,
                    "error_code": int(code),
                    "error": code.name,
                    "message": message,
                }
            )
        if removed:
            self._bump(group, change, trigger=TRIGGER_ADMIN_REMOVAL)
            self._maybe_new_target(group, change, now_ms)
            self._maybe_downgrade(change, now_ms)
        return change.result(
            {"group": group_id, "members": answers, "removed": removed, "group_epoch": group.epoch}
        )

    def set_group_config(
        self, group_id: str, body: Mapping[str, Any], now_ms: int
    ) -> Result[dict[str, Any]]:
        """A group's settings and its type (`connect.classic.group.type`), kept whichever
        type the group has (`GroupStore.settings`, `GroupStore.types`). The type is the one
        the group takes, empty, for a classic joiner (`classic_joiner_type`): a group set to
        a type while it is empty takes it at once, so that the first classic worker finds it
        (an empty connect group without connectors gives way to an empty classic group, and
        the other way round); one with members keeps its type until it is empty again.
        Settings never change a group's type: a classic group keeps them for when it is a
        connect group again."""
        if not group_id:
            raise ApiError(ErrorCode.INVALID_GROUP_ID, "group id must be non-empty")
        typed = CLASSIC_GROUP_TYPE_KEY in body
        kind = body[CLASSIC_GROUP_TYPE_KEY] if typed else self.store.type_override(group_id)
        if kind not in (None, "classic", "connect"):
            raise invalid(f"{CLASSIC_GROUP_TYPE_KEY} must be 'classic', 'connect' or null (the "
                          f"server's group.connect.classic.group.type), got {kind!r}")
        current = self.store.settings.get(group_id, GroupConfig())
        try:
            config = parse_group_config(
                {key: value for key, value in body.items() if key != CLASSIC_GROUP_TYPE_KEY},
                current)
        except ConfigError as error:
            raise invalid(str(error)) from None
        session = (
            config.session_timeout_ms
            if config.session_timeout_ms > 0
            else self.config.session_timeout_ms
        )
        interval = (
            config.heartbeat_interval_ms
            if config.heartbeat_interval_ms > 0
            else self.config.heartbeat_interval_ms
        )
        if interval >= session:
            raise invalid(
                f"the heartbeat interval ({interval} ms) must be below the session "
                f"timeout ({session} ms)"
            )
        group = self.store.groups.get(group_id)
        classic = self.classic.store.groups.get(group_id)
        if kind == "classic" and group is not None and group.connectors:
            raise invalid(f"group {group_id} has {len(group.connectors)} connector(s) set "
                          "through the admin API, which only a connect group runs: delete "
                          f"them before setting {CLASSIC_GROUP_TYPE_KEY}=classic")
        change = _Change(self.store)
        if group is None and classic is None:  # a new group: of the type set, else connect
            self.check_room(group_id)
            if kind == "classic":
                self.classic.keep_empty(group_id, change, now_ms)
            else:
                group = self._create_group(group_id, change)
        elif typed and kind == "classic" and group is not None and not group.members:
            change.event("group_deleted", group, reason=f"{CLASSIC_GROUP_TYPE_KEY}=classic")
            self._delete(group, change)
            group = None
            self.classic.keep_empty(group_id, change, now_ms)
        elif typed and kind == "connect" and classic is not None and not classic.active():
            self.classic.give_up_empty(group_id, change)
            group = self._create_group(group_id, change)
        wrote_settings = config != current
        if wrote_settings:
            change.write(configuration_record(group_id, config))
        # The type has a record of its own, written with the first settings too: settings
        # without one are from before it existed, and mean `connect` (`type_override`).
        if (typed or wrote_settings) and (group_id not in self.store.types
                                          or self.store.types[group_id] != kind):
            change.write(group_type_record(group_id, kind))
        if change.records:
            change.events.append(Event("group_config_set", group_id, None, {
                "group_type": "connect" if group is not None else "classic",
                "config": dict(body)}))
        if group is not None:
            self._note_idleness(group, change, now_ms)
        return change.result({"group": group_id, "config": self.group_config(group_id)})

    def classic_joiner_type(self, group_id: str) -> str:
        """The type an empty group `group_id` takes for a classic joiner: the one set for
        it through the admin API, else the server's `group.connect.classic.group.type`;
        `connect` for a connect group whose connectors the admin API set (a classic group
        could not run them, and they cannot be set for a group set to `classic`)."""
        group = self.store.groups.get(group_id)
        if group is not None and group.units_source != "installs":
            return "connect"
        return self.store.type_override(group_id) or self.config.classic_group_type

    def _known_group(self, group_id: str) -> None:
        if group_id not in self.store.groups and group_id not in self.classic.store.groups:
            raise ApiError(ErrorCode.GROUP_ID_NOT_FOUND, f"group {group_id} does not exist")

    def group_config(self, group_id: str) -> dict[str, Any]:
        """What the admin API set for the group, of either type: its settings (-1 or null:
        the server's) and its type (null: the server's decides)."""
        self._known_group(group_id)
        return {**_group_config_view(self.store.settings.get(group_id, GroupConfig())),
                CLASSIC_GROUP_TYPE_KEY: self.store.type_override(group_id)}

    def gives_way(self, group_id: str) -> bool:
        """Whether the connect group `group_id` becomes a classic group for a new classic
        member: it is empty and the type it takes for a classic joiner is `classic`. Its
        settings stay (`GroupStore.settings`)."""
        group = self.store.groups.get(group_id)
        return (group is not None and not group.members
                and self.classic_joiner_type(group_id) == "classic")

    def give_way(self, group_id: str, change: Any) -> None:
        """The records that delete the connect group a classic member takes (`gives_way`),
        written into `change`, the classic join's; its timers are cleared."""
        group = self.store.groups[group_id]
        change.events.append(Event("group_deleted", group_id, None, {
            "group_epoch": group.epoch, "assignment_epoch": group.assignment_epoch,
            "group_type": "connect", "reason": "classic_member_joined"}))
        self._delete(group, change)

    def effective_group_config(self, group_id: str) -> dict[str, Any]:
        """The values the group runs with: its overrides, else the server's defaults (for a
        classic group: those it would run with as a connect group)."""
        self._known_group(group_id)
        config = self.store.settings.get(group_id, GroupConfig())
        connect = self.store.groups.get(group_id)
        group = connect if connect is not None else Group(group_id, config=config)
        offload = group.config.assignor_offload_enable
        return {
            "connect.session.timeout.ms": self._session_timeout(group),
            "connect.heartbeat.interval.ms": self._heartbeat_interval(group),
            "connect.assignment.interval.ms": self._assignment_interval(group),
            "connect.assignor.offload.enable":
                self.config.assignor_offload_enable if offload is None else offload,
            "scheduled.rebalance.max.delay.ms": self._scheduled_delay(group),
            # where its units come from: `admin` (connectors set through the admin API)
            # or `installs` (what its client-side assignments hand out); null for a
            # classic group, whose leader assigns what it knows
            "units.source": group.units_source if connect is not None else None,
            # the type the group takes, empty, for a classic joiner
            CLASSIC_GROUP_TYPE_KEY: self.classic_joiner_type(group_id),
        }

    def delete_group(self, group_id: str, now_ms: int) -> Result[dict[str, Any]]:
        """`DELETE /groups/{group}`: a group of either type, by the same rule (refused
        while it has members)."""
        classic = self.store.classic.groups.get(group_id)
        if classic is not None and group_id not in self.store.groups:
            change = _Change(self.store)
            self.classic.delete_empty(group_id, change)  # (raises if it has members)
            change.events.append(Event("group_deleted", group_id, None, {
                "group_type": "classic", "generation": classic.generation}))
            return change.result({"group": group_id, "deleted": True})
        group = self._existing_group(group_id)
        if group.members:
            raise ApiError(
                ErrorCode.NON_EMPTY_GROUP,
                f"group {group_id} still has {len(group.members)} member(s)",
            )
        change = _Change(self.store)
        change.event("group_deleted", group)
        self._delete(group, change)
        self._forget_settings(group_id, change)
        return change.result({"group": group_id, "deleted": True})

    def _note_idleness(self, group: Group, change: _Change, now_ms: int) -> None:
        """A group with no members and no connectors is deleted after the retention: the
        time is a record (a restart keeps it), cleared once the group is in use again."""
        idle = not group.members and not group.connectors
        if idle and group.expire_at_ms is None:
            expire_at = now_ms + self.config.empty_group_retention_ms
            change.write(deadlines_record(group.group_id, group.rerun_at_ms, expire_at))
            change.timers.append(TimerSet(_timer(EXPIRY_TIMER, group.group_id), expire_at))
        elif not idle and group.expire_at_ms is not None:
            change.write(deadlines_record(group.group_id, group.rerun_at_ms, None))
            change.timers.append(TimerCancel(_timer(EXPIRY_TIMER, group.group_id)))

    def _delete(self, group: Group, change: _Change) -> None:
        """The records that delete an empty group, and its timers cancelled. What the
        admin API set for it stays (a classic group of that id keeps it): a group that
        goes for good forgets it too (`_forget_settings`)."""
        group_id = group.group_id
        group.assignor_run = None
        for member_id in list(group.target):
            change.write(target_member_record(group_id, member_id, None))
        change.write(connectors_record(group_id, None))
        change.write(Record(target_metadata_record(group_id, 0, 0, None, -1, b"").key, None))
        change.write(deadlines_record(group_id, None, None))
        change.write(Record(group_metadata_record(group_id, 0).key, None))
        change.timers.append(TimerClearGroup(group_id))
        change.releases.extend(self.classic.bridge.drop_parked(group_id))

    def _forget_settings(self, group_id: str, change: _Change) -> None:
        """The records that delete the settings and the type of a group that goes."""
        if group_id in self.store.settings:
            change.write(configuration_record(group_id, None))
        if group_id in self.store.types:
            change.write(group_type_record(group_id, None, present=False))


CLASSIC_GROUP_TYPE_KEY = "connect.classic.group.type"


def _covering_members(metadata: Mapping[str, MemberMetadata], assignor: str) -> list[str]:
    """Members whose version range for `assignor` covers every member's range, by id."""
    ranges = {}
    for member_id, md in metadata.items():
        info = next((a for a in md.client_assignors if a.name == assignor), None)
        if info is not None:
            ranges[member_id] = (info.minimum_version, info.maximum_version)
    if not ranges:
        return []
    low = min(r[0] for r in ranges.values())
    high = max(r[1] for r in ranges.values())
    return sorted(mid for mid, (lo, hi) in ranges.items() if lo <= low and hi >= high)


def _describe_units(units: frozenset[Unit]) -> str:
    from coordinator.units import format_unit

    names = sorted(format_unit(u) for u in units)
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    return shown


def _group_config_view(config: GroupConfig) -> dict[str, Any]:
    return {
        "connect.session.timeout.ms": config.session_timeout_ms,
        "connect.heartbeat.interval.ms": config.heartbeat_interval_ms,
        "connect.assignment.interval.ms": config.assignment_interval_ms,
        "connect.assignor.offload.enable": config.assignor_offload_enable,
        "scheduled.rebalance.max.delay.ms": config.scheduled_rebalance_max_delay_ms,
    }
