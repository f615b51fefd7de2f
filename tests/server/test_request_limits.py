"""The server's request limits (coordinator/server/limits.py) as the frame walk applies
them: every id, url and metadata a group would store is refused by its length, naming
the configuration key, for the Connect APIs and the classic group APIs alike."""

from __future__ import annotations

from typing import Any

import pytest

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
