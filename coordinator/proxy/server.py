"""The proxy's listeners and connections (trio).

One bootstrap listener (the coordinator's `--listen`) forwards to the upstream bootstrap
addresses; one listener per upstream broker, opened when the broker is first named in a
response (or by the start-up Metadata probe), forwards to that broker. Each client
connection has one upstream connection, opened on its first forwarded request.

Per connection, a reader task cuts request frames and either forwards them at once or
starts their local answer; every request that expects a response puts a slot in a
bounded queue in request order, and a writer task empties the queue: it waits for the
local answer, or reads the next response from the upstream stream and passes it on
(decoding only the few that carry addresses). Kafka answers in order on one connection,
so the next upstream response always belongs to the oldest upstream slot.

Nothing a client sends reaches further than its own connection, as on the plain listener:
the requests read here are decoded by the coordinator's one guarded path (with the
listener's limits; `wire.classify`), a body that does not parse is answered
INVALID_REQUEST, anything else that goes wrong closes the connection with one line.
Connections are capped (`server.max.connections`, over all the proxy's ports), a frame
must be finished within the read timeout of its first byte, and a connection with
nothing received and no answer awaited is closed after the idle timeout. Lines an outage
repeats for every connection go through one `RateLimitedLog`.

The forwarding path is where the proxy spends its time, and on loopback its cost is per
request and per socket call rather than per byte: the forwarded requests of one read go
upstream in one `sendmsg`, as views of the bytes the client sent (no copy); the answers
that are ready go to the client in one send; the rest of a large answer crosses from
socket to socket through a pipe (`os.splice`) without entering the proxy's memory; only
a request's header is read (a Produce's acks too) unless its API needs more; and the
sockets are called directly, a loop yielding to trio only after a few rounds in which no
call had to wait (a wait yields anyway), not once per call or per round.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog
import trio

from coordinator.config import FIELD_KEYS
from coordinator.logs import RateLimitedLog
from coordinator.proxy import wire
from coordinator.server.classic import Address, listed_groups
from coordinator.server.kafka import DEADLINE_CHECK_S, OFFLOAD_DECODE_BYTES, ProblemLog
from protocol._codec import INT32
from protocol.errors import ErrorCode
from protocol.framing import (
    REQUEST_CLASSES,
    SUPPORTED_APIS,
    FrameError,
    MalformedBody,
    MalformedRequest,
    MalformedResponse,
    RequestOverLimit,
    error_response,
)

if TYPE_CHECKING:
    from coordinator.config import ServerConfig
    from coordinator.metrics import ProxyMetrics
    from coordinator.server.kafka import KafkaServer

log = structlog.get_logger("connect_coordinator.proxy")

RECEIVE_BYTES = 262_144
MAX_IN_FLIGHT = 100  # per connection; Kafka clients send at most 5 by default
FLUSH_BYTES = 1_048_576  # forwarded requests are sent upstream at least this often
SEND_BUFFERS = 512  # buffers per `sendmsg` (Linux takes at most 1024)
PIPE_BYTES = 1_048_576  # asked of the kernel for a relay's pipe (it may give less)
SPLICE = hasattr(os, "splice")  # Linux: large answers cross inside the kernel (`_Pipe`)
# While no upstream answers the start-up probe, it tries again after these pauses (doubling);
# a broker's preferred port found taken is tried again after the same pauses.
PROBE_FIRST_PAUSE_S = 0.5
PROBE_LONGEST_PAUSE_S = 10.0


def parse_upstream(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


class UpstreamClosed(Exception):
    """The upstream broker closed the connection (or it broke) mid-response."""


class _Turns:
    """Lets a forwarding loop yield to trio only when it has not for a while.

    Every wait of a proxy socket is counted (`waited`); a wait yields, and while a task
    runs without yielding no other task can wait, so an unchanged count since a loop's
    last round means that round did not yield. `end_round` yields after `rounds` such
    rounds in a row: a busy connection still lets the others (and cancellation) in, and
    a round that waited anyway, the usual case, costs no second pass through the
    scheduler."""

    def __init__(self, rounds: int = 8) -> None:
        self.waits = 0
        self.rounds = rounds

    def waited(self) -> None:
        self.waits += 1

    def loop(self) -> _Loop:
        return _Loop(self)


class _Loop:
    __slots__ = ("_turns", "_seen", "_rounds")

    def __init__(self, turns: _Turns) -> None:
        self._turns = turns
        self._seen = turns.waits
        self._rounds = 0

    async def end_round(self) -> None:
        waits = self._turns.waits
        if waits != self._seen:
            self._seen, self._rounds = waits, 0
            return
        self._rounds += 1
        if self._rounds >= self._turns.rounds:
            await trio.lowlevel.checkpoint()
            self._seen, self._rounds = self._turns.waits, 0


class _Socket:
    """A connected TCP socket the forwarding path reads and writes with direct non-blocking
    calls, waiting through trio only when the call would block.

    A forwarded request costs a few socket calls; through trio's stream each one also pays
    for its wrappers and a pass through the scheduler, which together cost more than the
    call. Here a call that succeeds at once does not yield: the loops that use it yield
    once every few rounds that did not wait (`_Turns`), so other tasks still run and
    cancellation still arrives. Closing goes through the trio stream, which wakes any
    waiter."""

    def __init__(self, stream: trio.SocketStream, turns: _Turns) -> None:
        self._socket = socket.socket(fileno=stream.socket.detach())
        self.stream = trio.SocketStream(trio.socket.from_stdlib_socket(self._socket))
        self._turns = turns

    async def receive_some(self, max_bytes: int) -> bytes:
        data: bytes = await self._read(self._socket.recv, max_bytes)
        return data

    async def _read(self, read: Callable[[Any], Any], argument: Any) -> Any:
        """`read(argument)` once the socket has something (recv or recv_into)."""
        while True:
            try:
                return read(argument)
            except BlockingIOError:
                pass
            except OSError as error:
                raise _broken(error) from None
            self._turns.waited()
            await trio.lowlevel.wait_readable(self._socket)

    async def send_all(self, data: bytes | bytearray) -> None:
        view: memoryview | None = None  # only once a send was partial
        sent = 0
        try:
            while sent < len(data):
                try:
                    sent += self._socket.send(data if view is None else view[sent:])
                except BlockingIOError:
                    self._turns.waited()
                    await trio.lowlevel.wait_writable(self._socket)
                except OSError as error:
                    raise _broken(error) from None
                if view is None and sent < len(data):
                    view = memoryview(data)
        finally:
            if view is not None:
                view.release()

    async def send_buffers(self, buffers: list[memoryview]) -> None:
        """Send the buffers in order, as one `sendmsg` where the kernel takes them all
        (the forwarded frames of one read, each a view of what the client sent)."""
        try:
            await self._send_buffers(buffers)
        finally:
            buffers.clear()  # no view outlives the call, even in a traceback

    async def _send_buffers(self, buffers: list[memoryview]) -> None:
        while buffers:
            try:
                sent = self._socket.sendmsg(buffers[:SEND_BUFFERS])
            except BlockingIOError:
                self._turns.waited()
                await trio.lowlevel.wait_writable(self._socket)
                continue
            except OSError as error:
                raise _broken(error) from None
            done = 0
            while done < len(buffers) and sent >= len(buffers[done]):
                sent -= len(buffers[done])
                done += 1
            del buffers[:done]
            if sent:
                buffers[0] = buffers[0][sent:]

    async def receive_into(self, buffer: memoryview) -> int:
        received: int = await self._read(self._socket.recv_into, buffer)
        return received

    def fileno(self) -> int:
        number = self._socket.fileno()
        if number < 0:
            raise trio.ClosedResourceError("the socket was closed")
        return number

    async def wait_readable(self) -> None:
        self._turns.waited()
        await trio.lowlevel.wait_readable(self._socket)

    async def wait_writable(self) -> None:
        self._turns.waited()
        await trio.lowlevel.wait_writable(self._socket)

    async def aclose(self) -> None:
        await self.stream.aclose()


def _broken(error: OSError) -> trio.BrokenResourceError | trio.ClosedResourceError:
    if error.errno == errno.EBADF:
        return trio.ClosedResourceError("the socket was closed")
    return trio.BrokenResourceError(str(error))


class _ByteReader:
    """Reads exact byte counts from a stream, or relays them to another stream.

    What was received and not yet taken is the tail of one bytes object (`_data` from
    `_start`): a read that starts a frame is kept as it came, so relaying the frame on
    copies nothing; only a header or frame spanning reads is joined from its pieces."""

    def __init__(self, stream: trio.SocketStream | _Socket, rounds: _Loop | None = None
                 ) -> None:
        self.stream = stream
        self._data = b""
        self._start = 0
        self._rounds = rounds  # the reading task's turns (else a yield per read)
        self._chunk: memoryview | None = None  # `relay`'s buffer, never resized
        self._pipe: _Pipe | None = None  # `relay`'s pipe, where there is `os.splice`

    def close(self) -> None:
        if self._pipe is not None:
            self._pipe.close()
            self._pipe = None

    @property
    def buffered(self) -> int:
        return len(self._data) - self._start

    def int32_at(self, offset: int) -> int:
        return int(INT32.unpack_from(self._data, self._start + offset)[0])

    async def _receive(self, limit: int) -> bytes:
        try:
            data = await self.stream.receive_some(max(limit, RECEIVE_BYTES))
        except (trio.BrokenResourceError, trio.ClosedResourceError) as error:
            raise UpstreamClosed(str(error)) from None
        if not data:
            raise UpstreamClosed("the upstream broker closed the connection")
        return data

    async def fill(self, count: int) -> None:
        """Wait until at least `count` bytes are buffered."""
        have = self.buffered
        if have >= count:
            return
        pieces: list[bytes | memoryview] = []
        if have:
            pieces.append(memoryview(self._data)[self._start:])
        while have < count:
            if have:  # a frame longer than one read: let other tasks in between
                await self._end_round()
            data = await self._receive(count - have)
            pieces.append(data)
            have += len(data)
        self._data = data if len(pieces) == 1 else b"".join(pieces)
        self._start = 0

    async def _end_round(self) -> None:
        if self._rounds is None:
            await trio.lowlevel.checkpoint()
        else:
            await self._rounds.end_round()

    def _advance(self, count: int) -> None:
        self._start += count
        if self._start == len(self._data):
            self._data, self._start = b"", 0

    async def read_exactly(self, count: int) -> bytes:
        await self.fill(count)
        data = self._data[self._start:self._start + count]
        self._advance(count)
        return data

    def move_to(self, destination: bytearray, count: int) -> None:
        """Append the next `count` bytes, all buffered, to `destination` (one copy)."""
        with memoryview(self._data) as view:
            destination += view[self._start:self._start + count]
        self._advance(count)

    async def relay(self, count: int, destination: _Socket, prefix: bytearray) -> None:
        """Send `prefix` (emptied after) and the next `count` bytes to `destination` as
        they arrive: what is buffered goes out with the prefix in one `sendmsg` (a send on
        loopback costs more than gathering), the rest is read no further than the frame's
        end into one reused buffer and passed on as received, so a large Fetch response
        costs a receive and a send per chunk and no copy in between."""
        stream = self.stream
        assert isinstance(stream, _Socket)
        take = min(count, self.buffered)
        if prefix or take:
            parts = [memoryview(prefix), memoryview(self._data)[self._start:self._start + take]]
            try:
                await destination.send_buffers(list(parts))
            finally:
                parts[0].release()  # `prefix` is emptied below
            self._advance(take)
            prefix.clear()
            count -= take
        if count > 0 and SPLICE:
            if self._pipe is None:
                self._pipe = _Pipe()
            await self._pipe.relay(stream, destination, count)
            return
        while count > 0:
            if self._chunk is None:
                self._chunk = memoryview(bytearray(RECEIVE_BYTES))
            try:
                received = await stream.receive_into(self._chunk[:min(count, RECEIVE_BYTES)])
            except (trio.BrokenResourceError, trio.ClosedResourceError) as error:
                raise UpstreamClosed(str(error)) from None
            if not received:
                raise UpstreamClosed("the upstream broker closed the connection")
            count -= received
            await destination.send_buffers([self._chunk[:received]])
            # Once per chunk: a large answer holds the event loop (and the owned groups'
            # heartbeats on it) for at most one chunk's receive and send.
            await trio.lowlevel.checkpoint()


class _Pipe:
    """Moves the rest of a large answer from the upstream socket to the client's inside the
    kernel: `os.splice` into a pipe, then out of it, the pages handed on rather than
    copied into the proxy and out again (a 1 MB Fetch answer otherwise costs two copies
    of its bytes and the allocations around them)."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        with contextlib.suppress(OSError):  # a larger pipe is fewer calls per answer
            fcntl.fcntl(self.write_fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        self.size = fcntl.fcntl(self.write_fd, fcntl.F_GETPIPE_SZ)

    def close(self) -> None:
        os.close(self.read_fd)
        os.close(self.write_fd)

    async def relay(self, source: _Socket, destination: _Socket, count: int) -> None:
        """Move exactly `count` bytes, as they arrive; the pipe is empty before and after.
        Yields at least once per pipeful, so a large answer holds the event loop (and the
        owned groups' heartbeats on it) for at most that."""
        flags = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK
        while count > 0:
            waited = False
            try:
                moved = os.splice(source.fileno(), self.write_fd, min(count, self.size),
                                  flags=flags)
            except BlockingIOError:  # the pipe is empty: the socket has nothing yet
                await source.wait_readable()
                continue
            except OSError as error:
                raise UpstreamClosed(str(error)) from None
            if not moved:
                raise UpstreamClosed("the upstream broker closed the connection")
            count -= moved
            while moved:
                try:
                    moved -= os.splice(self.read_fd, destination.fileno(), moved,
                                       flags=flags)
                except BlockingIOError:  # the client's socket buffer is full
                    await destination.wait_writable()
                    waited = True
                except OSError as error:
                    raise _broken(error) from None
            if not waited:
                await trio.lowlevel.checkpoint()


@dataclass(eq=False)
class _Slot:
    """One expected response, in request order."""

    routing: wire.Routing | None
    upstream: bool = False  # the next upstream response; else `answer` once `done`
    done: trio.Event | None = None  # a local answer still being computed
    answer: bytes | None = None  # None when done: close the connection
    reason: str = ""

    @classmethod
    def pending(cls, routing: wire.Routing) -> _Slot:
        return cls(routing, done=trio.Event())

    @classmethod
    def answered(cls, routing: wire.Routing | None, answer: bytes | None, reason: str = ""
                 ) -> _Slot:
        return cls(routing, answer=answer, reason=reason)

    def finish(self, answer: bytes | None, reason: str = "") -> None:
        self.answer, self.reason = answer, reason
        assert self.done is not None
        self.done.set()


class ProxyServer:
    """Serves the Kafka listener in proxy mode (same `serve` / `drain` as KafkaServer)."""

    def __init__(self, local: KafkaServer, config: ServerConfig, metrics: ProxyMetrics) -> None:
        assert config.proxy_groups is not None
        self.local = local
        self.metrics = metrics
        self.upstreams = [parse_upstream(address) for address in config.proxy_upstream]
        self.owned = wire.GroupMatcher(config.proxy_groups)
        self.config = config
        # The requests read here are held to the listener's limits (one decoding path).
        self.decode_limits = local.decode_limits
        # Lines an outage repeats for every connection: a few per interval, with a count.
        self.lines = RateLimitedLog(log)
        self.open_connections = 0
        self._live: set[_Connection] = set()  # whose deadlines `_enforce_deadlines` checks
        self.connect_timeout_s = config.proxy_upstream_connect_timeout_ms / 1000
        self.max_frame_bytes = config.max_frame_bytes
        self.coordinator_node_id = config.proxy_coordinator_node_id
        self._advertised_host = config.proxy_advertised_host
        self.listen_host = "127.0.0.1"
        self.bootstrap_port = 0
        self.node_addresses: dict[int, tuple[str, int]] = {}  # node id -> upstream address
        self.node_ports: dict[int, int] = {}  # node id -> local port
        self._bind_lock = trio.Lock()
        self.turns = _Turns()
        self._accept_nursery: trio.Nursery | None = None
        self._connection_nursery: trio.Nursery | None = None
        self._accepting: trio.CancelScope | None = None
        self._connections: trio.CancelScope | None = None
        # API keys the local handlers serve for owned groups (the classic group APIs once
        # they exist there): ApiVersions caps them to the local range too.
        self.local_group_apis = frozenset(key for key in wire.GROUP_IDS if key in SUPPORTED_APIS)
        # ApiVersions: what the proxy can read and the coordinator answers alike.
        known = wire.known_versions(wire.API_VERSIONS)
        assert known is not None
        served = SUPPORTED_APIS[wire.API_VERSIONS]
        self.api_versions_served = (max(known[0], served[0]), min(known[1], served[1]))

    # -- addresses -----------------------------------------------------------------------

    @property
    def advertised_host(self) -> str:
        if self._advertised_host:
            return self._advertised_host
        if self.listen_host in ("0.0.0.0", "::", ""):
            return socket.gethostname()
        return self.listen_host

    @property
    def coordinator(self) -> wire.Endpoint:
        return wire.Endpoint(self.coordinator_node_id, self.advertised_host, self.bootstrap_port)

    def local_address(self, node_id: int) -> tuple[str, int]:
        return self.advertised_host, self.node_ports[node_id]

    def mapping(self) -> dict[str, Any]:
        """The documented mapping, as JSON: bootstrap and each node's local port."""
        return {
            "bootstrap": f"{self.advertised_host}:{self.bootstrap_port}",
            "upstream": [f"{host}:{port}" for host, port in self.upstreams],
            "coordinator_node_id": self.coordinator_node_id,
            "groups": self.owned.pattern,
            "nodes": {str(node): {"local": f"{self.advertised_host}:{self.node_ports[node]}",
                                  "upstream": "{}:{}".format(*self.node_addresses[node])}
                      for node in sorted(self.node_ports)},
        }

    async def learn_node(self, endpoint: wire.Endpoint) -> None:
        """Remember where an upstream node is and give it a local listener if it has none:
        listen port + 1 + node id when free, else any free port."""
        node = endpoint.node_id
        self.node_addresses[node] = (endpoint.host, endpoint.port)
        if node in self.node_ports:
            return
        if node == self.coordinator_node_id:
            log.error("proxy_node_id_clash", node_id=node,
                      hint="set proxy.coordinator.node.id to an id no upstream broker uses")
        async with self._bind_lock:
            if node in self.node_ports:
                return
            if self._accept_nursery is None:
                raise UpstreamClosed("the proxy is shutting down")
            preferred = self.bootstrap_port + 1 + node
            listeners: list[trio.SocketListener] = []
            has_preferred = bool(self.bootstrap_port) and 0 <= node and preferred <= 65535
            if has_preferred:
                try:
                    listeners = await trio.open_tcp_listeners(preferred, host=self.listen_host)
                except OSError as error:
                    log.warning("proxy_node_port_taken", node_id=node, port=preferred,
                                error=str(error), hint="a free port serves meanwhile; "
                                "the preferred one is tried again")
            if not listeners:
                listeners = await trio.open_tcp_listeners(0, host=self.listen_host)
                if has_preferred:
                    self._accept_nursery.start_soon(self._claim_preferred_port, node, preferred)
            port = int(listeners[0].socket.getsockname()[1])
            self.node_ports[node] = port
            for listener in listeners:
                self._accept_nursery.start_soon(self._accept, listener, node)
            log.info("proxy_node_listener", node_id=node,
                     listen=f"{self.advertised_host}:{port}",
                     upstream=f"{endpoint.host}:{endpoint.port}")

    async def _claim_preferred_port(self, node: int, preferred: int) -> None:
        """Bind a broker's preferred port once whoever held it lets go. A client that knew
        the broker by that port before a restart finds it again; the free port given
        meanwhile keeps serving the clients that learned it, and Metadata names the
        preferred port from then on."""
        pause_s = PROBE_FIRST_PAUSE_S
        while True:
            await trio.sleep(pause_s)
            pause_s = min(pause_s * 2, PROBE_LONGEST_PAUSE_S)
            async with self._bind_lock:
                if self._accept_nursery is None:
                    return
                try:
                    listeners = await trio.open_tcp_listeners(preferred, host=self.listen_host)
                except OSError:
                    continue
                for listener in listeners:
                    self._accept_nursery.start_soon(self._accept, listener, node)
                self.node_ports[node] = preferred
            log.info("proxy_node_listener", node_id=node,
                     listen=f"{self.advertised_host}:{preferred}",
                     upstream="{}:{}".format(*self.node_addresses[node]), preferred=True)
            return

    async def learn_nodes(self) -> bool:
        """Ask an upstream bootstrap address for its brokers (Metadata with no topics) and
        open their listeners. False when no upstream answered."""
        version = 12
        request_type = wire._request_type(wire.METADATA, version)
        body = request_type(topics=(), allow_auto_topic_creation=False,
                            include_topic_authorized_operations=False)
        frame = wire.encode_request(wire.METADATA, version, 1, body)
        for host, port in self.upstreams:
            try:
                with trio.fail_after(self.connect_timeout_s * 2):
                    stream = await trio.open_tcp_stream(host, port)
                    async with stream:
                        await stream.send_all(frame)
                        reader = _ByteReader(stream)
                        size = INT32.unpack(await reader.read_exactly(4))[0]
                        response = await reader.read_exactly(size)
                _, metadata = wire.decode_response(response, wire.METADATA, version)
            except (OSError, trio.TooSlowError, UpstreamClosed, MalformedResponse) as error:
                self.lines.warning("proxy_upstream_probe_failed", key=(host, port),
                                   upstream=f"{host}:{port}",
                                   error=str(error) or type(error).__name__)
                continue
            for endpoint in wire.endpoints(wire.METADATA, version, metadata):
                await self.learn_node(endpoint)
            return True
        return False

    async def _probe_upstream(self) -> None:
        """Learn the brokers at start-up, so their ports are open and logged early, and
        again while no upstream answers (every 0.5 s, then up to every 10 s): a client
        that knows a broker's port from before a restart finds it open once the cluster
        can be reached, without a Metadata request of its own on the bootstrap port."""
        pause_s = PROBE_FIRST_PAUSE_S
        while not self.node_ports:  # (a client's Metadata may have taught them meanwhile)
            try:
                if await self.learn_nodes():
                    return
            except (OSError, UpstreamClosed) as error:
                self.lines.warning("proxy_upstream_probe_failed", error=str(error))
            await trio.sleep(pause_s)
            pause_s = min(pause_s * 2, PROBE_LONGEST_PAUSE_S)

    # -- listening -----------------------------------------------------------------------

    async def serve(self, host: str, port: int, *,
                    listeners: list[trio.SocketListener] | None = None,
                    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """`listeners`, when given, are the bootstrap port's, already bound."""
        if listeners is None:
            listeners = await trio.open_tcp_listeners(port, host=host)
        self.listen_host = host
        self.bootstrap_port = int(listeners[0].socket.getsockname()[1])
        try:
            with trio.CancelScope() as self._connections:
                async with trio.open_nursery() as nursery:
                    self._connection_nursery = nursery
                    nursery.start_soon(self._enforce_deadlines)
                    with trio.CancelScope() as self._accepting:
                        async with trio.open_nursery() as accept_nursery:
                            self._accept_nursery = accept_nursery
                            for listener in listeners:
                                accept_nursery.start_soon(self._accept, listener, None)
                            log.info("proxy_listening", **self.mapping())
                            task_status.started(self.bootstrap_port)
                            accept_nursery.start_soon(self._probe_upstream)
                    self._accept_nursery = None
        finally:
            self._accept_nursery = None
            for listener in listeners:
                listener.socket.close()
        log.info("proxy_closed")

    async def _accept(self, listener: trio.SocketListener, node: int | None) -> None:
        """Accept while there is room (`server.max.connections`, counted over every
        listener of the proxy, as the plain listener counts its own)."""
        try:
            while True:
                try:
                    stream = await listener.accept()
                except OSError as error:  # e.g. too many open files: back off, keep serving
                    self.lines.warning("accept_failed", error=str(error))
                    await trio.sleep(0.1)
                    continue
                if self.open_connections >= self.config.max_connections:
                    self.local.runtime.metrics.reject("connection_limit")
                    self.lines.warning(
                        "connection_refused", reason=f"{self.open_connections} connections "
                        f"open, the limit ({FIELD_KEYS['max_connections']})")
                    stream.socket.close()
                    continue
                try:
                    connection = _Connection(self, stream, node)
                except OSError as error:  # the client reset the connection already
                    self.lines.warning("accept_failed", error=str(error))
                    await stream.aclose()
                    continue
                assert self._connection_nursery is not None
                self.open_connections += 1
                self._connection_nursery.start_soon(connection.run)
        finally:
            listener.socket.close()

    async def _enforce_deadlines(self) -> None:
        """Close the connections that have held a half-sent frame longer than the read
        timeout, or have had nothing in flight for the idle timeout (as the plain
        listener does; checked every tenth of the shorter timeout, within bounds)."""
        config = self.config
        read_s = config.connection_read_timeout_ms / 1000
        idle_s = config.connection_idle_timeout_ms / 1000
        low, high = DEADLINE_CHECK_S
        interval_s = min(max(min(read_s, idle_s) / 10, low), high)
        while True:
            await trio.sleep(interval_s)
            now = trio.current_time()
            for connection in self._live:
                connection.check_deadline(now, read_s, idle_s)

    async def drain(self, timeout_s: float) -> None:
        """Stop accepting, let local answers in flight finish, then close connections."""
        if self._accepting is not None:
            self._accepting.cancel()
        with trio.move_on_after(timeout_s):
            await self.local.wait_idle()
        if self._connections is not None:
            self._connections.cancel()


class _Connection:
    def __init__(self, proxy: ProxyServer, client: trio.SocketStream, node: int | None) -> None:
        self.proxy = proxy
        self.node = node  # None: the bootstrap listener
        self.upstream: _Socket | None = None
        self.responses: _ByteReader | None = None
        self._outgoing: list[memoryview] = []  # forwarded requests not yet sent upstream
        self._outgoing_bytes = 0
        try:
            self.peer: Any = client.socket.getpeername()
        except OSError:
            self.peer = None
        # The problems of the requests answered locally, logged as a connection's are.
        self.problems = ProblemLog(peer=self.peer)
        # Deadlines (`check_deadline`): when the connection last had something to do, how
        # many answers it waits for, when the frame being read began, and why it was cut.
        self.last_active = trio.current_time()
        self.in_flight = 0
        self.frames = wire.FrameCutter(proxy.max_frame_bytes)
        self.frame_started = 0.0
        self.scope = trio.CancelScope()
        self.timed_out = ""
        self.client = _Socket(client, proxy.turns)
        # Each task's rounds of socket calls, yielding only every few that did not wait.
        self._reading = proxy.turns.loop()
        self._writing = proxy.turns.loop()

    def check_deadline(self, now: float, read_s: float, idle_s: float) -> None:
        """Cut the connection off if it is past its read or idle deadline."""
        if self.timed_out:
            return
        if self.frames.buffered_bytes:
            if now - self.frame_started >= read_s:
                self.timed_out = "read_timeout"
        elif self.in_flight == 0 and now - self.last_active >= idle_s:
            self.timed_out = "idle_timeout"
        if self.timed_out:
            self.scope.cancel()

    async def run(self) -> None:
        proxy = self.proxy
        metrics = proxy.metrics
        metrics.connections.inc()
        proxy._live.add(self)
        send, receive = trio.open_memory_channel[_Slot](MAX_IN_FLIGHT)
        try:
            with self.scope:
                async with self.client.stream, trio.open_nursery() as nursery:
                    nursery.start_soon(self._read_requests, send, nursery)
                    await self._write_responses(receive)
                    nursery.cancel_scope.cancel()
        except Exception as error:  # a bug here closes this connection, never the server
            proxy.lines.error("proxy_connection_failed", traceback=True, peer=self.peer,
                              error=f"{type(error).__name__}: {error}")
        finally:
            proxy._live.discard(self)
            proxy.open_connections -= 1
            metrics.connections.dec()
            if self.timed_out:
                proxy.local.runtime.metrics.reject(self.timed_out)
                key = ("connection_read_timeout_ms" if self.timed_out == "read_timeout"
                       else "connection_idle_timeout_ms")
                proxy.lines.warning("connection_timed_out", key=self.timed_out,
                                    reason=self.timed_out, peer=self.peer,
                                    buffered=self.frames.buffered_bytes, limit=FIELD_KEYS[key])
            if self.responses is not None:
                self.responses.close()
            if self.upstream is not None:
                with trio.CancelScope(shield=True):
                    await self.upstream.aclose()

    # -- client -> proxy -----------------------------------------------------------------

    async def _read_requests(self, slots: trio.MemorySendChannel[_Slot],
                             nursery: trio.Nursery) -> None:
        with contextlib.suppress(trio.BrokenResourceError):  # the writer stopped: closing
            async with slots:
                await self._requests(self.frames, slots, nursery)

    async def _requests(self, frames: wire.FrameCutter, slots: trio.MemorySendChannel[_Slot],
                        nursery: trio.Nursery) -> None:
        while True:
            try:
                data = await self.client.receive_some(RECEIVE_BYTES)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                data = b""
            if not data:
                # The client is gone: stop waiting for the upstream's answers to it
                # (local answers in flight finish, shielded, before the close).
                nursery.cancel_scope.cancel()
                return
            # The forwarded requests of one read go upstream in one send.
            going_on = True
            now = trio.current_time()
            self.last_active = now
            was_reading = frames.buffered_bytes > 0
            cut = frames.cut(data)
            if frames.buffered_bytes and (cut or not was_reading):
                self.frame_started = now  # the first byte of the frame now being read
            for frame in cut:
                going_on = await self._request(frame, slots, nursery)
                if not going_on or self._outgoing_bytes >= FLUSH_BYTES:
                    going_on = await self._flush(slots) and going_on
                if not going_on:
                    break
            if not (await self._flush(slots) and going_on):
                return
            if frames.error is not None:
                await self._close_after(slots, f"bad frame: {frames.error}")
                return
            await self._reading.end_round()  # a yield now and then, not per call

    async def _flush(self, slots: trio.MemorySendChannel[_Slot]) -> bool:
        if not self._outgoing:
            return True
        assert self.upstream is not None
        buffers = self._outgoing
        self._outgoing = []
        self._outgoing_bytes = 0
        try:
            await self.upstream.send_buffers(buffers)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as error:
            self.proxy.metrics.upstream_failure("closed")
            self.proxy.lines.warning("proxy_upstream_send_failed", error=str(error),
                                     peer=self.peer)
            await self.upstream.aclose()  # the writer's reads fail at once too
            await self._close_after(slots, "the upstream connection broke")
            return False
        return True

    async def _queue(self, slots: trio.MemorySendChannel[_Slot], slot: _Slot) -> None:
        """Queue an expected answer, in request order, without a pass through the scheduler
        while there is room. With the queue full, the requests not yet sent upstream go
        first: the writer may be waiting for their answers to make room."""
        self.in_flight += 1
        try:
            slots.send_nowait(slot)
        except trio.WouldBlock:
            await self._flush(slots)
            await slots.send(slot)
    async def _close_after(self, slots: trio.MemorySendChannel[_Slot], reason: str) -> None:
        """Answer what came before, then close the connection."""
        await self._queue(slots, _Slot.answered(None, None, reason))

    async def _request(self, framed: memoryview, slots: trio.MemorySendChannel[_Slot],
                       nursery: trio.Nursery) -> bool:
        """Route one request (`framed`: its size prefix, then the frame); False when the
        connection is to close after earlier answers."""
        proxy = self.proxy
        frame = framed[4:]
        try:
            if len(frame) > OFFLOAD_DECODE_BYTES and wire.reads_body(wire.peek(frame)):
                # A large request read here is walked and decoded in the listener's
                # thread, as the plain listener does, while the loop answers heartbeats.
                routing = await proxy.local.off_loop(wire.classify, bytes(frame),
                                                     proxy.owned, proxy.decode_limits)
            else:
                routing = wire.classify(frame, proxy.owned, proxy.decode_limits)
        except MalformedBody as error:  # the frame boundary holds: answer it
            answer = self._invalid_request(error)
            if answer is None:
                await self._close_after(slots, f"malformed request: {error}")
                return False
            await self._queue(slots, _Slot.answered(None, answer))
            return True
        except MalformedRequest as error:
            await self._close_after(slots, f"malformed request: {error}")
            return False
        except Exception as error:  # never further than this connection
            await self._close_after(slots, f"request not understood: "
                                           f"{type(error).__name__}: {error}")
            return False
        head = routing.head
        if routing.action is wire.Action.REFUSE:
            answer, reason = wire.refusal(head)
            if head.api_key in wire.SASL_APIS:
                proxy.lines.warning("sasl_not_supported", peer=self.peer, hint=reason)
            else:
                proxy.lines.warning("proxy_api_refused", api=wire.api_name(head.api_key),
                                    peer=self.peer, reason=reason)
            if answer is None:
                await self._close_after(slots, reason)
                return False
            await self._queue(slots, _Slot.answered(routing, answer))
            return True
        if routing.action is wire.Action.FIND_COORDINATOR:
            proxy.metrics.owned(head.api_key)
            await self._queue(slots, _Slot.answered(routing, wire.find_coordinator_answer(
                head.api_version, head.correlation_id, routing.coordinator_keys,
                proxy.coordinator)))
            return True
        if routing.action is wire.Action.LOCAL:
            proxy.metrics.owned(head.api_key)
            slot = _Slot.pending(routing)
            await self._queue(slots, slot)
            nursery.start_soon(self._answer_locally,
                               bytes(frame) if routing.request is None else None, routing, slot)
            return True
        return await self._forward(framed, routing, slots)

    def _invalid_request(self, error: MalformedBody) -> bytes | None:
        """INVALID_REQUEST for a request read here that does not parse or is over a limit,
        as the plain listener answers it; None where no answer can carry the error."""
        metrics = self.proxy.local.runtime.metrics
        metrics.reject("over_limit" if isinstance(error, RequestOverLimit) else "invalid")
        self.problems.warning("bad_request", api=wire.api_name(error.api_key),
                              error=str(error))
        key, version = error.api_key, error.api_version
        if key == wire.FIND_COORDINATOR and version >= 4:
            return None  # its answer has an error per key, and the keys were not read
        if (key, version) in REQUEST_CLASSES:
            return error_response(key, version, error.correlation_id,
                                  ErrorCode.INVALID_REQUEST, str(error))
        return wire.error_answer(key, version, error.correlation_id,
                                 ErrorCode.INVALID_REQUEST, str(error))

    async def _answer_locally(self, frame: bytes | None, routing: wire.Routing,
                              slot: _Slot) -> None:
        head = routing.head
        coordinator = self.proxy.coordinator
        address = Address(coordinator.host, coordinator.port)
        local = self.proxy.local
        request = routing.request
        if request is None or (head.api_key, head.api_version) in REQUEST_CLASSES:
            # Shielded: a state change in the core is not abandoned halfway because its
            # client went away.
            with trio.CancelScope(shield=True):
                if request is None:  # the coordinator's own APIs: read by the listener
                    assert frame is not None
                    answer = await local.answer_frame(frame, self.problems, self.peer,
                                                      address)
                else:  # read once already, to route it
                    answer = await local.answer_decoded(request, self.problems, self.peer,
                                                        address)
            slot.finish(answer, "malformed request")
            return
        # A version (or an owned group's API) this process answers itself and does not
        # serve: UNSUPPORTED_VERSION in a form the client reads, and the connection stays.
        key, version, correlation = head.api_key, head.api_version, head.correlation_id
        message = (f"API {wire.api_name(key)} v{version} is not served "
                   "for the groups this coordinator owns (proxy.groups)")
        self.proxy.lines.warning("proxy_version_not_served", key=key, api=wire.api_name(key),
                                 version=version, peer=self.peer)
        if key == wire.API_VERSIONS:
            slot.finish(wire.unsupported_api_versions_answer(
                correlation, *self.proxy.api_versions_served), message)
            return
        answer = None if key in SUPPORTED_APIS else wire.error_answer(
            key, version, correlation, ErrorCode.UNSUPPORTED_VERSION, message)
        if answer is None:
            if request is not None:  # read once already: its group ids are at hand
                group_ids = wire.GROUP_IDS[key](request.body) if key in wire.GROUP_IDS else ()
            else:
                assert frame is not None
                group_ids = wire.owned_group_ids(frame, head)
            answer = error_response(key, version, correlation, ErrorCode.UNSUPPORTED_VERSION,
                                    message, group_ids=group_ids)
        slot.finish(answer, message)

    async def _forward(self, framed: memoryview, routing: wire.Routing,
                       slots: trio.MemorySendChannel[_Slot]) -> bool:
        head = routing.head
        proxy = self.proxy
        if not await self._connect_upstream():
            if head.api_key == wire.FIND_COORDINATOR:
                await self._queue(slots, _Slot.answered(routing, wire.find_coordinator_answer(
                    head.api_version, head.correlation_id, routing.coordinator_keys,
                    proxy.coordinator, ErrorCode.COORDINATOR_NOT_AVAILABLE,
                    "the upstream Kafka cluster is unreachable")))
                return True
            await self._close_after(slots, "the upstream Kafka cluster is unreachable")
            return False
        assert self.upstream is not None
        # The slot is queued before the request leaves (at the next flush), so the writer
        # expects its response before it can arrive.
        if routing.expects_response:
            await self._queue(slots, _Slot(routing, upstream=True))
        self._outgoing.append(framed)  # as it came: no copy
        self._outgoing_bytes += len(framed)
        proxy.metrics.forwarded(head.api_key, len(framed))
        return True

    async def _connect_upstream(self) -> bool:
        if self.upstream is not None:
            return True
        proxy = self.proxy
        if self.node is None:
            addresses = list(proxy.upstreams)
        else:
            if self.node not in proxy.node_addresses:
                await proxy.learn_nodes()
            known = proxy.node_addresses.get(self.node)
            addresses = [known] if known is not None else []
        errors: list[str] = []
        for host, port in addresses:
            try:
                with trio.fail_after(proxy.connect_timeout_s):
                    self.upstream = _Socket(await trio.open_tcp_stream(host, port),
                                            proxy.turns)
            except (OSError, trio.TooSlowError) as error:
                errors.append(f"{host}:{port}: {error or 'timed out'}")
                continue
            self.responses = _ByteReader(self.upstream, self._writing)
            return True
        proxy.metrics.upstream_failure("connect")
        proxy.lines.warning("proxy_upstream_unreachable", key=self.node, node_id=self.node,
                            peer=self.peer, errors=errors or ["no known address for this node"])
        return False

    # -- proxy -> client -----------------------------------------------------------------

    async def _write_responses(self, slots: trio.MemoryReceiveChannel[_Slot]) -> None:
        """Answer in request order. Answers that are ready go out together: the writer
        sends what it has gathered only before it would wait (for an upstream response
        still to come, a local answer, the next request), so a burst of pipelined answers
        costs one send to the client, not one each (a send on loopback wakes the client,
        which costs more than the copy)."""
        ready = bytearray()
        async with slots:
            try:
                while True:
                    try:
                        slot = slots.receive_nowait()
                    except trio.WouldBlock:
                        await self._send(ready)
                        slot = await slots.receive()
                    if slot.upstream:
                        await self._relay_response(slot, ready)
                    else:
                        if slot.done is not None and not slot.done.is_set():
                            await self._send(ready)
                            await slot.done.wait()
                        if slot.answer is None:
                            await self._send(ready)
                            self.proxy.lines.info("proxy_connection_closed",
                                                  reason=slot.reason, peer=self.peer)
                            return
                        ready += slot.answer
                    self.in_flight -= 1
                    self.last_active = trio.current_time()
                    if len(ready) >= FLUSH_BYTES:
                        await self._send(ready)
            except trio.EndOfChannel:  # the reader is done
                pass
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
            except UpstreamClosed as error:
                self.proxy.metrics.upstream_failure("closed")
                self.proxy.lines.warning("proxy_upstream_closed", error=str(error),
                                         peer=self.peer)
            except (MalformedResponse, FrameError) as error:
                self.proxy.lines.error("proxy_bad_upstream_response", error=str(error),
                                       peer=self.peer)
            # The answers gathered before the end (or the upstream's failure) still go out.
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await self._send(ready)

    async def _send(self, ready: bytearray) -> None:
        if ready:
            await self.client.send_all(ready)
            ready.clear()
            await self._writing.end_round()  # a yield now and then, not per call

    async def _relay_response(self, slot: _Slot, ready: bytearray) -> None:
        """The next upstream response: added to `ready` when it is all there (after its
        rewrite, if any), else streamed to the client behind what `ready` holds."""
        responses = self.responses
        assert responses is not None and slot.routing is not None
        head = slot.routing.head
        if responses.buffered < 8:  # size, correlation id
            await self._send(ready)
            await responses.fill(8)
        size, correlation = responses.int32_at(0), responses.int32_at(4)
        if correlation != head.correlation_id:
            raise MalformedResponse(f"upstream answered correlation id {correlation} where "
                                    f"{head.correlation_id} was next")
        if size < 4 or size > self.proxy.max_frame_bytes:
            raise MalformedResponse(f"upstream response of {size} bytes")
        if slot.routing.rewrite:
            if responses.buffered < size + 4:
                await self._send(ready)
            frame = (await responses.read_exactly(size + 4))[4:]
            answer = await self._rewritten(frame, slot.routing)
            ready += answer
            self.proxy.metrics.relayed(head.api_key, len(answer))
        elif responses.buffered >= size + 4:
            responses.move_to(ready, size + 4)
            self.proxy.metrics.relayed(head.api_key, size + 4)
        else:
            await responses.relay(size + 4, self.client, prefix=ready)
            self.proxy.metrics.relayed(head.api_key, size + 4)

    async def _rewritten(self, frame: bytes, routing: wire.Routing) -> bytes:
        proxy = self.proxy
        head = routing.head
        key, version = head.api_key, head.api_version
        correlation, body = wire.decode_response(frame, key, version)
        if key == wire.API_VERSIONS:
            body = wire.intersect_api_versions(body, SUPPORTED_APIS, proxy.local_group_apis)
            version = int(type(body).__version__)
        elif key == wire.LIST_GROUPS:
            local = [wire.LocalGroup(*listed)
                     for listed in listed_groups(proxy.local.runtime.core)]
            assert routing.request is not None
            body = wire.merge_listed_groups(body, routing.request.body, local, proxy.owned)
        else:
            for endpoint in wire.endpoints(key, version, body):
                await proxy.learn_node(endpoint)
            body = wire.rewrite(key, version, body, proxy.local_address, proxy.coordinator,
                                routing.owned_keys)
        return wire.encode_response(key, version, correlation, body)


__all__ = ["ProxyServer", "UpstreamClosed"]
