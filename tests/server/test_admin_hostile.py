"""The admin API under hostile bodies: bounded, decoded strictly, answered in JSON."""

from __future__ import annotations

import socket

import trio

from coordinator.server.app import ServerHandle
from tests.server.conftest import TEST_CONFIG, http


async def test_invalid_utf8_body_is_a_400_json_error(server: ServerHandle) -> None:
    status, body = await http(server, "PUT", "/groups/g/connectors/c",
                              raw=b'{"tasks": 1, "x": "\xff\xfe"}')
    assert status == 400
    assert isinstance(body, dict)  # JSON
    assert body["error"] == "INVALID_REQUEST"
    assert "UTF-8" in body["message"]


def _put(port: int, head: bytes, chunks: int = 0, chunk: bytes = b"") -> bytes:
    """A PUT whose body (`chunks` chunks, chunked) is sent only as far as given, never
    finished: what the server answers (first bytes)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"PUT /groups/g/connectors/c HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/json\r\n" + head + b"\r\n")
        for _ in range(chunks):
            sock.sendall(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            data = sock.recv(4096)
            if not data:
                break
            answer += data
        return answer


async def test_a_declared_body_over_the_limit_is_refused_unread(server: ServerHandle) -> None:
    limit = TEST_CONFIG.admin_max_body_bytes
    answer = await trio.to_thread.run_sync(
        _put, server.admin_port, b"Content-Length: %d\r\n" % (limit + 1))
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b"server.admin.max.body.bytes" in answer
    status, _ = await http(server, "GET", "/groups/g")
    assert status == 404  # nothing was changed


async def test_a_chunked_body_over_the_limit_is_refused_while_it_streams(
        server: ServerHandle) -> None:
    limit = TEST_CONFIG.admin_max_body_bytes
    # Enough chunks to cross the limit, and no end: the server must answer without it.
    answer = await trio.to_thread.run_sync(
        _put, server.admin_port, b"Transfer-Encoding: chunked\r\n", limit // 65536 + 1,
        b" " * 65536)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]


async def test_a_large_group_view_is_built_off_the_loop_the_same(server: ServerHandle) -> None:
    from coordinator.client import KafkaClient
    from coordinator.server.admin import VIEW_OFFLOAD_MEMBERS
    from protocol.messages import ConnectGroupHeartbeatRequest

    members = VIEW_OFFLOAD_MEMBERS + 20
    status, _ = await http(server, "PUT", "/groups/big/connectors/c", body={"tasks": 3})
    assert status == 200
    async with await KafkaClient.connect("127.0.0.1", server.kafka_port) as client:
        for index in range(members):
            response = await client.request(1000, ConnectGroupHeartbeatRequest(
                group_id="big", member_id=f"m{index:03}", member_epoch=0,
                worker_url=f"http://w{index}:8083", rebalance_timeout_ms=30_000))
            assert response.error_code == 0
    status, view = await http(server, "GET", "/groups/big")
    assert status == 200
    assert [m["member_id"] for m in view["members"]] == [f"m{i:03}" for i in range(members)]
    assert view["connectors_and_tasks"]["connectors"] == ["c"]
    assert [t["task"] for t in view["connectors_and_tasks"]["tasks"]] == [0, 1, 2]
    targeted = sum(len(m["target"]["tasks"]) + len(m["target"]["connectors"])
                   for m in view["members"])
    assert targeted + len(view["unassigned"]["names"]) == 4
