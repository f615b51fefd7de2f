"""The classic group engine: Kafka's JoinGroup/SyncGroup/Heartbeat/LeaveGroup, sans-IO.

Everything that affects a classic group's state lives in this file and `state.py`.

Theory of operation. A classic group moves through four states:

- Empty: no members. The phase deadline is when the group expires: an empty group goes
  after `group.connect.empty.group.retention.ms`, as an empty connect group does (its
  settings with it). A JoinGroup starts a join phase (PreparingRebalance). The first
  phase of an empty group waits `group.initial.rebalance.delay.ms` (each new member pushes
  the end back by the delay again, never past the largest rebalance timeout from the
  start), so that workers started together land in one generation.
- PreparingRebalance: the join barrier. Every JoinGroup is parked (the shell holds the
  response); the phase ends when every member has joined again, or at its deadline
  (the largest rebalance timeout). Members that did not rejoin are removed. Then the
  generation rises by one, a protocol every member supports is selected, a leader is
  chosen (the previous one if it rejoined), and every parked JoinGroup is answered: the
  leader's with every member's metadata.
- CompletingRebalance: followers' SyncGroups are parked until the leader's SyncGroup
  brings the assignment; then all are answered with their part, verbatim.
- Stable: heartbeats answer NONE; a JoinGroup from the leader or with new metadata, a
  new member, a leave or an expired session start the next join phase. Heartbeats during
  a join phase answer REBALANCE_IN_PROGRESS.

Deadlines that change behaviour (the end of a join phase, by when members must have sent
SyncGroup, when an empty group expires) are in the group's record; so are whether each
member joined this round and synced this generation. Timers are derived from that state
(`timers`), after loading the log as after a rollback, and a timer that fires checks the
recorded deadline, so a stale one does nothing. Session timers are re-armed by every
request and, after a restart, start afresh. Parked requests are the shell's: the engine
names them by `WaiterKey` and hands their answers back in `Result.releases`, which the
shell delivers once the records of the change are durable.

Pending members. A v4+ JoinGroup without a member id is told MEMBER_ID_REQUIRED with a
fresh id, and that id is a member record marked pending, written without the request's
protocols (they come again with the real join): a record, so a restart or a rollback
finds exactly what the log says, and the few bytes of an id cost no more than any other
change. They count against `group.connect.max.size` in their group and against
`group.connect.classic.max.pending.members` in all, and go after the join's rebalance
timeout (never later than `group.max.session.timeout.ms`), not its session: a worker
told its id comes back at once.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from coordinator.config import ServerConfig
from coordinator.core import describe as describing
from coordinator.core.classic.state import (
    NO_DEADLINE,
    ClassicGroup,
    ClassicState,
    ClassicStore,
    member_record,
    metadata_record,
    new_metadata,
    protocol_metadata,
    protocols_of,
    replace_member,
    replace_meta,
)
from coordinator.core.classic.view import member_views
from coordinator.core.result import (
    Event,
    Record,
    Result,
    TimerCancel,
    TimerClearGroup,
    TimerKey,
    TimerOp,
    TimerSet,
)
from protocol.errors import ApiError, ErrorCode
from protocol.messages import ClassicGroupMemberValue

PROTOCOL_TYPE = "connect"
CLASSIC_SESSION_TIMER = "classic_session"
CLASSIC_PHASE_TIMER = "classic_phase"
CLASSIC_TIMERS = (CLASSIC_SESSION_TIMER, CLASSIC_PHASE_TIMER)

# Why a classic group started a join phase: the `reason` of "classic_rebalance_started".
REASON_MEMBER_JOINED = "member_joined"
REASON_METADATA_CHANGED = "metadata_changed"
REASON_LEADER_REJOINED = "leader_rejoined"
REASON_MEMBER_LEFT = "member_left"
REASON_SESSION_TIMEOUT = "session_timeout"
REASON_SYNC_TIMEOUT = "sync_timeout"
REASON_STATIC_REPLACED = "static_member_replaced"
# A connect group became classic when its last new-protocol member went.
REASON_DOWNGRADED = "downgraded"
CLASSIC_REBALANCE_REASONS = (
    REASON_MEMBER_JOINED, REASON_METADATA_CHANGED, REASON_LEADER_REJOINED,
    REASON_MEMBER_LEFT, REASON_SESSION_TIMEOUT, REASON_SYNC_TIMEOUT, REASON_STATIC_REPLACED,
    REASON_DOWNGRADED,
)

JOIN = "join"
SYNC = "sync"
# A refused join's message names this many of its protocols at most.
_NAMES_TOLD = 10
WaiterKey = tuple[str, str, str]  # (JOIN or SYNC, group id, member id)


# ---------------------------------------------------------------------- requests, answers


@dataclass(frozen=True, slots=True)
class JoinRequest:
    group_id: str
    member_id: str
    protocol_type: str
    protocols: tuple[tuple[str, bytes], ...]
    session_timeout_ms: int
    rebalance_timeout_ms: int
    instance_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    require_known_member_id: bool = True  # JoinGroup v4+
    skip_assignment_supported: bool = True  # JoinGroup v9+
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class JoinMember:
    member_id: str
    instance_id: str | None
    metadata: bytes


@dataclass(frozen=True, slots=True)
class JoinAnswer:
    error: int
    member_id: str = ""
    generation: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    members: tuple[JoinMember, ...] = ()
    skip_assignment: bool = False


@dataclass(frozen=True, slots=True)
class SyncRequest:
    group_id: str
    member_id: str
    generation: int
    assignments: tuple[tuple[str, bytes], ...] = ()
    instance_id: str | None = None
    protocol_type: str | None = None
    protocol_name: str | None = None


@dataclass(frozen=True, slots=True)
class SyncAnswer:
    error: int
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""


@dataclass(frozen=True, slots=True)
class HeartbeatRequest:
    group_id: str
    member_id: str
    generation: int
    instance_id: str | None = None


@dataclass(frozen=True, slots=True)
class HeartbeatAnswer:
    error: int


@dataclass(frozen=True, slots=True)
class LeaveRequest:
    group_id: str
    members: tuple[tuple[str, str | None], ...]  # (member id, instance id)


@dataclass(frozen=True, slots=True)
class LeaveAnswer:
    error: int
    members: tuple[tuple[str, str | None, int], ...] = ()  # (member id, instance id, error)


@dataclass(frozen=True, slots=True)
class Parked:
    """The answer is not ready: the shell parks the request under `key` until a
    `Result.releases` entry with that key answers it."""

    key: WaiterKey


@dataclass(frozen=True, slots=True)
class DescribedClassicMember:
    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


@dataclass(frozen=True, slots=True)
class DescribedClassicGroup:
    group_id: str
    state: str
    protocol_type: str
    protocol_name: str
    generation: int
    leader: str | None
    members: tuple[DescribedClassicMember, ...]


class _ClassicError(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


# ---------------------------------------------------------------------- change collector


@dataclass(slots=True)
class _Change:
    store: ClassicStore
    records: list[Record] = field(default_factory=list)
    timers: list[TimerOp] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    undo: list[Record] = field(default_factory=list)
    releases: list[tuple[Any, Any]] = field(default_factory=list)

    def write(self, record: Record) -> None:
        self.undo.append(self.store.current_record(record.key))
        self.store.replay(record)
        self.records.append(record)

    def event(self, name: str, group: ClassicGroup, member_id: str | None = None,
              **fields: Any) -> None:
        fields.setdefault("generation", group.generation)
        fields.setdefault("group_type", "classic")
        if member_id is not None:
            fields.setdefault("protocol", "classic")
            if group.meta.protocol_name is not None:  # chosen once a join phase completes
                fields.setdefault("classic_protocol", group.meta.protocol_name)
        self.events.append(Event(name, group.group_id, member_id, fields))

    def result(self, response: Any) -> Result[Any]:
        self.undo.reverse()
        return Result(response, self.records, self.timers, self.events, self.undo,
                      releases=self.releases)


def _session_key(group_id: str, member_id: str) -> TimerKey:
    return (CLASSIC_SESSION_TIMER, group_id, member_id)


def _phase_key(group_id: str) -> TimerKey:
    return (CLASSIC_PHASE_TIMER, group_id, "")


def _new_member_id(client_id: str) -> str:
    return f"{client_id or 'member'}-{uuid.uuid4()}"


# What a member id generator adds to the client id (a uuid: 37 bytes) fits in this.
MEMBER_ID_SUFFIX_BYTES = 64


# ---------------------------------------------------------------------- the engine


class ClassicEngine:
    """Every classic group of this coordinator. See the module docstring."""

    def __init__(
        self,
        config: ServerConfig,
        store: ClassicStore | None = None,
        *,
        new_member_id: Callable[[str], str] = _new_member_id,
        other_type: Callable[[str], bool] = lambda group_id: False,
    ) -> None:
        self.config = config
        self.store = store if store is not None else ClassicStore()
        self.new_member_id = new_member_id
        # Whether a group id belongs to a group of another type (a connect group).
        self.other_type = other_type
        # Classic members of connect groups go to the bridge (set by the coordinator).
        self.bridge: Any = None
        # An empty connect group that a new classic member takes (set by the
        # coordinator): whether it does; the records that delete it, written into the
        # join's change; and the store that replays them along with the classic group's.
        self.connect_gives_way: Callable[[str], bool] = lambda group_id: False
        self.connect_give_way: Callable[[str, Any], None] = lambda group_id, change: None
        self.connect_records: Any = self.store
        # The type an empty group takes for a classic joiner (set by the coordinator: the
        # group's own, set through the admin API, else the server's).
        self.classic_joiner_type: Callable[[str], str] = \
            lambda group_id: self.config.classic_group_type
        # Set by the coordinator: raises (ApiError) when a new group `group_id` would take
        # the coordinator past `group.coordinator.max.groups`, counting both types; and the
        # records that forget what the admin API set for a group that goes for good.
        self.check_room: Callable[[str], None] = lambda group_id: None
        self.forget_settings: Callable[[str, Any], None] = lambda group_id, change: None
        self.has_settings: Callable[[str], bool] = lambda group_id: False

    def fresh_member_id(self, client_id: str) -> str:
        """A new member id: the client id, cut so that the id fits
        `group.connect.max.id.bytes` (the worker sends it back, and a longer one would be
        refused), and a unique suffix."""
        room = max(0, self.config.max_id_bytes - MEMBER_ID_SUFFIX_BYTES)
        if len(client_id) > room // 4:  # (4 bytes a character at most)
            client_id = client_id.encode("utf-8", "surrogatepass")[:room].decode("utf-8", "ignore")
        return self.new_member_id(client_id)

    def _bridged(self, group_id: str) -> bool:
        return self.bridge is not None and self.bridge.handles(group_id)

    # ------------------------------------------------------------------ derived timers
    def timers(self, now_ms: int, group_ids: Iterable[str] | None = None) -> list[TimerOp]:
        """The timers the replayed state calls for: each group's phase deadline as
        recorded, and a fresh session for every member."""
        operations: list[TimerOp] = []
        groups = self.store.groups
        for group_id in (groups if group_ids is None else group_ids):
            group = groups.get(group_id)
            if group is None:
                continue
            if group.meta.phase_deadline_ms != NO_DEADLINE:
                operations.append(TimerSet(_phase_key(group_id), group.meta.phase_deadline_ms))
            elif group.state is ClassicState.EMPTY:
                # Emptied before empty groups expired: the timer writes its deadline.
                operations.append(TimerSet(_phase_key(group_id), now_ms))
            for member_id, member in group.members.items():
                operations.append(TimerSet(_session_key(group_id, member_id),
                                           now_ms + self._lifetime(member)))
        return operations

    def _lifetime(self, member: ClassicGroupMemberValue) -> int:
        """How long a member lives without a word: its session, or for a pending one the
        rebalance timeout of its join, within the longest session a join may ask for."""
        if not member.pending:
            return member.session_timeout_ms
        return max(0, min(member.rebalance_timeout_ms,
                          self.config.classic_max_session_timeout_ms))

    def _empty_metadata(self, now_ms: int) -> Any:
        """A new empty group's record: it expires after the retention unless joined."""
        return replace_meta(new_metadata(PROTOCOL_TYPE),
                            phase_deadline_ms=now_ms + self.config.empty_group_retention_ms)

    def give_up_empty(self, group_id: str, change: Any) -> None:
        """Before a connect group `group_id` is created: an empty classic group of that id
        is deleted (an empty group takes the type of its next joiner, with `change`'s
        records); one with members refuses the joiner."""
        group = self.store.groups.get(group_id)
        if group is None:
            return
        if group.active():
            raise ApiError(ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
                           f"group {group_id!r} is a classic group with members")
        for member_id in list(group.members):  # only told MEMBER_ID_REQUIRED
            change.write(member_record(group_id, member_id, None))
        change.write(metadata_record(group_id, None))

    def keep_empty(self, group_id: str, change: Any, now_ms: int) -> None:
        """An empty classic group `group_id` (unless it is one already): the group set to
        `classic` through the admin config API while it is empty or new. (The type itself
        is the coordinator's record, `GroupType`, kept whichever the group's type.)"""
        if group_id not in self.store.groups:
            meta = self._empty_metadata(now_ms)
            change.write(metadata_record(group_id, meta))
            change.timers.append(TimerSet(_phase_key(group_id), meta.phase_deadline_ms))

    def delete_empty(self, group_id: str, change: Any) -> None:
        """The records that delete the classic group `group_id`, empty (pending members go
        with it), and its settings; its timers cleared. One with members is refused as a
        connect group with members is."""
        group = self.store.groups[group_id]
        active = len(group.active())
        if active:
            raise ApiError(ErrorCode.NON_EMPTY_GROUP,
                           f"group {group_id} still has {active} member(s)")
        for member_id in list(group.members):
            change.write(member_record(group_id, member_id, None))
        change.write(metadata_record(group_id, None))
        change.timers.append(TimerClearGroup(group_id))
        self.forget_settings(group_id, change)

    def replay(self, record: Record) -> None:
        self.store.replay(record)

    def rollback(self, result: Result[Any]) -> None:
        for record in result.undo:
            self.store.replay(record)

    # ------------------------------------------------------------------ JoinGroup
    def join(self, request: JoinRequest, now_ms: int) -> Result[JoinAnswer | Parked]:
        # An empty group takes the type of its next joiner: for a classic one, the type
        # the group was set to, else the server's (`classic_joiner_type`).
        taking_over = False
        if self.bridge is not None:
            group_id = request.group_id
            if self.bridge.handles(group_id):
                # A connect group -- unless it is an empty one that a new classic member
                # makes classic.
                taking_over = not request.member_id and self.connect_gives_way(group_id)
                bridged = not taking_over
            else:
                # A new group, or an empty classic group (its members all left), that a
                # classic member puts on the connect engine: the bridge's join creates the
                # connect group, and deletes the empty classic group in the same change.
                existing = self.store.groups.get(group_id)
                bridged = (self.classic_joiner_type(group_id) == "connect"
                           and (existing is None or not existing.active()))
            if bridged:
                answer: Result[JoinAnswer | Parked] = self.bridge.join(request, now_ms)
                return answer
        # One change deletes the connect group taken over and creates the classic group.
        change = _Change(self.connect_records if taking_over else self.store)
        try:
            if taking_over:
                self._check_join(request)  # (a bad request changes nothing)
                self._check_pending_room(request, None)
                self.connect_give_way(request.group_id, change)
            response: JoinAnswer | Parked = self._join(request, change, now_ms)
        except _ClassicError as error:
            change.events.append(Event("classic_join_refused", request.group_id,
                                       request.member_id or None,
                                       {"error": error.code.name, "reason": error.message}))
            response = JoinAnswer(error.code, request.member_id)
        return change.result(response)

    def _check_join(self, request: JoinRequest) -> None:
        """The checks of a JoinGroup that do not depend on its group."""
        if not request.group_id:
            raise _ClassicError(ErrorCode.INVALID_GROUP_ID, "the group id is empty")
        low = self.config.classic_min_session_timeout_ms
        high = self.config.classic_max_session_timeout_ms
        if not low <= request.session_timeout_ms <= high:
            raise _ClassicError(
                ErrorCode.INVALID_SESSION_TIMEOUT,
                f"session timeout {request.session_timeout_ms} ms is outside "
                f"[{low}, {high}] (group.min/max.session.timeout.ms)")
        if request.protocol_type != PROTOCOL_TYPE:
            raise _ClassicError(
                ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
                f"protocol type {request.protocol_type!r}: this coordinator serves "
                f"{PROTOCOL_TYPE!r} groups only")
        if not request.protocols:
            raise _ClassicError(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, "no protocols listed")

    def _join(self, request: JoinRequest, change: _Change, now_ms: int) -> JoinAnswer | Parked:
        self._check_join(request)
        if self.other_type(request.group_id):
            raise _ClassicError(
                ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
                f"group {request.group_id!r} is a connect group")
        group = self.store.groups.get(request.group_id)
        self._check_pending_room(request, group)
        if group is None:
            if request.member_id:
                raise _ClassicError(ErrorCode.UNKNOWN_MEMBER_ID,
                                    f"group {request.group_id!r} does not exist")
            try:
                self.check_room(request.group_id)
            except ApiError as error:
                raise _ClassicError(error.code, error.message) from None
            meta = self._empty_metadata(now_ms)
            change.write(metadata_record(request.group_id, meta))
            change.timers.append(TimerSet(_phase_key(request.group_id), meta.phase_deadline_ms))
            group = self.store.groups[request.group_id]
        elif not self._supports(group, request):
            listed = [name for name, _ in request.protocols[:_NAMES_TOLD]]
            more = len(request.protocols) - len(listed)
            raise _ClassicError(
                ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
                f"none of the protocols {listed}{f' (and {more} more)' if more else ''} is "
                f"supported by every member of group {request.group_id!r}")
        if request.member_id:
            return self._join_known(group, request, change, now_ms)
        return self._join_new(group, request, change, now_ms)

    def _check_pending_room(self, request: JoinRequest, group: ClassicGroup | None) -> None:
        """For a join that will be told MEMBER_ID_REQUIRED: room for one more pending
        member in its group (members and pending ones count against the group size, as at
        a broker), and among all the pending members. The second is the coordinator's
        limit, not the group's: the worker is told to retry, as when the coordinator is
        away. Checked before the change writes anything."""
        if request.member_id or request.instance_id is not None \
                or not request.require_known_member_id:
            return
        if group is not None and len(group.members) >= self.config.max_size:
            raise _ClassicError(ErrorCode.GROUP_MAX_SIZE_REACHED,
                                f"group {request.group_id!r} has {self.config.max_size} "
                                "members, pending ones included (group.connect.max.size)")
        limit = self.config.classic_max_pending_members
        if self.store.pending_total >= limit:
            raise _ClassicError(ErrorCode.COORDINATOR_NOT_AVAILABLE,
                                f"{limit} members told MEMBER_ID_REQUIRED have not joined "
                                "yet (group.connect.classic.max.pending.members)")

    @staticmethod
    def _candidates(members: Iterable[ClassicGroupMemberValue]) -> list[str] | None:
        """The protocols every member supports, in the first member's order (None: no
        members). Each name is counted once per member that lists it: linear in the
        names listed, however many there are."""
        listed = list(members)
        if not listed:
            return None
        support: Counter[str] = Counter()
        for member in listed:
            support.update({protocol.name for protocol in member.protocols})
        everyone = len(listed)
        return list(dict.fromkeys(protocol.name for protocol in listed[0].protocols
                                  if support[protocol.name] == everyone))

    @staticmethod
    def _supports(group: ClassicGroup, request: JoinRequest) -> bool:
        """Whether the join lists a protocol every other member supports, read from the
        group's count of members supporting each (`protocol_support`): as long as the
        join's own list and its member's, not the group's."""
        member = group.members.get(request.member_id) if request.member_id else None
        mine: frozenset[str] = frozenset()
        if member is not None and not member.pending:
            mine = frozenset(protocol.name for protocol in member.protocols)
        others = group.supporting - (1 if member is not None and not member.pending else 0)
        if others <= 0:
            return True
        support = group.protocol_support
        return any(support.get(name, 0) - (name in mine) == others
                   for name, _ in request.protocols)

    def _check_instance(self, group: ClassicGroup, member_id: str,
                        instance_id: str | None) -> None:
        if instance_id is None:
            return
        owner = group.instances.get(instance_id)
        if owner is not None and owner != member_id:
            raise _ClassicError(
                ErrorCode.FENCED_INSTANCE_ID,
                f"instance {instance_id!r} belongs to member {owner!r}, not {member_id!r}")

    def _join_new(self, group: ClassicGroup, request: JoinRequest, change: _Change,
                  now_ms: int) -> JoinAnswer | Parked:
        if request.instance_id is not None and request.instance_id in group.instances:
            return self._replace_static(group, group.instances[request.instance_id], request,
                                        change, now_ms)
        if len(group.members) >= self.config.max_size:  # (pending ones count)
            raise _ClassicError(ErrorCode.GROUP_MAX_SIZE_REACHED,
                                f"group {group.group_id!r} has {self.config.max_size} members")
        member_id = self.fresh_member_id(request.client_id)
        if request.instance_id is None and request.require_known_member_id:
            # It must come back with this id: then it is a member (Kafka's KIP-394).
            # Until then its protocols are not kept (see the module docstring).
            pending = self._member_value(request, None, pending=True)
            change.write(member_record(group.group_id, member_id, pending))
            change.timers.append(TimerSet(_session_key(group.group_id, member_id),
                                          now_ms + self._lifetime(pending)))
            return JoinAnswer(ErrorCode.MEMBER_ID_REQUIRED, member_id)
        return self._add_and_rebalance(group, member_id, request, change, now_ms)

    def _member_value(self, request: JoinRequest, previous: ClassicGroupMemberValue | None,
                      *, pending: bool = False, joined_generation: int = -1
                      ) -> ClassicGroupMemberValue:
        return ClassicGroupMemberValue(
            instance_id=request.instance_id,
            client_id=request.client_id,
            client_host=request.client_host,
            session_timeout_ms=request.session_timeout_ms,
            rebalance_timeout_ms=request.rebalance_timeout_ms,
            pending=pending,
            protocols=() if pending else protocols_of(request.protocols),
            joined_generation=joined_generation,
            synced_generation=previous.synced_generation if previous else -1,
            assignment_generation=previous.assignment_generation if previous else -1,
            assignment=previous.assignment if previous else b"",
        )

    def _add_and_rebalance(self, group: ClassicGroup, member_id: str, request: JoinRequest,
                           change: _Change, now_ms: int) -> Parked:
        change.write(member_record(group.group_id, member_id, self._member_value(
            request, None, joined_generation=group.generation + 1)))
        change.event("classic_member_joined", group, member_id,
                     instance_id=request.instance_id, client_id=request.client_id)
        change.timers.append(TimerSet(_session_key(group.group_id, member_id),
                                      now_ms + request.session_timeout_ms))
        if group.state is ClassicState.PREPARING_REBALANCE:
            if group.meta.initial_delay:
                self._extend_initial_delay(group, change, now_ms)
            self._maybe_complete_join(group, change, now_ms)
        else:
            self._prepare_rebalance(group, change, now_ms, REASON_MEMBER_JOINED)
        return Parked((JOIN, group.group_id, member_id))

    def _extend_initial_delay(self, group: ClassicGroup, change: _Change, now_ms: int) -> None:
        meta = group.meta
        limit = meta.phase_started_ms + group.max_rebalance_timeout_ms()
        deadline = min(now_ms + self.config.initial_rebalance_delay_ms, limit)
        if deadline > meta.phase_deadline_ms:
            change.write(metadata_record(group.group_id,
                                         replace_meta(meta, phase_deadline_ms=deadline)))
            change.timers.append(TimerSet(_phase_key(group.group_id), deadline))

    def _join_known(self, group: ClassicGroup, request: JoinRequest, change: _Change,
                    now_ms: int) -> JoinAnswer | Parked:
        member_id = request.member_id
        self._check_instance(group, member_id, request.instance_id)
        member = group.members.get(member_id)
        if member is None:
            raise _ClassicError(ErrorCode.UNKNOWN_MEMBER_ID,
                                f"member {member_id!r} is not in group {group.group_id!r}")
        if member.pending:
            if group.supporting >= self.config.max_size:
                raise _ClassicError(ErrorCode.GROUP_MAX_SIZE_REACHED,
                                    f"group {group.group_id!r} has {self.config.max_size} members")
            return self._add_and_rebalance(group, member_id, request, change, now_ms)
        change.timers.append(TimerSet(_session_key(group.group_id, member_id),
                                      now_ms + request.session_timeout_ms))
        same = member.protocols == protocols_of(request.protocols)
        state = group.state
        if state is ClassicState.PREPARING_REBALANCE:
            self._update_member(group, member_id, request, member, change)
            self._maybe_complete_join(group, change, now_ms)
            return Parked((JOIN, group.group_id, member_id))
        if state is ClassicState.COMPLETING_REBALANCE and same:
            # It did not get its JoinGroup answer: the same one again.
            return self._current_join_answer(group, member_id, skip_assignment=False)
        if state is ClassicState.STABLE and same and member_id != group.meta.leader:
            return self._current_join_answer(group, member_id, skip_assignment=False)
        self._update_member(group, member_id, request, member, change)
        reason = REASON_METADATA_CHANGED if not same else REASON_LEADER_REJOINED
        self._prepare_rebalance(group, change, now_ms, reason)
        return Parked((JOIN, group.group_id, member_id))

    def _update_member(self, group: ClassicGroup, member_id: str, request: JoinRequest,
                       member: ClassicGroupMemberValue, change: _Change) -> None:
        change.write(member_record(group.group_id, member_id, self._member_value(
            request, member, joined_generation=group.generation + 1)))

    def _current_join_answer(self, group: ClassicGroup, member_id: str, *,
                             skip_assignment: bool) -> JoinAnswer:
        meta = group.meta
        leader = meta.leader or ""
        members = self._join_members(group) if member_id == leader else ()
        return JoinAnswer(ErrorCode.NONE, member_id, meta.generation, meta.protocol_type,
                          meta.protocol_name, leader, members, skip_assignment)

    def _join_members(self, group: ClassicGroup) -> tuple[JoinMember, ...]:
        name = group.meta.protocol_name
        return tuple(JoinMember(member_id, member.instance_id, protocol_metadata(member, name))
                     for member_id, member in group.active().items())

    def _replace_static(self, group: ClassicGroup, old_id: str, request: JoinRequest,
                        change: _Change, now_ms: int) -> JoinAnswer | Parked:
        """A known instance id with a new member id: the new one takes the old one's place
        (KIP-345); the old one is fenced."""
        old = group.members[old_id]
        new_id = self.fresh_member_id(request.client_id)
        same = old.protocols == protocols_of(request.protocols)
        state = group.state
        joined = group.generation + 1 if state is ClassicState.PREPARING_REBALANCE \
            else old.joined_generation
        change.write(member_record(group.group_id, old_id, None))
        change.write(member_record(group.group_id, new_id, self._member_value(
            request, old, joined_generation=joined)))
        change.timers.append(TimerCancel(_session_key(group.group_id, old_id)))
        change.timers.append(TimerSet(_session_key(group.group_id, new_id),
                                      now_ms + request.session_timeout_ms))
        change.releases.append(((JOIN, group.group_id, old_id),
                                JoinAnswer(ErrorCode.FENCED_INSTANCE_ID, old_id)))
        change.releases.append(((SYNC, group.group_id, old_id),
                                SyncAnswer(ErrorCode.FENCED_INSTANCE_ID)))
        change.event("classic_static_member_replaced", group, new_id,
                     instance_id=request.instance_id, replaced=old_id)
        was_leader = group.meta.leader == old_id
        if was_leader:
            change.write(metadata_record(group.group_id,
                                         replace_meta(group.meta, leader=new_id)))
        if state is ClassicState.PREPARING_REBALANCE:
            self._maybe_complete_join(group, change, now_ms)
            return Parked((JOIN, group.group_id, new_id))
        if state is ClassicState.STABLE and same and (
                not was_leader or request.skip_assignment_supported):
            # Nothing changed for the group: no rebalance. A new leader is told the
            # members but not to assign again (JoinGroup v9's SkipAssignment).
            return self._current_join_answer(group, new_id, skip_assignment=was_leader)
        self._update_member(group, new_id, request, group.members[new_id], change)
        self._prepare_rebalance(group, change, now_ms, REASON_STATIC_REPLACED)
        return Parked((JOIN, group.group_id, new_id))

    # ------------------------------------------------------------------ phases
    def _prepare_rebalance(self, group: ClassicGroup, change: _Change, now_ms: int,
                           reason: str) -> None:
        state = group.state
        if state is ClassicState.COMPLETING_REBALANCE:
            for member_id in group.members:
                change.releases.append(((SYNC, group.group_id, member_id),
                                        SyncAnswer(ErrorCode.REBALANCE_IN_PROGRESS)))
        delay = self.config.initial_rebalance_delay_ms
        longest = group.max_rebalance_timeout_ms()
        initial = state is ClassicState.EMPTY and delay > 0
        deadline = now_ms + (min(delay, longest) if initial else longest)
        change.write(metadata_record(group.group_id, replace_meta(
            group.meta, state=ClassicState.PREPARING_REBALANCE, phase_started_ms=now_ms,
            phase_deadline_ms=deadline, initial_delay=initial)))
        change.timers.append(TimerSet(_phase_key(group.group_id), deadline))
        change.event("classic_rebalance_started", group, reason=reason,
                     deadline_ms=deadline, initial_delay=initial)
        self._maybe_complete_join(group, change, now_ms)

    def _maybe_complete_join(self, group: ClassicGroup, change: _Change, now_ms: int) -> None:
        if group.state is not ClassicState.PREPARING_REBALANCE or group.meta.initial_delay:
            return
        if len(group.joined()) == len(group.active()):
            self._complete_join(group, change, now_ms)

    def _complete_join(self, group: ClassicGroup, change: _Change, now_ms: int) -> None:
        joined = group.joined()
        for member_id in [m for m in group.active() if m not in joined]:
            self._remove(group, member_id, change, "not_rejoined")
        generation = group.generation + 1
        if not joined:
            self._become_empty(group, change, generation, now_ms)
            return
        protocol = self._select_protocol(joined.values())
        leader = group.meta.leader if group.meta.leader in joined else next(iter(joined))
        deadline = now_ms + group.max_rebalance_timeout_ms()
        change.write(metadata_record(group.group_id, replace_meta(
            group.meta, generation=generation, state=ClassicState.COMPLETING_REBALANCE,
            protocol_name=protocol, leader=leader, phase_started_ms=now_ms,
            phase_deadline_ms=deadline, initial_delay=False)))
        change.timers.append(TimerSet(_phase_key(group.group_id), deadline))
        members = self._join_members(group)
        for member_id, member in joined.items():
            change.releases.append(((JOIN, group.group_id, member_id), JoinAnswer(
                ErrorCode.NONE, member_id, generation, PROTOCOL_TYPE, protocol, leader,
                members if member_id == leader else ())))
            change.timers.append(TimerSet(_session_key(group.group_id, member_id),
                                          now_ms + member.session_timeout_ms))
        change.event("classic_join_completed", group, leader=leader, protocol=protocol,
                     members=len(joined))

    def _become_empty(self, group: ClassicGroup, change: _Change, generation: int,
                      now_ms: int) -> None:
        expire_at = now_ms + self.config.empty_group_retention_ms
        change.write(metadata_record(group.group_id, replace_meta(
            group.meta, generation=generation, state=ClassicState.EMPTY, protocol_name=None,
            leader=None, phase_started_ms=NO_DEADLINE, phase_deadline_ms=expire_at,
            initial_delay=False)))
        change.timers.append(TimerSet(_phase_key(group.group_id), expire_at))
        change.event("classic_group_emptied", group, expire_at_ms=expire_at)

    @staticmethod
    def _select_protocol(members: Iterable[ClassicGroupMemberValue]) -> str:
        """Kafka's vote: among the protocols all support, each member votes for the one it
        prefers; the most votes win (ties: the first member's preference)."""
        listed = list(members)
        candidates = ClassicEngine._candidates(listed) or []
        if not candidates:  # cannot happen: joins are checked against the others
            return listed[0].protocols[0].name
        common = frozenset(candidates)
        votes: Counter[str] = Counter()
        for member in listed:
            votes[next(p.name for p in member.protocols if p.name in common)] += 1
        best = max(votes.values())
        return next(name for name in candidates if votes[name] == best)

    def _remove(self, group: ClassicGroup, member_id: str, change: _Change, why: str) -> None:
        change.write(member_record(group.group_id, member_id, None))
        change.timers.append(TimerCancel(_session_key(group.group_id, member_id)))
        change.releases.append(((JOIN, group.group_id, member_id),
                                JoinAnswer(ErrorCode.UNKNOWN_MEMBER_ID, member_id)))
        change.releases.append(((SYNC, group.group_id, member_id),
                                SyncAnswer(ErrorCode.UNKNOWN_MEMBER_ID)))
        change.event("classic_member_removed", group, member_id, reason=why)

    def _after_removal(self, group: ClassicGroup, change: _Change, now_ms: int,
                       reason: str) -> None:
        state = group.state
        if state is ClassicState.EMPTY:
            return
        if not group.active():
            self._become_empty(group, change, group.generation + 1, now_ms)
        elif state is ClassicState.PREPARING_REBALANCE:
            self._maybe_complete_join(group, change, now_ms)
        else:
            self._prepare_rebalance(group, change, now_ms, reason)

    # ------------------------------------------------------------------ SyncGroup
    def sync(self, request: SyncRequest, now_ms: int) -> Result[SyncAnswer | Parked]:
        if self._bridged(request.group_id):
            bridged: Result[SyncAnswer | Parked] = self.bridge.sync(request, now_ms)
            return bridged
        change = _Change(self.store)
        try:
            response: SyncAnswer | Parked = self._sync(request, change, now_ms)
        except _ClassicError as error:
            response = SyncAnswer(error.code)
        return change.result(response)

    def _member_of(self, group_id: str, member_id: str, instance_id: str | None
                   ) -> tuple[ClassicGroup, ClassicGroupMemberValue]:
        group = self.store.groups.get(group_id)
        if group is None:
            raise _ClassicError(ErrorCode.UNKNOWN_MEMBER_ID, f"no classic group {group_id!r}")
        self._check_instance(group, member_id, instance_id)
        member = group.members.get(member_id)
        if member is None or member.pending:
            raise _ClassicError(ErrorCode.UNKNOWN_MEMBER_ID,
                                f"member {member_id!r} is not in group {group_id!r}")
        return group, member

    def _sync(self, request: SyncRequest, change: _Change, now_ms: int) -> SyncAnswer | Parked:
        group, member = self._member_of(request.group_id, request.member_id,
                                        request.instance_id)
        meta = group.meta
        if request.generation != meta.generation:
            raise _ClassicError(ErrorCode.ILLEGAL_GENERATION,
                                f"generation {request.generation}, the group is at "
                                f"{meta.generation}")
        if (request.protocol_type is not None and request.protocol_type != meta.protocol_type
                or request.protocol_name is not None
                and request.protocol_name != meta.protocol_name):
            raise _ClassicError(ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
                                "protocol type or name differs from the group's")
        change.timers.append(TimerSet(_session_key(group.group_id, request.member_id),
                                      now_ms + member.session_timeout_ms))
        state = group.state
        if state is ClassicState.PREPARING_REBALANCE:
            raise _ClassicError(ErrorCode.REBALANCE_IN_PROGRESS, "a join phase is in progress")
        if state is ClassicState.EMPTY:
            raise _ClassicError(ErrorCode.UNKNOWN_MEMBER_ID, "the group is empty")
        if state is ClassicState.COMPLETING_REBALANCE and request.member_id == meta.leader:
            return self._install(group, request, change)
        if member.synced_generation != meta.generation:
            change.write(member_record(group.group_id, request.member_id, replace_member(
                member, synced_generation=meta.generation)))
        if state is ClassicState.COMPLETING_REBALANCE:
            return Parked((SYNC, group.group_id, request.member_id))
        if not group.awaiting_sync() and meta.phase_deadline_ms != NO_DEADLINE:
            change.write(metadata_record(group.group_id, replace_meta(
                group.meta, phase_deadline_ms=NO_DEADLINE)))
            change.timers.append(TimerCancel(_phase_key(group.group_id)))
        return self._assignment_answer(group, request.member_id)

    def _assignment_answer(self, group: ClassicGroup, member_id: str) -> SyncAnswer:
        member = group.members[member_id]
        assignment = member.assignment \
            if member.assignment_generation == group.generation else b""
        return SyncAnswer(ErrorCode.NONE, group.meta.protocol_type, group.meta.protocol_name,
                          assignment)

    def _install(self, group: ClassicGroup, request: SyncRequest, change: _Change) -> SyncAnswer:
        """The leader's SyncGroup: every member's assignment, verbatim."""
        generation = group.generation
        given = dict(request.assignments)
        for member_id, member in list(group.active().items()):
            synced = generation if member_id == request.member_id else member.synced_generation
            change.write(member_record(group.group_id, member_id, replace_member(
                member, assignment_generation=generation, assignment=given.get(member_id, b""),
                synced_generation=synced)))
        waiting = group.awaiting_sync()
        change.write(metadata_record(group.group_id, replace_meta(
            group.meta, state=ClassicState.STABLE,
            phase_deadline_ms=group.meta.phase_deadline_ms if waiting else NO_DEADLINE)))
        if not waiting:
            change.timers.append(TimerCancel(_phase_key(group.group_id)))
        for member_id, member in group.active().items():
            if member_id != request.member_id and member.synced_generation == generation:
                change.releases.append(((SYNC, group.group_id, member_id),
                                        self._assignment_answer(group, member_id)))
        change.event("classic_group_stable", group, leader=request.member_id,
                     assigned=len(given))
        return self._assignment_answer(group, request.member_id)

    # ------------------------------------------------------------------ Heartbeat
    def heartbeat(self, request: HeartbeatRequest, now_ms: int) -> Result[HeartbeatAnswer]:
        if self._bridged(request.group_id):
            bridged: Result[HeartbeatAnswer] = self.bridge.heartbeat(request, now_ms)
            return bridged
        change = _Change(self.store)
        try:
            group, member = self._member_of(request.group_id, request.member_id,
                                            request.instance_id)
            if group.state is ClassicState.EMPTY:
                raise _ClassicError(ErrorCode.UNKNOWN_MEMBER_ID, "the group is empty")
            if request.generation != group.generation:
                raise _ClassicError(ErrorCode.ILLEGAL_GENERATION, "stale generation")
            change.timers.append(TimerSet(_session_key(group.group_id, request.member_id),
                                          now_ms + member.session_timeout_ms))
            code = ErrorCode.REBALANCE_IN_PROGRESS \
                if group.state is ClassicState.PREPARING_REBALANCE else ErrorCode.NONE
            return change.result(HeartbeatAnswer(code))
        except _ClassicError as error:
            return change.result(HeartbeatAnswer(error.code))

    # ------------------------------------------------------------------ LeaveGroup
    def leave(self, request: LeaveRequest, now_ms: int) -> Result[LeaveAnswer]:
        if self._bridged(request.group_id):
            bridged: Result[LeaveAnswer] = self.bridge.leave(request, now_ms)
            return bridged
        change = _Change(self.store)
        group = self.store.groups.get(request.group_id)
        if group is None:
            return change.result(LeaveAnswer(ErrorCode.UNKNOWN_MEMBER_ID, tuple(
                (member_id, instance_id, ErrorCode.UNKNOWN_MEMBER_ID)
                for member_id, instance_id in request.members)))
        answers: list[tuple[str, str | None, int]] = []
        removed_active = False
        for member_id, instance_id in request.members:
            target = member_id
            code = ErrorCode.NONE
            if instance_id is not None:
                owner = group.instances.get(instance_id)
                if owner is None:
                    code = ErrorCode.UNKNOWN_MEMBER_ID
                elif member_id and owner != member_id:
                    code = ErrorCode.FENCED_INSTANCE_ID
                else:
                    target = owner
            elif member_id not in group.members:
                code = ErrorCode.UNKNOWN_MEMBER_ID
            if code == ErrorCode.NONE:
                removed_active |= not group.members[target].pending
                self._remove(group, target, change, "leave")
            answers.append((member_id, instance_id, code))
        if removed_active:
            self._after_removal(group, change, now_ms, REASON_MEMBER_LEFT)
        top = answers[0][2] if len(answers) == 1 else ErrorCode.NONE
        return change.result(LeaveAnswer(top, tuple(answers)))

    # ------------------------------------------------------------------ timers
    def on_timer(self, key: TimerKey, now_ms: int) -> Result[None]:
        kind, group_id, member_id = key
        group = self.store.groups.get(group_id)
        if group is not None and kind == CLASSIC_PHASE_TIMER \
                and group.state is ClassicState.EMPTY:
            return self._empty_phase_ended(group, now_ms)
        change = _Change(self.store)
        if group is None:
            return change.result(None)
        if kind == CLASSIC_PHASE_TIMER:
            self._phase_ended(group, change, now_ms)
        elif kind == CLASSIC_SESSION_TIMER:
            self._session_expired(group, member_id, change, now_ms)
        return change.result(None)

    def _empty_phase_ended(self, group: ClassicGroup, now_ms: int) -> Result[None]:
        """An empty group's deadline: it expires, with its settings (records of the
        coordinator's store, hence a change on it); one without a deadline (emptied
        before empty groups expired) is given one now."""
        change = _Change(self.connect_records)
        deadline = group.meta.phase_deadline_ms
        if deadline == NO_DEADLINE:
            deadline = now_ms + self.config.empty_group_retention_ms
            change.write(metadata_record(group.group_id, replace_meta(
                group.meta, phase_deadline_ms=deadline)))
        if now_ms < deadline:
            change.timers.append(TimerSet(_phase_key(group.group_id), deadline))
            return change.result(None)
        change.event("group_expired", group, pending_members=len(group.members),
                     retention_ms=self.config.empty_group_retention_ms)
        self.delete_empty(group.group_id, change)
        return change.result(None)

    def _phase_ended(self, group: ClassicGroup, change: _Change, now_ms: int) -> None:
        deadline = group.meta.phase_deadline_ms
        if deadline == NO_DEADLINE:
            return  # a stale timer (the phase ended otherwise)
        if now_ms < deadline:
            change.timers.append(TimerSet(_phase_key(group.group_id), deadline))
            return
        if group.state is ClassicState.PREPARING_REBALANCE:
            self._complete_join(group, change, now_ms)
        elif group.state in (ClassicState.COMPLETING_REBALANCE, ClassicState.STABLE):
            late = group.awaiting_sync()  # (in CompletingRebalance: the leader too)
            for member_id in late:
                self._remove(group, member_id, change, "sync_timeout")
            if late:
                self._after_removal(group, change, now_ms, REASON_SYNC_TIMEOUT)
            if group.state is ClassicState.STABLE and group.meta.phase_deadline_ms != NO_DEADLINE:
                change.write(metadata_record(group.group_id, replace_meta(
                    group.meta, phase_deadline_ms=NO_DEADLINE)))

    def _session_expired(self, group: ClassicGroup, member_id: str, change: _Change,
                         now_ms: int) -> None:
        member = group.members.get(member_id)
        if member is None:
            return
        state = group.state
        parked = (
            state is ClassicState.PREPARING_REBALANCE and not member.pending
            and member.joined_generation == group.generation + 1
        ) or (
            state is ClassicState.COMPLETING_REBALANCE
            and member.synced_generation == group.generation
        )
        if parked:
            # Waiting on the group, not silent: the phase's own deadline bounds it.
            change.timers.append(TimerSet(_session_key(group.group_id, member_id),
                                          now_ms + member.session_timeout_ms))
            return
        self._remove(group, member_id, change,
                     "pending_timeout" if member.pending else "session_timeout")
        if not member.pending:
            self._after_removal(group, change, now_ms, REASON_SESSION_TIMEOUT)
        elif (not group.members and group.generation == 0
              and not self.has_settings(group.group_id)):
            # A group that only ever had pending members goes with the last of them, as
            # it came: such joins must not hold places in the group limit for a retention.
            change.event("group_expired", group, reason="no_member_joined")
            change.write(metadata_record(group.group_id, None))
            change.timers.append(TimerClearGroup(group.group_id))

    # ------------------------------------------------------------------ views
    def describe_snapshot(self, group_id: str) -> describing.ClassicSnapshot:
        """A classic group as ConnectGroupDescribe (version 1+) shows it."""
        group = self.store.groups[group_id]
        members = tuple(
            describing.ClassicMemberSnapshot(view.member_id, view.instance_id, view.worker_url,
                                             view.joined_generation, view.synced_generation,
                                             view.holds)
            for view in sorted(member_views(group), key=lambda view: view.member_id))
        return describing.ClassicSnapshot(group_id, group.state.name, group.meta.generation,
                                          group.meta.protocol_name, members,
                                          tuple(sorted(group.pending())))

    def describe(self, group_id: str) -> DescribedClassicGroup | None:
        group = self.store.groups.get(group_id)
        if group is None:
            return None
        meta = group.meta
        stable = group.state is ClassicState.STABLE
        members = tuple(
            DescribedClassicMember(
                member_id, member.instance_id, member.client_id, member.client_host,
                protocol_metadata(member, meta.protocol_name),
                member.assignment if stable and member.assignment_generation
                == meta.generation else b"")
            for member_id, member in group.active().items())
        return DescribedClassicGroup(group_id, group.state.label, meta.protocol_type,
                                     meta.protocol_name or "", meta.generation, meta.leader,
                                     members)
