"""The server's request limits (coordinator/server/limits.py) as the frame walk applies
them: every id, url and metadata a group would store is refused by its length, naming
the configuration key, for the Connect APIs and the classic group APIs alike."""

from __future__ import annotations

from typing import Any

import pytest

from coordinator.config import CONFIG_KEYS as FIELD_KEYS_BY_NAME
from coordinator.config import ServerConfig
from coordinator.server.limits import decode_limits
from protocol import classic as wire
from protocol.framing import RequestOverLimit, decode_request, encode_request
from protocol.messages import ConnectGroupHeartbeatRequest

CONFIG = ServerConfig(max_id_bytes=64, max_url_bytes=128, max_metadata_bytes=2048)
LIMITS = decode_limits(CONFIG)


def _frame(api_key: int, version: int, body: Any) -> bytes:
    return encode_request(api_key, version, 9, "c", body)[4:]


def _classic(api_key: int, version: int, struct: str = "", **values: Any) -> bytes:
    kind = (getattr(wire.module(api_key, version, "request"), struct) if struct
            else wire.REQUEST_CLASSES[api_key, version])
    return _frame(api_key, version, wire.build(kind, **values))


def _join(version: int, **overrides: Any) -> bytes:
    protocol_kind = wire.module(wire.JOIN_GROUP, version, "request").JoinGroupRequestProtocol
    values: dict[str, Any] = {
        "group_id": "g", "member_id": "", "protocol_type": "connect",
        "session_timeout_ms": 10_000, "rebalance_timeout_ms": 10_000,
        "protocols": (wire.build(protocol_kind, name="sessioned", metadata=b"m"),)}
    values.update(overrides)
    return _classic(wire.JOIN_GROUP, version, **values)


@pytest.mark.parametrize("version", [0, 5, 9])
def test_a_classic_join_within_the_limits_decodes(version: int) -> None:
    assert decode_request(_join(version), LIMITS).body.group_id == "g"


@pytest.mark.parametrize("version", [0, 5, 9])
@pytest.mark.parametrize("field", ["group_id", "member_id", "protocol_type"])
def test_a_classic_join_with_an_id_over_the_limit_is_refused(version: int, field: str) -> None:
    with pytest.raises(RequestOverLimit, match=r"65 bytes.*group.connect.max.id.bytes"):
        decode_request(_join(version, **{field: "x" * 65}), LIMITS)


def test_classic_protocol_metadata_over_the_limit_is_refused() -> None:
    protocol_kind = wire.module(wire.JOIN_GROUP, 9, "request").JoinGroupRequestProtocol
    big = (wire.build(protocol_kind, name="sessioned", metadata=b"m" * 2049),)
    with pytest.raises(RequestOverLimit, match="group.connect.max.metadata.bytes"):
        decode_request(_join(9, protocols=big), LIMITS)


def test_a_classic_sync_assignment_over_the_limit_is_refused() -> None:
    assignment_kind = wire.module(wire.SYNC_GROUP, 5, "request").SyncGroupRequestAssignment
    frame = _classic(wire.SYNC_GROUP, 5, group_id="g", member_id="m", generation_id=1,
                     assignments=(wire.build(assignment_kind, member_id="m",
                                             assignment=b"a" * 2049),))
    with pytest.raises(RequestOverLimit, match="group.connect.max.metadata.bytes"):
        decode_request(frame, LIMITS)


def test_a_classic_leave_of_a_member_with_a_long_instance_id_is_refused() -> None:
    member_kind = wire.module(wire.LEAVE_GROUP, 5, "request").MemberIdentity
    frame = _classic(wire.LEAVE_GROUP, 5, group_id="g",
                     members=(wire.build(member_kind, member_id="m",
                                         group_instance_id="i" * 65),))
    with pytest.raises(RequestOverLimit, match="group.connect.max.id.bytes"):
        decode_request(frame, LIMITS)


@pytest.mark.parametrize(("field", "size", "key"), [
    ("member_id", 65, "group.connect.max.id.bytes"),
    ("instance_id", 65, "group.connect.max.id.bytes"),
    ("server_assignor", 65, "group.connect.max.id.bytes"),
    ("worker_url", 129, "group.connect.max.url.bytes"),
])
def test_a_heartbeat_field_over_its_limit_is_refused(field: str, size: int, key: str) -> None:
    values: dict[str, Any] = {"group_id": "g", "member_id": "m", "member_epoch": 0,
                              field: "x" * size}
    with pytest.raises(RequestOverLimit, match=rf"{size} bytes.*{key}"):
        decode_request(_frame(1000, 0, ConnectGroupHeartbeatRequest(**values)), LIMITS)
    values[field] = "x" * (size - 1)
    assert decode_request(_frame(1000, 0, ConnectGroupHeartbeatRequest(**values)), LIMITS)


# -- the lists Kafka's own APIs carry --------------------------------------------------------

LISTS = ServerConfig(max_join_protocols=3, max_leave_members=2, max_describe_groups=2,
                     max_find_coordinator_keys=2, max_metadata_topics=2, max_list_filters=2,
                     max_size=2)
LIST_LIMITS = decode_limits(LISTS)


def _protocols(version: int, count: int) -> tuple[Any, ...]:
    kind = wire.module(wire.JOIN_GROUP, version, "request").JoinGroupRequestProtocol
    return tuple(wire.build(kind, name=f"p{index}", metadata=b"m") for index in range(count))


def _assignments(count: int) -> tuple[Any, ...]:
    kind = wire.module(wire.SYNC_GROUP, 5, "request").SyncGroupRequestAssignment
    return tuple(wire.build(kind, member_id=f"m{index}", assignment=b"a")
                 for index in range(count))


def _leavers(count: int) -> tuple[Any, ...]:
    kind = wire.module(wire.LEAVE_GROUP, 5, "request").MemberIdentity
    return tuple(wire.build(kind, member_id=f"m{index}") for index in range(count))


def _topics(count: int) -> tuple[Any, ...]:
    kind = wire.module(wire.METADATA, 12, "request").MetadataRequestTopic
    return tuple(wire.build(kind, name=f"t{index}", topic_id=None) for index in range(count))


LIST_CASES = {
    "group.connect.max.join.protocols": lambda n: _join(9, protocols=_protocols(9, n)),
    "group.connect.max.size": lambda n: _classic(
        wire.SYNC_GROUP, 5, group_id="g", member_id="m", assignments=_assignments(n)),
    "group.connect.max.leave.members": lambda n: _classic(
        wire.LEAVE_GROUP, 5, group_id="g", members=_leavers(n)),
    "group.connect.max.describe.groups": lambda n: _classic(
        wire.DESCRIBE_GROUPS, 5, groups=tuple(f"g{index}" for index in range(n))),
    "group.connect.max.find.coordinator.keys": lambda n: _classic(
        wire.FIND_COORDINATOR, 6, coordinator_keys=tuple(f"k{index}" for index in range(n))),
    "group.connect.max.metadata.topics": lambda n: _classic(
        wire.METADATA, 12, topics=_topics(n)),
    "group.connect.max.list.filters": lambda n: _classic(
        wire.LIST_GROUPS, 5, states_filter=("Stable",) * n),
}


@pytest.mark.parametrize("key", sorted(LIST_CASES))
def test_a_list_over_its_limit_is_refused_naming_the_key(key: str) -> None:
    field = FIELD_KEYS_BY_NAME[key]
    limit = getattr(LISTS, field)
    assert decode_request(LIST_CASES[key](limit), LIST_LIMITS)
    with pytest.raises(RequestOverLimit, match=rf"{limit + 1} elements.*{key}"):
        decode_request(LIST_CASES[key](limit + 1), LIST_LIMITS)


def test_a_list_groups_types_filter_is_limited_too() -> None:
    frame = _classic(wire.LIST_GROUPS, 5, types_filter=("classic", "connect", "consumer"))
    with pytest.raises(RequestOverLimit, match="group.connect.max.list.filters"):
        decode_request(frame, LIST_LIMITS)


@pytest.mark.parametrize("api_key", [wire.FIND_COORDINATOR, wire.DESCRIBE_GROUPS])
def test_a_name_a_lookup_asks_for_is_held_to_the_id_limit(api_key: int) -> None:
    frame = (_classic(api_key, 6, coordinator_keys=("k" * 65,)) if api_key == wire.FIND_COORDINATOR
             else _classic(api_key, 5, groups=("g" * 65,)))
    with pytest.raises(RequestOverLimit, match="group.connect.max.id.bytes"):
        decode_request(frame, LIMITS)
