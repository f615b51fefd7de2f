"""Classic groups as records describe them, changed only by `ClassicStore.replay`.

A classic group is its metadata record (generation, phase, leader, the deadline of the
phase) plus one record per member (its JoinGroup, whether it joined this round and synced
this generation, the assignment the leader gave it). The record values are kept as they
are: a change is a new value, and the value held now is what undoes a later one.
Derived here: the instance id index and the count of members supporting each protocol.
"""

from __future__ import annotations

import dataclasses
import enum
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from coordinator.core.result import Record
from protocol.messages import (
    ClassicBridgeMemberKey,
    ClassicBridgeMemberValue,
    ClassicGroupMemberKey,
    ClassicGroupMemberValue,
    ClassicGroupMetadataKey,
    ClassicGroupMetadataValue,
)
from protocol.messages.classic_group_member_value import Protocol

CLASSIC_KEY_TYPES = (ClassicGroupMetadataKey, ClassicGroupMemberKey, ClassicBridgeMemberKey)


class ClassicState(enum.IntEnum):
    """Kafka's classic group states; the names are the ones DescribeGroups shows."""

    EMPTY = 0
    PREPARING_REBALANCE = 1
    COMPLETING_REBALANCE = 2
    STABLE = 3

    @property
    def label(self) -> str:
        return _LABELS[self]


_LABELS = {
    ClassicState.EMPTY: "Empty",
    ClassicState.PREPARING_REBALANCE: "PreparingRebalance",
    ClassicState.COMPLETING_REBALANCE: "CompletingRebalance",
    ClassicState.STABLE: "Stable",
}

NO_DEADLINE = -1


def new_metadata(protocol_type: str) -> ClassicGroupMetadataValue:
    return ClassicGroupMetadataValue(
        protocol_type=protocol_type, protocol_name=None, generation=0,
        state=ClassicState.EMPTY, leader=None, phase_started_ms=NO_DEADLINE,
        phase_deadline_ms=NO_DEADLINE, initial_delay=False)


@dataclass(slots=True)
class ClassicGroup:
    group_id: str
    meta: ClassicGroupMetadataValue
    members: dict[str, ClassicGroupMemberValue] = field(default_factory=dict)
    instances: dict[str, str] = field(default_factory=dict)  # instance id -> member id
    # Protocol name -> how many members (not pending ones) list it, and how many members
    # are counted: whether a join lists a protocol every other member supports is then
    # read in time proportional to the join's own list, whatever the group's size.
    protocol_support: Counter[str] = field(default_factory=Counter)
    supporting: int = 0

    def count_support(self, member: ClassicGroupMemberValue, step: int) -> None:
        """Count `member`'s protocols in (step 1) or out (step -1) of `protocol_support`."""
        if member.pending:
            return
        self.supporting += step
        support = self.protocol_support
        for name in {protocol.name for protocol in member.protocols}:
            support[name] += step
            if not support[name]:
                del support[name]

    @property
    def state(self) -> ClassicState:
        return ClassicState(self.meta.state)

    @property
    def generation(self) -> int:
        return self.meta.generation

    def joined(self) -> dict[str, ClassicGroupMemberValue]:
        """The members (not pending ones) that have joined the round in progress."""
        target = self.meta.generation + 1
        return {member_id: member for member_id, member in self.members.items()
                if not member.pending and member.joined_generation == target}

    def pending(self) -> dict[str, ClassicGroupMemberValue]:
        """The members only told MEMBER_ID_REQUIRED (kept without their protocols)."""
        return {member_id: member for member_id, member in self.members.items()
                if member.pending}

    def active(self) -> dict[str, ClassicGroupMemberValue]:
        """The members, without those only told MEMBER_ID_REQUIRED."""
        return {member_id: member for member_id, member in self.members.items()
                if not member.pending}

    def awaiting_sync(self) -> list[str]:
        """Members of the current generation that have not sent SyncGroup in it."""
        generation = self.meta.generation
        return [member_id for member_id, member in self.members.items()
                if not member.pending and member.synced_generation != generation]

    def max_rebalance_timeout_ms(self) -> int:
        return max((member.rebalance_timeout_ms for member in self.members.values()
                    if not member.pending), default=0)


def protocols_of(pairs: tuple[tuple[str, bytes], ...]) -> tuple[Protocol, ...]:
    return tuple(Protocol(name=name, metadata=metadata) for name, metadata in pairs)


def protocol_metadata(member: ClassicGroupMemberValue, name: str | None) -> bytes:
    for protocol in member.protocols:
        if protocol.name == name:
            return protocol.metadata
    return b""


def replace_member(member: ClassicGroupMemberValue, **changes: Any) -> ClassicGroupMemberValue:
    return dataclasses.replace(member, **changes)


def replace_meta(meta: ClassicGroupMetadataValue, **changes: Any) -> ClassicGroupMetadataValue:
    return dataclasses.replace(meta, **changes)


def metadata_record(group_id: str, meta: ClassicGroupMetadataValue | None) -> Record:
    return Record(ClassicGroupMetadataKey(group_id=group_id), meta)


def member_record(group_id: str, member_id: str,
                  member: ClassicGroupMemberValue | None) -> Record:
    return Record(ClassicGroupMemberKey(group_id=group_id, member_id=member_id), member)


def bridge_record(group_id: str, member_id: str,
                  value: ClassicBridgeMemberValue | None) -> Record:
    return Record(ClassicBridgeMemberKey(group_id=group_id, member_id=member_id), value)


class ClassicStore:
    """All classic groups, plus `replay`: the one way their state changes. Also the
    classic members of connect groups (`bridged`: (group id, member id) -> what the
    bridge keeps of each)."""

    def __init__(self) -> None:
        self.groups: dict[str, ClassicGroup] = {}
        self.bridged: dict[tuple[str, str], ClassicBridgeMemberValue] = {}
        # Members only told MEMBER_ID_REQUIRED, in every group (derived by replay).
        self.pending_total = 0

    def member_count(self) -> int:
        return sum(len(group.members) for group in self.groups.values())

    def replay(self, record: Record) -> None:
        self.apply(record.key, record.value)

    def apply(self, key: Any, value: Any) -> None:
        if isinstance(key, ClassicBridgeMemberKey):
            if value is None:
                self.bridged.pop((key.group_id, key.member_id), None)
            else:
                self.bridged[key.group_id, key.member_id] = value
            return
        if isinstance(key, ClassicGroupMetadataKey):
            if value is None:
                gone = self.groups.pop(key.group_id, None)
                if gone is not None:
                    self.pending_total -= sum(m.pending for m in gone.members.values())
                return
            group = self.groups.get(key.group_id)
            if group is None:
                self.groups[key.group_id] = ClassicGroup(key.group_id, value)
            else:
                group.meta = value
            return
        group = self.groups.get(key.group_id)
        if group is None:
            if value is None:
                return
            # (after compaction a member's record may come before its group's)
            group = self.groups[key.group_id] = ClassicGroup(key.group_id,
                                                             new_metadata("connect"))
        previous = group.members.get(key.member_id)
        if previous is not None:
            group.count_support(previous, -1)
        if previous is not None and previous.pending:
            self.pending_total -= 1
        if value is not None and value.pending:
            self.pending_total += 1
        if previous is not None and previous.instance_id is not None:
            if group.instances.get(previous.instance_id) == key.member_id:
                del group.instances[previous.instance_id]
        if value is None:
            group.members.pop(key.member_id, None)
            return
        group.members[key.member_id] = value
        group.count_support(value, 1)
        if value.instance_id is not None:
            group.instances[value.instance_id] = key.member_id

    def current_record(self, key: Any) -> Record:
        """The record that describes what the state holds for `key` now (None: nothing);
        replaying it undoes any later record with the same key."""
        if isinstance(key, ClassicBridgeMemberKey):
            return Record(key, self.bridged.get((key.group_id, key.member_id)))
        group = self.groups.get(key.group_id)
        if isinstance(key, ClassicGroupMetadataKey):
            return Record(key, group.meta if group else None)
        return Record(key, group.members.get(key.member_id) if group else None)
