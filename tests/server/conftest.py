"""Server fixtures: the real coordinator on port 0 in the test's trio run, over real TCP."""

from __future__ import annotations

import json
import struct
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio

from coordinator.config import ServerConfig
from coordinator.server.app import ServerHandle, run_server
from protocol.framing import FrameBuffer

# Small frames make the oversize case cheap; no assignor offload keeps tests process-free.
TEST_CONFIG = ServerConfig(
    assignment_interval_ms=0,
    assignor_offload_enable=False,
    max_frame_bytes=4_096,
    shutdown_timeout_ms=2_000,
)


@pytest.fixture
async def server(nursery: trio.Nursery) -> AsyncIterator[ServerHandle]:
    handle: ServerHandle = await nursery.start(
        run_server, TEST_CONFIG, ("127.0.0.1", 0), ("127.0.0.1", 0)
    )
    yield handle
    handle.stop()


def admin_url(handle: ServerHandle, path: str) -> str:
    return f"http://127.0.0.1:{handle.admin_port}{path}"


def _http(method: str, url: str, body: bytes | None) -> tuple[int, str, Any]:
    request = urllib.request.Request(url, data=body, method=method)
    if body is not None:
        request.add_header("content-type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            status, content_type, raw = (
                response.status, response.headers.get("content-type", ""), response.read()
            )
    except urllib.error.HTTPError as error:
        status, content_type, raw = error.code, error.headers.get("content-type", ""), error.read()
        error.close()
    payload: Any = raw.decode()
    if content_type.startswith("application/json"):
        payload = json.loads(raw)
    return status, content_type, payload


async def http(
    handle: ServerHandle, method: str, path: str, body: Any = None, raw: bytes | None = None
) -> tuple[int, Any]:
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    status, _, payload = await trio.to_thread.run_sync(
        _http, method, admin_url(handle, path), data
    )
    return status, payload


async def read_frame(stream: trio.SocketStream, buffer: FrameBuffer) -> bytes | None:
    """The next frame, or None when the server closed the connection."""
    while True:
        frame = buffer.next_frame()
        if frame is not None:
            return frame
        data = await stream.receive_some(65536)
        if not data:
            return None
        buffer.feed(data)


def raw_header(api_key: int, api_version: int, correlation_id: int) -> bytes:
    """A request header v2 with a null client id and no tagged fields."""
    return struct.pack(">hhih", api_key, api_version, correlation_id, -1) + b"\x00"


def framed(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload
