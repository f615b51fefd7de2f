"""Converting a live group between the two types: classic -> connect (upgrade) on the
first new-protocol join, connect -> classic (downgrade) when the last new-protocol member
leaves. `group.connect.migration.policy` says which directions are allowed.

Theory of operation. A conversion is one change: the records that delete the group of one
type and the records that create the group of the other type, written together, so the
log holds either the group before or the group after, never half of each; a restart in
the middle replays one of the two. A conversion whose records cannot be written is rolled
back like any change (the undo records restore the old group) and the coordinator's one
scheduling rule (`GroupCoordinator.reschedule`) derives the old group's timers again.

- Upgrade: the connect group's epoch and target epoch are the classic generation; each
  classic member becomes a bridged member at that epoch whose current assignment and
  target part are the units it holds (see `classic_holdings`); parked JoinGroup and
  SyncGroup calls are answered REBALANCE_IN_PROGRESS (their workers rejoin, now through
  the bridge). The joiner's own join then bumps the epoch as any join does.
- Downgrade: the classic group's generation is the group epoch; each member keeps what it
  holds (as its last assignment of that generation) and a classic rebalance starts, so
  the workers' own leader assigns from what they report holding. A group with connectors
  set through the admin API (a classic group could not run them), or set to `connect`
  through it, or on a server whose `group.connect.classic.group.type` is `connect` with
  no type of its own, is not downgraded. Its other settings are not the classic group's business:
  they stay in their own record for when the group is a connect group again.
- An empty group takes the type of its next joiner; for a classic joiner, the type set
  for the group through the admin API, else the server's `group.connect.classic.group.type`
  (`GroupCoordinator.classic_joiner_type`). An empty connect group without connectors set
  through the admin API that a new classic member joins becomes a classic group when that
  type is `classic` (`GroupCoordinator.gives_way`): the join's change deletes the connect
  group and creates the classic one. An empty classic group gives way the same way
  (`ClassicEngine.give_up_empty`) to a new-protocol member, and to a classic member when
  that type is `connect` (its join goes to the bridge, which creates the connect group).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from coordinator.connect_protocol import (
    EAGER_VERSION,
    PROTOCOL_VERSIONS,
    ConnectAssignment,
    ConnectProtocolError,
    decode_assignment,
    decode_worker_metadata,
    encode_assignment,
)
from coordinator.core.classic.bridge import (
    EAGER,
    INCREMENTAL_COOPERATIVE,
    _client_assignors,
    _units_bytes,
)
from coordinator.core.classic.engine import (
    JOIN,
    PROTOCOL_TYPE,
    REASON_DOWNGRADED,
    SYNC,
    JoinAnswer,
    SyncAnswer,
)
from coordinator.core.classic.state import (
    ClassicGroup,
    ClassicState,
    bridge_record,
    member_record,
    metadata_record,
    new_metadata,
    replace_meta,
)
from coordinator.core.group import (
    AssignorInfo,
    Group,
    MemberMetadata,
    current_assignment_record,
    group_metadata_record,
    member_metadata_record,
    target_member_record,
    target_metadata_record,
)
from coordinator.core.reconcile import CurrentAssignment, MemberState, TargetPart
from coordinator.core.result import CLIENT_MODE, SESSION_TIMER, Event, TimerClearGroup, TimerSet
from coordinator.units import Unit
from protocol.errors import ApiError, ErrorCode
from protocol.messages import ClassicBridgeMemberValue, ClassicGroupMemberValue
from protocol.messages.classic_group_member_value import Protocol

if TYPE_CHECKING:
    from coordinator.core.coordinator import GroupCoordinator

UPGRADE = "upgrade"
DOWNGRADE = "downgrade"
CONVERSION_DIRECTIONS = (UPGRADE, DOWNGRADE)
MIGRATION_POLICIES = ("bidirectional", "upgrade", "downgrade", "disabled")
NO_UNITS: frozenset[Unit] = frozenset()


def allowed(policy: str, direction: str) -> bool:
    return policy == "bidirectional" or policy == direction


def classic_holdings(group: ClassicGroup) -> dict[str, frozenset[Unit]]:
    """What each member of a classic group may be running, as far as its own messages
    say: a cooperative member (protocol version 1-2) runs the allocation its JoinGroup
    reported; once it sent its SyncGroup for the assignment of the current generation
    (and has not rejoined since, which would have reported a newer allocation) it may
    also run what that assignment granted. What the assignment revoked still counts: the
    SyncGroup's answer may never have reached it, and only its next JoinGroup says it
    let them go (counting a unit it stopped is safe, the connect engine then tells it to
    release or keep it; missing one it runs is not). An eager member holds such an
    assignment, and nothing once it rejoins. A member that has not asked for its
    assignment still runs just its allocation: the units it was granted stay free. A
    unit two members claim goes to the first (by member id): the other is then told to
    release it like any unit not in its part."""
    name = group.meta.protocol_name
    version = PROTOCOL_VERSIONS.get(name or "", EAGER_VERSION)
    generation = group.generation
    held: dict[str, frozenset[Unit]] = {}
    taken: set[Unit] = set()
    for member_id, member in sorted(group.active().items()):
        rejoined = member.joined_generation > generation
        units: frozenset[Unit] = NO_UNITS
        try:
            metadata = next((p.metadata for p in member.protocols if p.name == name), b"")
            if version >= 1 and metadata:
                allocation = decode_worker_metadata(metadata).allocation
                units = allocation.assigned if allocation is not None else NO_UNITS
            if (not rejoined and member.assignment
                    and member.assignment_generation == generation
                    and member.synced_generation == generation):
                told = decode_assignment(member.assignment)
                units = told.assigned if version == EAGER_VERSION else units | told.assigned
        except ConnectProtocolError:
            units = NO_UNITS  # bytes its leader wrote that we cannot read: holds nothing known
        held[member_id] = frozenset(units - taken)
        taken |= units
    return held


def _member_metadata(member: ClassicGroupMemberValue, protocol_name: str | None
                     ) -> MemberMetadata:
    protocols = tuple((p.name, p.metadata) for p in member.protocols)
    url, _offset = _url_and_offset(protocols, protocol_name)
    return MemberMetadata(
        instance_id=member.instance_id, worker_url=url,
        rebalance_timeout_ms=member.rebalance_timeout_ms, server_assignor=None,
        client_assignors=tuple(
            AssignorInfo(a.name, a.minimum_version, a.maximum_version, a.reason,
                         a.version, a.metadata)
            for a in _client_assignors(protocols)))


def upgrade(core: GroupCoordinator, classic: ClassicGroup, joiner: Any, change: Any,
            now_ms: int) -> Group:
    """The records that turn the classic group into a connect group (see the module
    docstring); returns the connect group. `joiner`: the heartbeat that joins, checked
    here against the classic members before anything is written."""
    group_id = classic.group_id
    policy = core.config.connect_migration_policy
    if not allowed(policy, UPGRADE):
        raise ApiError(
            ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
            f"group {group_id!r} is a classic group with members and "
            f"group.connect.migration.policy={policy} does not allow converting it to a "
            "connect group")
    meta = classic.meta
    active = classic.active()
    metadata = {member_id: _member_metadata(member, meta.protocol_name)
                for member_id, member in active.items()}
    everyone = {**metadata, joiner.member_id: core._metadata_from(None, joiner)}
    mode, name = core._select_mode(everyone)
    if mode != CLIENT_MODE:
        # Its workers' units come from their own assignments: a server-side assignor
        # would know none of them and take every unit away.
        raise ApiError(
            ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
            f"group {group_id!r} is a classic group with members: a joiner must list a "
            "client assignor its workers support (incremental-cooperative or eager), not "
            "a server assignor")
    from coordinator.core.coordinator import _covering_members  # (imports this module)

    if not _covering_members(everyone, name):
        raise ApiError(
            ErrorCode.UNSUPPORTED_ASSIGNOR,
            f"no worker's version range for client assignor {name!r} covers every "
            f"member's range in group {group_id!r}")
    epoch = max(classic.generation, 1)
    held = classic_holdings(classic)
    version = PROTOCOL_VERSIONS.get(meta.protocol_name or "", EAGER_VERSION)
    assignor = EAGER if version == EAGER_VERSION else INCREMENTAL_COOPERATIVE
    # The classic group goes, its parked requests answered: their workers rejoin.
    for member_id in list(classic.members):
        change.write(member_record(group_id, member_id, None))
        change.releases.append(((JOIN, group_id, member_id),
                                JoinAnswer(ErrorCode.REBALANCE_IN_PROGRESS, member_id)))
        change.releases.append(((SYNC, group_id, member_id),
                                SyncAnswer(ErrorCode.REBALANCE_IN_PROGRESS)))
    change.write(metadata_record(group_id, None))
    change.timers.append(TimerClearGroup(group_id))
    # The connect group, at the classic generation, each member holding what it holds.
    core._create_group(group_id, change)
    change.write(group_metadata_record(group_id, epoch))
    change.write(target_metadata_record(group_id, epoch, 0, assignor, now_ms, b""))
    # Each target part names the classic leader as the worker that computed it, as an
    # install's parts do (`computed_by`): Connect's assignor keeps its view of the previous
    # assignment only in the worker that made it, so that worker assigns first.
    leader_url = ""
    if meta.leader in active:
        leader_protocols = tuple((p.name, p.metadata) for p in active[meta.leader].protocols)
        leader_url = _url_and_offset(leader_protocols, meta.protocol_name)[0]
    for member_id, member in active.items():
        units = held[member_id]
        protocols = tuple((p.name, p.metadata) for p in member.protocols)
        _url, offset = _url_and_offset(protocols, meta.protocol_name)
        named = b"" if meta.leader not in active else encode_assignment(ConnectAssignment(
            version, leader=meta.leader, leader_url=leader_url, config_offset=offset))
        change.write(member_metadata_record(group_id, member_id, metadata[member_id]))
        change.write(current_assignment_record(group_id, member_id, CurrentAssignment(
            epoch=epoch, previous_epoch=epoch - 1, state=MemberState.STABLE, assigned=units,
            version=version)))
        change.write(target_member_record(group_id, member_id,
                                          TargetPart(units, version, named)))
        change.write(bridge_record(group_id, member_id, ClassicBridgeMemberValue(
            protocol_name=meta.protocol_name or "default",
            session_timeout_ms=member.session_timeout_ms, config_offset=offset,
            allocation=_units_bytes(units), told_epoch=epoch, told=_units_bytes(units))))
        change.timers.append(TimerSet((SESSION_TIMER, group_id, member_id),
                                      now_ms + member.session_timeout_ms))
    group = core.store.groups[group_id]
    change.event("group_converted", group, None, direction=UPGRADE,
                 members=len(active), generation=classic.generation)
    return group


def _url_and_offset(protocols: Iterable[tuple[str, bytes]], name: str | None
                    ) -> tuple[str, int]:
    for protocol, metadata in protocols:
        if protocol == name:
            try:
                decoded = decode_worker_metadata(metadata)
            except ConnectProtocolError:
                break
            return decoded.url or "unknown", decoded.config_offset
    return "unknown", -1


def should_downgrade(core: GroupCoordinator, group: Group) -> bool:
    """Whether the group is to become classic now: only bridged (classic) members remain,
    the policy allows it, and the type it takes for classic joiners is `classic`
    (`classic_joiner_type`: not with connectors set through the admin API, which a
    classic group could not run, nor when the group or, failing that, the server puts
    classic workers on the connect engine). Its other settings stay with the classic
    group, for when it is a connect group again."""
    if not group.members or core.classic_joiner_type(group.group_id) == "connect":
        return False
    bridged = core.store.classic.bridged
    if any((group.group_id, member_id) not in bridged for member_id in group.members):
        return False
    return allowed(core.config.connect_migration_policy, DOWNGRADE)


def downgrade(core: GroupCoordinator, group: Group, change: Any, now_ms: int) -> None:
    """The records that turn the connect group into a classic group and start a classic
    rebalance (see the module docstring)."""
    group_id = group.group_id
    generation = group.epoch
    bridged = core.store.classic.bridged
    members: dict[str, ClassicGroupMemberValue] = {}
    protocol_names = []
    for member_id, member in sorted(group.members.items()):
        kept = bridged[group_id, member_id]
        protocol_names.append(kept.protocol_name)
        version = PROTOCOL_VERSIONS.get(kept.protocol_name, EAGER_VERSION)
        assignor = EAGER if version == EAGER_VERSION else INCREMENTAL_COOPERATIVE
        metadata = member.metadata
        info = next((a for a in metadata.client_assignors if a.name == assignor), None) \
            if metadata is not None else None
        held = member.current.held
        members[member_id] = ClassicGroupMemberValue(
            instance_id=metadata.instance_id if metadata else None,
            client_id="", client_host="",
            session_timeout_ms=kept.session_timeout_ms,
            rebalance_timeout_ms=metadata.rebalance_timeout_ms if metadata else 60_000,
            pending=False,
            protocols=(Protocol(name=kept.protocol_name,
                                metadata=info.metadata if info else b""),),
            joined_generation=-1, synced_generation=generation,
            assignment_generation=generation,
            assignment=encode_assignment(ConnectAssignment(version, assigned=held)))
    # The connect group goes: every record of it, its members' and the bridge's.
    for member_id in list(group.members):
        change.write(target_member_record(group_id, member_id, None))
        change.write(current_assignment_record(group_id, member_id, None))
        change.write(member_metadata_record(group_id, member_id, None))
        change.write(bridge_record(group_id, member_id, None))
    core._delete(group, change)
    protocol = max(set(protocol_names), key=protocol_names.count)
    longest = max((m.rebalance_timeout_ms for m in members.values()), default=0)
    meta = replace_meta(new_metadata(PROTOCOL_TYPE), generation=generation,
                        state=ClassicState.PREPARING_REBALANCE, protocol_name=protocol,
                        phase_started_ms=now_ms, phase_deadline_ms=now_ms + longest,
                        initial_delay=False)
    change.write(metadata_record(group_id, meta))
    for member_id, value in members.items():
        change.write(member_record(group_id, member_id, value))
    # Timers as a load would derive them: the join phase's deadline, fresh sessions.
    change.timers.extend(core.classic.timers(now_ms, [group_id]))
    change.events.append(Event("group_converted", group_id, None, {
        "direction": DOWNGRADE, "members": len(members), "generation": generation,
        "group_type": "classic"}))
    change.events.append(Event("classic_rebalance_started", group_id, None, {
        "reason": REASON_DOWNGRADED, "generation": generation, "group_type": "classic",
        "deadline_ms": meta.phase_deadline_ms, "initial_delay": False}))
