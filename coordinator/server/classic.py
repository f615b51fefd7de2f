"""The shell of Kafka's classic APIs: kio messages in and out, parked requests held.

- Metadata and FindCoordinator are answered here: standalone, the coordinator is the only
  broker (node COORDINATOR_NODE_ID, at the address the client reached) and has no topics.
- JoinGroup, SyncGroup, Heartbeat and LeaveGroup become the classic engine's requests and
  its answers become the response of the version asked for. A JoinGroup or SyncGroup the
  engine parks waits here (`Waiters`) until a later change releases it, once that change's
  records are durable.
- DescribeGroups and ListGroups show classic and connect groups alike.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import trio

from coordinator.core.classic.engine import (
    JOIN,
    PROTOCOL_TYPE,
    DescribedClassicMember,
    HeartbeatRequest,
    JoinAnswer,
    JoinRequest,
    LeaveRequest,
    SyncAnswer,
    SyncRequest,
    WaiterKey,
)
from protocol import classic as wire
from protocol.errors import ErrorCode

COORDINATOR_NODE_ID = 0
CLUSTER_ID = "connect-coordinator"

# Kafka's names for the states of groups of the new protocol, for connect groups.
_CONNECT_STATES = {"EMPTY": "Empty", "ASSIGNING": "Assigning", "RECONCILING": "Reconciling",
                   "STABLE": "Stable", "DEAD": "Dead"}


# ---------------------------------------------------------------------- parked requests


class _Waiter:
    __slots__ = ("answer", "_done")

    def __init__(self) -> None:
        self.answer: Any = None
        self._done = trio.Event()

    def set(self, answer: Any) -> None:
        if not self._done.is_set():
            self.answer = answer
            self._done.set()

    async def wait(self) -> Any:
        await self._done.wait()
        return self.answer


def _displaced(key: WaiterKey) -> Any:
    """What a parked request gets when the same member sends another one meanwhile."""
    if key[0] == JOIN:
        return JoinAnswer(ErrorCode.REBALANCE_IN_PROGRESS, key[2])
    return SyncAnswer(ErrorCode.REBALANCE_IN_PROGRESS)


class Waiters:
    """Parked JoinGroup and SyncGroup requests, by (join|sync, group, member)."""

    def __init__(self) -> None:
        self._waiting: dict[WaiterKey, _Waiter] = {}

    def __len__(self) -> int:
        return len(self._waiting)

    def park(self, key: WaiterKey) -> _Waiter:
        waiter = _Waiter()
        previous = self._waiting.get(key)
        if previous is not None:
            previous.set(_displaced(key))
        self._waiting[key] = waiter
        return waiter

    def discard(self, key: WaiterKey, waiter: _Waiter) -> None:
        if self._waiting.get(key) is waiter:
            del self._waiting[key]

    def release(self, releases: Iterable[tuple[Any, Any]]) -> None:
        for key, answer in releases:
            waiter = self._waiting.pop(key, None)
            if waiter is not None:
                waiter.set(answer)

    def release_all(self, code: int) -> None:
        """Answer every parked request with `code` (the server is shutting down)."""
        for key, waiter in list(self._waiting.items()):
            waiter.set(JoinAnswer(code, key[2]) if key[0] == JOIN else SyncAnswer(code))
        self._waiting.clear()


# ---------------------------------------------------------------------- requests


@dataclass(frozen=True, slots=True)
class Address:
    host: str
    port: int


def join_request(body: Any, version: int, client_id: str | None, client_host: str
                 ) -> JoinRequest:
    session = wire.timeout_ms(body.session_timeout)
    rebalance = wire.timeout_ms(body.rebalance_timeout) if version >= 1 else session
    return JoinRequest(
        group_id=body.group_id,
        member_id=body.member_id,
        protocol_type=body.protocol_type,
        protocols=tuple((protocol.name, protocol.metadata) for protocol in body.protocols),
        session_timeout_ms=session,
        rebalance_timeout_ms=rebalance if rebalance > 0 else session,
        instance_id=getattr(body, "group_instance_id", None),
        client_id=client_id or "",
        client_host=client_host,
        require_known_member_id=version >= 4,
        skip_assignment_supported=version >= 9,
        reason=getattr(body, "reason", None),
    )


def sync_request(body: Any) -> SyncRequest:
    return SyncRequest(
        group_id=body.group_id,
        member_id=body.member_id,
        generation=int(body.generation_id),
        assignments=tuple((item.member_id, item.assignment) for item in body.assignments),
        instance_id=getattr(body, "group_instance_id", None),
        protocol_type=getattr(body, "protocol_type", None),
        protocol_name=getattr(body, "protocol_name", None),
    )


def heartbeat_request(body: Any) -> HeartbeatRequest:
    return HeartbeatRequest(body.group_id, body.member_id, int(body.generation_id),
                            getattr(body, "group_instance_id", None))


def leave_request(body: Any, version: int) -> LeaveRequest:
    if version < 3:
        return LeaveRequest(body.group_id, ((body.member_id, None),))
    return LeaveRequest(body.group_id, tuple(
        (member.member_id, member.group_instance_id) for member in body.members))


# ---------------------------------------------------------------------- responses


def join_response(version: int, answer: JoinAnswer) -> Any:
    members = tuple(
        wire.nested(wire.JOIN_GROUP, version, "response", "JoinGroupResponseMember",
                    member_id=member.member_id, group_instance_id=member.instance_id,
                    metadata=member.metadata)
        for member in answer.members)
    return wire.build(
        wire.RESPONSE_CLASSES[wire.JOIN_GROUP, version],
        error_code=answer.error, generation_id=answer.generation,
        protocol_type=answer.protocol_type,
        # (before v7 the name is not nullable)
        protocol_name=answer.protocol_name if version >= 7 else answer.protocol_name or "",
        leader=answer.leader, skip_assignment=answer.skip_assignment,
        member_id=answer.member_id, members=members)


def sync_response(version: int, answer: SyncAnswer) -> Any:
    return wire.build(wire.RESPONSE_CLASSES[wire.SYNC_GROUP, version],
                      error_code=answer.error, protocol_type=answer.protocol_type,
                      protocol_name=answer.protocol_name, assignment=answer.assignment)


def heartbeat_response(version: int, code: int) -> Any:
    return wire.build(wire.RESPONSE_CLASSES[wire.HEARTBEAT, version], error_code=code)


def leave_response(version: int, code: int,
                   members: tuple[tuple[str, str | None, int], ...]) -> Any:
    if version < 3:
        return wire.build(wire.RESPONSE_CLASSES[wire.LEAVE_GROUP, version], error_code=code)
    return wire.build(
        wire.RESPONSE_CLASSES[wire.LEAVE_GROUP, version], error_code=ErrorCode.NONE,
        members=tuple(
            wire.nested(wire.LEAVE_GROUP, version, "response", "MemberResponse",
                        member_id=member_id, group_instance_id=instance_id, error_code=error)
            for member_id, instance_id, error in members))


def metadata_response(version: int, body: Any, address: Address) -> Any:
    broker = wire.nested(wire.METADATA, version, "response", "MetadataResponseBroker",
                         node_id=COORDINATOR_NODE_ID, host=address.host, port=address.port)
    # A topic asked for by name does not exist here; an empty or null list asks for
    # all topics, of which there are none.
    topics = tuple(
        wire.nested(wire.METADATA, version, "response", "MetadataResponseTopic",
                    error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, name=topic.name,
                    topic_id=getattr(topic, "topic_id", None), partitions=())
        for topic in (body.topics or ()) if topic.name)
    return wire.build(wire.RESPONSE_CLASSES[wire.METADATA, version], brokers=(broker,),
                      cluster_id=CLUSTER_ID, controller_id=COORDINATOR_NODE_ID, topics=topics)


GROUP_KEY_TYPE = 0


def find_coordinator_response(version: int, body: Any, address: Address) -> tuple[Any, int]:
    key_type = int(getattr(body, "key_type", GROUP_KEY_TYPE))
    if key_type == GROUP_KEY_TYPE:
        code, message = ErrorCode.NONE, None
        node, host, port = COORDINATOR_NODE_ID, address.host, address.port
    else:
        code = ErrorCode.COORDINATOR_NOT_AVAILABLE
        message = f"this coordinator serves groups only (key type 0), not key type {key_type}"
        node, host, port = -1, "", -1
    response_type = wire.RESPONSE_CLASSES[wire.FIND_COORDINATOR, version]
    if version < 4:
        return wire.build(response_type, error_code=code, error_message=message, node_id=node,
                          host=host, port=port), code
    coordinators = tuple(
        wire.nested(wire.FIND_COORDINATOR, version, "response", "Coordinator", key=key,
                    node_id=node, host=host, port=port, error_code=code,
                    error_message=message)
        for key in body.coordinator_keys)
    return wire.build(response_type, coordinators=coordinators), code


def _connect_group_view(core: Any, group_id: str) -> tuple[str, str, tuple[Any, ...]] | None:
    group = core.store.groups.get(group_id)
    if group is None:
        return None
    return (_CONNECT_STATES.get(group.state, group.state), group.assignor_name or "",
            tuple(group.members.values()))


def listed_groups(core: Any) -> list[tuple[str, str, str, str]]:
    """Every group: (group id, protocol type, state, group type), in group id order."""
    listed = []
    for group_id, group in core.classic.store.groups.items():
        listed.append((group_id, group.meta.protocol_type, group.state.label, "classic"))
    for group_id in core.store.groups:
        view = _connect_group_view(core, group_id)
        if view is not None:
            listed.append((group_id, PROTOCOL_TYPE, view[0], "connect"))
    return sorted(listed)


def list_groups_rows(body: Any, core: Any) -> list[tuple[str, str, str]]:
    """The groups ListGroups answers with, filtered: (group id, state, group type)."""
    states = {state.lower() for state in getattr(body, "states_filter", ())}
    types = {kind.lower() for kind in getattr(body, "types_filter", ())}
    return [(group_id, state, kind) for group_id, _, state, kind in listed_groups(core)
            if (not states or state.lower() in states) and (not types or kind in types)]


def list_groups_body(version: int, rows: Iterable[tuple[str, str, str]]) -> Any:
    groups = tuple(
        wire.nested(wire.LIST_GROUPS, version, "response", "ListedGroup", group_id=group_id,
                    protocol_type=PROTOCOL_TYPE, group_state=state, group_type=kind)
        for group_id, state, kind in rows)
    return wire.build(wire.RESPONSE_CLASSES[wire.LIST_GROUPS, version],
                      error_code=ErrorCode.NONE, groups=groups)


def list_groups_response(version: int, body: Any, core: Any) -> Any:
    return list_groups_body(version, list_groups_rows(body, core))


def _assignor_metadata(metadata: Any, assignor: str | None) -> bytes:
    if metadata is None:
        return b""
    return next((info.metadata for info in metadata.client_assignors if info.name == assignor),
                b"")


@dataclass(frozen=True, slots=True)
class DescribedGroupSnapshot:
    """What DescribeGroups shows of one group, taken on the event loop: plain values that
    later changes to the group do not touch, so the answer can be built elsewhere."""

    group_id: str
    state: str
    protocol_type: str
    protocol: str
    members: tuple[DescribedClassicMember, ...]


def describe_group_snapshot(core: Any, group_id: str) -> DescribedGroupSnapshot:
    classic_view = core.classic.describe(group_id)
    if classic_view is not None:
        return DescribedGroupSnapshot(
            group_id, classic_view.state, classic_view.protocol_type,
            classic_view.protocol_name, classic_view.members)
    connect_view = _connect_group_view(core, group_id)
    if connect_view is None:
        return DescribedGroupSnapshot(group_id, "Dead", "", "", ())
    state, protocol, connect_members = connect_view
    bridged = core.classic.store.bridged
    told = [value.protocol_name for member in connect_members
            if (value := bridged.get((group_id, member.member_id))) is not None]
    # The protocol classic workers were told names the group's protocol, as a broker
    # names it; each member's metadata is its Connect metadata for the selected assignor
    # (the bytes a classic worker sent for that protocol).
    assignor = core.store.groups[group_id].assignor_name
    return DescribedGroupSnapshot(
        group_id, state, PROTOCOL_TYPE, told[0] if told else protocol, tuple(
            DescribedClassicMember(
                member.member_id, member.metadata.instance_id if member.metadata else None,
                "", "", _assignor_metadata(member.metadata, assignor), b"")
            for member in connect_members))


def describe_groups_body(version: int, snapshots: Iterable[DescribedGroupSnapshot]) -> Any:
    described = tuple(
        wire.nested(
            wire.DESCRIBE_GROUPS, version, "response", "DescribedGroup",
            error_code=ErrorCode.NONE, group_id=group.group_id, group_state=group.state,
            protocol_type=group.protocol_type, protocol_data=group.protocol,
            members=tuple(
                wire.nested(wire.DESCRIBE_GROUPS, version, "response",
                            "DescribedGroupMember", member_id=member.member_id,
                            group_instance_id=member.instance_id,
                            client_id=member.client_id, client_host=member.client_host,
                            member_metadata=member.metadata,
                            member_assignment=member.assignment)
                for member in group.members),
            authorized_operations=-2147483648)
        for group in snapshots)
    return wire.build(wire.RESPONSE_CLASSES[wire.DESCRIBE_GROUPS, version], groups=described)


def describe_groups_response(version: int, body: Any, core: Any) -> Any:
    return describe_groups_body(version, (describe_group_snapshot(core, group_id)
                                          for group_id in body.groups))
