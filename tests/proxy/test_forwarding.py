"""The proxy's forwarding path over real TCP, against a scripted upstream broker.

Requests the proxy does not need to read (here Fetch and ListOffsets frames with bodies no
broker would accept) must cross byte for byte, both ways; answers must come back in
request order however the requests and answers are cut into reads; Metadata answers must
still be rewritten when they arrive among others.
"""

from __future__ import annotations

import os
import random
import socket
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
import trio
from kio.schema.find_coordinator.v6.request import FindCoordinatorRequest
from kio.schema.metadata.v12.request import MetadataRequest
from kio.schema.metadata.v12.response import MetadataResponse, MetadataResponseBroker
from kio.static.primitive import i8, i32, i32Timedelta

from coordinator.config import ServerConfig
from coordinator.proxy import server, wire
from coordinator.proxy.server import MAX_IN_FLIGHT
from coordinator.server.app import ServerHandle, run_server
from protocol._codec import INT32
from protocol.framing import FrameBuffer

PRODUCE, FETCH, LIST_OFFSETS = 0, 1, 2
MAX_FRAME_BYTES = 16 * 1024 * 1024


def passthrough_request(api_key: int, correlation: int, body: bytes) -> bytes:
    """A request frame (size prefix included) with a v1 header and `body` as it is."""
    client_id = b"test-client"
    header = (api_key.to_bytes(2, "big") + (4).to_bytes(2, "big")
              + correlation.to_bytes(4, "big", signed=True)
              + len(client_id).to_bytes(2, "big") + client_id)
    return INT32.pack(len(header) + len(body)) + header + body


def scripted_answer(request_frame: bytes, answer_bytes: int) -> bytes:
    """The scripted broker's answer to a pass-through request: its correlation id, then
    `answer_bytes` bytes drawn from the request's own bytes (so each answer is distinct)."""
    correlation = request_frame[8:12]
    seed = int.from_bytes(request_frame[-8:].rjust(8, b"\0"), "big")
    body = random.Random(seed).randbytes(answer_bytes)
    return INT32.pack(4 + len(body)) + correlation + body


class ScriptedBroker:
    """Answers Metadata v12 naming itself as node 1; answers any other request with
    `scripted_answer` (its size set per correlation id in `answer_sizes`, else 64 bytes);
    all the answers to one read go back in one send. Records every request frame."""

    def __init__(self) -> None:
        self.port = 0
        self.requests: list[bytes] = []  # size prefix included, as received
        self.answer_sizes: dict[int, int] = {}

    async def serve(self, port: int = 0, *,
                    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(port, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(self._connection, listeners)

    def metadata_answer(self, correlation: int) -> bytes:
        body = MetadataResponse(
            throttle_time=i32Timedelta.parse(timedelta(0)),
            brokers=(MetadataResponseBroker(node_id=i32(1), host="127.0.0.1",
                                            port=i32(self.port)),),
            cluster_id="scripted", controller_id=i32(1), topics=())
        return wire.encode_response(wire.METADATA, 12, correlation, body)

    async def _connection(self, stream: trio.SocketStream) -> None:
        frames = FrameBuffer(MAX_FRAME_BYTES)
        async with stream:
            try:
                while data := await stream.receive_some(65536):
                    frames.feed(data)
                    answers = bytearray()
                    for frame in frames:
                        self.requests.append(INT32.pack(len(frame)) + frame)
                        head = wire.peek(frame)
                        if head.api_key == wire.METADATA:
                            answers += self.metadata_answer(head.correlation_id)
                        else:
                            size = self.answer_sizes.get(head.correlation_id, 64)
                            answers += scripted_answer(self.requests[-1], size)
                    if answers:
                        await stream.send_all(answers)
            except trio.BrokenResourceError:
                pass


@pytest.fixture
async def upstream(nursery: trio.Nursery) -> ScriptedBroker:
    broker = ScriptedBroker()
    await nursery.start(broker.serve)
    return broker


@pytest.fixture
async def proxy(nursery: trio.Nursery, upstream: ScriptedBroker
                ) -> AsyncIterator[ServerHandle]:
    config = ServerConfig(assignor_offload_enable=False, shutdown_timeout_ms=2_000,
                          max_frame_bytes=MAX_FRAME_BYTES,
                          proxy_upstream=(f"127.0.0.1:{upstream.port}",),
                          proxy_groups="owned-.*")
    handle: ServerHandle = await nursery.start(
        run_server, config, ("127.0.0.1", 0), ("127.0.0.1", 0))
    yield handle
    handle.stop()


async def read_answers(stream: trio.SocketStream, count: int) -> list[bytes]:
    """`count` response frames, size prefix included, as they come."""
    buffer = bytearray()
    answers: list[bytes] = []
    with trio.fail_after(20):
        while len(answers) < count:
            while len(buffer) >= 4 and len(buffer) >= 4 + INT32.unpack_from(buffer)[0]:
                end = 4 + INT32.unpack_from(buffer)[0]
                answers.append(bytes(buffer[:end]))
                del buffer[:end]
            if len(answers) < count:
                data = await stream.receive_some(65536)
                assert data, f"the proxy closed the connection after {len(answers)} answers"
                buffer += data
    return answers


def correlation_of(answer: bytes) -> int:
    return int.from_bytes(answer[4:8], "big", signed=True)


def request_correlation(request: bytes) -> int:
    return int.from_bytes(request[8:12], "big", signed=True)


def client_requests(upstream: ScriptedBroker) -> list[bytes]:
    """What reached the upstream from the test's client (not the proxy's own probes)."""
    return [request for request in upstream.requests if b"test-client" in request[:40]]


async def test_a_passthrough_request_and_its_answer_cross_byte_identical(
        proxy: ServerHandle, upstream: ScriptedBroker) -> None:
    rng = random.Random(1)
    # A small answer, one much larger than a socket read, one just over a read.
    requests = [passthrough_request(FETCH, 11, rng.randbytes(200)),
                passthrough_request(FETCH, 12, rng.randbytes(70_000)),
                passthrough_request(LIST_OFFSETS, 13, rng.randbytes(9))]
    upstream.answer_sizes = {11: 10, 12: 3 * 1024 * 1024, 13: 300_000}
    async with await trio.open_tcp_stream("127.0.0.1", proxy.kafka_port) as client:
        for request in requests:
            await client.send_all(request)
            [answer] = await read_answers(client, 1)
            assert answer == scripted_answer(request, upstream.answer_sizes[
                request_correlation(request)])
    assert client_requests(upstream) == requests


async def test_pipelined_requests_are_answered_in_request_order(
        proxy: ServerHandle, upstream: ScriptedBroker) -> None:
    """More requests in one write than the proxy keeps in flight per connection, forwarded
    ones among owned groups' FindCoordinator (answered by the proxy itself)."""
    rng = random.Random(2)
    requests: list[bytes] = []
    for correlation in range(1, 251):
        if correlation % 7 == 0:
            requests.append(wire.encode_request(
                wire.FIND_COORDINATOR, 6, correlation,
                FindCoordinatorRequest(key_type=i8(0), coordinator_keys=("owned-a",))))
        else:
            requests.append(passthrough_request(
                rng.choice((FETCH, LIST_OFFSETS)), correlation,
                rng.randbytes(rng.randrange(0, 300))))
    upstream.answer_sizes = {correlation: rng.randrange(0, 5000) for correlation in
                             range(1, 251)}
    async with await trio.open_tcp_stream("127.0.0.1", proxy.kafka_port) as client:
        await client.send_all(b"".join(requests))
        answers = await read_answers(client, len(requests))
    assert [correlation_of(answer) for answer in answers] == list(range(1, 251))
    for request, answer in zip(requests, answers, strict=True):
        if request_correlation(request) % 7 == 0:
            _, found = wire.decode_response(answer[4:], wire.FIND_COORDINATOR, 6)
            assert found.coordinators[0].port == proxy.kafka_port
        else:
            assert answer == scripted_answer(request, upstream.answer_sizes[
                request_correlation(request)])
    forwarded = [request for request in requests if request_correlation(request) % 7]
    assert client_requests(upstream) == forwarded


async def test_metadata_among_passthrough_answers_is_still_rewritten(
        proxy: ServerHandle, upstream: ScriptedBroker) -> None:
    rng = random.Random(3)
    metadata = wire.encode_request(wire.METADATA, 12, 22, MetadataRequest(
        topics=None, allow_auto_topic_creation=False,
        include_topic_authorized_operations=False), client_id="test-client")
    requests = [passthrough_request(FETCH, 21, rng.randbytes(50)), metadata,
                passthrough_request(FETCH, 23, rng.randbytes(50))]
    async with await trio.open_tcp_stream("127.0.0.1", proxy.kafka_port) as client:
        await client.send_all(b"".join(requests))
        first, rewritten, last = await read_answers(client, 3)
    assert first == scripted_answer(requests[0], 64)
    assert last == scripted_answer(requests[2], 64)
    correlation, body = wire.decode_response(rewritten[4:], wire.METADATA, 12)
    assert correlation == 22
    [broker] = body.brokers
    assert broker.host == "127.0.0.1"
    assert broker.port not in (upstream.port, proxy.kafka_port)
    # The rewritten address is the proxy's listener for node 1: it forwards there too.
    async with await trio.open_tcp_stream(broker.host, broker.port) as node_client:
        request = passthrough_request(FETCH, 31, b"to node 1")
        await node_client.send_all(request)
        assert await read_answers(node_client, 1) == [scripted_answer(request, 64)]


async def test_a_client_that_does_not_read_stops_the_forwarding_of_its_requests(
        proxy: ServerHandle, upstream: ScriptedBroker) -> None:
    """Backpressure: answers the client does not read stop its requests from going
    upstream once the proxy's in-flight limit is reached; reading resumes them, in order."""
    rng = random.Random(4)
    count = MAX_IN_FLIGHT + 150
    requests = [passthrough_request(FETCH, correlation, rng.randbytes(20))
                for correlation in range(1, count + 1)]
    upstream.answer_sizes = dict.fromkeys(range(1, count + 1), 200_000)
    async with await trio.open_tcp_stream("127.0.0.1", proxy.kafka_port) as client:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client.send_all, b"".join(requests))
            # Until the number of forwarded requests stops growing (the answers fill the
            # socket buffers long before the limit's worth of them is sent).
            seen = -1
            while seen != len(client_requests(upstream)):
                seen = len(client_requests(upstream))
                await trio.sleep(0.5)
            assert seen <= MAX_IN_FLIGHT + 2
            answers = await read_answers(client, count)
    assert [correlation_of(answer) for answer in answers] == list(range(1, count + 1))
    assert client_requests(upstream) == requests


async def test_produce_requests_cut_anywhere_cross_byte_identical_in_order(
        proxy: ServerHandle, upstream: ScriptedBroker) -> None:
    """Produce frames (acks=1) go upstream as the client sent them, whether several arrive
    in one read (each then a view of that read) or one spans many reads."""
    rng = random.Random(5)
    requests = []
    for correlation in range(1, 41):
        records = rng.randbytes(rng.choice((0, 100, 16_000, 300_000)))
        # transactional id null, acks=1, timeout 30 s, then bytes the proxy never reads
        body = (-1).to_bytes(2, "big", signed=True) + (1).to_bytes(2, "big") + \
            (30_000).to_bytes(4, "big") + records
        request = passthrough_request(PRODUCE, correlation, body)
        requests.append(request[:6] + (7).to_bytes(2, "big") + request[8:])  # v7
    stream = b"".join(requests)
    cuts = sorted(rng.sample(range(1, len(stream)), 60))
    async with await trio.open_tcp_stream("127.0.0.1", proxy.kafka_port) as client:
        async with trio.open_nursery() as nursery:
            async def send() -> None:
                for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
                    await client.send_all(stream[start:end])
                    await trio.lowlevel.checkpoint()  # let the proxy read each piece
            nursery.start_soon(send)
            answers = await read_answers(client, len(requests))
    assert client_requests(upstream) == requests
    assert answers == [scripted_answer(request, 64) for request in requests]


@pytest.mark.parametrize("splice", [True, False])
async def test_large_answers_cross_byte_identical_through_the_pipe_or_without(
        proxy: ServerHandle, upstream: ScriptedBroker, monkeypatch: pytest.MonkeyPatch,
        splice: bool) -> None:
    """Where the kernel can splice, the rest of a large answer crosses through a pipe;
    either way the client gets the upstream's bytes, in order, behind smaller answers."""
    if splice and not server.SPLICE:
        pytest.skip("no os.splice here")
    monkeypatch.setattr(server, "SPLICE", splice)
    rng = random.Random(6)
    requests = [passthrough_request(FETCH, correlation, rng.randbytes(30))
                for correlation in range(1, 9)]
    upstream.answer_sizes = {1: 10, 2: 2_500_000, 3: 5, 4: 1_048_576, 5: 300_000,
                             6: 70_000, 7: 4_000_000, 8: 1}
    async with await trio.open_tcp_stream("127.0.0.1", proxy.kafka_port) as client:
        await client.send_all(b"".join(requests))
        answers = await read_answers(client, len(requests))
    assert answers == [scripted_answer(request, upstream.answer_sizes[
        request_correlation(request)]) for request in requests]


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not server.SPLICE, reason="no os.splice here")
async def test_a_connections_pipe_is_closed_with_it(
        proxy: ServerHandle, upstream: ScriptedBroker) -> None:
    request = passthrough_request(FETCH, 1, b"large")
    upstream.answer_sizes = {1: 2_000_000}
    async with await trio.open_tcp_stream("127.0.0.1", proxy.kafka_port) as client:
        await client.send_all(request)
        [answer] = await read_answers(client, 1)
        assert answer == scripted_answer(request, 2_000_000)
        during = open_descriptors()
    # The client, the proxy's two sockets, the upstream's socket and the pipe's two ends
    # are all closed once the proxy has seen the client go.
    for _ in range(200):
        if open_descriptors() <= during - 6:
            break
        await trio.sleep(0.05)
    assert open_descriptors() <= during - 6


async def test_a_brokers_port_opens_once_the_upstream_answers_without_a_client(
        nursery: trio.Nursery) -> None:
    """The upstream is not up when the proxy starts (a cluster started after it, or a
    proxy restarted while its clients know only the brokers' ports): the start-up probe
    tries again, and the broker's port opens as soon as the upstream answers, with no
    Metadata request from a client on the bootstrap port."""
    with socket.socket() as reserve:
        reserve.bind(("127.0.0.1", 0))
        upstream_port = reserve.getsockname()[1]
    config = ServerConfig(assignor_offload_enable=False, shutdown_timeout_ms=2_000,
                          proxy_upstream=(f"127.0.0.1:{upstream_port}",),
                          proxy_groups="owned-.*")
    handle: ServerHandle = await nursery.start(
        run_server, config, ("127.0.0.1", 0), ("127.0.0.1", 0))
    node_port = handle.kafka_port + 1 + 1  # node 1's preferred port
    await trio.sleep(1.0)  # a first probe or two fail
    with pytest.raises(OSError):
        await trio.open_tcp_stream("127.0.0.1", node_port)
    broker = ScriptedBroker()
    await nursery.start(broker.serve, upstream_port)
    with trio.fail_after(5):
        while True:
            try:
                stream = await trio.open_tcp_stream("127.0.0.1", node_port)
                break
            except OSError:
                await trio.sleep(0.05)
    await stream.aclose()
    assert broker.requests and all(wire.peek(frame[4:]).api_key == wire.METADATA
                                   for frame in broker.requests)  # the probe's only
    handle.stop()


async def advertised_port(kafka_port: int, correlation: int) -> int:
    """The port a Metadata request on the bootstrap port names for node 1."""
    metadata = wire.encode_request(wire.METADATA, 12, correlation, MetadataRequest(
        topics=None, allow_auto_topic_creation=False,
        include_topic_authorized_operations=False), client_id="test-client")
    async with await trio.open_tcp_stream("127.0.0.1", kafka_port) as client:
        await client.send_all(metadata)
        [answer] = await read_answers(client, 1)
    _, body = wire.decode_response(answer[4:], wire.METADATA, 12)
    [broker] = body.brokers
    return int(broker.port)


async def test_a_brokers_preferred_port_taken_at_start_is_claimed_once_let_go(
        nursery: trio.Nursery, upstream: ScriptedBroker) -> None:
    """Another socket holds node 1's preferred port (bootstrap + 1 + 1) as the proxy starts,
    as it may after a restart: a free port serves meanwhile, and the preferred one is bound
    as soon as it is let go, with no client's help (its clients from before the restart
    know only that one); Metadata names it from then on, and the free port keeps serving
    the clients that learned it."""
    for _attempt in range(20):  # a bootstrap port whose node 1 port can be held
        with socket.socket() as reserve:
            reserve.bind(("127.0.0.1", 0))
            bootstrap_port = reserve.getsockname()[1]
        holder = socket.socket()
        try:
            holder.bind(("127.0.0.1", bootstrap_port + 2))
            break
        except OSError:
            holder.close()
    holder.listen()
    config = ServerConfig(assignor_offload_enable=False, shutdown_timeout_ms=2_000,
                          proxy_upstream=(f"127.0.0.1:{upstream.port}",),
                          proxy_groups="owned-.*")
    handle: ServerHandle = await nursery.start(
        run_server, config, ("127.0.0.1", bootstrap_port), ("127.0.0.1", 0))
    fallback = await advertised_port(handle.kafka_port, 1)
    assert fallback != bootstrap_port + 2
    holder.close()
    with trio.fail_after(5):
        for correlation in range(2, 1_000):
            if await advertised_port(handle.kafka_port, correlation) == bootstrap_port + 2:
                break
            await trio.sleep(0.05)
    for port in (bootstrap_port + 2, fallback):
        async with await trio.open_tcp_stream("127.0.0.1", port) as node_client:
            request = passthrough_request(FETCH, 3, port.to_bytes(4, "big"))
            await node_client.send_all(request)
            assert await read_answers(node_client, 1) == [scripted_answer(request, 64)]
    handle.stop()
