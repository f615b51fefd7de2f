"""Ids on every surface, over real TCP: every legal group id can be addressed through the
admin API (a `/` percent-encoded), a path that is not valid percent-encoded UTF-8 is
refused, and control characters are refused in ids by the admin API and by KRPC alike."""

from __future__ import annotations

import socket
from typing import Any
from urllib.parse import quote

import pytest
import trio

from coordinator.client import KafkaClient
from coordinator.server.app import ServerHandle
from protocol.errors import ErrorCode
from protocol.messages import ConnectGroupHeartbeatRequest, ConnectorsAndTasks
from tests.server.conftest import http
from tests.server.test_classic_tcp import join

# A control character of each kind: C0, DEL, C1, a line separator, a bidi override.
CONTROLS = ["\x00", "\n", "\x1b", "\x7f", "\x85", "\u2028", "\u202e", "\u2066"]


async def test_a_group_id_with_a_slash_is_addressable_percent_encoded(
        server: ServerHandle) -> None:
    group = "team/a b%"
    path = f"/groups/{quote(group, safe='')}"
    status, answer = await http(server, "PUT", f"{path}/connectors/{quote('c/1', safe='')}",
                                body={"tasks": 2})
    assert status == 200, answer
    status, view = await http(server, "GET", path)
    assert status == 200, view
    assert view["group_id"] == group
    assert view["connectors_and_tasks"]["connectors"] == ["c/1"]
    status, listed = await http(server, "GET", "/groups")
    assert [g["group_id"] for g in listed["groups"]] == [group]
    status, answer = await http(server, "PUT", f"{path}/config",
                                body={"connect.session.timeout.ms": 20_000})
    assert status == 200, answer
    status, answer = await http(server, "GET", f"{path}/config")
    assert status == 200 and answer["group"] == group
    status, answer = await http(server, "DELETE", f"{path}/connectors/{quote('c/1', safe='')}")
    assert status == 200, answer
    status, answer = await http(server, "DELETE", path)
    assert status == 200, answer


def raw_request(port: int, target: bytes) -> bytes:
    """A GET of `target` as given (no client re-encodes it); the server's whole answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"GET " + target + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = b""
        while data := sock.recv(4096):
            answer += data
        return answer


@pytest.mark.parametrize("target, why", [
    (b"/groups/a%zzb", b"percent"),
    (b"/groups/a%", b"percent"),
    (b"/groups/a%ff%fe", b"UTF-8"),
    (b"/groups/%c3%28/config", b"UTF-8"),
])
async def test_a_path_that_is_not_percent_encoded_utf8_is_refused(
        server: ServerHandle, target: bytes, why: bytes) -> None:
    answer = await trio.to_thread.run_sync(raw_request, server.admin_port, target)
    assert answer.startswith(b"HTTP/1.1 400"), answer[:300]
    assert why in answer
    status, listed = await http(server, "GET", "/groups")
    assert listed["groups"] == []  # nothing was created under a replaced name


@pytest.mark.parametrize("control", CONTROLS)
async def test_control_characters_are_refused_in_admin_ids(
        server: ServerHandle, control: str) -> None:
    for path in (f"/groups/{quote('g' + control + 'x', safe='')}/connectors/c",
                 f"/groups/g/connectors/{quote('c' + control + 'x', safe='')}"):
        status, answer = await http(server, "PUT", path, body={"tasks": 1})
        assert status == 400, (path, answer)
        assert "control character" in answer["message"]
    status, answer = await http(server, "PUT",
                                f"/groups/{quote('g' + control, safe='')}/config",
                                body={"connect.session.timeout.ms": 20_000})
    assert status == 400, answer
    status, answer = await http(server, "POST", "/groups/g/members/remove",
                                body={"members": [{"instance_id": "i" + control}]})
    assert status == 400 and "control character" in answer["message"], answer
    status, listed = await http(server, "GET", "/groups")
    assert listed["groups"] == []


def heartbeat(**fields: Any) -> ConnectGroupHeartbeatRequest:
    values: dict[str, Any] = dict(group_id="g", member_id="m", member_epoch=0,
                                  worker_url="http://w:8083", rebalance_timeout_ms=30_000)
    values.update(fields)
    return ConnectGroupHeartbeatRequest(**values)


@pytest.mark.parametrize("control", CONTROLS)
async def test_control_characters_are_refused_in_krpc_ids(
        server: ServerHandle, control: str) -> None:
    async with await KafkaClient.connect("127.0.0.1", server.kafka_port) as client:
        for request in (heartbeat(group_id="g" + control),
                        heartbeat(member_id="m" + control),
                        heartbeat(instance_id="i" + control)):
            response = await client.request(1000, request)
            assert response.error_code == ErrorCode.INVALID_REQUEST, request
            assert "control character" in response.error_message
        joined = await client.request(1000, heartbeat())
        assert joined.error_code == 0
        owned = ConnectorsAndTasks(connectors=("c" + control,), tasks=())
        response = await client.request(1000, heartbeat(
            member_epoch=joined.member_epoch, owned_connectors_and_tasks=owned))
        assert response.error_code == ErrorCode.INVALID_REQUEST
        assert "control character" in response.error_message
        answer = await join(client, group="g" + control)
        assert answer.error_code == ErrorCode.INVALID_GROUP_ID
        answer = await join(client, group="classic", instance_id="i" + control)
        assert answer.error_code == ErrorCode.INVALID_REQUEST
    status, listed = await http(server, "GET", "/groups")
    assert [g["group_id"] for g in listed["groups"]] == ["g"]


async def test_printable_unicode_ids_are_accepted_everywhere(server: ServerHandle) -> None:
    group = "café-グループ-👩\u200d💻 x"  # accents, CJK, an emoji joined by ZWJ, a space
    async with await KafkaClient.connect("127.0.0.1", server.kafka_port) as client:
        response = await client.request(1000, heartbeat(group_id=group, member_id="m-é"))
        assert response.error_code == 0, response.error_message
    status, answer = await http(server, "PUT",
                                f"/groups/{quote(group, safe='')}/connectors/{quote('ç', safe='')}",
                                body={"tasks": 1})
    assert status == 200, answer
    status, view = await http(server, "GET", f"/groups/{quote(group, safe='')}")
    assert status == 200 and view["group_id"] == group
    assert view["connectors_and_tasks"]["connectors"] == ["ç"]
