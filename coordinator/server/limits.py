"""The size limits a KRPC request is held to before any work is done for it.

Three places, cheapest first:

1. while the frame is walked (protocol/guard.py): the arrays whose length the work is
   proportional to (owned units, an install's members and units, a describe's group
   ids) are refused as soon as their count is read;
2. once decoded, from the request alone (:func:`oversized_field`): ids, names and urls
   that are too long to store or to hand out to every member;
3. a describe's answer is estimated from the groups it names (:func:`describe_answer_bytes`)
   and refused if it would not fit in one frame, before it is built.

Each refusal is INVALID_REQUEST with a message naming the configuration key.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping
from typing import Any

from coordinator.config import FIELD_KEYS, ServerConfig
from coordinator.core.coordinator import GroupCoordinator
from protocol.guard import ArrayLimit, Limits

HEARTBEAT, PREPARE, INSTALL, DESCRIBE = 1000, 1001, 1002, 1003
CONNECT_APIS = (HEARTBEAT, PREPARE, INSTALL, DESCRIBE)


def _limit(config: ServerConfig, counter: str, field: str) -> ArrayLimit:
    return ArrayLimit(counter, getattr(config, field), FIELD_KEYS[field])


def decode_limits(config: ServerConfig) -> dict[int, Limits]:
    """API key -> the array limits its requests are walked with."""
    owned = _limit(config, "units", "max_owned_units")
    listed = _limit(config, "units", "max_group_units")
    return {
        HEARTBEAT: {("ConnectorsAndTasks", "connectors"): owned,
                    ("ConnectorsAndTasks", "tasks"): owned,
                    # a handful is all there is; a thousand is already absurd
                    ("ConnectGroupHeartbeatRequest", "client_assignors"):
                        ArrayLimit("assignors", 1_000, "(fixed)")},
        INSTALL: {("ConnectorsAndTasks", "connectors"): listed,
                  ("ConnectorsAndTasks", "tasks"): listed,
                  ("ConnectGroupInstallAssignmentRequest", "members"):
                      _limit(config, "members", "max_size")},
        DESCRIBE: {("ConnectGroupDescribeRequest", "group_ids"):
                   _limit(config, "groups", "max_describe_groups")},
    }


def encoded_length(text: str) -> int:
    """UTF-8 length without encoding when the answer is plain (ASCII or short)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def too_long(what: str, text: str | None, limit: int, key: str) -> str | None:
    if text is None or len(text) <= limit // 4:  # 4 bytes a character at most
        return None
    size = encoded_length(text)
    if size <= limit:
        return None
    return f"{what} is {size} bytes, above the limit of {limit} ({key})"


def _names(config: ServerConfig, what: str, names: Iterable[str]) -> str | None:
    names = tuple(names)
    # the longest in characters first, in C: a large request's names are checked at once
    if not names or max(map(len, names)) <= config.max_id_bytes // 4:
        return None
    for name in names:
        problem = too_long(what, name, config.max_id_bytes, FIELD_KEYS["max_id_bytes"])
        if problem is not None:
            return problem
    return None


_CONNECTOR = operator.attrgetter("connector")


def _units(config: ServerConfig, what: str, units: Any) -> str | None:
    if units is None:
        return None
    return (_names(config, f"{what}.Connectors[]", units.connectors)
            or _names(config, f"{what}.Tasks[].Connector", map(_CONNECTOR, units.tasks)))


def _metadata(config: ServerConfig, what: str, blobs: Iterable[bytes]) -> str | None:
    limit = config.max_metadata_bytes
    for blob in blobs:
        if len(blob) > limit:
            return (f"{what} is {len(blob)} bytes, above the limit of {limit} "
                    f"({FIELD_KEYS['max_metadata_bytes']})")
    return None


def oversized_field(api_key: int, body: Any, config: ServerConfig) -> str | None:
    """What in a decoded request is over its length limit (a message naming the key),
    or None. Proportional to the request's size, which the frame limit bounds."""
    id_key, url_key = FIELD_KEYS["max_id_bytes"], FIELD_KEYS["max_url_bytes"]
    ids = config.max_id_bytes
    if api_key not in CONNECT_APIS:
        return _classic_oversized(body, config)
    if api_key == DESCRIBE:
        return _names(config, "GroupIds[]", body.group_ids)
    problem = (too_long("GroupId", body.group_id, ids, id_key)
               or too_long("MemberId", body.member_id, ids, id_key))
    if problem is not None or api_key == PREPARE:
        return problem
    if api_key == HEARTBEAT:
        return (too_long("InstanceId", body.instance_id, ids, id_key)
                or too_long("WorkerUrl", body.worker_url, config.max_url_bytes, url_key)
                or too_long("ServerAssignor", body.server_assignor, ids, id_key)
                or _names(config, "ClientAssignors[].Name",
                          (assignor.name for assignor in body.client_assignors or ()))
                or _metadata(config, "ClientAssignors[].Metadata",
                             (assignor.metadata for assignor in body.client_assignors or ()))
                or _units(config, "OwnedConnectorsAndTasks", body.owned_connectors_and_tasks))
    if api_key == INSTALL:
        for member in body.members:
            problem = (too_long("Members[].MemberId", member.member_id, ids, id_key)
                       or _metadata(config, "Members[].Metadata", (member.metadata,))
                       or _units(config, "Members[].Assigned", member.assigned))
            if problem is not None:
                return problem
    return None


def _classic_oversized(body: Any, config: ServerConfig) -> str | None:
    """Kafka's own APIs (classic groups, FindCoordinator, Metadata): the ids a classic
    group stores are held to the id limit, and the protocol metadata and assignments it
    keeps to the metadata limit; what the request does not have is not looked at."""
    id_key, ids = FIELD_KEYS["max_id_bytes"], config.max_id_bytes
    for field in ("group_id", "member_id", "group_instance_id", "protocol_type"):
        problem = too_long(field, getattr(body, field, None), ids, id_key)
        if problem is not None:
            return problem
    for protocol in getattr(body, "protocols", None) or ():
        problem = (too_long("Protocols[].Name", protocol.name, ids, id_key)
                   or _metadata(config, "Protocols[].Metadata", (protocol.metadata,)))
        if problem is not None:
            return problem
    for assignment in getattr(body, "assignments", None) or ():
        problem = (too_long("Assignments[].MemberId", assignment.member_id, ids, id_key)
                   or _metadata(config, "Assignments[].Assignment", (assignment.assignment,)))
        if problem is not None:
            return problem
    for member in getattr(body, "members", None) or ():
        problem = (too_long("Members[].MemberId", getattr(member, "member_id", None), ids,
                            id_key)
                   or too_long("Members[].GroupInstanceId",
                               getattr(member, "group_instance_id", None), ids, id_key))
        if problem is not None:
            return problem
    return None


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
