"""The KRPC listener over real TCP: versions, bad frames, pipelining, errors, readiness."""

from __future__ import annotations

import struct
from typing import Any

import kio.schema.api_versions.v0 as av0
import kio.schema.api_versions.v1 as av1
import kio.schema.api_versions.v2 as av2
import kio.schema.api_versions.v3 as av3
import kio.schema.api_versions.v4 as av4
import pytest
import trio

from coordinator.assignors import load_assignors
from coordinator.client import KafkaClient
from coordinator.core.coordinator import GroupCoordinator
from coordinator.server.app import ServerHandle
from coordinator.server.kafka import KafkaServer
from coordinator.server.runtime import Runtime
from protocol.errors import ErrorCode
from protocol.framing import FrameBuffer, decode_response, encode_request
from protocol.messages import ConnectGroupDescribeRequest, ConnectGroupHeartbeatRequest
from tests.server.conftest import TEST_CONFIG, framed, raw_header, read_frame

API_VERSIONS = 18
HEARTBEAT = 1000
DESCRIBE = 1003


def api_versions_request(version: int) -> Any:
    if version >= 3:
        module = av3 if version == 3 else av4
        return module.ApiVersionsRequest(
            client_software_name="tests", client_software_version="1.0"
        )
    return (av0, av1, av2)[version].ApiVersionsRequest()


async def connect(handle: ServerHandle) -> trio.SocketStream:
    return await trio.open_tcp_stream("127.0.0.1", handle.kafka_port)


async def assert_still_serving(handle: ServerHandle) -> None:
    """A fresh connection gets an ApiVersions answer."""
    async with await KafkaClient.connect("127.0.0.1", handle.kafka_port) as client:
        response = await client.request(API_VERSIONS, api_versions_request(0), 0)
    assert int(response.error_code) == 0


async def assert_closed(stream: trio.SocketStream) -> None:
    with trio.fail_after(5):
        assert await read_frame(stream, FrameBuffer(1 << 20)) is None


@pytest.mark.parametrize("version", [0, 1, 2, 3, 4])
async def test_api_versions_lists_every_api(server: ServerHandle, version: int) -> None:
    async with await KafkaClient.connect("127.0.0.1", server.kafka_port) as client:
        response = await client.request(API_VERSIONS, api_versions_request(version), version)
    assert int(response.error_code) == 0
    served = {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in response.api_keys}
    assert served == {18: (0, 4), 1000: (0, 0), 1001: (0, 0), 1002: (0, 0), 1003: (0, 1),
                      # Kafka's, for classic members and for finding the coordinator
                      3: (0, 12), 10: (0, 6), 11: (0, 9), 12: (0, 4), 13: (0, 5), 14: (0, 5),
                      15: (0, 5), 16: (0, 5)}


async def test_unknown_api_key_is_answered_and_connection_stays(server: ServerHandle) -> None:
    stream = await connect(server)
    async with stream:
        await stream.send_all(framed(raw_header(4242, 0, 77)))
        buffer = FrameBuffer(1 << 20)
        frame = await read_frame(stream, buffer)
        assert frame is not None
        correlation, code = struct.unpack(">ih", frame[:6])
        assert (correlation, code) == (77, ErrorCode.UNSUPPORTED_VERSION)
        # the same connection still serves
        await stream.send_all(encode_request(API_VERSIONS, 0, 78, "t", api_versions_request(0)))
        frame = await read_frame(stream, buffer)
        assert frame is not None
        assert decode_response(frame, API_VERSIONS, 0)[0] == 78
    await assert_still_serving(server)


async def test_unsupported_version_is_answered_and_connection_stays(server: ServerHandle) -> None:
    stream = await connect(server)
    async with stream:
        # ConnectGroupHeartbeat v3 does not exist; the header parses, the version does not.
        await stream.send_all(framed(raw_header(HEARTBEAT, 3, 5)))
        buffer = FrameBuffer(1 << 20)
        frame = await read_frame(stream, buffer)
        assert frame is not None
        body: Any
        correlation, body = decode_response(frame, HEARTBEAT, 0)
        assert correlation == 5
        assert body.error_code == ErrorCode.UNSUPPORTED_VERSION
        assert body.error_message
        # ApiVersions v9 gets the v0 answer with UNSUPPORTED_VERSION, as Kafka does
        await stream.send_all(framed(raw_header(API_VERSIONS, 9, 6)))
        frame = await read_frame(stream, buffer)
        assert frame is not None
        versions: Any
        correlation, versions = decode_response(frame, API_VERSIONS, 0)
        assert (correlation, int(versions.error_code)) == (6, ErrorCode.UNSUPPORTED_VERSION)
        await stream.send_all(encode_request(API_VERSIONS, 0, 7, "t", api_versions_request(0)))
        frame = await read_frame(stream, buffer)
        assert frame is not None and decode_response(frame, API_VERSIONS, 0)[0] == 7


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param(framed(b"\x00\x01"), id="header-too-short"),
        pytest.param(struct.pack(">i", -5) + b"abc", id="negative-size"),
        pytest.param(struct.pack(">i", 1 << 20), id="oversize"),
    ],
)
async def test_bad_frames_close_only_their_connection(server: ServerHandle, payload: bytes) -> None:
    bystander = await connect(server)
    stream = await connect(server)
    async with bystander, stream:
        await stream.send_all(payload)
        await assert_closed(stream)
        # a connection opened before keeps working, and so does a new one
        await bystander.send_all(encode_request(API_VERSIONS, 0, 9, "t", api_versions_request(0)))
        frame = await read_frame(bystander, FrameBuffer(1 << 20))
        assert frame is not None and decode_response(frame, API_VERSIONS, 0)[0] == 9
    await assert_still_serving(server)


@pytest.mark.parametrize(
    ("payload", "api_key"),
    [
        pytest.param(framed(raw_header(HEARTBEAT, 0, 1) + b"\xff\xff"), HEARTBEAT,
                     id="garbage-body"),
        pytest.param(
            framed(encode_request(API_VERSIONS, 0, 1, "t", api_versions_request(0))[4:] + b"junk"),
            API_VERSIONS, id="trailing-bytes",
        ),
    ],
)
async def test_bad_bodies_are_answered_invalid_request(server: ServerHandle, payload: bytes,
                                                       api_key: int) -> None:
    """The frame boundary holds, so a body that does not parse is answered, and the
    connection goes on."""
    stream = await connect(server)
    async with stream:
        buffer = FrameBuffer(1 << 20)
        await stream.send_all(payload)
        frame = await read_frame(stream, buffer)
        assert frame is not None
        correlation, body = decode_response(frame, api_key, 0)
        assert correlation == 1
        assert int(body.error_code) == ErrorCode.INVALID_REQUEST
        await stream.send_all(encode_request(API_VERSIONS, 0, 9, "t", api_versions_request(0)))
        frame = await read_frame(stream, buffer)
        assert frame is not None and decode_response(frame, API_VERSIONS, 0)[0] == 9


async def test_truncated_frame_at_eof(server: ServerHandle) -> None:
    stream = await connect(server)
    request = encode_request(API_VERSIONS, 0, 1, "t", api_versions_request(0))
    await stream.send_all(request[: len(request) - 2])
    await stream.send_eof()
    await assert_closed(stream)
    await stream.aclose()
    await assert_still_serving(server)
    families = server.runtime.metrics.rejected_frames.labels("truncated")._value.get()
    assert families >= 1


async def test_pipelined_requests_are_answered_in_order(server: ServerHandle) -> None:
    requests = b"".join(
        [
            encode_request(API_VERSIONS, 3, 101, "t", api_versions_request(3)),
            encode_request(DESCRIBE, 0, 102, "t", ConnectGroupDescribeRequest(group_ids=("nope",))),
            framed(raw_header(4242, 0, 103)),
            encode_request(API_VERSIONS, 0, 104, "t", api_versions_request(0)),
        ]
    )
    stream = await connect(server)
    async with stream:
        await stream.send_all(requests)
        buffer = FrameBuffer(1 << 20)
        seen = []
        for _ in range(4):
            frame = await read_frame(stream, buffer)
            assert frame is not None
            seen.append(struct.unpack(">i", frame[:4])[0])
    assert seen == [101, 102, 103, 104]


async def test_pipelining_through_the_client(server: ServerHandle) -> None:
    results: list[int] = []
    async with await KafkaClient.connect("127.0.0.1", server.kafka_port) as client:

        async def describe(index: int) -> None:
            response = await client.request(
                DESCRIBE, ConnectGroupDescribeRequest(group_ids=(f"g{index}",))
            )
            assert response.groups[0].group_id == f"g{index}"
            assert response.groups[0].error_code == ErrorCode.GROUP_ID_NOT_FOUND
            results.append(index)

        async with trio.open_nursery() as nursery:
            for index in range(20):
                nursery.start_soon(describe, index)
    assert sorted(results) == list(range(20))


async def test_unexpected_error_is_answered_and_server_survives(
    server: ServerHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def explode(result: Any) -> Any:
        raise RuntimeError("boom")

    # Every core result passes through Runtime.complete; make it fail once wired in.
    monkeypatch.setattr(server.runtime, "complete", explode)
    async with await KafkaClient.connect("127.0.0.1", server.kafka_port) as client:
        response = await client.request(
            HEARTBEAT,
            ConnectGroupHeartbeatRequest(group_id="g", member_id="m", member_epoch=0,
                                         worker_url="http://w", rebalance_timeout_ms=1000),
        )
        assert response.error_code == ErrorCode.UNKNOWN_SERVER_ERROR
        assert "boom" in (response.error_message or "")
        versions = await client.request(API_VERSIONS, api_versions_request(0), 0)
        assert int(versions.error_code) == 0


async def test_requests_wait_for_the_log_to_load(nursery: trio.Nursery) -> None:
    """Before `ready`, Connect APIs get COORDINATOR_LOAD_IN_PROGRESS; ApiVersions works."""
    core = GroupCoordinator(TEST_CONFIG, load_assignors(TEST_CONFIG.server_assignors))
    runtime = Runtime(core, TEST_CONFIG)
    kafka = KafkaServer(runtime, TEST_CONFIG.max_frame_bytes)
    port = await nursery.start(kafka.serve, "127.0.0.1", 0)
    async with await KafkaClient.connect("127.0.0.1", port) as client:
        response = await client.request(
            HEARTBEAT,
            ConnectGroupHeartbeatRequest(group_id="g", member_id="m", member_epoch=0,
                                         worker_url="http://w", rebalance_timeout_ms=1000),
        )
        assert response.error_code == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        assert response.error_message
        described = await client.request(DESCRIBE, ConnectGroupDescribeRequest(group_ids=("g",)))
        assert described.groups[0].error_code == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        versions = await client.request(API_VERSIONS, api_versions_request(0), 0)
        assert int(versions.error_code) == 0
        runtime.mark_ready()
        described = await client.request(DESCRIBE, ConnectGroupDescribeRequest(group_ids=("g",)))
        assert described.groups[0].error_code == ErrorCode.GROUP_ID_NOT_FOUND
    nursery.cancel_scope.cancel()
