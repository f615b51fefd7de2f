"""The in-memory model of connect groups, changed only by `GroupStore.replay(record)`.

Everything a record describes lives here; so does what is derived from records (the owner
index, the set of members not yet reconciled). State that records do not describe — the
worker chosen to compute a client-side assignment, the metadata Prepare handed out — is
transient: it is rebuilt after a restart by the normal flow.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from coordinator.config import GroupConfig
from coordinator.connect_protocol import ConnectProtocolError, assignment_leader
from coordinator.core.classic.state import CLASSIC_KEY_TYPES as CLASSIC_KEYS
from coordinator.core.classic.state import ClassicStore
from coordinator.core.reconcile import (
    EMPTY,
    NO_ASSIGNMENT,
    CurrentAssignment,
    MemberState,
    TargetPart,
)
from coordinator.core.result import Record
from coordinator.units import CONNECTOR, Unit, units_of
from protocol.fastpath import name_and_int32_bytes
from protocol.messages import (
    ConnectGroupConfigurationKey,
    ConnectGroupConfigurationValue,
    ConnectGroupConnectorsKey,
    ConnectGroupConnectorsValue,
    ConnectGroupCurrentMemberAssignmentKey,
    ConnectGroupCurrentMemberAssignmentValue,
    ConnectGroupDeadlinesKey,
    ConnectGroupDeadlinesValue,
    ConnectGroupMemberMetadataKey,
    ConnectGroupMemberMetadataValue,
    ConnectGroupMetadataKey,
    ConnectGroupMetadataValue,
    ConnectGroupTargetAssignmentMemberKey,
    ConnectGroupTargetAssignmentMemberValue,
    ConnectGroupTargetAssignmentMetadataKey,
    ConnectGroupTargetAssignmentMetadataValue,
    ConnectorsAndTasks,
    ConnectorTaskId,
    GroupTypeKey,
    GroupTypeValue,
)
from protocol.messages.connect_group_connectors_value import Connector
from protocol.records import connector_entries_bytes, connectors_value_bytes


class InvariantViolation(RuntimeError):
    """The state would break a rule that must always hold (a bug, never a client's fault)."""


@dataclass(frozen=True, slots=True)
class AssignorInfo:
    """One client-side assignor a member supports, as it reported it."""

    name: str
    minimum_version: int
    maximum_version: int
    reason: int
    version: int
    metadata: bytes


@dataclass(frozen=True, slots=True)
class MemberMetadata:
    """What a member told the coordinator about itself: the inputs of an assignment."""

    instance_id: str | None
    worker_url: str
    rebalance_timeout_ms: int
    server_assignor: str | None
    client_assignors: tuple[AssignorInfo, ...]

    def same_assignor_choice(self, other: MemberMetadata) -> bool:
        """Whether choosing the group's assignor, and the workers whose version range
        covers everyone's, reads the same from `other`: the server assignor and the client
        assignors' names, order and ranges (not their reasons or metadata bytes, which a
        classic worker's every new allocation changes)."""
        mine, theirs = self.client_assignors, other.client_assignors
        return (
            self.server_assignor == other.server_assignor
            and len(mine) == len(theirs)
            and all(
                a.name == b.name
                and a.minimum_version == b.minimum_version
                and a.maximum_version == b.maximum_version
                for a, b in zip(mine, theirs, strict=True)
            )
        )

    def assignment_inputs_differ(self, other: MemberMetadata) -> bool:
        """Whether a change needs a new target (the protocol's triggers), not just a record."""
        return (
            self.worker_url != other.worker_url
            or self.server_assignor != other.server_assignor
            or self.client_assignors != other.client_assignors
        )


@dataclass(slots=True)
class Member:
    member_id: str
    metadata: MemberMetadata | None = None
    current: CurrentAssignment = NO_ASSIGNMENT
    # The wire form of the units it was last given, with the set it stands for: after each
    # new target epoch every member moves to it, most with the same units, and its record
    # and answer then need neither a new wire form nor, replayed, a new set.
    assigned_wire: tuple[frozenset[Unit], ConnectorsAndTasks] | None = field(
        default=None, compare=False, repr=False)

    def wire_of(self, units: frozenset[Unit]) -> ConnectorsAndTasks:
        cached = self.assigned_wire
        if cached is not None and cached[0] is units:
            return cached[1]
        return units_to_wire(units)


@dataclass(slots=True)
class ConnectorsLayout:
    """A connectors record value, where each connector sits in it and each entry's bytes:
    a resize builds the next value, its bytes and the connectors map by changing one
    entry (with copies at C speed) instead of going over every connector of the group."""

    value: ConnectGroupConnectorsValue
    index: dict[str, int]  # connector -> the position of its entry
    entries: list[bytes]  # each entry's bytes, in order
    base: ConnectGroupConnectorsValue | None = None  # the value it was resized from
    resized: tuple[str, int] | None = None  # (connector, tasks): the entry that changed

    @classmethod
    def of(cls, value: ConnectGroupConnectorsValue) -> ConnectorsLayout:
        index = {connector.name: i for i, connector in enumerate(value.connectors)}
        return cls(value, index, connector_entries_bytes(value))


@dataclass(slots=True)
class SpecCache:
    """The mappings the group's last server-side spec got, each with a version number, and
    what replay changed since: the next spec reuses or copies them (a resize of a big
    group's connector then builds nothing and goes over none of its members) and tells the
    packer what changed by version (`MappingChange`). A mapping a spec got is never
    changed in place (a spec in flight holds it); a copy gets a new version. Only a cache:
    dropped whenever in doubt (`Group.forget_transient_state`), and then rebuilt whole."""

    last_version: int = 0  # the last version handed out
    # member id -> its MemberSpec, in the members' order, and the members whose metadata
    # or target part was replayed since (or who left).
    member_specs: dict[str, Any] = field(default_factory=dict)
    member_specs_version: int = 0
    stale_members: set[str] = field(default_factory=set)
    # A member that left came back since: it is last in the members' order now, not where
    # its cached spec is, so the next spec is built in the members' order.
    rejoined: bool = False
    # member id -> its target part's units (None: build it anew), and the ids whose part
    # was replayed since.
    previous_target: dict[str, frozenset[Unit]] | None = None
    previous_target_version: int = 0
    changed_targets: set[str] = field(default_factory=set)
    # The connectors mapping the last spec got (None: none yet), and the names resized
    # since (None: the connectors were replaced some other way since, so unknown).
    connectors: dict[str, int] | None = None
    connectors_version: int = 0
    resized: set[str] | None = field(default_factory=set)

    def next_version(self) -> int:
        self.last_version += 1
        return self.last_version


@dataclass(slots=True)
class Group:
    group_id: str
    epoch: int = 0
    connectors: dict[str, int] = field(default_factory=dict)
    # The record value `connectors` was replayed from: what undoes a change to them.
    connectors_value: ConnectGroupConnectorsValue | None = None
    # Where each connector sits in `connectors_value`, when a resize has needed it; and
    # the next value, built by a resize for its replay (`resized_connectors_record`).
    connectors_layout: ConnectorsLayout | None = None
    resized_connectors: ConnectorsLayout | None = None
    members: dict[str, Member] = field(default_factory=dict)
    instances: dict[str, str] = field(default_factory=dict)  # instance id -> member id
    assignment_epoch: int = 0
    assignment_error: int = 0
    assignor_name: str | None = None
    last_assignment_ms: int = -1
    assignor_state: bytes = b""
    target: dict[str, TargetPart] = field(default_factory=dict)
    owners: dict[Unit, str] = field(default_factory=dict)  # unit -> member that holds it
    unreconciled: set[str] = field(default_factory=set)
    # The settings set through the admin API (`GroupStore.settings`, which keeps them
    # while the group is classic too).
    config: GroupConfig = field(default_factory=GroupConfig)
    # When the server-side assignor asked to run again (held-back units are released then),
    # and when the group, empty and without connectors, is deleted (both durable).
    rerun_at_ms: int | None = None
    expire_at_ms: int | None = None
    # Transient (not in records), dropped by `forget_transient_state` after a load or a
    # rollback: a client-side assignment in progress.
    chosen_member: str | None = None
    compute_requested_ms: int | None = None
    prepared: PreparedAssignment | None = None
    assignor_run: Any = None  # the offloaded AssignorRun in flight, if any
    retry_after_ms: int = 0  # after a failed assignor run, the next waits until then
    # Target parts of members removed since the last server-side run: the assignor sees
    # them in previous_target, so it knows whose units a returning worker may take back.
    departed_parts: dict[str, frozenset[Unit]] = field(default_factory=dict)
    # Bumped by every member metadata record: what the two caches below go by.
    metadata_changes: int = 0
    # Bumped by every target member record (an offloaded run's landing checks both).
    target_changes: int = 0
    # Target parts that carry a client-side assignor's version or metadata.
    versioned_parts: int = 0
    # No member's epoch has ever exceeded this: a target epoch above it leaves every
    # member unreconciled, without looking at each.
    member_epoch_bound: int = 0
    # Bumped when a member with metadata comes or goes, or its assignor choice changes
    # (`MemberMetadata.same_assignor_choice`): what the mode cache goes by.
    assignor_changes: int = 0
    # (assignor_changes, mode, assignor, covering): the assignment mode follows the
    # members' assignor choices; `covering`: the members whose client assignor range
    # covers everyone's (by id).
    mode_cache: tuple[int, str, str, tuple[str, ...]] | None = None
    # ((assignor_changes, assignor, default), version): `lowest_top_version`'s answer.
    top_version_cache: tuple[tuple[int, str, int], int] | None = None
    # What the next server-side run's spec is built from without going over the group.
    spec_cache: SpecCache = field(default_factory=lambda: SpecCache())
    chosen_epoch: int = -1
    _units: frozenset[Unit] | None = None

    @property
    def units_source(self) -> str:
        """`admin` once a connectors record was ever written for the group (the admin API
        set its connectors; deleting them all leaves an empty record), else `installs`:
        the group runs what its client-side assignments hand out (Connect's own model,
        where the leader reads the connectors from its config topic)."""
        return "installs" if self.connectors_value is None else "admin"

    def known_units(self) -> frozenset[Unit]:
        """What the group runs: its connectors' units, or for a group that takes its units
        from its installs, what the last valid install assigned plus what members hold."""
        if self.connectors_value is not None:
            return self.units
        known: set[Unit] = set()
        for part in self.target.values():
            known |= part.units
        for member in self.members.values():
            known |= member.current.assigned
            known |= member.current.pending_revocation
        return frozenset(known)

    @property
    def units(self) -> frozenset[Unit]:
        """Everything the group runs (cached; connectors change rarely)."""
        if self._units is None:
            self._units = units_of(self.connectors)
        return self._units

    @property
    def unit_count(self) -> int:
        """len(units), without building them: each connector plus its tasks."""
        return len(self.connectors) + sum(self.connectors.values())

    def known_unit_count(self) -> int:
        """len(known_units()): in O(connectors) when the admin API set them, else in
        O(what the installs and members name)."""
        if self.connectors_value is not None:
            return self.unit_count
        return len(self.known_units())

    @property
    def state(self) -> str:
        """EMPTY / ASSIGNING / RECONCILING / STABLE, in O(1)."""
        if not self.members:
            return "EMPTY"
        if self.epoch > self.assignment_epoch:
            return "ASSIGNING"
        if self.unreconciled:
            return "RECONCILING"
        return "STABLE"

    def forget_transient_state(self) -> None:
        """Drop what records do not describe, as a freshly loaded group has none of it:
        the client-side assignment in progress, the run in flight (its result will be
        ignored), a failed run's pause, and the caches the next run's spec is built from.
        Target parts of departed members stay only for those still gone."""
        self.chosen_member = None
        self.compute_requested_ms = None
        self.prepared = None
        self.chosen_epoch = -1
        self.assignor_run = None
        self.retry_after_ms = 0
        self.mode_cache = self.top_version_cache = None
        self.departed_parts = {member_id: part for member_id, part in self.departed_parts.items()
                               if member_id not in self.members}
        # A new cache starts its versions past the old one's: a packer that holds a spec
        # from before never mistakes a new mapping for one it knows.
        version = self.spec_cache.last_version + 1
        self.spec_cache = SpecCache(
            last_version=version, member_specs_version=version, stale_members=set(self.members),
            previous_target_version=version, connectors=None, connectors_version=version)

    def is_reconciled(self, member: Member) -> bool:
        current = member.current
        return current.epoch == self.assignment_epoch and current.state is MemberState.STABLE

    def refresh_reconciled(self, member: Member) -> None:
        if self.is_reconciled(member):
            self.unreconciled.discard(member.member_id)
        else:
            self.unreconciled.add(member.member_id)


def computed_by(group: Group) -> str | None:
    """The member that computed the group's current target, read from the target itself:
    a Connect assignment names its leader in every part, and the leader's own part names
    itself. None for a target whose parts say no such thing (a server-side run's, say),
    or whose leader is no longer a member. Derived from replayed state only, so a restart
    or a rolled-back write gives the same answer as before."""
    # Every part comes from one install, so the first that carries metadata decides.
    first = next((part for part in group.target.values() if part.metadata), None)
    if first is None:
        return None
    try:
        leader = assignment_leader(first.metadata)
        own = group.target.get(leader)
        named_by_itself = own is not None and bool(own.metadata) \
            and assignment_leader(own.metadata) == leader
    except ConnectProtocolError:
        return None
    return leader if named_by_itself and leader in group.members else None


@dataclass(frozen=True, slots=True)
class PreparedAssignment:
    """What Prepare handed out; Install is validated against it."""

    group_epoch: int
    member_ids: frozenset[str]
    units: frozenset[Unit] | None  # None: the group takes its units from its installs
    assignor_name: str
    # What each member held when Prepare was answered: what the assigning worker was
    # shown. A classic leader's assignment revokes and grants relative to it.
    held: dict[str, frozenset[Unit]] = field(default_factory=dict)


# --- conversions between the model and the wire/record structs ---------------------------


EMPTY_WIRE = ConnectorsAndTasks(connectors=(), tasks=())


def units_to_wire(units: Iterable[Unit]) -> ConnectorsAndTasks:
    if not units:
        return EMPTY_WIRE
    return _convert(units)


def _convert(units: Iterable[Unit]) -> ConnectorsAndTasks:
    connectors: list[str] = []
    tasks: list[ConnectorTaskId] = []
    for name, task in sorted(units):
        if task == CONNECTOR:
            connectors.append(name)
        else:
            tasks.append(ConnectorTaskId(connector=name, task=task))
    return ConnectorsAndTasks(connectors=tuple(connectors), tasks=tuple(tasks))


def units_from_record(value: ConnectorsAndTasks) -> frozenset[Unit]:
    # Start-up replays up to three of these per member: no intermediate set, and the
    # common empty one (pending revocation) shared.
    connectors, tasks = value.connectors, value.tasks
    if not tasks:
        return frozenset([(name, CONNECTOR) for name in connectors]) if connectors else EMPTY
    units = [(task.connector, task.task) for task in tasks]
    if connectors:
        units += [(name, CONNECTOR) for name in connectors]
    return frozenset(units)


class GroupStore:
    """All groups, plus `replay`: the one way their state changes."""

    # Key class -> the method that applies a record with that key (filled in below).
    _appliers: ClassVar[dict[type, Callable[[GroupStore, Any, Any], None]]]

    def __init__(self) -> None:
        self.groups: dict[str, Group] = {}
        self.member_total = 0
        self.classic = ClassicStore()  # classic groups: records of their own
        # What the admin API set for a group, whichever its type (a classic group keeps
        # them for when it is a connect group again): its settings, and the type it takes,
        # empty, for a classic joiner (None: the server's type decides). Both go with the
        # group when it is deleted.
        self.settings: dict[str, GroupConfig] = {}
        self.types: dict[str, str | None] = {}

    def group(self, group_id: str) -> Group:
        group = self.groups.get(group_id)
        if group is None:
            group = self.groups[group_id] = Group(group_id)
            group.config = self.settings.get(group_id, group.config)
        return group

    def type_override(self, group_id: str) -> str | None:
        """The type set for the group through the admin API: `classic`, `connect`, or None
        (the server's `group.connect.classic.group.type` decides). A group with settings
        but no type record has settings from a coordinator that recorded no type apart:
        any setting then kept a group connect, and it still does."""
        if group_id in self.types:
            return self.types[group_id]
        return "connect" if group_id in self.settings else None

    def _member(self, group: Group, member_id: str) -> Member:
        member = group.members.get(member_id)
        if member is None:
            member = group.members[member_id] = Member(member_id)
            self.member_total += 1
            group.spec_cache.stale_members.add(member_id)  # (may come before its metadata)
            group.refresh_reconciled(member)
        return member

    def current_record(self, key: object) -> Record:
        """The record that describes what the state holds for `key` now (None: nothing).

        Replaying it undoes any later record with the same key: that is how a change whose
        log write failed is rolled back. Such a record is never written, so a target
        part's carries the `TargetPart` itself, which its replay takes back as it was.
        """
        match key:
            case ConnectGroupMetadataKey():
                group = self.groups.get(key.group_id)
                return (
                    group_metadata_record(key.group_id, group.epoch) if group else Record(key, None)
                )
            case ConnectGroupConnectorsKey():
                group = self.groups.get(key.group_id)
                # The record it came from; none for a group whose connectors were never
                # set (an empty record would make it take its units from the admin API).
                return Record(key, group.connectors_value if group is not None else None)
            case ConnectGroupMemberMetadataKey():
                member = self._find_member(key.group_id, key.member_id)
                return member_metadata_record(
                    key.group_id, key.member_id, member.metadata if member else None
                )
            case ConnectGroupCurrentMemberAssignmentKey():
                member = self._find_member(key.group_id, key.member_id)
                return current_assignment_record(
                    key.group_id, key.member_id, member.current if member else None, member
                )
            case ConnectGroupTargetAssignmentMemberKey():
                # The part object itself (replay takes one back as it was): an undo is
                # replayed, never written, and building the record would cost a
                # conversion of its units (~30 us for 50) in every landing.
                group = self.groups.get(key.group_id)
                return Record(key, group.target.get(key.member_id) if group else None)
            case ConnectGroupTargetAssignmentMetadataKey():
                group = self.groups.get(key.group_id)
                if group is None:
                    return Record(key, None)
                return target_metadata_record(
                    key.group_id,
                    group.assignment_epoch,
                    group.assignment_error,
                    group.assignor_name,
                    group.last_assignment_ms,
                    group.assignor_state,
                )
            case ConnectGroupConfigurationKey():
                return configuration_record(key.group_id, self.settings.get(key.group_id))
            case GroupTypeKey():
                if key.group_id not in self.types:
                    return Record(key, None)
                return group_type_record(key.group_id, self.types[key.group_id])
            case ConnectGroupDeadlinesKey():
                group = self.groups.get(key.group_id)
                if group is None:
                    return Record(key, None)
                return deadlines_record(key.group_id, group.rerun_at_ms, group.expire_at_ms)
        if type(key) in CLASSIC_KEYS:
            return self.classic.current_record(key)
        raise InvariantViolation(f"no record type for key {key!r}")

    def _find_member(self, group_id: str, member_id: str) -> Member | None:
        group = self.groups.get(group_id)
        return group.members.get(member_id) if group else None

    def replay(self, record: Record) -> None:
        model = record.model
        self.apply(record.key, record.value if model is None else model)

    def apply(self, key: Any, value: Any) -> None:
        """`replay` of the record (key, value), for callers that hold them apart."""
        if value is None and key.group_id not in self.groups and type(key) not in _KEPT_APART:
            return  # a tombstone for a group that is gone deletes nothing (and creates nothing)
        # One dict lookup instead of a chain of class patterns: start-up replays every
        # surviving record through here.
        apply = self._appliers.get(type(key))
        if apply is None:
            raise InvariantViolation(f"cannot replay a record with key {key!r}")
        apply(self, key, value)

    def _replay_group_metadata(self, key: ConnectGroupMetadataKey, value: object) -> None:
        if value is None:
            self._delete_group(key.group_id)
        else:
            assert isinstance(value, ConnectGroupMetadataValue)
            self.group(key.group_id).epoch = value.epoch

    def _replay_connectors(self, key: ConnectGroupConnectorsKey, value: object) -> None:
        group = self.group(key.group_id)
        resized, group.resized_connectors = group.resized_connectors, None
        if value is None:
            group.connectors = {}
            group.connectors_value = group.connectors_layout = group.spec_cache.resized = None
        else:
            assert isinstance(value, ConnectGroupConnectorsValue)
            if (resized is not None and value is resized.value and resized.resized
                    and resized.base is group.connectors_value):
                name, tasks = resized.resized  # the record of a resize, just built
                connectors = dict(group.connectors)  # (an in-flight spec may hold the old)
                connectors[name] = tasks
                group.connectors = connectors
                group.connectors_layout = resized
                if group.spec_cache.resized is not None:
                    group.spec_cache.resized.add(name)
            else:
                group.connectors = {c.name: c.tasks for c in value.connectors}
                group.connectors_layout = group.spec_cache.resized = None
            group.connectors_value = value
        group._units = None

    def _replay_target_member(self, key: ConnectGroupTargetAssignmentMemberKey,
                              value: object) -> None:
        group = self.group(key.group_id)
        group.target_changes += 1
        if key.member_id in group.members:  # (members' specs only: bounded by the group)
            group.spec_cache.stale_members.add(key.member_id)
        if group.spec_cache.previous_target is not None:
            group.spec_cache.changed_targets.add(key.member_id)
        target = group.target
        old = target.get(key.member_id) if value is not None else target.pop(key.member_id, None)
        if old is not None and (old.version or old.metadata):
            group.versioned_parts -= 1
        if value is not None:
            if isinstance(value, TargetPart):  # the part the record was built from, or an undo
                part = value
            else:
                assert isinstance(value, ConnectGroupTargetAssignmentMemberValue)
                part = TargetPart(units_from_record(value.assigned), value.version,
                                  value.metadata)
            target[key.member_id] = part
            if part.version or part.metadata:
                group.versioned_parts += 1

    def _replay_configuration(self, key: ConnectGroupConfigurationKey, value: object) -> None:
        # (kept apart from the connect group: a classic group keeps its settings too)
        if value is None:
            self.settings.pop(key.group_id, None)
            config = GroupConfig()
        else:
            assert isinstance(value, ConnectGroupConfigurationValue)
            config = self.settings[key.group_id] = GroupConfig(
                session_timeout_ms=value.session_timeout_ms,
                heartbeat_interval_ms=value.heartbeat_interval_ms,
                assignment_interval_ms=value.assignment_interval_ms,
                assignor_offload_enable=(
                    None
                    if value.assignor_offload_enable < 0
                    else bool(value.assignor_offload_enable)
                ),
                scheduled_rebalance_max_delay_ms=value.scheduled_rebalance_max_delay_ms,
            )
        group = self.groups.get(key.group_id)
        if group is not None:
            group.config = config

    def _replay_group_type(self, key: GroupTypeKey, value: object) -> None:
        if value is None:
            self.types.pop(key.group_id, None)
        else:
            assert isinstance(value, GroupTypeValue)
            self.types[key.group_id] = value.classic_group_type

    def _replay_deadlines(self, key: ConnectGroupDeadlinesKey, value: object) -> None:
        group = self.group(key.group_id)
        if value is None:
            group.rerun_at_ms = group.expire_at_ms = None
        else:
            assert isinstance(value, ConnectGroupDeadlinesValue)
            group.rerun_at_ms = value.rerun_at_ms if value.rerun_at_ms >= 0 else None
            group.expire_at_ms = value.expire_at_ms if value.expire_at_ms >= 0 else None

    def _delete_group(self, group_id: str) -> None:
        group = self.groups.pop(group_id, None)
        if group is not None:
            self.member_total -= len(group.members)

    def _replay_member_metadata(self, key: ConnectGroupMemberMetadataKey, value: object) -> None:
        group = self.group(key.group_id)
        group.metadata_changes += 1
        if value is None:
            cache = group.spec_cache
            if key.member_id in cache.member_specs:
                cache.stale_members.add(key.member_id)  # its spec goes from the next copy
            else:
                cache.stale_members.discard(key.member_id)  # (bounded by the members)
            member = group.members.pop(key.member_id, None)
            if member is None:
                return
            if member.metadata is not None:
                group.assignor_changes += 1
            self.member_total -= 1
            self._release(group, key.member_id, member.current.held)
            group.unreconciled.discard(key.member_id)
            if member.metadata and member.metadata.instance_id is not None:
                if group.instances.get(member.metadata.instance_id) == key.member_id:
                    del group.instances[member.metadata.instance_id]
            return
        assert isinstance(value, ConnectGroupMemberMetadataValue)
        cache = group.spec_cache
        if key.member_id in cache.member_specs and key.member_id not in group.members:
            cache.rejoined = True
        member = self._member(group, key.member_id)
        cache.stale_members.add(key.member_id)
        previous = member.metadata
        old_instance = previous.instance_id if previous else None
        # Positional arguments: a frozen dataclass takes keywords about a third slower, and
        # start-up replays one of these per member.
        member.metadata = MemberMetadata(
            value.instance_id,
            value.worker_url,
            value.rebalance_timeout_ms,
            value.server_assignor,
            tuple(
                AssignorInfo(
                    a.name, a.minimum_version, a.maximum_version, a.reason, a.version, a.metadata
                )
                for a in value.client_assignors
            ) if value.client_assignors else (),
        )
        if previous is None or not previous.same_assignor_choice(member.metadata):
            group.assignor_changes += 1
        if old_instance is not None and old_instance != value.instance_id:
            if group.instances.get(old_instance) == key.member_id:
                del group.instances[old_instance]
        if value.instance_id is not None:
            group.instances[value.instance_id] = key.member_id

    def _replay_current_assignment(
        self, key: ConnectGroupCurrentMemberAssignmentKey, value: object
    ) -> None:
        group = self.group(key.group_id)
        if value is None:
            member = group.members.get(key.member_id)
            if member is not None:
                self._release(group, key.member_id, member.current.held)
                member.current = NO_ASSIGNMENT
                member.assigned_wire = None
                group.refresh_reconciled(member)
            return
        assert isinstance(value, ConnectGroupCurrentMemberAssignmentValue)
        member_id = key.member_id
        member = group.members.get(member_id) or self._member(group, member_id)
        state = _MEMBER_STATES.get(value.state)
        previous = member.current
        cached = member.assigned_wire
        if cached is not None and value.assigned is cached[1]:
            assigned = cached[0]  # a record written from this member's state: same units
        else:
            assigned = units_from_record(value.assigned)
            if assigned == previous.assigned:
                # Most records move a member to a new epoch with the same units: keep the
                # old set (and its tuples), so the new ones die at once instead of waiting
                # for the cyclic collector to walk them (50,000 for a group of 1,000
                # members after each new target epoch).
                assigned = previous.assigned
            member.assigned_wire = (assigned, value.assigned)
        pending = value.pending_revocation
        pending_revocation = (
            units_from_record(pending) if pending.connectors or pending.tasks else EMPTY)
        new = CurrentAssignment(  # positional, as MemberMetadata above
            value.member_epoch,
            value.previous_member_epoch,
            MemberState(value.state) if state is None else state,
            assigned,
            pending_revocation,
            value.error,
            value.version,
            value.metadata,
        )
        old_held = previous.held
        new_held = assigned | pending_revocation if pending_revocation else assigned
        if old_held:
            self._release(group, member_id, old_held - new_held)
            self._claim(group, member_id, new_held - old_held)
        else:  # a member's first assignment (every member's, at start-up)
            self._claim(group, member_id, new_held)
        member.current = new
        if new.epoch > group.member_epoch_bound:
            group.member_epoch_bound = new.epoch
        group.refresh_reconciled(member)

    def _replay_target_metadata(
        self, key: ConnectGroupTargetAssignmentMetadataKey, value: object
    ) -> None:
        group = self.group(key.group_id)
        if value is None:
            group.assignment_epoch = 0
            group.assignment_error = 0
            group.assignor_name = None
            group.last_assignment_ms = -1
            group.assignor_state = b""
        else:
            assert isinstance(value, ConnectGroupTargetAssignmentMetadataValue)
            epoch_changed = value.assignment_epoch != group.assignment_epoch
            group.assignment_epoch = value.assignment_epoch
            group.assignment_error = value.error
            group.assignor_name = value.assignor_name
            group.last_assignment_ms = value.last_assignment_ms
            group.assignor_state = value.assignor_state
            if not epoch_changed:
                return
        # A new target epoch changes who counts as reconciled. Usually no member has reached
        # it yet, and all are (a copy of the keys: this runs on the event loop when a big
        # group's run lands); otherwise (a rollback) one pass over the members.
        if group.assignment_epoch > group.member_epoch_bound:
            group.unreconciled = set(group.members)
            return
        group.unreconciled = {
            member_id
            for member_id, member in group.members.items()
            if not group.is_reconciled(member)
        }

    @staticmethod
    def _release(group: Group, member_id: str, units: frozenset[Unit]) -> None:
        owners = group.owners
        for unit in units:
            if owners.get(unit) == member_id:
                del owners[unit]

    @staticmethod
    def _claim(group: Group, member_id: str, units: frozenset[Unit]) -> None:
        owners = group.owners
        for unit in units:
            holder = owners.setdefault(unit, member_id)
            if holder != member_id:
                raise InvariantViolation(
                    f"group {group.group_id}: {unit} would be held by {member_id} while "
                    f"{holder} still holds it"
                )


GroupStore._appliers = {
    ConnectGroupMetadataKey: GroupStore._replay_group_metadata,
    ConnectGroupConnectorsKey: GroupStore._replay_connectors,
    ConnectGroupMemberMetadataKey: GroupStore._replay_member_metadata,
    ConnectGroupCurrentMemberAssignmentKey: GroupStore._replay_current_assignment,
    ConnectGroupTargetAssignmentMemberKey: GroupStore._replay_target_member,
    ConnectGroupTargetAssignmentMetadataKey: GroupStore._replay_target_metadata,
    ConnectGroupConfigurationKey: GroupStore._replay_configuration,
    GroupTypeKey: GroupStore._replay_group_type,
    ConnectGroupDeadlinesKey: GroupStore._replay_deadlines,
    **{key_type: lambda store, key, value: store.classic.apply(key, value)
       for key_type in CLASSIC_KEYS},
}
_MEMBER_STATES = {int(state): state for state in MemberState}
# Records whose tombstone applies whether or not a connect group of that id exists.
_KEPT_APART = frozenset({*CLASSIC_KEYS, ConnectGroupConfigurationKey, GroupTypeKey})


# --- record builders -------------------------------------------------------------------


def group_metadata_record(group_id: str, epoch: int) -> Record:
    return Record(
        ConnectGroupMetadataKey(group_id=group_id), ConnectGroupMetadataValue(epoch=epoch)
    )


def member_metadata_record(
    group_id: str, member_id: str, metadata: MemberMetadata | None
) -> Record:
    from protocol.messages.connect_group_member_metadata_value import ClientAssignor

    key = ConnectGroupMemberMetadataKey(group_id=group_id, member_id=member_id)
    if metadata is None:
        return Record(key, None)
    return Record(
        key,
        ConnectGroupMemberMetadataValue(
            instance_id=metadata.instance_id,
            worker_url=metadata.worker_url,
            rebalance_timeout_ms=metadata.rebalance_timeout_ms,
            server_assignor=metadata.server_assignor,
            client_assignors=tuple(
                ClientAssignor(
                    name=a.name,
                    minimum_version=a.minimum_version,
                    maximum_version=a.maximum_version,
                    reason=a.reason,
                    version=a.version,
                    metadata=a.metadata,
                )
                for a in metadata.client_assignors
            ),
        ),
    )


def current_assignment_record(
    group_id: str, member_id: str, current: CurrentAssignment | None,
    member: Member | None = None,
) -> Record:
    """`member`: the member it is written for, whose last units' wire form is reused."""
    key = ConnectGroupCurrentMemberAssignmentKey(group_id=group_id, member_id=member_id)
    if current is None:
        return Record(key, None)
    return Record(
        key,
        ConnectGroupCurrentMemberAssignmentValue(
            member_epoch=current.epoch,
            previous_member_epoch=current.previous_epoch,
            state=int(current.state),
            assigned=(units_to_wire(current.assigned) if member is None
                      else member.wire_of(current.assigned)),
            pending_revocation=units_to_wire(current.pending_revocation),
            error=current.error,
            version=current.version,
            metadata=current.metadata,
        ),
    )


def target_member_record(group_id: str, member_id: str, part: TargetPart | None) -> Record:
    key = ConnectGroupTargetAssignmentMemberKey(group_id=group_id, member_id=member_id)
    if part is None:
        return Record(key, None)
    if part.wire is None:
        # The part keeps the wire form built here: the member's current assignment record
        # and its answer, once it reaches this target, then need no conversion of their own.
        part = dataclasses.replace(part, wire=units_to_wire(part.units))
    value = ConnectGroupTargetAssignmentMemberValue(
        assigned=part.wire, version=part.version, metadata=part.metadata)
    return Record(key, value, model=part)


def target_metadata_record(
    group_id: str,
    epoch: int,
    error: int,
    assignor_name: str | None,
    last_assignment_ms: int,
    assignor_state: bytes,
) -> Record:
    return Record(
        ConnectGroupTargetAssignmentMetadataKey(group_id=group_id),
        ConnectGroupTargetAssignmentMetadataValue(
            assignment_epoch=epoch,
            error=error,
            assignor_name=assignor_name,
            last_assignment_ms=last_assignment_ms,
            assignor_state=assignor_state,
        ),
    )


def deadlines_record(group_id: str, rerun_at_ms: int | None,
                     expire_at_ms: int | None) -> Record:
    key = ConnectGroupDeadlinesKey(group_id=group_id)
    if rerun_at_ms is None and expire_at_ms is None:
        return Record(key, None)
    return Record(key, ConnectGroupDeadlinesValue(
        rerun_at_ms=-1 if rerun_at_ms is None else rerun_at_ms,
        expire_at_ms=-1 if expire_at_ms is None else expire_at_ms))


def connectors_record(group_id: str, connectors: dict[str, int] | None) -> Record:
    key = ConnectGroupConnectorsKey(group_id=group_id)
    if connectors is None:
        return Record(key, None)
    return Record(
        key,
        ConnectGroupConnectorsValue(
            connectors=tuple(_connector_entry(name, tasks)
                             for name, tasks in sorted(connectors.items()))
        ),
    )


def resized_connectors_record(group: Group, name: str, tasks: int) -> Record:
    """`connectors_record` of the group with its connector `name` at `tasks` tasks, built
    from the group's record by changing that one entry: a resize of a group of a thousand
    connectors then neither sorts, builds nor encodes all of them again. Its replay takes
    the same short cut (`resized_connectors`)."""
    value = group.connectors_value
    assert value is not None and name in group.connectors
    layout = group.connectors_layout
    if layout is None or layout.value is not value:
        layout = group.connectors_layout = ConnectorsLayout.of(value)
    position = layout.index[name]
    connectors = list(value.connectors)
    connectors[position] = _connector_entry(name, tasks)
    entries = layout.entries.copy()
    entries[position] = name_and_int32_bytes(name, tasks)
    resized = ConnectorsLayout(ConnectGroupConnectorsValue(connectors=tuple(connectors)),
                               layout.index, entries, value, (name, tasks))
    group.resized_connectors = resized
    return Record(ConnectGroupConnectorsKey(group_id=group.group_id), resized.value,
                  connectors_value_bytes(entries))


@functools.lru_cache(maxsize=1 << 16)
def _connector_entry(name: str, tasks: int) -> Connector:
    # The record lists every connector of the group and is built twice per resize (the
    # change and its undo): the entries of unchanged connectors are the same immutable
    # objects as last time, not a thousand new ones.
    return Connector(name=name, tasks=tasks)


def group_type_record(group_id: str, kind: str | None, *, present: bool = True) -> Record:
    """The type set for the group (`kind`, None: the server's decides), or with
    `present=False` the tombstone that goes with the group."""
    key = GroupTypeKey(group_id=group_id)
    return Record(key, GroupTypeValue(classic_group_type=kind) if present else None)


def configuration_record(group_id: str, config: GroupConfig | None) -> Record:
    key = ConnectGroupConfigurationKey(group_id=group_id)
    if config is None:
        return Record(key, None)
    offload = config.assignor_offload_enable
    return Record(
        key,
        ConnectGroupConfigurationValue(
            session_timeout_ms=config.session_timeout_ms,
            heartbeat_interval_ms=config.heartbeat_interval_ms,
            assignment_interval_ms=config.assignment_interval_ms,
            scheduled_rebalance_max_delay_ms=config.scheduled_rebalance_max_delay_ms,
            assignor_offload_enable=-1 if offload is None else int(offload),
        ),
    )
