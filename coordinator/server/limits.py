"""The size limits a KRPC request is held to before any work is done for it.

Two places, cheapest first:

1. while the frame is walked (protocol/guard.py): the arrays whose length the work is
   proportional to (owned units, an install's members and units, a describe's group
   ids) are refused as soon as their count is read, and ids, names, urls and metadata
   that are too long to store or to hand out to every member as soon as their length is;
2. a describe's answer is estimated from the groups it names (:func:`describe_answer_bytes`,
   and for DescribeGroups :func:`described_group_bytes` of each group's snapshot) and
   refused if it would not fit in one frame, before it is built; so are ListGroups'
   (:func:`listed_groups_bytes`) and the answers with an entry per name a request lists
   (:func:`listing_answer_bytes`: FindCoordinator, Metadata, LeaveGroup).

Each refusal is INVALID_REQUEST with a message naming the configuration key.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from coordinator.config import FIELD_KEYS, ServerConfig
from coordinator.core.classic.engine import PROTOCOL_TYPE
from coordinator.core.coordinator import GroupCoordinator
from coordinator.server.classic import DescribedGroupSnapshot
from protocol.classic import (
    DESCRIBE_GROUPS,
    FIND_COORDINATOR,
    JOIN_GROUP,
    LEAVE_GROUP,
    LIST_GROUPS,
    METADATA,
    SYNC_GROUP,
)
from protocol.classic import HEARTBEAT as CLASSIC_HEARTBEAT
from protocol.guard import ArrayLimit, LengthLimit, Limit, Limits

HEARTBEAT, PREPARE, INSTALL, DESCRIBE = 1000, 1001, 1002, 1003


def _limit(config: ServerConfig, counter: str, field: str) -> ArrayLimit:
    return ArrayLimit(counter, getattr(config, field), FIELD_KEYS[field])


def _length(config: ServerConfig, field: str) -> LengthLimit:
    return LengthLimit(getattr(config, field), FIELD_KEYS[field])


def _ids(limit: LengthLimit, entity: str, *names: str) -> dict[tuple[str, str], Limit]:
    return {(entity, name): limit for name in names}


def decode_limits(config: ServerConfig) -> dict[int, Limits]:
    """API key -> the limits its requests are walked with: the arrays whose length the
    work is proportional to, and every id, name, url and metadata a group stores."""
    owned = _limit(config, "units", "max_owned_units")
    listed = _limit(config, "units", "max_group_units")
    ids, url = _length(config, "max_id_bytes"), _length(config, "max_url_bytes")
    metadata = _length(config, "max_metadata_bytes")
    # Unit names: a connector's name is an id like any other.
    units: dict[tuple[str, str], Limit] = {("ConnectorsAndTasks", "connectors[]"): ids,
                                           ("ConnectorTaskId", "connector"): ids}
    heartbeat = {("ConnectorsAndTasks", "connectors"): owned,
                 ("ConnectorsAndTasks", "tasks"): owned,
                 # a handful is all there is; a thousand is already absurd
                 ("ConnectGroupHeartbeatRequest", "client_assignors"):
                     ArrayLimit("assignors", 1_000, "(fixed)"),
                 ("ConnectGroupHeartbeatRequest", "worker_url"): url,
                 ("ClientAssignor", "metadata"): metadata,
                 **_ids(ids, "ConnectGroupHeartbeatRequest", "group_id", "member_id",
                        "instance_id", "server_assignor"),
                 **_ids(ids, "ClientAssignor", "name"), **units}
    install = {("ConnectorsAndTasks", "connectors"): listed,
               ("ConnectorsAndTasks", "tasks"): listed,
               ("ConnectGroupInstallAssignmentRequest", "members"):
                   _limit(config, "members", "max_size"),
               ("MemberAssignment", "metadata"): metadata,
               **_ids(ids, "ConnectGroupInstallAssignmentRequest", "group_id", "member_id"),
               **_ids(ids, "MemberAssignment", "member_id"), **units}
    # The classic group APIs: what a classic group stores is held to the same limits.
    classic = ("group_id", "member_id", "group_instance_id", "protocol_type")
    join = {**_ids(ids, "JoinGroupRequest", *classic),
            ("JoinGroupRequest", "protocols"):
                _limit(config, "protocols", "max_join_protocols"),
            ("JoinGroupRequestProtocol", "name"): ids,
            ("JoinGroupRequestProtocol", "metadata"): metadata}
    # A leader assigns to its group's members: no more than a group may have.
    sync = {**_ids(ids, "SyncGroupRequest", *classic),
            ("SyncGroupRequest", "assignments"): _limit(config, "members", "max_size"),
            ("SyncGroupRequestAssignment", "member_id"): ids,
            ("SyncGroupRequestAssignment", "assignment"): metadata}
    Table = dict[tuple[str, str], Limit]
    leave: Table = {
        **_ids(ids, "LeaveGroupRequest", "group_id", "member_id"),
        ("LeaveGroupRequest", "members"): _limit(config, "members", "max_leave_members"),
        **_ids(ids, "MemberIdentity", "member_id", "group_instance_id")}
    # Lookups and listings: each name asked for is an entry of the answer.
    find: Table = {
        ("FindCoordinatorRequest", "key"): ids,
        ("FindCoordinatorRequest", "coordinator_keys"):
            _limit(config, "keys", "max_find_coordinator_keys"),
        ("FindCoordinatorRequest", "coordinator_keys[]"): ids}
    topics: Table = {
        ("MetadataRequest", "topics"): _limit(config, "topics", "max_metadata_topics"),
        ("MetadataRequestTopic", "name"): ids}
    described: Table = {
        ("DescribeGroupsRequest", "groups"): _limit(config, "groups", "max_describe_groups"),
        ("DescribeGroupsRequest", "groups[]"): ids}
    list_groups: Table = {
        ("ListGroupsRequest", "states_filter"): _limit(config, "states", "max_list_filters"),
        ("ListGroupsRequest", "types_filter"): _limit(config, "types", "max_list_filters"),
        **_ids(ids, "ListGroupsRequest", "states_filter[]", "types_filter[]")}
    return {
        HEARTBEAT: Limits(heartbeat),
        PREPARE: Limits(_ids(ids, "ConnectGroupPrepareAssignmentRequest", "group_id",
                             "member_id")),
        INSTALL: Limits(install),
        DESCRIBE: Limits({("ConnectGroupDescribeRequest", "group_ids"):
                          _limit(config, "groups", "max_describe_groups"),
                          ("ConnectGroupDescribeRequest", "group_ids[]"): ids}),
        JOIN_GROUP: Limits(join),
        SYNC_GROUP: Limits(sync),
        CLASSIC_HEARTBEAT: Limits(_ids(ids, "HeartbeatRequest", "group_id", "member_id",
                                       "group_instance_id")),
        LEAVE_GROUP: Limits(leave),
        FIND_COORDINATOR: Limits(find),
        METADATA: Limits(topics),
        DESCRIBE_GROUPS: Limits(described),
        LIST_GROUPS: Limits(list_groups),
    }


def encoded_length(text: str) -> int:
    """UTF-8 length without encoding when the answer is plain (ASCII or short)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def too_long(what: str, text: str | None, limit: int, key: str) -> str | None:
    """For the admin API's JSON bodies (KRPC requests are checked as they are walked)."""
    if text is None or len(text) <= limit // 4:  # 4 bytes a character at most
        return None
    size = encoded_length(text)
    if size <= limit:
        return None
    return f"{what} is {size} bytes, above the limit of {limit} ({key})"


# What a described member costs besides its strings and units: epochs, state, markers.
_MEMBER_OVERHEAD = 48
_GROUP_OVERHEAD = 64
_UNIT_OVERHEAD = 6  # a task: length, int32, tagged fields


def _units_bytes(connectors: Mapping[str, int]) -> int:
    return sum((len(name) + _UNIT_OVERHEAD) * (tasks + 1) for name, tasks in connectors.items())


def describe_answer_bytes(core: GroupCoordinator, group_ids: Iterable[str],
                          stop_above: int) -> int:
    """About how large a describe's answer for `group_ids` is, at least; stops counting
    once above `stop_above`. Each unit of a group appears in its unit list and, at most
    about three times over, in its members' assigned, pending and target sets."""
    total = 0
    groups = core.store.groups
    for group_id in group_ids:
        total += _GROUP_OVERHEAD + len(group_id)
        group = groups.get(group_id)
        classic = core.classic.store.groups.get(group_id)
        if classic is not None:  # its members' ids and urls, and what they hold
            total += sum(_MEMBER_OVERHEAD + len(member_id) + len(member.client_id)
                         for member_id, member in classic.members.items())
        if group is not None:
            total += 3 * _units_bytes(group.connectors)  # the group's, targets, assigned
            for member_id, member in group.members.items():
                metadata = member.metadata
                total += _MEMBER_OVERHEAD + len(member_id)
                if metadata is not None:
                    total += len(metadata.instance_id or "") + len(metadata.worker_url or "")
        if total > stop_above:
            break
    return total


# What an entry of a classic answer costs besides its strings: lengths, codes, a port.
_ENTRY_OVERHEAD = 16
# FindCoordinator's entries may carry an error message (a key type not served).
_MESSAGE_ROOM = 96
_TOPIC_ID_BYTES = 16


def described_group_bytes(snapshot: DescribedGroupSnapshot) -> int:
    """About how much one group of a DescribeGroups answer takes: its members' ids,
    protocol metadata and assignments are there whole."""
    total = (_GROUP_OVERHEAD + len(snapshot.group_id) + len(snapshot.state)
             + len(snapshot.protocol_type) + len(snapshot.protocol))
    for member in snapshot.members:
        total += (_MEMBER_OVERHEAD + len(member.member_id) + len(member.instance_id or "")
                  + len(member.client_id) + len(member.client_host) + len(member.metadata)
                  + len(member.assignment))
    return total


def listed_groups_bytes(rows: Iterable[tuple[str, str, str]]) -> int:
    """About how much a ListGroups answer of `rows` (group id, state, type) takes."""
    fixed = _ENTRY_OVERHEAD + len(PROTOCOL_TYPE)
    return sum(fixed + len(group_id) + len(state) + len(kind) for group_id, state, kind in rows)


def listing_answer_bytes(api_key: int, version: int, body: Any, host: str) -> int:
    """About how much an answer with an entry per name the request lists takes
    (FindCoordinator from v4, Metadata, LeaveGroup from v3), counted from the request
    before any work is done for it; 0 for the others."""
    if api_key == FIND_COORDINATOR and version >= 4:
        entry = _ENTRY_OVERHEAD + _MESSAGE_ROOM + len(host)
        return sum(entry + len(key) for key in body.coordinator_keys)
    if api_key == METADATA:
        entry = _ENTRY_OVERHEAD + _TOPIC_ID_BYTES
        return sum(entry + len(topic.name or "") for topic in body.topics or ())
    if api_key == LEAVE_GROUP and version >= 3:
        return sum(_ENTRY_OVERHEAD + len(member.member_id) + len(member.group_instance_id or "")
                   for member in body.members)
    return 0
