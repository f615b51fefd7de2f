"""Describing groups in two steps: a snapshot taken on the event loop, built elsewhere.

What a describe reads is taken at once (:func:`snapshot`, proportional to the group's
members) and holds only immutable pieces: the members' metadata, current assignments and
target parts are frozen values that a change replaces, never edits. Building the answer
(:func:`build`, proportional to every member's units, hundreds of milliseconds for a group
of thousands of members) may then run in a thread while the loop answers heartbeats.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from coordinator.core.group import Group, MemberMetadata, units_to_wire
from coordinator.core.reconcile import CurrentAssignment, TargetPart
from coordinator.units import Unit
from protocol.errors import ApiError, ErrorCode
from protocol.messages import ConnectGroupDescribeResponse
from protocol.messages.connect_group_describe_response import DescribedGroup, DescribedMember

EMPTY_UNITS: frozenset[Unit] = frozenset()


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


def snapshot(group: Group, assignor: str | None,
             units: frozenset[Unit] | None = None) -> GroupSnapshot:
    """`units`: what the group runs (its connectors' units unless given)."""
    target: dict[str, TargetPart] = group.target
    members = tuple(sorted(
        ((m.member_id, m.metadata, m.current,
          part.units if (part := target.get(m.member_id)) is not None else EMPTY_UNITS)
         for m in group.members.values()),
        key=lambda member: member[0]))
    return GroupSnapshot(group.group_id, group.state, group.epoch, group.assignment_epoch,
                         assignor, group.units if units is None else units, members,
                         group.units_source)


def build(group: GroupSnapshot) -> DescribedGroup:
    members = []
    for member_id, metadata, current, target in group.members:
        members.append(
            DescribedMember(
                member_id=member_id,
                instance_id=metadata.instance_id if metadata else None,
                worker_url=metadata.worker_url if metadata else "",
                member_epoch=current.epoch,
                member_state=current.state.name if metadata else "UNKNOWN",
                assigned=units_to_wire(current.assigned),
                pending_revocation=units_to_wire(current.pending_revocation),
                target=units_to_wire(target),
            )
        )
    return DescribedGroup(
        error_code=0,
        error_message=None,
        group_id=group.group_id,
        group_state=group.state,
        group_epoch=group.epoch,
        assignment_epoch=group.assignment_epoch,
        assignor_name=group.assignor,
        connectors_and_tasks=units_to_wire(group.units),
        members=tuple(members),
    )


def failed(group_id: str, error: ApiError) -> DescribedGroup:
    return DescribedGroup(
        error_code=int(error.code),
        error_message=error.message,
        group_id=group_id,
        group_state="DEAD",
        group_epoch=-1,
        assignment_epoch=-1,
        assignor_name=None,
        connectors_and_tasks=units_to_wire(EMPTY_UNITS),
        members=(),
    )


def response(items: Sequence[GroupSnapshot | tuple[str, ApiError]]
             ) -> ConnectGroupDescribeResponse:
    """The answer for snapshots of the groups found and (id, error) for the others."""
    groups = [failed(*item) if isinstance(item, tuple) else build(item)
              for item in items]
    return ConnectGroupDescribeResponse(throttle_time_ms=0, groups=tuple(groups))


def not_found(group_id: str) -> ApiError:
    if not group_id:
        return ApiError(ErrorCode.INVALID_GROUP_ID, "group id must be non-empty")
    return ApiError(ErrorCode.GROUP_ID_NOT_FOUND, f"group {group_id} does not exist")
