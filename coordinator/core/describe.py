"""Describing groups in two steps: a snapshot taken on the event loop, built elsewhere.

What a describe reads is taken at once (:func:`snapshot`, proportional to the group's
members) and holds only immutable pieces: the members' metadata, current assignments and
target parts are frozen values that a change replaces, never edits. Building the answer
(:func:`build`, proportional to every member's units, hundreds of milliseconds for a group
of thousands of members) may then run in a thread while the loop answers heartbeats.

Version 1 of the answer says each group's type and units source and each member's protocol
(`connect`, or `classic` with the protocol it was told), and describes classic groups too;
version 0 is built from the same snapshot without those fields, and finds no classic group.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from coordinator.core.group import Group, MemberMetadata, units_to_wire
from coordinator.core.reconcile import CurrentAssignment, TargetPart
from coordinator.units import Unit
from coordinator.urls import redacted_url
from protocol.errors import ApiError, ErrorCode
from protocol.messages import ConnectGroupDescribeResponse, ConnectGroupDescribeResponseV0
from protocol.messages.connect_group_describe_response import (
    DescribedGroup,
    DescribedGroupV0,
    DescribedMember,
    DescribedMemberV0,
)

EMPTY_UNITS: frozenset[Unit] = frozenset()
NEWEST_VERSION = 1
CONNECT, CLASSIC = "connect", "classic"
PENDING = "PENDING"  # a classic member only told MEMBER_ID_REQUIRED

# version -> (response, group, member) classes
_CLASSES: dict[int, tuple[type[Any], type[Any], type[Any]]] = {
    0: (ConnectGroupDescribeResponseV0, DescribedGroupV0, DescribedMemberV0),
    1: (ConnectGroupDescribeResponse, DescribedGroup, DescribedMember),
}
NO_PROTOCOLS: Mapping[str, str] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class GroupSnapshot:
    group_id: str
    state: str
    epoch: int
    assignment_epoch: int
    assignor: str | None
    units: frozenset[Unit]
    # (member id, metadata, current assignment, target units), by member id
    members: tuple[tuple[str, MemberMetadata | None, CurrentAssignment, frozenset[Unit]], ...]
    units_source: str = "admin"
    # member id -> the protocol a classic (bridged) member was told; others speak connect
    classic_protocols: Mapping[str, str] = field(default_factory=lambda: NO_PROTOCOLS)


@dataclass(frozen=True, slots=True)
class ClassicMemberSnapshot:
    member_id: str
    instance_id: str | None
    worker_url: str
    joined_generation: int
    synced_generation: int
    holds: frozenset[Unit]


@dataclass(frozen=True, slots=True)
class ClassicSnapshot:
    """A classic group as describe shows it (version 1+): its generation is both epochs,
    and a member that synced the generation is STABLE with what it holds as its target;
    one only told MEMBER_ID_REQUIRED is PENDING, at epoch -1, holding nothing."""
    group_id: str
    state: str
    generation: int
    protocol_name: str | None
    members: tuple[ClassicMemberSnapshot, ...]
    pending: tuple[str, ...] = ()  # their member ids


def snapshot(group: Group, assignor: str | None,
             units: frozenset[Unit] | None = None,
             classic_protocols: Mapping[str, str] = NO_PROTOCOLS) -> GroupSnapshot:
    """`units`: what the group runs (its connectors' units unless given);
    `classic_protocols`: the protocol each of its classic members was told."""
    target: dict[str, TargetPart] = group.target
    members = tuple(sorted(
        ((m.member_id, m.metadata, m.current,
          part.units if (part := target.get(m.member_id)) is not None else EMPTY_UNITS)
         for m in group.members.values()),
        key=lambda member: member[0]))
    return GroupSnapshot(group.group_id, group.state, group.epoch, group.assignment_epoch,
                         assignor, group.units if units is None else units, members,
                         group.units_source, MappingProxyType(classic_protocols))


def build(group: GroupSnapshot | ClassicSnapshot, version: int = NEWEST_VERSION) -> Any:
    """The described group in `version`'s classes (DescribedGroup for the newest)."""
    if isinstance(group, ClassicSnapshot):
        return _build_classic(group)
    _, group_class, member_class = _CLASSES[version]
    newer = version >= 1
    protocols = group.classic_protocols
    members = []
    for member_id, metadata, current, target in group.members:
        extra: dict[str, Any] = {}
        if newer:
            told = protocols.get(member_id)
            extra = {"protocol": CONNECT if told is None else CLASSIC, "classic_protocol": told}
        members.append(
            member_class(
                member_id=member_id,
                instance_id=metadata.instance_id if metadata else None,
                # Shown without its credentials; the group keeps the URL as the worker gave
                # it, since the leader hands it to the other workers to reach one another.
                worker_url=redacted_url(metadata.worker_url) if metadata else "",
                member_epoch=current.epoch,
                member_state=current.state.name if metadata else "UNKNOWN",
                assigned=units_to_wire(current.assigned),
                pending_revocation=units_to_wire(current.pending_revocation),
                target=units_to_wire(target),
                **extra,
            )
        )
    extra = {"group_type": CONNECT, "units_source": group.units_source} if newer else {}
    return group_class(
        error_code=0,
        error_message=None,
        group_id=group.group_id,
        group_state=group.state,
        group_epoch=group.epoch,
        assignment_epoch=group.assignment_epoch,
        assignor_name=group.assignor,
        connectors_and_tasks=units_to_wire(group.units),
        members=tuple(members),
        **extra,
    )


def _build_classic(group: ClassicSnapshot) -> DescribedGroup:
    members = []
    units: set[Unit] = set()
    for member in group.members:
        units |= member.holds
        synced = member.synced_generation == group.generation
        members.append(DescribedMember(
            member_id=member.member_id,
            instance_id=member.instance_id,
            worker_url=redacted_url(member.worker_url),
            protocol=CLASSIC,
            classic_protocol=group.protocol_name,
            member_epoch=member.joined_generation,
            member_state="STABLE" if synced else "UNKNOWN",
            assigned=units_to_wire(member.holds),
            pending_revocation=units_to_wire(EMPTY_UNITS),
            target=units_to_wire(member.holds if synced else EMPTY_UNITS),
        ))
    nothing = units_to_wire(EMPTY_UNITS)
    members.extend(DescribedMember(
        member_id=member_id, instance_id=None, worker_url="", protocol=CLASSIC,
        classic_protocol=None, member_epoch=-1, member_state=PENDING, assigned=nothing,
        pending_revocation=nothing, target=nothing) for member_id in group.pending)
    return DescribedGroup(
        error_code=0,
        error_message=None,
        group_id=group.group_id,
        group_state=group.state,
        group_type=CLASSIC,
        units_source="installs",
        group_epoch=group.generation,
        assignment_epoch=group.generation,
        assignor_name=group.protocol_name,
        connectors_and_tasks=units_to_wire(frozenset(units)),
        members=tuple(members),
    )


def failed(group_id: str, error: ApiError, version: int = NEWEST_VERSION) -> Any:
    _, group_class, _ = _CLASSES[version]
    extra = {"group_type": "", "units_source": ""} if version >= 1 else {}
    return group_class(
        error_code=int(error.code),
        error_message=error.message,
        group_id=group_id,
        group_state="DEAD",
        group_epoch=-1,
        assignment_epoch=-1,
        assignor_name=None,
        connectors_and_tasks=units_to_wire(EMPTY_UNITS),
        members=(),
        **extra,
    )


Snapshot = GroupSnapshot | ClassicSnapshot


def response(items: Sequence[Snapshot | tuple[str, ApiError]],
             version: int = NEWEST_VERSION) -> Any:
    """The answer, in `version`'s classes, for snapshots of the groups found and
    (id, error) for the others (a classic group's snapshot is for version 1+ only)."""
    response_class = _CLASSES[version][0]
    groups = [failed(*item, version) if isinstance(item, tuple) else build(item, version)
              for item in items]
    return response_class(throttle_time_ms=0, groups=tuple(groups))


def not_found(group_id: str) -> ApiError:
    if not group_id:
        return ApiError(ErrorCode.INVALID_GROUP_ID, "group id must be non-empty")
    return ApiError(ErrorCode.GROUP_ID_NOT_FOUND, f"group {group_id} does not exist")
