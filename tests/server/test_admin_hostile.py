"""The admin API under hostile bodies: bounded, decoded strictly, answered in JSON."""

from __future__ import annotations

import socket

from coordinator.server.app import ServerHandle
from tests.server.conftest import TEST_CONFIG, http


async def test_invalid_utf8_body_is_a_400_json_error(server: ServerHandle) -> None:
    status, body = await http(server, "PUT", "/groups/g/connectors/c",
                              raw=b'{"tasks": 1, "x": "\xff\xfe"}')
    assert status == 400
    assert isinstance(body, dict)  # JSON
    assert body["error"] == "INVALID_REQUEST"
    assert "UTF-8" in body["message"]


async def test_a_body_over_the_limit_is_refused_with_413(server: ServerHandle) -> None:
    limit = TEST_CONFIG.admin_max_body_bytes
    status, body = await http(server, "PUT", "/groups/g/connectors/c",
                              raw=b'{"tasks": 1' + b" " * limit + b"}")
    assert status == 413
    assert "server.admin.max.body.bytes" in body["message"]
    status, _ = await http(server, "GET", "/groups/g")
    assert status == 404  # nothing was changed


def _chunked_put(port: int, chunks: int, chunk: bytes) -> bytes:
    """A chunked PUT that never says its length; what the server answers (first bytes)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"PUT /groups/g/connectors/c HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
        try:
            for _ in range(chunks):
                sock.sendall(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
            sock.sendall(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused before the end: what we want
        return sock.recv(4096)


async def test_a_chunked_body_over_the_limit_is_refused_while_it_streams(
        server: ServerHandle) -> None:
    import trio
    limit = TEST_CONFIG.admin_max_body_bytes
    answer = await trio.to_thread.run_sync(_chunked_put, server.admin_port,
                                           limit // 65536 + 4, b" " * 65536)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
