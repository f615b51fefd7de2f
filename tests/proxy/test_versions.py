"""Versions the proxy answers itself and does not serve, over real TCP: each gets
UNSUPPORTED_VERSION in a form the client reads, on the same connection, never a close.
Kafka 4.4 clients open every connection with ApiVersions v5 and retry with the highest
version the answer offers (KIP-511)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio
from kio.schema.describe_groups.v6.request import DescribeGroupsRequest as DescribeGroupsV6
from kio.schema.find_coordinator.v6.request import FindCoordinatorRequest
from kio.static.primitive import i8

from coordinator.config import ServerConfig
from coordinator.proxy import wire
from coordinator.server.app import ServerHandle, run_server
from protocol.errors import ErrorCode
from protocol.framing import FrameBuffer
from tests.proxy.test_server import SilentBroker
from tests.server.conftest import read_frame
from tests.server.test_versions import api_versions_v5_request, unsupported_api_versions


@pytest.fixture
async def proxy(nursery: trio.Nursery) -> AsyncIterator[ServerHandle]:
    # Every request here is answered by the proxy itself: the upstream never answers.
    upstream = SilentBroker()
    await nursery.start(upstream.serve)
    config = ServerConfig(assignor_offload_enable=False, shutdown_timeout_ms=2_000,
                          proxy_upstream=(f"127.0.0.1:{upstream.port}",),
                          proxy_groups="owned-.*")
    handle: ServerHandle = await nursery.start(
        run_server, config, ("127.0.0.1", 0), ("127.0.0.1", 0))
    yield handle
    handle.stop()


async def next_answer(stream: trio.SocketStream, buffer: FrameBuffer) -> bytes:
    with trio.fail_after(10):
        frame = await read_frame(stream, buffer)
    assert frame is not None, "the proxy closed the connection"
    return frame


async def assert_still_answers(stream: trio.SocketStream, buffer: FrameBuffer) -> None:
    """A FindCoordinator for an owned group, answered by the proxy on the same connection."""
    request = FindCoordinatorRequest(key_type=i8(0), coordinator_keys=("owned-g",))
    await stream.send_all(wire.encode_request(wire.FIND_COORDINATOR, 6, 99, request))
    correlation, body = wire.decode_response(await next_answer(stream, buffer),
                                             wire.FIND_COORDINATOR, 6)
    assert correlation == 99 and int(body.coordinators[0].error_code) == 0


async def test_api_versions_v5_gets_unsupported_version_with_the_range_not_a_close(
        proxy: ServerHandle) -> None:
    async with await trio.open_tcp_stream("127.0.0.1", proxy.kafka_port) as stream:
        buffer = FrameBuffer(1 << 20)
        await stream.send_all(api_versions_v5_request(7))
        low, high = unsupported_api_versions(await next_answer(stream, buffer), 7)
        assert (low, high) == (0, 4)
        await assert_still_answers(stream, buffer)


async def test_a_newer_describe_groups_of_an_owned_group_is_refused_in_its_form(
        proxy: ServerHandle) -> None:
    """DescribeGroups v6 (newer than the coordinator serves) naming an owned group."""
    async with await trio.open_tcp_stream("127.0.0.1", proxy.kafka_port) as stream:
        buffer = FrameBuffer(1 << 20)
        request = DescribeGroupsV6(groups=("owned-a", "owned-b"),
                                   include_authorized_operations=False)
        await stream.send_all(wire.encode_request(wire.DESCRIBE_GROUPS, 6, 8, request))
        body: Any
        correlation, body = wire.decode_response(await next_answer(stream, buffer),
                                                 wire.DESCRIBE_GROUPS, 6)
        assert correlation == 8
        assert [(group.group_id, int(group.error_code)) for group in body.groups] == [
            ("owned-a", ErrorCode.UNSUPPORTED_VERSION), ("owned-b", ErrorCode.UNSUPPORTED_VERSION)]
        await assert_still_answers(stream, buffer)
