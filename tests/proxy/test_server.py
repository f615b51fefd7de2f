"""The proxy's connections over real TCP, with upstreams that misbehave in ways a real
broker rarely does on demand: one that accepts and never answers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
import trio
from kio.schema.metadata.v12.request import MetadataRequest

from coordinator.config import ServerConfig
from coordinator.proxy import wire
from coordinator.server.app import ServerHandle, run_server


@dataclass
class SilentConnection:
    received: bytearray = field(default_factory=bytearray)
    closed: trio.Event = field(default_factory=trio.Event)


class SilentBroker:
    """Accepts connections, reads what comes, never answers; records each connection."""

    def __init__(self) -> None:
        self.port = 0
        self.connections: list[SilentConnection] = []
        self.received = trio.Event()  # replaced after each receive

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                    ) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(self._connection, listeners)

    async def _connection(self, stream: trio.SocketStream) -> None:
        connection = SilentConnection()
        self.connections.append(connection)
        try:
            async with stream:
                while data := await stream.receive_some(65536):
                    connection.received += data
                    self.received.set()
                    self.received = trio.Event()
        except trio.BrokenResourceError:
            pass
        finally:
            connection.closed.set()

    async def connection_with(self, marker: bytes) -> SilentConnection:
        while True:
            for connection in self.connections:
                if marker in connection.received:
                    return connection
            await self.received.wait()


@pytest.fixture
async def silent(nursery: trio.Nursery) -> SilentBroker:
    broker = SilentBroker()
    await nursery.start(broker.serve)
    return broker


@pytest.fixture
async def proxy(nursery: trio.Nursery, silent: SilentBroker) -> AsyncIterator[ServerHandle]:
    config = ServerConfig(assignor_offload_enable=False, shutdown_timeout_ms=2_000,
                          proxy_upstream=(f"127.0.0.1:{silent.port}",),
                          proxy_groups="owned-.*")
    handle: ServerHandle = await nursery.start(
        run_server, config, ("127.0.0.1", 0), ("127.0.0.1", 0))
    yield handle
    handle.stop()


CORRELATION = 424242  # marks the test client's request among the proxy's own probes


def _metadata_request() -> bytes:
    return wire.encode_request(wire.METADATA, 12, CORRELATION, MetadataRequest(
        topics=None, allow_auto_topic_creation=False,
        include_topic_authorized_operations=False))


async def test_a_client_that_leaves_releases_its_upstream_connection(
        proxy: ServerHandle, silent: SilentBroker) -> None:
    client = await trio.open_tcp_stream("127.0.0.1", proxy.kafka_port)
    await client.send_all(_metadata_request())
    with trio.fail_after(10):  # forwarded, never answered
        upstream = await silent.connection_with(CORRELATION.to_bytes(4, "big"))
    assert not upstream.closed.is_set()
    await client.aclose()
    # The proxy stops waiting for the answer and closes its side upstream.
    with trio.fail_after(10):
        await upstream.closed.wait()


async def test_the_listener_survives_clients_that_send_garbage(proxy: ServerHandle) -> None:
    for garbage in (b"\xff\xff\xff\xff", b"\x00\x00\x00\x02\x00\x03",
                    b"\x00\x00\x00\x08\x00\x0a\x00\x06\x00\x00\x00\x01"):
        client = await trio.open_tcp_stream("127.0.0.1", proxy.kafka_port)
        await client.send_all(garbage)
        with trio.fail_after(10):
            assert await client.receive_some(100) == b""  # closed by the proxy
        await client.aclose()
    # Still serving: an owned group's coordinator is answered locally.
    client = await trio.open_tcp_stream("127.0.0.1", proxy.kafka_port)
    from kio.schema.find_coordinator.v6.request import FindCoordinatorRequest
    from kio.static.primitive import i8

    await client.send_all(wire.encode_request(wire.FIND_COORDINATOR, 6, 9,
                                              FindCoordinatorRequest(
                                                  key_type=i8(0),
                                                  coordinator_keys=("owned-a",))))
    with trio.fail_after(10):
        data = b""
        while len(data) < 4 or len(data) < 4 + int.from_bytes(data[:4], "big"):
            data += await client.receive_some(4096)
    _, body = wire.decode_response(data[4:], wire.FIND_COORDINATOR, 6)
    assert body.coordinators[0].port == proxy.kafka_port
    await client.aclose()
