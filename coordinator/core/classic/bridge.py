"""Classic members in a connect group: JoinGroup/SyncGroup/Heartbeat/LeaveGroup told as
the connect engine's own requests, and its answers told back in Connect's classic terms.

Theory of operation. A classic member is a connect-group member like any other; the
bridge only translates, through the connect engine's public operations (heartbeat,
prepare, install), so revoke-before-assign, fencing and durability are the engine's:

- JoinGroup (v4+ without a member id and without an instance id: MEMBER_ID_REQUIRED and a
  fresh id first) is a join at epoch 0 for a member the group does not know, else a
  heartbeat at the member's epoch whose owned units are the `allocation` of its Connect
  metadata (version 0, eager: nothing) and whose client assignor is its protocols
  (`sessioned`/`compatible`: incremental-cooperative 1-2 or 1-1, `default`: eager 0).
  New metadata bytes are new assignor metadata: the group epoch moves. The answer is
  sent once the records are durable and, while a round is pending, once every bridged
  member expected in it has rejoined (a broker's join barrier, bounded by
  `group.connect.classic.join.wait.ms` and half the member's session): every JoinGroup
  of the round is answered at once, and the workers' heartbeats, timed from that
  answer, keep in step. Its generation is the member epoch; it is answered as leader,
  with every member's metadata (its allocation being what the coordinator knows it
  holds), only when it is the worker chosen to compute a client-side assignment.
- The chosen worker's SyncGroup is its Install for the group epoch Prepare handed out:
  each member's part is the allocation the leader was shown (what the member held when
  Prepare was answered) minus what it revokes plus what it is granted, so a unit a
  member was granted since and the leader gave to another is released before it moves.
  An invalid one changes nothing; its sender is told REBALANCE_IN_PROGRESS.
- Any other member's SyncGroup waits while the chosen worker computes (as a broker's
  followers wait for their leader's SyncGroup), unless it has units to release or to
  start, bounded by `group.connect.classic.sync.wait.ms` and half its session: the
  install answers it with its part, so a leader's successor reaches every worker in one
  round.
- Every SyncGroup is answered with the member's reconciled assignment in Connect's
  incremental form: the units granted beyond its allocation and the ones to revoke now
  (version 0: the whole set), the group's Connect leader, the highest config offset.
- Heartbeat answers REBALANCE_IN_PROGRESS when the member must rejoin to make progress:
  it must release units, a newer epoch waits for it, what it may run changed, another
  worker computes the next assignment, or it was chosen to compute it.
- The chosen worker assigns in every round it completes, as a broker's leader does:
  Connect's assignor forgets its previous assignment (and the delay that holds a
  departed worker's units back) after a round it completed without assigning. So its
  JoinGroup computes a pending assignment inside the assignment interval, any other
  JoinGroup of it starts a new one (a new reason), and the epoch its own install moved
  it to does not call it back. Which worker that is survives a restart: the engine asks
  the one the current target names as its leader (`computed_by`) while it is a member.
- LeaveGroup is a leave (epoch -1; -2 for a static member, which keeps its units for its
  session).

What the bridge keeps of a member (its protocol, its last allocation, what it was last
told) is a record of its own (`ClassicBridgeMember`), so it survives a restart.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from coordinator.connect_protocol import (
    EAGER_VERSION,
    PROTOCOL_VERSIONS,
    ConnectAssignment,
    ConnectProtocolError,
    WorkerMetadata,
    decode_assignment,
    decode_worker_metadata,
    encode_assignment,
    encode_worker_metadata,
)
from coordinator.core.classic.engine import (
    JOIN,
    PROTOCOL_TYPE,
    SYNC,
    HeartbeatAnswer,
    HeartbeatRequest,
    JoinAnswer,
    JoinMember,
    JoinRequest,
    LeaveAnswer,
    LeaveRequest,
    Parked,
    SyncAnswer,
    SyncRequest,
)
from coordinator.core.classic.state import ClassicStore, bridge_record
from coordinator.core.group import computed_by, units_to_wire
from coordinator.core.reconcile import MemberState
from coordinator.core.result import (
    SESSION_TIMER,
    Event,
    Result,
    TimerCancel,
    TimerOp,
    TimerSet,
)
from coordinator.units import Unit
from protocol.errors import ErrorCode
from protocol.messages import (
    ClassicBridgeMemberValue,
    ConnectGroupHeartbeatRequest,
    ConnectGroupInstallAssignmentRequest,
    ConnectGroupPrepareAssignmentRequest,
)
from protocol.messages.connect_group_heartbeat_request import ClientAssignor
from protocol.messages.connect_group_install_assignment_request import MemberAssignment

if TYPE_CHECKING:
    from coordinator.core.coordinator import GroupCoordinator

INCREMENTAL_COOPERATIVE = "incremental-cooperative"
# A SyncGroup that waits for the chosen worker's assignment has waited as long as it may.
SYNC_WAIT_TIMER = "classic_sync_wait"
# The chosen worker's JoinGroup has waited as long as it may for the others to rejoin.
JOIN_WAIT_TIMER = "classic_join_wait"
EAGER = "eager"
MAX_REASON = 127  # the reason is an int8; 0 is "nothing asked"
NO_UNITS: frozenset[Unit] = frozenset()

# The connect engine's errors told in classic terms.
_JOIN_ERRORS = {
    ErrorCode.FENCED_MEMBER_EPOCH: ErrorCode.UNKNOWN_MEMBER_ID,
    ErrorCode.UNRELEASED_INSTANCE_ID: ErrorCode.FENCED_INSTANCE_ID,
    ErrorCode.UNSUPPORTED_ASSIGNOR: ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
    ErrorCode.INVALID_REQUEST: ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
}


def _merge(results: list[Result[Any]], response: Any) -> Result[Any]:
    """One result for changes made one after the other (each already applied)."""
    if len(results) == 1:  # a heartbeat's: its lists as they are
        only = results[0]
        return Result(response, only.records, only.timers, only.events, only.undo, only.jobs,
                      only.releases)
    merged: Result[Any] = Result(response)
    for result in results:
        merged.records.extend(result.records)
        merged.timers.extend(result.timers)
        merged.events.extend(result.events)
        merged.jobs.extend(result.jobs)
        merged.releases.extend(result.releases)
    for result in reversed(results):  # undo: newest first
        merged.undo.extend(result.undo)
    return merged


def _client_assignors(protocols: tuple[tuple[str, bytes], ...], reason: int = 0
                      ) -> tuple[ClientAssignor, ...]:
    """A classic member's protocols as the client assignors it counts as listing; `reason`
    stands for its rebalance requests (see `ClassicBridge._reason`)."""
    versions = [PROTOCOL_VERSIONS[name] for name, _ in protocols if name in PROTOCOL_VERSIONS]
    metadata = {PROTOCOL_VERSIONS[name]: _assignor_part(data) for name, data in protocols
                if name in PROTOCOL_VERSIONS}
    assignors = []
    cooperative = sorted(v for v in versions if v >= 1)
    if cooperative:
        top = cooperative[-1]
        assignors.append(ClientAssignor(name=INCREMENTAL_COOPERATIVE, minimum_version=1,
                                        maximum_version=top, reason=reason, version=top,
                                        metadata=metadata[top]))
    if EAGER_VERSION in versions:
        assignors.append(ClientAssignor(name=EAGER, minimum_version=0, maximum_version=0,
                                        reason=reason, version=0,
                                        metadata=metadata[EAGER_VERSION]))
    return tuple(assignors)


def _assignor_part(data: bytes) -> bytes:
    """Connect metadata as an assignor input: its version, url and config offset, with an
    empty allocation. Connect sends its whole last assignment as its allocation; what it
    runs of that reaches the engine as the units it owns (the leader is shown those,
    `_leader_view`), and the rest (leader, offset, revoked units, delay) is what it was
    told. Neither is new metadata: a rejoin after a grant or a revocation would otherwise
    move the group epoch again inside the round it is part of, one more round each (a
    revocation's second round comes from the release: `units_released`). Bytes that do
    not decode are kept as they are."""
    try:
        decoded = decode_worker_metadata(data)
    except ConnectProtocolError:
        return data
    if decoded.version < 1 or decoded.allocation is None:
        return data
    return encode_worker_metadata(WorkerMetadata(decoded.version, decoded.url,
                                                 decoded.config_offset,
                                                 ConnectAssignment(decoded.allocation.version)))


def _units_bytes(units: frozenset[Unit]) -> bytes:
    return encode_assignment(ConnectAssignment(1, assigned=units)) if units else b""


# At most this many assignments' units are remembered (about one per bridged member).
TOLD_MEMO_ENTRIES = 100_000


def _units_of(blob: bytes) -> frozenset[Unit]:
    return decode_assignment(blob).assigned if blob else NO_UNITS


class ClassicBridge:
    """Classic members of connect groups; see the module docstring."""

    def __init__(self, core: GroupCoordinator, store: ClassicStore) -> None:
        self.core = core
        self.store = store
        # The units of each `told` assignment seen, by its bytes: a stable heartbeat
        # compares them with what the member holds, and decoding them each time was most
        # of the bridge's cost of a heartbeat. A pure function's memo, not state: bytes
        # never change, so nothing replayed or rolled back can make it wrong.
        self._told_units: dict[bytes, frozenset[Unit]] = {}
        # The config offset in each member metadata seen, by its bytes, the same kind of
        # memo: every SyncGroup answer names the highest one of the group, and decoding
        # every member's metadata for it made a SyncGroup in a group of 1,000 cost ~20 ms.
        self._config_offsets: dict[bytes, int] = {}
        # Per group: (the group, its metadata and target versions, `_highest_offsets`,
        # `computed_by`).
        self._leaders: dict[str, tuple[Any, tuple[int, int], tuple[int, str, str] | None,
                                       int, str | None]] = {}
        # SyncGroups waiting for the assignment the chosen worker is computing, by group
        # and member: (the generation they were sent with, until when they wait).
        # Requests in flight, as the shell's parked ones are: a restart drops both (their
        # connections are gone), and a rolled-back change puts back the ones it answered
        # (`restore_parked`).
        self._parked: dict[str, dict[str, tuple[int, int]]] = {}
        # JoinGroups held until every bridged member expected in the round has rejoined
        # (a broker's join barrier), by group and member: (its protocol, until when). In
        # flight, as above.
        self._held_joins: dict[str, dict[str, tuple[str, int]]] = {}
        # By group, while a round is pending: the bridged members that rejoined in it, and
        # the ones the held JoinGroups still wait for; forgotten when the round ends.
        self._rejoined: dict[str, set[str]] = {}
        self._awaited: dict[str, set[str]] = {}

    def _config_offset(self, metadata: bytes) -> int:
        """The config offset in Connect worker metadata (ConnectProtocolError if bad)."""
        offset = self._config_offsets.get(metadata)
        if offset is None:
            if len(self._config_offsets) >= TOLD_MEMO_ENTRIES:
                self._config_offsets.clear()
            offset = decode_worker_metadata(metadata).config_offset
            self._config_offsets[metadata] = offset
        return offset

    def _told(self, blob: bytes) -> frozenset[Unit]:
        units = self._told_units.get(blob)
        if units is None:
            if len(self._told_units) >= TOLD_MEMO_ENTRIES:
                self._told_units.clear()  # members come and go: start again
            units = self._told_units[blob] = _units_of(blob)
        return units

    def handles(self, group_id: str) -> bool:
        return group_id in self.core.store.groups

    # ------------------------------------------------------------------ JoinGroup
    def join(self, request: JoinRequest, now_ms: int) -> Result[JoinAnswer]:
        member_id = request.member_id
        if request.protocol_type != PROTOCOL_TYPE:
            return Result(JoinAnswer(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, member_id))
        preferred = next(((name, data) for name, data in request.protocols
                          if name in PROTOCOL_VERSIONS), None)
        if preferred is None:
            return Result(JoinAnswer(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, member_id))
        try:
            metadata = decode_worker_metadata(preferred[1])
        except ConnectProtocolError as error:
            return Result(JoinAnswer(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, member_id),
                          events=[Event("classic_join_refused", request.group_id,
                                        member_id or None, {"reason": str(error)})])
        if not member_id:
            # (the classic engine's generator: one source of ids, replaceable in tests)
            member_id = self.core.classic.fresh_member_id(request.client_id)
            if request.instance_id is None and request.require_known_member_id:
                return Result(JoinAnswer(ErrorCode.MEMBER_ID_REQUIRED, member_id))
        group = self.core.store.groups.get(request.group_id)
        known = group.members.get(member_id) if group is not None else None
        previous = self.store.bridged.get((request.group_id, member_id))
        allocation = metadata.allocation.assigned \
            if metadata.allocation is not None and metadata.version >= 1 else NO_UNITS
        results: list[Result[Any]] = []
        heartbeat = ConnectGroupHeartbeatRequest(
            group_id=request.group_id, member_id=member_id,
            member_epoch=known.current.epoch if known is not None else 0,
            instance_id=request.instance_id, worker_url=metadata.url or "unknown",
            rebalance_timeout_ms=request.rebalance_timeout_ms,
            client_assignors=_client_assignors(
                request.protocols, self._reason(group, known, previous, now_ms)),
            owned_connectors_and_tasks=units_to_wire(allocation) if known is not None
            else None)
        # A JoinGroup is the chosen worker's only moment to assign in its round: it is
        # asked to whenever an assignment is pending, the assignment interval or not.
        result = self.core.heartbeat(heartbeat, now_ms, compute_now=True)
        results.append(result)
        code = ErrorCode(result.response.error_code)
        if code not in (ErrorCode.NONE, ErrorCode.COMPUTE_ASSIGNMENT):
            return _merge(results, JoinAnswer(_JOIN_ERRORS.get(code, code), member_id))
        epoch = int(result.response.member_epoch)
        protocol = self._protocol_name(request.group_id, request.protocols)
        # An eager worker stopped everything to rejoin: it runs nothing it was told before.
        eager = PROTOCOL_VERSIONS.get(protocol) == EAGER_VERSION
        bridged = ClassicBridgeMemberValue(
            protocol_name=protocol, session_timeout_ms=request.session_timeout_ms,
            config_offset=metadata.config_offset, allocation=_units_bytes(allocation),
            told_epoch=previous.told_epoch if previous else -1,
            told=previous.told if previous and not eager else b"")
        record = bridge_record(request.group_id, member_id, bridged)
        bridge_change: Result[Any] = Result(None, [record],
                                            undo=[self.store.current_record(record.key)])
        self.store.replay(record)
        results.append(bridge_change)
        for event in result.events:  # logged before its bridge record existed
            if event.member_id == member_id:
                event.fields["protocol"] = "classic"
                event.fields["classic_protocol"] = protocol
        self._own_session(result, request.group_id, member_id, request.session_timeout_ms,
                          now_ms)
        joined = self.core.store.groups[request.group_id]
        results.extend(self._release_stale(joined, now_ms))  # (held in vain: answer first)
        held = self._hold_join(joined, member_id, protocol, request.session_timeout_ms,
                               now_ms)
        if held is not None:
            results.append(held)
            return _merge(results, Parked((JOIN, request.group_id, member_id)))
        # The last of the round: the held JoinGroups are answered with this one.
        results.extend(self._release_joins(request.group_id, now_ms))
        leader, members = "", tuple[JoinMember, ...]()
        if code == ErrorCode.COMPUTE_ASSIGNMENT:
            leader, members = self._prepare(joined, member_id, epoch, results, now_ms)
        return _merge(results, JoinAnswer(ErrorCode.NONE, member_id, epoch, PROTOCOL_TYPE,
                                          protocol, leader, members))

    def _prepare(self, group: Any, member_id: str, epoch: int, results: list[Result[Any]],
                 now_ms: int) -> tuple[str, tuple[JoinMember, ...]]:
        """Prepare for the chosen worker: (the leader to name, every member's metadata),
        or a follower's answer ("", ()) when the engine does not hand it out."""
        prepared = self.core.prepare_assignment(ConnectGroupPrepareAssignmentRequest(
            group_id=group.group_id, member_id=member_id, member_epoch=epoch), now_ms)
        results.append(prepared)
        if prepared.response.error_code != ErrorCode.NONE:
            return "", ()
        return member_id, tuple(self._leader_view(group.group_id, m)
                                for m in prepared.response.members)

    # ------------------------------------------------------------------ the join barrier
    def _hold_join(self, group: Any, member_id: str, protocol: str, session_ms: int,
                   now_ms: int) -> Result[None] | None:
        """Hold a JoinGroup of a pending round while some bridged member expected in it
        has not rejoined (its timer set), or None: answer it now.

        As on a broker, every worker's JoinGroup in a round is then answered at the same
        moment, the assignment is computed from everyone's fresh metadata and reaches
        them with the install; and since each Connect worker times its heartbeats from
        its JoinGroup's answer, their heartbeats keep in step: the next rebalance is heard
        of by all at once (a leader bounce waits for one heartbeat, not for the later of
        two drawn apart). Expected: every bridged member, each told at its heartbeat to
        rejoin. One that must release units is not held (it is told so at once, revoke
        before assign), and counts as rejoined only when it comes back having released
        them, as on a broker: the assignment is then computed from what members hold, not
        from units still on their way out (computed from those, each assignment would
        move what the last one left behind, round after round)."""
        group_id = group.group_id
        if not self._install_awaited(group):
            return None
        member = group.members.get(member_id)
        if member is None or member.current.state is MemberState.UNREVOKED:
            return None
        self._rejoined.setdefault(group_id, set()).add(member_id)
        wait_ms = min(self.core.config.classic_join_wait_ms, session_ms // 2)
        # (without the SyncGroup wait the others are not told to rejoin while it computes)
        if wait_ms <= 0 or self.core.config.classic_sync_wait_ms <= 0:
            return None
        awaited = self._awaited.get(group_id)
        if awaited is None:
            awaited = self._awaited[group_id] = self._expected(group)
        if not self._still_awaited(group, awaited):
            return None
        self._held_joins.setdefault(group_id, {})[member_id] = (protocol, now_ms + wait_ms)
        return Result(None, timers=[TimerSet((JOIN_WAIT_TIMER, group_id, member_id),
                                             now_ms + wait_ms)])

    def _expected(self, group: Any) -> set[str]:
        """The bridged members a pending round waits for (see `_hold_join`)."""
        group_id = group.group_id
        # (a member whose SyncGroup waits cannot rejoin before it is answered)
        done = self._rejoined.get(group_id, set()) | set(self._parked.get(group_id, ()))
        return {member_id for member_id in group.members
                if member_id not in done and (group_id, member_id) in self.store.bridged}

    def _still_awaited(self, group: Any, awaited: set[str]) -> bool:
        """Whether a member the round waits for has not rejoined yet; the ones that have,
        or went, are crossed off (the first still awaited ends the look: O(1) a call)."""
        rejoined = self._rejoined.get(group.group_id, set())
        parked = self._parked.get(group.group_id, {})  # (answered by the install)
        for member_id in list(awaited):
            if member_id in group.members and member_id not in rejoined \
                    and member_id not in parked \
                    and (group.group_id, member_id) in self.store.bridged:
                return True
            awaited.discard(member_id)
        return False

    def _maybe_release_joins(self, group: Any, now_ms: int) -> list[Result[Any]]:
        """Answer the held JoinGroups once no member the round waits for is left, or at
        once when the round is no longer pending."""
        if not self._held_joins.get(group.group_id):
            return []
        if self._install_awaited(group) \
                and self._still_awaited(group, self._awaited.get(group.group_id, set())):
            return []
        return self._release_joins(group.group_id, now_ms)

    def _release_joins(self, group_id: str, now_ms: int) -> list[Result[Any]]:
        """Answer every held JoinGroup of the group: the chosen worker's as the leader with
        every member's metadata while the round is still its to compute, the others' as
        followers, a member's that is gone UNKNOWN_MEMBER_ID."""
        self._awaited.pop(group_id, None)
        held = self._held_joins.pop(group_id, {})
        group = self.core.store.groups.get(group_id)
        results: list[Result[Any]] = []
        for member_id, (protocol, _until) in held.items():
            cancel = TimerCancel((JOIN_WAIT_TIMER, group_id, member_id))
            member = group.members.get(member_id) if group is not None else None
            if group is None or member is None:
                results.append(Result(None, timers=[cancel], releases=[
                    ((JOIN, group_id, member_id), JoinAnswer(ErrorCode.UNKNOWN_MEMBER_ID,
                                                             member_id))]))
                continue
            epoch = member.current.epoch
            leader, members = "", tuple[JoinMember, ...]()
            if group.chosen_member == member_id and self._install_awaited(group):
                leader, members = self._prepare(group, member_id, epoch, results, now_ms)
            answer = JoinAnswer(ErrorCode.NONE, member_id, epoch, PROTOCOL_TYPE, protocol,
                                leader, members)
            results.append(Result(None, timers=[cancel, *self._session_from_now(
                group_id, member_id, now_ms)], releases=[((JOIN, group_id, member_id), answer)]))
        return results

    def _session_from_now(self, group_id: str, member_id: str, now_ms: int
                          ) -> list[TimerSet]:
        """A held request is answered or a SyncGroup comes: the member's session starts
        again (as a broker's does when a join completes or a SyncGroup arrives), since
        its heartbeats wait behind that request on its connection."""
        bridged = self.store.bridged.get((group_id, member_id))
        if bridged is None:
            return []
        return [TimerSet((SESSION_TIMER, group_id, member_id),
                         now_ms + bridged.session_timeout_ms)]

    def on_join_wait_timer(self, group_id: str, member_id: str, now_ms: int) -> Result[None]:
        """A held JoinGroup waited as long as it may: the round goes on with the members
        that rejoined (every held JoinGroup is answered; the others hear of the
        assignment at their next heartbeat)."""
        if member_id not in self._held_joins.get(group_id, {}):
            return Result(None)
        return _merge(self._release_joins(group_id, now_ms) or [Result(None)], None)

    @classmethod
    def _reason(cls, group: Any, known: Any, bridged: ClassicBridgeMemberValue | None,
                now_ms: int) -> int:
        """The reason its client assignors carry. A new reason is new assignor metadata:
        the group epoch rises and the chosen worker assigns again. Two rejoins get one:

        - the chosen worker's, when no assignment is pending: Connect's assignor keeps
          its previous assignment (what holds a departed worker's units back for its
          scheduled delay) only while the worker assigned in every round it completed,
          as a broker's leader does; a round it completed without assigning would make
          it forget and rebalance from scratch, revoking from the others;
        - a worker's rejoin when the `delay` it was told is over, for its leader to hand
          out the units it held back (a broker takes that JoinGroup as a new rebalance),
          when the coordinator did not ask for it (the group settled at its epoch).

        Otherwise the reason stays (any other change of metadata moves the epoch
        anyway)."""
        if known is None or known.metadata is None:
            return 0
        reason = max((a.reason for a in known.metadata.client_assignors), default=0)
        if group.epoch == group.assignment_epoch and (
                group.chosen_member == known.member_id
                or group.chosen_member is None and cls._ran_last_assignment(group, known)):
            return reason % MAX_REASON + 1
        current = known.current
        settled = (
            bridged is not None
            and group.epoch == group.assignment_epoch == current.epoch == bridged.told_epoch
            and current.state is MemberState.STABLE)
        if settled and cls._delay_left(group, known.member_id, now_ms) == 1:
            return reason % MAX_REASON + 1
        return reason

    @staticmethod
    def _ran_last_assignment(group: Any, member: Any) -> bool:
        """Whether the member computed the group's current target, as the target says
        (`computed_by`: what the engine's choice of worker falls back on after a
        restart or a rolled-back write)."""
        return bool(computed_by(group) == member.member_id)

    @staticmethod
    def _own_session(result: Result[Any], group_id: str, member_id: str, timeout_ms: int,
                     now_ms: int) -> None:
        """A classic member's session is the one its JoinGroup asked for: its session
        timer, armed by the heartbeat at the group's timeout, is moved to its own (in
        place: one timer operation, not two)."""
        key = (SESSION_TIMER, group_id, member_id)
        timers = result.timers
        for index, op in enumerate(timers):
            if isinstance(op, TimerSet) and op.key == key:
                timers[index] = TimerSet(key, now_ms + timeout_ms)

    def _leader_view(self, group_id: str, prepared: Any) -> JoinMember:
        """A member's metadata for the leader, its allocation being what it held when
        Prepare was answered (what the leader's SyncGroup is read against)."""
        group = self.core.store.groups[group_id]
        shown = group.prepared.held if group.prepared is not None else {}
        held = shown.get(prepared.member_id, NO_UNITS)
        data = prepared.assignor.metadata
        try:
            metadata = decode_worker_metadata(data)
            if metadata.version >= 1:
                allocation = ConnectAssignment(metadata.version, assigned=held)
                data = encode_worker_metadata(WorkerMetadata(
                    metadata.version, metadata.url, metadata.config_offset, allocation))
        except ConnectProtocolError:
            pass  # told as the member sent it
        return JoinMember(prepared.member_id, prepared.instance_id, data)

    def _protocol_name(self, group_id: str, protocols: tuple[tuple[str, bytes], ...]) -> str:
        """The protocol of the group's assignor and version, as the member knows it."""
        group = self.core.store.groups.get(group_id)
        names = [name for name, _ in protocols if name in PROTOCOL_VERSIONS]
        if group is not None:
            _, assignor = self.core._group_mode(group)  # the engine's choice of assignor
            if assignor == EAGER and "default" in names:
                return "default"
            if assignor == INCREMENTAL_COOPERATIVE:
                lowest_top = self.core.lowest_top_version(group, INCREMENTAL_COOPERATIVE, 2)
                for name in names:
                    if 1 <= PROTOCOL_VERSIONS[name] <= lowest_top:
                        return name
        return names[0]

    # ------------------------------------------------------------------ SyncGroup
    def sync(self, request: SyncRequest, now_ms: int) -> Result[SyncAnswer | Parked]:
        group = self.core.store.groups.get(request.group_id)
        member = group.members.get(request.member_id) if group is not None else None
        bridged = self.store.bridged.get((request.group_id, request.member_id))
        if group is None or member is None or bridged is None:
            return Result(SyncAnswer(ErrorCode.UNKNOWN_MEMBER_ID))
        prepared = group.prepared
        installs = group.chosen_member == request.member_id and prepared is not None
        # A SyncGroup carries its JoinGroup's generation. The member's epoch may have moved
        # on since (an install in between took what it released): the answer tells what it
        # may run now, so that generation is as good, and refusing it would cost a round.
        # The worker that installs must sync at its epoch: its assignment is for it.
        if request.generation > member.current.epoch \
                or (installs and request.generation != member.current.epoch):
            return Result(SyncAnswer(ErrorCode.ILLEGAL_GENERATION))
        results: list[Result[Any]] = []
        if installs and prepared is not None:
            installed = self._install(group, request, prepared.group_epoch, now_ms)
            results.append(installed)
            if installed.response is not None:
                return _merge(results, SyncAnswer(ErrorCode.REBALANCE_IN_PROGRESS))
            # The assignment is in: the SyncGroups that waited for it are answered with it,
            # once the eager workers' releases are taken (they stopped everything to rejoin,
            # so what the new target moves elsewhere is free now, not after another round).
            results.extend(self._eager_releases(group, now_ms))
            results.extend(self._release_parked(request.group_id, now_ms))
            results.extend(self._maybe_release_joins(group, now_ms))  # (late rejoins)
            self._forget_round(request.group_id)
        else:
            wait_ms = self._sync_wait_ms(group, request.member_id, bridged)
            if wait_ms > 0:
                waiting = self._parked.setdefault(request.group_id, {})
                waiting[request.member_id] = (request.generation, now_ms + wait_ms)
                timer = TimerSet((SYNC_WAIT_TIMER, request.group_id, request.member_id),
                                 now_ms + wait_ms)
                session = self._session_from_now(request.group_id, request.member_id, now_ms)
                return Result(Parked((SYNC, request.group_id, request.member_id)),
                              timers=[timer, *session])
        answered = self._answer_sync(request.group_id, request.member_id, now_ms)
        results.append(answered)
        return _merge(results, answered.response)

    def _eager_releases(self, group: Any, now_ms: int) -> list[Result[Any]]:
        """For each eager member that the new target asks to release units it does not
        run (it stopped everything to rejoin and has not been told them since): its
        heartbeats, reporting what it runs, that take the release now, so that the units
        reach their new owners in this round's SyncGroup answers instead of after one
        more round. (A cooperative worker reports its releases itself.)"""
        results: list[Result[Any]] = []
        for member_id in list(group.members):
            bridged = self.store.bridged.get((group.group_id, member_id))
            if bridged is None \
                    or PROTOCOL_VERSIONS.get(bridged.protocol_name, 1) != EAGER_VERSION:
                continue
            runs = self._told(bridged.told)
            # The first heartbeat moves it towards the target (pending revocation, if
            # any), the second takes the release: one report cannot do both.
            for _ in range(2):
                member = group.members.get(member_id)
                if member is None or member.current.epoch == group.assignment_epoch \
                        and member.current.state is not MemberState.UNREVOKED:
                    break
                if not runs.isdisjoint(member.current.pending_revocation):
                    break
                beat = self.core.heartbeat(ConnectGroupHeartbeatRequest(
                    group_id=group.group_id, member_id=member_id,
                    member_epoch=member.current.epoch, rebalance_timeout_ms=-1,
                    owned_connectors_and_tasks=units_to_wire(runs)), now_ms)
                self._own_session(beat, group.group_id, member_id,
                                  bridged.session_timeout_ms, now_ms)
                results.append(beat)
        return results

    def _sync_wait_ms(self, group: Any, member_id: str,
                      bridged: ClassicBridgeMemberValue) -> int:
        """How long a member's SyncGroup waits for the assignment the chosen worker is
        computing (0: it does not). As on a broker, where followers wait for their
        leader's SyncGroup: answered now, it would be told what it runs, and its part of
        the new assignment only at its next heartbeat after the install. Only a bridged
        chosen worker's install answers it (`sync`); the wait is at most half the member's
        session, since its heartbeats wait behind the SyncGroup on its connection. A member
        the current target gives units to release or to start does not wait, unless it is
        eager: it stopped everything to rejoin, and what it would start now the round's
        assignment replaces, stopping it again after one more round."""
        if not self._may_wait(group, member_id):
            return 0
        if PROTOCOL_VERSIONS.get(bridged.protocol_name, 1) != EAGER_VERSION \
                and group.members[member_id].current.assigned != self._told(bridged.allocation):
            return 0  # units to start (what it runs is its JoinGroup's allocation): now
        return min(self.core.config.classic_sync_wait_ms, bridged.session_timeout_ms // 2)

    def _may_wait(self, group: Any, member_id: str) -> bool:
        """Whether another worker computes the next assignment and this member has
        nothing to release meanwhile (a heartbeat then has it rejoin and wait)."""
        if self.core.config.classic_sync_wait_ms <= 0 or group.chosen_member == member_id \
                or not self._install_awaited(group):
            return False
        member = group.members.get(member_id)
        return member is not None and member.current.state is not MemberState.UNREVOKED

    def _install_awaited(self, group: Any) -> bool:
        """Whether a bridged chosen worker is computing the group's next assignment."""
        chosen = group.chosen_member
        return chosen is not None and group.epoch > group.assignment_epoch \
            and (group.group_id, chosen) in self.store.bridged

    def _release_stale(self, group: Any, now_ms: int) -> list[Result[Any]]:
        """Answer the group's held requests whose wait is over: the held JoinGroups when no
        member the round waits for is left, a waiting SyncGroup of the chosen worker
        (`release_chosen`), and every waiting SyncGroup when the assignment is no longer
        coming (the round ended another way)."""
        results = self._maybe_release_joins(group, now_ms)
        chosen = self.release_chosen(group)
        if chosen is not None:
            results.append(chosen)
        if not self._install_awaited(group):
            self._forget_round(group.group_id)
            if self._parked.get(group.group_id):
                results.extend(self._release_parked(group.group_id, now_ms))
        return results

    def _forget_round(self, group_id: str) -> None:
        """The round is over: who rejoined in it no longer counts for the next."""
        self._rejoined.pop(group_id, None)
        self._awaited.pop(group_id, None)

    def settle(self, group: Any, member_id: str, now_ms: int) -> list[Result[Any]]:
        """After a change the bridge did not make (a timer of `member_id`'s: its session
        ended, a successor was chosen): answer the held requests whose wait it ended."""
        return [*self._release_gone(group.group_id, member_id),
                *self._release_stale(group, now_ms)]

    def _release_gone(self, group_id: str, member_id: str) -> list[Result[Any]]:
        """A member that left or was removed: its held JoinGroup (if any) is answered
        UNKNOWN_MEMBER_ID now (its SyncGroup: `_release_parked`)."""
        group = self.core.store.groups.get(group_id)
        held = self._held_joins.get(group_id, {})
        if member_id not in held or (group is not None and member_id in group.members):
            return []
        del held[member_id]
        if not held:
            del self._held_joins[group_id]
        return [Result(None, timers=[TimerCancel((JOIN_WAIT_TIMER, group_id, member_id))],
                       releases=[((JOIN, group_id, member_id),
                                  JoinAnswer(ErrorCode.UNKNOWN_MEMBER_ID, member_id))])]

    def release_chosen(self, group: Any) -> Result[None] | None:
        """A member whose SyncGroup waits and that is now chosen to compute the assignment
        (the previous one left) must rejoin to do so: its SyncGroup is answered
        REBALANCE_IN_PROGRESS at once, as a broker answers one in a new round."""
        group_id, chosen = group.group_id, group.chosen_member
        waiting = self._parked.get(group_id)
        if not waiting or chosen not in waiting:
            return None
        del waiting[chosen]
        if not waiting:
            del self._parked[group_id]
        self._unrejoin(group_id, chosen)  # it is to rejoin, and the round waits for it
        return Result(None, timers=[TimerCancel((SYNC_WAIT_TIMER, group_id, chosen))],
                      releases=[((SYNC, group_id, chosen),
                                 SyncAnswer(ErrorCode.REBALANCE_IN_PROGRESS))])

    def _release_parked(self, group_id: str, now_ms: int,
                        member_id: str | None = None) -> list[Result[Any]]:
        """Answer the group's waiting SyncGroups (or only `member_id`'s) with what each
        member may run now; the answers go out with the change's records."""
        waiting = self._parked.get(group_id)
        if not waiting:
            return []
        members = list(waiting) if member_id is None else \
            [member_id] if member_id in waiting else []
        results: list[Result[Any]] = []
        for waiter in members:
            waiting.pop(waiter)
            answered = self._answer_sync(group_id, waiter, now_ms)
            answered.releases.append(((SYNC, group_id, waiter), answered.response))
            answered.timers.append(TimerCancel((SYNC_WAIT_TIMER, group_id, waiter)))
            results.append(answered)
        if not waiting:
            del self._parked[group_id]
        return results

    def on_sync_wait_timer(self, group_id: str, member_id: str, now_ms: int
                           ) -> Result[None]:
        """A SyncGroup waited as long as it may: it is answered with what the member may
        run now (the assignment, when it comes, reaches it at a later heartbeat)."""
        return _merge(self._release_parked(group_id, now_ms, member_id) or [Result(None)],
                      None)

    def wait_timers(self, group_ids: Iterable[str], now_ms: int) -> list[TimerOp]:
        """The timers of the requests still held in these groups (after a rollback
        cleared the groups' timers)."""
        operations: list[TimerOp] = []
        for group_id in group_ids:
            for member_id, (_generation, until) in self._parked.get(group_id, {}).items():
                operations.append(TimerSet((SYNC_WAIT_TIMER, group_id, member_id),
                                           max(now_ms, until)))
            for member_id, (_protocol, until) in self._held_joins.get(group_id, {}).items():
                operations.append(TimerSet((JOIN_WAIT_TIMER, group_id, member_id),
                                           max(now_ms, until)))
        return operations

    def drop_parked(self, group_id: str) -> list[tuple[Any, Any]]:
        """The group goes (it becomes classic, or is deleted): its held requests are
        answered REBALANCE_IN_PROGRESS, and their workers rejoin whatever comes next."""
        waiting = self._parked.pop(group_id, {})
        self._forget_round(group_id)
        answers: list[tuple[Any, Any]] = [
            ((SYNC, group_id, member_id), SyncAnswer(ErrorCode.REBALANCE_IN_PROGRESS))
            for member_id in waiting]
        answers += [((JOIN, group_id, member_id),
                     JoinAnswer(ErrorCode.REBALANCE_IN_PROGRESS, member_id))
                    for member_id in self._held_joins.pop(group_id, {})]
        return answers

    def forget_held(self, result: Result[Any]) -> None:
        """A change was rolled back: a request it held was answered with an error (the
        shell's), and a JoinGroup it took no longer counts as a rejoin."""
        response = result.response
        if isinstance(response, Parked):
            kind, group_id, member_id = response.key
            if kind == SYNC:
                waiting = self._parked.get(group_id, {})
                waiting.pop(member_id, None)
                if not waiting:
                    self._parked.pop(group_id, None)
            else:
                held = self._held_joins.get(group_id, {})
                held.pop(member_id, None)
                if not held:
                    self._held_joins.pop(group_id, None)
                self._unrejoin(group_id, member_id)
        elif isinstance(response, JoinAnswer):
            for group_id in result.touched_groups():
                self._unrejoin(group_id, response.member_id)

    def _unrejoin(self, group_id: str, member_id: str) -> None:
        """A rolled-back JoinGroup: its member has not rejoined in the round after all."""
        rejoined = self._rejoined.get(group_id)
        if rejoined is not None and member_id in rejoined:
            rejoined.discard(member_id)
            awaited = self._awaited.get(group_id)
            if awaited is not None:
                awaited.add(member_id)

    def restore_parked(self, releases: Iterable[tuple[Any, Any]]) -> None:
        """A change that answered held requests was rolled back: its answers were never
        sent, so those requests wait again."""
        for key, _answer in releases:
            kind, group_id, member_id = key
            group = self.core.store.groups.get(group_id)
            member = group.members.get(member_id) if group is not None else None
            if member is None or (group_id, member_id) not in self.store.bridged:
                continue
            # (its timer, re-derived, answers it at once unless an install does first)
            if kind == SYNC:
                self._parked.setdefault(group_id, {})[member_id] = (member.current.epoch, 0)
                self._rejoined.setdefault(group_id, set()).add(member_id)  # (it had)
            elif kind == JOIN:
                protocol = self.store.bridged[(group_id, member_id)].protocol_name
                self._held_joins.setdefault(group_id, {})[member_id] = (protocol, 0)

    def _answer_sync(self, group_id: str, member_id: str, now_ms: int
                     ) -> Result[SyncAnswer]:
        """A SyncGroup's answer: the member's reconciled assignment in Connect's terms."""
        group = self.core.store.groups.get(group_id)
        member = group.members.get(member_id) if group is not None else None
        bridged = self.store.bridged.get((group_id, member_id))
        if group is None or member is None or bridged is None:
            return Result(SyncAnswer(ErrorCode.UNKNOWN_MEMBER_ID))
        results: list[Result[Any]] = []
        # A heartbeat keeps its session and moves it as far as it can go now.
        beat = self.core.heartbeat(ConnectGroupHeartbeatRequest(
            group_id=group_id, member_id=member_id,
            member_epoch=member.current.epoch, rebalance_timeout_ms=-1), now_ms)
        self._own_session(beat, group_id, member_id, bridged.session_timeout_ms, now_ms)
        results.append(beat)
        member = group.members.get(member_id)
        if member is None:
            return _merge(results, SyncAnswer(ErrorCode.UNKNOWN_MEMBER_ID))
        allocation = _units_of(bridged.allocation)
        now_holds = member.current.assigned
        version = PROTOCOL_VERSIONS.get(bridged.protocol_name, 1)
        leader, leader_url, offset = self._connect_leader(group_id)
        if version == EAGER_VERSION:
            told = ConnectAssignment(EAGER_VERSION, 0, leader, leader_url, offset, now_holds)
        else:
            told = ConnectAssignment(version, 0, leader, leader_url, offset,
                                     now_holds - allocation, allocation - now_holds,
                                     self._delay_left(group, member_id, now_ms))
        # The epoch whose assignment (and delay) this answer tells, which may be past the
        # generation the worker goes on with (its JoinGroup's): told everything of it, the
        # worker has nothing to learn from a rejoin for that epoch alone.
        value = ClassicBridgeMemberValue(
            protocol_name=bridged.protocol_name, session_timeout_ms=bridged.session_timeout_ms,
            config_offset=bridged.config_offset, allocation=bridged.allocation,
            told_epoch=member.current.epoch, told=_units_bytes(now_holds))
        record = bridge_record(group_id, member_id, value)
        results.append(Result(None, [record], undo=[self.store.current_record(record.key)]))
        self.store.replay(record)
        return _merge(results, SyncAnswer(ErrorCode.NONE, PROTOCOL_TYPE, bridged.protocol_name,
                                          encode_assignment(told)))

    @staticmethod
    def _delay_left(group: Any, member_id: str, now_ms: int) -> int:
        """What is left of the `delay` the assigning worker gave this member in the last
        assignment (ms; at least 1 once over, so that the worker still rejoins): when it
        is over, the worker rejoins and its leader hands out the units it held back."""
        part = group.target.get(member_id)
        if part is None or not part.metadata:
            return 0
        try:
            delay = decode_assignment(part.metadata).delay_ms
        except ConnectProtocolError:
            return 0
        if delay <= 0:
            return 0
        installed_ms: int = group.last_assignment_ms
        return max(installed_ms + delay - now_ms, 1)

    def _install(self, group: Any, request: SyncRequest, group_epoch: int,
                 now_ms: int) -> Result[str | None]:
        """The chosen worker's assignment as an Install; `response` is None when it took,
        else the reason it did not.

        Connect's leader revokes and grants relative to the allocations its JoinGroup
        answer showed it, so each part is read against those, not against what members
        hold now: a unit granted to a member since (it synced in between) and handed by
        the leader to another is that other's target, which the holder releases first."""
        parts = []
        error = 0
        shown = group.prepared.held if group.prepared is not None else {}
        try:
            for member_id, blob in request.assignments:
                assignment = decode_assignment(blob)
                error = max(error, assignment.error)
                holds = shown.get(member_id, NO_UNITS)
                units = assignment.assigned if assignment.version == EAGER_VERSION \
                    else (holds - assignment.revoked) | assignment.assigned
                parts.append(MemberAssignment(member_id=member_id, assigned=units_to_wire(units),
                                              version=assignment.version, metadata=blob))
        except ConnectProtocolError as bad:
            refused = Event("classic_install_invalid", group.group_id, request.member_id,
                            {"reason": str(bad)})
            return Result[str | None](str(bad), events=[refused])
        installed = self.core.install_assignment(ConnectGroupInstallAssignmentRequest(
            group_id=group.group_id, member_id=request.member_id,
            member_epoch=request.generation, group_epoch=group_epoch, error=min(error, 127),
            members=tuple(parts)), now_ms)
        reason = None
        if installed.response.error_code != ErrorCode.NONE:
            reason = installed.response.error_message or "invalid"
            installed.events.append(Event("classic_install_invalid", group.group_id,
                                          request.member_id, {"reason": reason}))
        return _merge([installed], reason)

    def _connect_leader(self, group_id: str) -> tuple[str, str, int]:
        """(leader, its url, the highest config offset): the worker that ran the last
        client-side assignment, else the member with the highest config offset."""
        group = self.core.store.groups[group_id]
        versions = (group.metadata_changes, group.target_changes)
        memo = self._leaders.get(group_id)
        if memo is None or memo[0] is not group or memo[1] != versions:
            # Every SyncGroup asks, and going over a group of 1,000 each time cost
            # milliseconds (memo by group and versions; the offsets only by metadata).
            offsets = memo[2:4] if memo is not None and memo[0] is group \
                and memo[1][0] == versions[0] else self._highest_offsets(group)
            memo = (group, versions, *offsets, computed_by(group))
            if len(self._leaders) >= TOLD_MEMO_ENTRIES:
                self._leaders.clear()
            self._leaders[group_id] = memo
        _group, _versions, best, highest, assigner = memo
        # The worker asked to assign, else (none asked yet since a restart) the one
        # that computed the current target: the leader a worker was last told stays.
        chosen = group.chosen_member
        if chosen is None:
            chosen = assigner
        member = group.members.get(chosen) if chosen is not None else None
        if member is not None and member.metadata is not None:
            return chosen or "", member.metadata.worker_url, highest
        if best is None:
            return "", "", -1
        return best[1], best[2], highest

    def _highest_offsets(self, group: Any) -> tuple[tuple[int, str, str] | None, int]:
        """The member with the highest config offset (offset, id, url), and that offset."""
        best: tuple[int, str, str] | None = None
        for member_id, member in group.members.items():
            if member.metadata is None:
                continue
            offset = -1
            for assignor in member.metadata.client_assignors:
                try:
                    offset = max(offset, self._config_offset(assignor.metadata))
                except ConnectProtocolError:
                    continue
            if best is None or (offset, member_id) > (best[0], best[1]):
                best = (offset, member_id, member.metadata.worker_url)
        # -1 is what Connect reports for an empty config topic: told 0, a worker would
        # wait for an offset that does not exist and force a rebalance again and again.
        return best, best[0] if best is not None else -1

    # ------------------------------------------------------------------ Heartbeat
    def heartbeat(self, request: HeartbeatRequest, now_ms: int) -> Result[HeartbeatAnswer]:
        group = self.core.store.groups.get(request.group_id)
        member = group.members.get(request.member_id) if group is not None else None
        bridged = self.store.bridged.get((request.group_id, request.member_id))
        if group is None or member is None or bridged is None:
            return Result(HeartbeatAnswer(ErrorCode.UNKNOWN_MEMBER_ID))
        if request.generation > member.current.epoch:
            return Result(HeartbeatAnswer(ErrorCode.ILLEGAL_GENERATION))
        beat = self.core.heartbeat(ConnectGroupHeartbeatRequest(
            group_id=request.group_id, member_id=request.member_id,
            member_epoch=member.current.epoch, instance_id=request.instance_id,
            rebalance_timeout_ms=-1), now_ms)
        self._own_session(beat, request.group_id, request.member_id,
                          bridged.session_timeout_ms, now_ms)
        results = [beat, *self._release_stale(group, now_ms)]
        code = beat.response.error_code
        if code != ErrorCode.NONE and code != ErrorCode.COMPUTE_ASSIGNMENT:
            error = ErrorCode(code)
            return _merge(results, HeartbeatAnswer(_JOIN_ERRORS.get(error, error)))
        member = group.members[request.member_id]
        current = member.current
        # A member at the group's target, running what it was told, has nothing to learn
        # from a rejoin: its new epoch alone does not call it back. (A broker gives the
        # round's generation in the JoinGroup answers; here a member's epoch moves when
        # the round's assignment is installed, after them. A rejoin for it alone would be
        # one more JoinGroup per worker and round, and an eager worker stops every task
        # at each.) The chosen worker's install told it its part, and a rejoin would be a
        # round in which it does not assign (see `_reason`); any other member is called
        # back while a `delay` of the target may be news to it.
        at_target = (current.epoch == group.assignment_epoch
                     and current.state is MemberState.STABLE
                     and (group.chosen_member == member.member_id
                          or self._ran_last_assignment(group, member)
                          or self._delay_left(group, member.member_id, now_ms) == 0))
        must_rejoin = (
            code == ErrorCode.COMPUTE_ASSIGNMENT
            or current.state is MemberState.UNREVOKED
            # Rejoin now, its SyncGroup then waiting for the assignment being computed.
            or self._may_wait(group, member.member_id)
            or current.assigned != self._told(bridged.told)
            or (current.epoch != bridged.told_epoch and not at_target)
        )
        return _merge(results, HeartbeatAnswer(
            ErrorCode.REBALANCE_IN_PROGRESS if must_rejoin else ErrorCode.NONE))

    # ------------------------------------------------------------------ LeaveGroup
    def leave(self, request: LeaveRequest, now_ms: int) -> Result[LeaveAnswer]:
        results: list[Result[Any]] = []
        answers: list[tuple[str, str | None, int]] = []
        group = self.core.store.groups.get(request.group_id)
        for member_id, instance_id in request.members:
            target = member_id
            if instance_id is not None and group is not None:
                owner = group.instances.get(instance_id)  # (not a walk over the members)
                if owner is None or (member_id and owner != member_id):
                    code = ErrorCode.UNKNOWN_MEMBER_ID if owner is None \
                        else ErrorCode.FENCED_INSTANCE_ID
                    answers.append((member_id, instance_id, int(code)))
                    continue
                target = owner
            if group is None or target not in group.members:
                answers.append((member_id, instance_id, int(ErrorCode.UNKNOWN_MEMBER_ID)))
                continue
            left = self.core.heartbeat(ConnectGroupHeartbeatRequest(
                group_id=request.group_id, member_id=target,
                member_epoch=-2 if instance_id is not None else -1,
                instance_id=instance_id), now_ms)
            results.append(left)
            results.extend(self._release_parked(request.group_id, now_ms, target))
            results.extend(self._release_gone(request.group_id, target))
            key = (request.group_id, target)
            if key in self.store.bridged:
                record = bridge_record(request.group_id, target, None)
                results.append(Result(None, [record],
                                      undo=[self.store.current_record(record.key)]))
                self.store.replay(record)
            answers.append((member_id, instance_id, int(left.response.error_code)))
        group = self.core.store.groups.get(request.group_id)
        if group is not None:  # (a chosen worker that left has a successor)
            results.extend(self._release_stale(group, now_ms))
        top = answers[0][2] if len(answers) == 1 else ErrorCode.NONE
        return _merge(results, LeaveAnswer(top, tuple(answers)))
