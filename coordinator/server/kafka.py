"""The KRPC listener: one task per connection, pipelined requests answered in order.

Nothing a client sends reaches further than its own connection:

- a frame that cannot be cut, a header that does not parse: the connection is closed;
- a body that does not have its schema's shape, or is over a limit
  (coordinator/server/limits.py): answered INVALID_REQUEST, the connection kept;
- anything else that goes wrong while answering: UNKNOWN_SERVER_ERROR, the connection
  kept; any failure of the connection task itself ends that connection only.

Each connection logs its problems itself, rate-limited (:class:`ProblemLog`): a client
sending garbage in a loop makes one line every few seconds, not one per frame. Client
input is logged at warning without a traceback; only the coordinator's own failures
carry one.

No request holds the event loop for long: what costs in proportion to a request's size is
bounded by the limits, and a frame above OFFLOAD_DECODE_BYTES is decoded and checked, and
freed once answered (`release_gradually`), and a describe whose answer is estimated above
OFFLOAD_DESCRIBE_BYTES is built and encoded (from snapshots taken on the loop,
DESCRIBE_GROUPS_PER_STEP groups per step), in the listener's own thread; so are the large
answers of Kafka's own APIs (DescribeGroups, ListGroups, FindCoordinator, Metadata,
LeaveGroup), each refused instead if it would not fit in a frame. Large requests
take turns there, and the thread rests as long as each took (REST_RATIO), so however many
clients send them they hold the GIL at most half the time. `bench hostile` tells the
longest step of the loop under each kind of large request.

Connections are capped (`server.max.connections`), a frame must be finished within
`server.connection.read.timeout.ms` of its first byte, and a connection with nothing
in flight is closed after `server.connection.idle.timeout.ms`. A connection holds at
most one frame being read plus the answers to one read (sent once they reach
SEND_BATCH_BYTES), and reads nothing more until they are sent: a client that does not
read its answers stops being read from.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import structlog
import trio

from coordinator.config import FIELD_KEYS, ServerConfig
from coordinator.core import describe as describing
from coordinator.core.validation import (
    CheckedHeartbeat,
    CheckedInstall,
    check_classic_ids,
    check_heartbeat,
    check_install,
    install_unit_count,
)
from coordinator.logs import RateLimitedLog
from coordinator.metrics import api_name
from coordinator.server import classic
from coordinator.server.classic import Address
from coordinator.server.limits import (
    decode_limits,
    describe_answer_bytes,
    described_group_bytes,
    listed_groups_bytes,
    listing_answer_bytes,
)
from coordinator.server.runtime import NotDurable, Runtime
from protocol._codec import INT16, INT32
from protocol.classic import (
    CLASSIC_APIS,
    DESCRIBE_GROUPS,
    FIND_COORDINATOR,
    JOIN_GROUP,
    LEAVE_GROUP,
    LIST_GROUPS,
    METADATA,
    SYNC_GROUP,
)
from protocol.classic import HEARTBEAT as HEARTBEAT_V
from protocol.errors import ApiError, ErrorCode
from protocol.fastpath import encode_classic_heartbeat_response, encode_heartbeat_response
from protocol.framing import (
    API_VERSIONS,
    DecodedRequest,
    FrameBuffer,
    FrameError,
    FrameTooLarge,
    MalformedBody,
    MalformedRequest,
    RequestOverLimit,
    UnsupportedApi,
    api_versions_response,
    decode_request,
    encode_response,
    error_response,
    peek_caller,
)
from protocol.sasl import REFUSAL as SASL_REFUSAL
from protocol.sasl import SASL_APIS, sasl_refusal

T = TypeVar("T")
log = structlog.get_logger("connect_coordinator.kafka")
HEARTBEAT, PREPARE, INSTALL, DESCRIBE = 1000, 1001, 1002, 1003
RECEIVE_BYTES = 65536
LARGE_RECEIVE_BYTES = 1024 * 1024
# Frames above this are walked and decoded in a background thread (a frame of a few MB
# takes tens of milliseconds), so that heartbeats are answered meanwhile.
OFFLOAD_DECODE_BYTES = 64 * 1024
# A connection remembers its last request frame up to this size (RepeatedFrame).
REPEATED_FRAME_BYTES = 1024


class RepeatedFrame:
    """A connection's last small request frame and what it decoded to. A stable member's
    heartbeats are the same bytes every time but for the correlation id; such a frame is
    neither walked nor decoded again (that was about a sixth of a stable heartbeat's work):
    the bytes decoded before decode the same way."""

    __slots__ = ("api", "rest", "request")

    def __init__(self) -> None:
        self.api = b""  # the frame's API key and version
        self.rest = b""  # the frame after its correlation id
        self.request: DecodedRequest | None = None

    def get(self, frame: bytes) -> DecodedRequest | None:
        """The request `frame` decodes to, if it repeats the last one remembered."""
        last = self.request
        if (last is None or len(frame) != len(self.rest) + 8 or frame[8:] != self.rest
                or frame[:4] != self.api):
            return None  # (the length first: no copy of a frame that cannot repeat)
        return DecodedRequest(last.api_key, last.api_version, INT32.unpack_from(frame, 4)[0],
                              last.client_id, last.body)

    def remember(self, frame: bytes, request: DecodedRequest) -> None:
        if len(frame) <= REPEATED_FRAME_BYTES:
            self.api, self.rest, self.request = frame[:4], frame[8:], request
# Answers to one read are sent once they add up to this much, before the next is built.
SEND_BATCH_BYTES = 256 * 1024
# The loop yields to other connections after answering for this long in one read.
ANSWERING_SLICE_S = 0.002
PROBLEM_LOG_INTERVAL_S = 10.0
# Connection timeouts are checked this often: a tenth of the shorter timeout, within these
# bounds (a timeout fires up to one check late).
DEADLINE_CHECK_S = (0.01, 1.0)


class ConnectionDeadline:
    """When a connection waiting for bytes is cut off, and why.

    One task checks every connection's deadline now and then, instead of a cancel scope
    with a deadline around every read: trio registers and unregisters such a scope with
    its timer heap each time, which cost a stable heartbeat's answer about a third more.
    """

    __slots__ = ("at", "reason", "scope", "expired")

    def __init__(self) -> None:
        self.at = math.inf  # no deadline while a request is being answered or sent
        self.reason = ""
        self.scope = trio.CancelScope()
        self.expired = False


# A describe whose answer is estimated above this is built and encoded in a thread.
OFFLOAD_DESCRIBE_BYTES = 32 * 1024
# A describe's groups are snapshotted this many per step of the loop (10-20 us each).
DESCRIBE_GROUPS_PER_STEP = 100


def _encode_described(version: int, correlation_id: int,
                      taken: list[describing.Snapshot | tuple[str, Any]]) -> bytes:
    return encode_response(DESCRIBE, version, correlation_id,
                           describing.response(taken, version))


def _encode_classic_described(version: int, correlation_id: int,
                              taken: list[classic.DescribedGroupSnapshot]
                              ) -> tuple[bytes, int]:
    return encode_response(DESCRIBE_GROUPS, version, correlation_id,
                           classic.describe_groups_body(version, taken)), ErrorCode.NONE


def _encode_classic_list(version: int, correlation_id: int,
                         rows: list[tuple[str, str, str]]) -> tuple[bytes, int]:
    return encode_response(LIST_GROUPS, version, correlation_id,
                           classic.list_groups_body(version, rows)), ErrorCode.NONE


def _encode_lookup(api_key: int, version: int, correlation_id: int, body: Any,
                   address: Address) -> tuple[bytes, int]:
    """Metadata's or FindCoordinator's answer (they depend on the request only)."""
    code: int = ErrorCode.NONE
    if api_key == METADATA:
        response = classic.metadata_response(version, body, address)
    else:
        response, code = classic.find_coordinator_response(version, body, address)
    return encode_response(api_key, version, correlation_id, response), code


def _encode_left(version: int, correlation_id: int, code: int,
                 members: tuple[tuple[str, str | None, int], ...]) -> tuple[bytes, int]:
    return encode_response(LEAVE_GROUP, version, correlation_id,
                           classic.leave_response(version, code, members)), code


# After each large request the listener's thread rests this many times as long as the
# request took: however many clients send large requests back to back, it holds the GIL
# at most 1 / (1 + REST_RATIO) of the time, and the loop the rest. Clients wait instead.
REST_RATIO = 1.0


def _then_rest(fn: Callable[..., T], *args: Any) -> T:
    started = time.perf_counter()
    try:
        return fn(*args)
    finally:
        time.sleep((time.perf_counter() - started) * REST_RATIO)


def _elements(value: Any) -> list[Any]:
    """The elements of the arrays among a decoded message's fields, and among those of the
    structs it holds (an Install's members, a heartbeat's owned tasks)."""
    found: list[Any] = []
    for name in getattr(value, "__slots__", ()):
        field = getattr(value, name, None)
        if isinstance(field, tuple):
            found.extend(field)
        elif hasattr(field, "__dataclass_fields__"):
            for inner_name in getattr(field, "__slots__", ()):
                inner = getattr(field, inner_name, None)
                if isinstance(inner, tuple):
                    found.extend(inner)
    return found


def release_gradually(held: list[Any]) -> None:
    """Frees what `held` holds (decoded requests, checked Installs) an element of an array
    at a time: freeing one large array is one step of C, during which the thread holding
    the GIL keeps it; between elements, it changes hands as often as the loop asks."""
    pieces: list[Any] = []
    for item in held:
        body = getattr(item, "body", None)
        pieces.extend(_elements(body) if body is not None else ())
        parts = getattr(item, "parts", None)
        if isinstance(parts, dict):
            pieces.extend(parts.values())
    held.clear()  # the arrays go; each of their elements is still held by `pieces`
    while pieces:
        pieces.pop()


def _group_type(runtime: Runtime, group_id: str) -> str:
    """The type of the group that answered (a group converted meanwhile: its new type)."""
    return "classic" if group_id in runtime.core.classic.store.groups else "connect"


class ProblemLog:
    """One connection's (or the listener's) problem lines: the first of each kind at once,
    then at most one line per `interval_s`, telling how many were not logged since."""

    def __init__(self, interval_s: float = PROBLEM_LOG_INTERVAL_S, **context: Any) -> None:
        self.interval_s = interval_s
        self.context = context
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def _due(self, event: str) -> int | None:
        now = time.monotonic()
        if now - self._last.get(event, -math.inf) < self.interval_s:
            self._suppressed[event] = self._suppressed.get(event, 0) + 1
            return None
        self._last[event] = now
        return self._suppressed.pop(event, 0)

    def warning(self, event: str, **fields: Any) -> None:
        suppressed = self._due(event)
        if suppressed is not None:
            log.warning(event, **self.context, **fields, suppressed=suppressed)

    def error(self, event: str, **fields: Any) -> None:
        """The coordinator's own failure: with the traceback of the exception handled."""
        suppressed = self._due(event)
        if suppressed is not None:
            log.error(event, **self.context, **fields, suppressed=suppressed, exc_info=True)


def _peer(stream: trio.SocketStream) -> str | None:
    try:
        address = stream.socket.getpeername()
    except OSError:
        return None
    return f"{address[0]}:{address[1]}" if isinstance(address, tuple) else str(address)


class KafkaServer:
    def __init__(self, runtime: Runtime, max_frame_bytes: int | None = None) -> None:
        self.runtime = runtime
        config: ServerConfig = runtime.config
        self.config = config
        self.max_frame_bytes = (config.max_frame_bytes if max_frame_bytes is None
                                else max_frame_bytes)
        self.decode_limits = decode_limits(config)
        self.in_flight = 0
        self.open_connections = 0
        self._refusals = ProblemLog()
        # Lines every connection may repeat (an fd limit reached, SASL clients).
        self._lines = RateLimitedLog(log)
        # Made only when someone waits for the requests in flight to finish (a drain):
        # an event a request would cost every request.
        self._idle: trio.Event | None = None
        self._accepting: trio.CancelScope | None = None
        self._deadlines: set[ConnectionDeadline] = set()
        self._connections: trio.CancelScope | None = None
        # Our own threads for big decodes and describes: at the loop's priority. A thread
        # of trio's cache may have been made a background one (scheduling.py), and one of
        # those holding the GIL while the OS runs others made heartbeats wait for it
        # (a p99 of 200 ms in `bench hostile`).
        # One: large requests take their turn, however many connections send them.
        self._decoders = ThreadPoolExecutor(max_workers=1, thread_name_prefix="krpc-decode")

    async def serve(self, host: str, port: int, *,
                    listeners: list[trio.SocketListener] | None = None,
                    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen until `stop_accepting`; then finish what is in flight. Reports the port.

        `listeners`, when given, are already bound (to host:port); serve takes them over."""
        if listeners is None:
            listeners = await trio.open_tcp_listeners(port, host=host)
        bound = listeners[0].socket.getsockname()[1]
        try:
            with trio.CancelScope() as self._connections:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._enforce_deadlines)
                    with trio.CancelScope() as self._accepting:
                        task_status.started(bound)
                        async with trio.open_nursery() as accept_nursery:
                            for listener in listeners:
                                accept_nursery.start_soon(self._accept, listener, nursery)
                    self._close(listeners)
        finally:
            self._close(listeners)
            self._decoders.shutdown(wait=False, cancel_futures=True)
        log.info("kafka_listener_closed")

    async def off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` in the listener's thread, taking turns with its other large requests
        (the proxy's large requests too); the loop goes on meanwhile."""
        return await self._off_loop(fn, *args)

    async def _off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` in one of the listener's threads; the loop goes on meanwhile."""
        token = trio.lowlevel.current_trio_token()
        done = trio.Event()
        future = self._decoders.submit(_then_rest, fn, *args)

        def wake(_: object) -> None:
            try:
                token.run_sync_soon(done.set)
            except trio.RunFinishedError:
                pass  # the server stopped meanwhile; nobody waits any more

        future.add_done_callback(wake)
        await done.wait()  # if cancelled, the work finishes unobserved: it changes nothing
        return future.result()

    async def _enforce_deadlines(self) -> None:
        """Cut off the connections whose deadline has passed (until the server stops)."""
        config = self.config
        shortest_s = min(config.connection_read_timeout_ms,
                         config.connection_idle_timeout_ms) / 1000
        low, high = DEADLINE_CHECK_S
        interval_s = min(max(shortest_s / 10, low), high)
        while True:
            await trio.sleep(interval_s)
            now = trio.current_time()
            for deadline in self._deadlines:
                if deadline.at <= now and not deadline.expired:
                    deadline.expired = True
                    deadline.scope.cancel()

    @staticmethod
    def _close(listeners: list[trio.SocketListener]) -> None:
        for listener in listeners:
            listener.socket.close()  # synchronous: holds even when we are being cancelled

    async def _accept(self, listener: trio.SocketListener, nursery: trio.Nursery) -> None:
        while True:
            try:
                stream = await listener.accept()
            except OSError as error:  # e.g. too many open files: back off, keep serving
                self._lines.warning("accept_failed", error=str(error))
                await trio.sleep(0.1)
                continue
            if self.open_connections >= self.config.max_connections:
                self.runtime.metrics.reject("connection_limit")
                self._refusals.warning(
                    "connection_refused", peer=_peer(stream),
                    reason=f"{self.open_connections} connections open, the limit "
                           f"({FIELD_KEYS['max_connections']})")
                stream.socket.close()
                continue
            self.open_connections += 1
            nursery.start_soon(self._connection, stream)

    async def drain(self, timeout_s: float) -> None:
        """Graceful shutdown: stop accepting, wait for in-flight requests, then close."""
        if self._accepting is not None:
            self._accepting.cancel()
        # Parked JoinGroup/SyncGroup requests would hold the drain until their groups
        # move on: they are told to find the coordinator again.
        self.runtime.waiters.release_all(ErrorCode.COORDINATOR_NOT_AVAILABLE)
        with trio.move_on_after(timeout_s):
            await self.wait_idle()
        if self._connections is not None:
            self._connections.cancel()

    async def _connection(self, stream: trio.SocketStream) -> None:
        metrics = self.runtime.metrics
        metrics.connections.inc()
        peer = _peer(stream)
        try:
            local = stream.socket.getsockname()
        except OSError:
            local = None
        # The address this connection reached the coordinator at: what FindCoordinator
        # and Metadata answer with.
        address = Address(str(local[0]), int(local[1])) if local else Address("", -1)
        problems = ProblemLog(peer=peer)
        try:
            async with stream:
                await self._converse(stream, problems, peer, address)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the peer went away
        except Exception:  # never further than this connection
            problems.error("connection_failed")
        finally:
            self.open_connections -= 1
            metrics.connections.dec()

    async def _converse(self, stream: trio.SocketStream, problems: ProblemLog, peer: Any,
                        address: Address) -> None:
        frames = FrameBuffer(self.max_frame_bytes)
        deadline = ConnectionDeadline()
        self._deadlines.add(deadline)
        try:
            with deadline.scope:
                await self._read_and_answer(stream, problems, peer, address, frames, deadline)
        finally:
            self._deadlines.discard(deadline)
        if deadline.expired:
            reason = deadline.reason
            self.runtime.metrics.reject(reason)
            key = ("connection_read_timeout_ms" if reason == "read_timeout"
                   else "connection_idle_timeout_ms")
            problems.warning("connection_timed_out", reason=reason,
                             buffered=frames.buffered_bytes, limit=FIELD_KEYS[key])

    async def _read_and_answer(self, stream: trio.SocketStream, problems: ProblemLog,
                               peer: Any, address: Address, frames: FrameBuffer,
                               deadline: ConnectionDeadline) -> None:
        """Until the peer closes, sends a bad frame, or `deadline` cuts it off."""
        metrics = self.runtime.metrics
        config = self.config
        read_timeout_s = config.connection_read_timeout_ms / 1000
        idle_timeout_s = config.connection_idle_timeout_ms / 1000
        last_answer = trio.current_time()
        frame_started = 0.0  # when the first byte of the frame being read arrived
        repeated = RepeatedFrame()
        while True:
            if frames.buffered_bytes:
                deadline.at, deadline.reason = frame_started + read_timeout_s, "read_timeout"
            else:
                deadline.at, deadline.reason = last_answer + idle_timeout_s, "idle_timeout"
            # A large frame is read in large steps: fewer turns of the loop for it.
            data = await stream.receive_some(
                min(max(RECEIVE_BYTES, frames.missing_bytes), LARGE_RECEIVE_BYTES))
            deadline.at = math.inf
            if not data:
                if frames.buffered_bytes:
                    metrics.reject("truncated")
                    problems.warning("truncated_frame", buffered=frames.buffered_bytes)
                return
            was_reading = frames.buffered_bytes > 0
            try:
                frames.feed(data)
            except FrameError as error:
                reason = "oversize" if isinstance(error, FrameTooLarge) else "malformed"
                metrics.reject(reason)
                problems.warning("bad_frame_closing_connection", error=str(error))
                return
            del data
            # Answers to the frames of one read go out together, in order.
            answers: list[bytes] = []
            pending = 0
            closing = False
            sliced = time.perf_counter()
            completed = False
            for frame in frames:
                completed = True
                answer = await self._answer(frame, problems, peer, address, repeated)
                if answer is None:
                    metrics.reject("malformed")
                    closing = True
                    break
                answers.append(answer)
                pending += len(answer)
                if pending >= SEND_BATCH_BYTES:
                    await stream.send_all(b"".join(answers))
                    answers, pending = [], 0
                if time.perf_counter() - sliced > ANSWERING_SLICE_S:
                    await trio.lowlevel.checkpoint()  # let other connections in
                    sliced = time.perf_counter()
            if answers:
                await stream.send_all(b"".join(answers))
            if closing:
                return
            now = trio.current_time()
            if completed:
                last_answer = now
            if frames.buffered_bytes and (completed or not was_reading):
                frame_started = now

    async def wait_idle(self) -> None:
        """Until no request is being answered."""
        while self.in_flight:
            if self._idle is None:
                self._idle = trio.Event()
            await self._idle.wait()

    async def answer_frame(self, frame: bytes, problems: ProblemLog, peer: Any,
                           address: Address) -> bytes | None:
        """One request frame's framed response, or None when its connection must close
        (the proxy hands the requests of owned groups here, with its connection's problem
        log; `address` is the one the coordinator is known by)."""
        return await self._answer(frame, problems, peer, address)

    async def _answer(self, frame: bytes, problems: ProblemLog, peer: Any = None,
                      address: Address | None = None,
                      repeated: RepeatedFrame | None = None) -> bytes | None:
        """The framed response, or None when the connection must close."""
        started = time.perf_counter()
        if len(frame) >= 8 and INT16.unpack_from(frame, 0)[0] in SASL_APIS:
            return self._refuse_sasl(frame, started)
        offloaded = len(frame) > OFFLOAD_DECODE_BYTES
        if offloaded and self.runtime.ready:
            refused = self._refuse_install_early(frame, started)
            if refused is not None:
                return refused
        try:
            if offloaded:
                request, checked = await self._off_loop(self._decode, frame, True)
            elif repeated is None:
                request, checked = self._decode(frame, False)
            else:
                checked = None
                again = repeated.get(frame)
                if again is None:
                    request, checked = self._decode(frame, False)
                    repeated.remember(frame, request)
                else:
                    request = again
        except UnsupportedApi as error:
            self._count(error.api_key, ErrorCode.UNSUPPORTED_VERSION, started)
            return error_response(error.api_key, error.api_version, error.correlation_id,
                                  ErrorCode.UNSUPPORTED_VERSION, str(error))
        except MalformedBody as error:  # the frame boundary holds: answer it
            self.runtime.metrics.reject(
                "over_limit" if isinstance(error, RequestOverLimit) else "invalid")
            problems.warning("bad_request", api=api_name(error.api_key), error=str(error))
            self._count(error.api_key, ErrorCode.INVALID_REQUEST, started)
            return error_response(error.api_key, error.api_version, error.correlation_id,
                                  ErrorCode.INVALID_REQUEST, str(error))
        except MalformedRequest as error:
            problems.warning("malformed_request_closing_connection", error=str(error))
            return None
        return await self._respond(request, checked, problems, peer, address, started,
                                   offloaded)

    async def answer_decoded(self, request: DecodedRequest, problems: ProblemLog, peer: Any,
                             address: Address) -> bytes:
        """The framed response to a request decoded already, by the same guarded path
        (`decode_request_as`): the proxy's requests of owned groups, read once to route
        them."""
        return await self._respond(request, None, problems, peer, address,
                                   time.perf_counter(), False)

    async def _respond(self, request: DecodedRequest,
                       checked: CheckedInstall | CheckedHeartbeat | None, problems: ProblemLog,
                       peer: Any, address: Address | None, started: float,
                       offloaded: bool) -> bytes:
        self.in_flight += 1
        try:
            if request.api_key in CLASSIC_APIS:
                answer, code = await self._classic(request, problems, peer,
                                                   address or Address("", -1))
            else:
                answer, code = await self._dispatch(request, problems, checked)
        except Exception as error:
            problems.error("request_failed", api=api_name(request.api_key))
            code = ErrorCode.UNKNOWN_SERVER_ERROR
            answer = error_response(request.api_key, request.api_version,
                                    request.correlation_id, code,
                                    f"internal error: {type(error).__name__}: {error}")
        finally:
            self.in_flight -= 1
            if self.in_flight == 0 and self._idle is not None:
                self._idle.set()
                self._idle = None
        self._count(request.api_key, code, started)
        if offloaded:
            # Freeing a large request costs as much as building it did (some 20 ms for a
            # maximum Install): in the listener's thread too, not on the loop.
            held: list[Any] = [request, checked]
            del request, checked
            try:
                self._decoders.submit(_then_rest, release_gradually, held)
            except RuntimeError:  # the listener's thread is gone (the server stopped)
                held.clear()
        return answer

    def _decode(self, frame: bytes, off_loop: bool
                ) -> tuple[DecodedRequest, CheckedInstall | CheckedHeartbeat | None]:
        """The request, held to its limits as it is walked (coordinator/server/limits.py);
        off the loop, a large Install's `check_install` too (here, rather than in the
        runtime's background threads, whose lower priority made the loop wait for the
        GIL they held), and a large heartbeat's `check_heartbeat` (its owned list made
        into units: 10,000 of them took a few milliseconds)."""
        request = decode_request(frame, self.decode_limits)
        checked: CheckedInstall | CheckedHeartbeat | None = None
        if off_loop and request.api_key == HEARTBEAT:
            checked = check_heartbeat(request.body)
        elif (off_loop and request.api_key == INSTALL
                and install_unit_count(request.body) >= self.runtime.install_offload_units):
            checked = check_install(request.body)
        return request, checked

    def _refuse_sasl(self, frame: bytes, started: float) -> bytes | None:
        """A SASL client is told at once that it cannot authenticate here (None: a
        version not known, the connection is closed)."""
        api_key, api_version = INT16.unpack_from(frame, 0)[0], INT16.unpack_from(frame, 2)[0]
        self._lines.warning("sasl_not_supported", hint=SASL_REFUSAL)
        answer = sasl_refusal(api_key, api_version, INT32.unpack_from(frame, 4)[0])
        if answer is not None:
            self._count(api_key, ErrorCode.UNSUPPORTED_SASL_MECHANISM, started)
        return answer

    def _refuse_install_early(self, frame: bytes, started: float) -> bytes | None:
        """The answer to a large Install from a caller that may not install (not the
        group's chosen worker at its current epoch), given before its assignment is
        decoded: the error it would get anyway, at no cost proportional to its size."""
        api_key, api_version = INT16.unpack_from(frame, 0)[0], INT16.unpack_from(frame, 2)[0]
        if api_key != INSTALL:
            return None
        caller = peek_caller(frame)
        if caller is None:
            return None
        error = self.runtime.core.install_refusal(*caller)
        if error is None:
            return None
        self._count(api_key, int(error.code), started)
        return error_response(api_key, api_version, INT32.unpack_from(frame, 4)[0],
                              int(error.code), error.message)

    def _count(self, api_key: int, code: int, started: float) -> None:
        self.runtime.metrics.observe_request(api_key, code, time.perf_counter() - started)

    def _refuse(self, request: DecodedRequest, problems: ProblemLog, message: str,
                group_ids: tuple[str, ...] = ()) -> tuple[bytes, int]:
        """INVALID_REQUEST for a request over a limit (`message` names it)."""
        self.runtime.metrics.reject("over_limit")
        problems.warning("bad_request", api=api_name(request.api_key), error=message)
        code = ErrorCode.INVALID_REQUEST
        return error_response(request.api_key, request.api_version, request.correlation_id,
                              code, message, group_ids=group_ids), code

    def _too_large(self, request: DecodedRequest, problems: ProblemLog, estimate: int,
                   group_ids: tuple[str, ...] = ()) -> tuple[bytes, int] | None:
        """INVALID_REQUEST for a request whose answer is estimated above the frame limit."""
        if estimate <= self.max_frame_bytes:
            return None
        return self._refuse(
            request, problems,
            f"the answer would take more than {self.max_frame_bytes} bytes "
            f"({FIELD_KEYS['max_frame_bytes']}): ask for fewer at once", group_ids=group_ids)

    async def _classic(self, request: DecodedRequest, problems: ProblemLog, peer: Any,
                       address: Address) -> tuple[bytes, int]:
        """Kafka's own APIs: finding the coordinator, and classic groups."""
        key, version, correlation = request.api_key, request.api_version, request.correlation_id
        body = request.body
        response: Any
        code: int = ErrorCode.NONE
        listing = listing_answer_bytes(key, version, body, address.host)
        too_large = self._too_large(request, problems, listing,
                                    tuple(getattr(body, "coordinator_keys", ())))
        if too_large is not None:
            return too_large
        if key in (METADATA, FIND_COORDINATOR):
            return await self._encoded(listing, _encode_lookup, key, version, correlation,
                                       body, address)
        else:
            runtime = self.runtime
            if not runtime.ready:
                code = ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
                return error_response(key, version, correlation, code, "loading",
                                      group_ids=getattr(body, "groups", ())), code
            engine = runtime.core.classic
            if key in (JOIN_GROUP, SYNC_GROUP, HEARTBEAT_V, LEAVE_GROUP):
                try:
                    check_classic_ids(body)
                except ApiError as error:
                    return error_response(key, version, correlation, error.code,
                                          error.message), error.code
            try:
                if key == JOIN_GROUP:
                    arrived = time.perf_counter()
                    host = (str(peer[0]) if isinstance(peer, tuple)
                            else str(peer).rpartition(":")[0] if peer else "")
                    join = classic.join_request(body, version, request.client_id, host)
                    answer = await runtime.classic(engine.join, join)
                    response, code = classic.join_response(version, answer), answer.error
                    runtime.metrics.classic_join(_group_type(runtime, join.group_id),
                                                 time.perf_counter() - arrived)
                elif key == SYNC_GROUP:
                    arrived = time.perf_counter()
                    synced = classic.sync_request(body)
                    answer = await runtime.classic(engine.sync, synced)
                    response, code = classic.sync_response(version, answer), answer.error
                    runtime.metrics.classic_sync(_group_type(runtime, synced.group_id),
                                                 time.perf_counter() - arrived)
                elif key == HEARTBEAT_V:
                    beat = await runtime.classic(engine.heartbeat,
                                                 classic.heartbeat_request(body))
                    code = int(beat.error)
                    return encode_classic_heartbeat_response(version, correlation, code), code
                elif key == LEAVE_GROUP:
                    left = await runtime.classic(engine.leave,
                                                 classic.leave_request(body, version))
                    return await self._encoded(listing, _encode_left, version, correlation,
                                               left.error, left.members)
                elif key == LIST_GROUPS:
                    return await self._list_groups(request, problems)
                else:
                    return await self._describe_groups(request, problems)
            except NotDurable:
                code = ErrorCode.COORDINATOR_NOT_AVAILABLE
                return error_response(key, version, correlation, code, "not durable",
                                      group_ids=getattr(body, "groups", ())), code
        return encode_response(key, version, correlation, response), code

    async def _list_groups(self, request: DecodedRequest, problems: ProblemLog
                           ) -> tuple[bytes, int]:
        """ListGroups: refused if its answer would not fit in a frame; a large one built
        and encoded in the listener's thread (10,000 groups took some 50 ms)."""
        rows = classic.list_groups_rows(request.body, self.runtime.core)
        estimate = listed_groups_bytes(rows)
        too_large = self._too_large(request, problems, estimate)
        if too_large is not None:
            return too_large
        return await self._encoded(estimate, _encode_classic_list, request.api_version,
                                   request.correlation_id, rows)

    async def _describe_groups(self, request: DecodedRequest, problems: ProblemLog
                               ) -> tuple[bytes, int]:
        """DescribeGroups: each group's snapshot taken on the loop, a few groups a step,
        its answer counted as they are taken and refused as soon as it would not fit in a
        frame; a large one built and encoded in the listener's thread."""
        group_ids: tuple[str, ...] = tuple(getattr(request.body, "groups", ()))
        core = self.runtime.core
        taken: list[classic.DescribedGroupSnapshot] = []
        estimate = 0
        for start in range(0, len(group_ids), DESCRIBE_GROUPS_PER_STEP):
            if start:
                await trio.lowlevel.checkpoint()
            for group_id in group_ids[start:start + DESCRIBE_GROUPS_PER_STEP]:
                snapshot = classic.describe_group_snapshot(core, group_id)
                estimate += described_group_bytes(snapshot)
                too_large = self._too_large(request, problems, estimate, group_ids)
                if too_large is not None:
                    return too_large
                taken.append(snapshot)
        return await self._encoded(estimate, _encode_classic_described, request.api_version,
                                   request.correlation_id, taken)

    async def _encoded(self, estimate: int, encode: Callable[..., tuple[bytes, int]],
                       *args: Any) -> tuple[bytes, int]:
        """`encode(*args)`, an answer built from values that later changes do not touch:
        in the listener's thread if it is estimated above OFFLOAD_DESCRIBE_BYTES (a
        thousand entries took 10-15 ms to build), else here."""
        if estimate > OFFLOAD_DESCRIBE_BYTES:
            return await self._off_loop(encode, *args)
        return encode(*args)

    async def _describe_snapshots(self, group_ids: tuple[str, ...], version: int
                                  ) -> list[describing.Snapshot | tuple[str, Any]]:
        """Each group's snapshot, DESCRIBE_GROUPS_PER_STEP at a time with the other tasks
        answered in between: a describe of many groups is no longer one long step (1,000
        groups took 10-20 ms). Each group's snapshot is whole; groups taken in different
        steps may be from different moments, as when described one by one."""
        core = self.runtime.core
        taken: list[describing.Snapshot | tuple[str, Any]] = []
        for start in range(0, len(group_ids), DESCRIBE_GROUPS_PER_STEP):
            if start:
                await trio.lowlevel.checkpoint()
            taken.extend(core.describe_snapshot(group_id, version)
                         for group_id in group_ids[start:start + DESCRIBE_GROUPS_PER_STEP])
        return taken

    async def _dispatch(self, request: DecodedRequest, problems: ProblemLog,
                        checked: CheckedInstall | CheckedHeartbeat | None = None
                        ) -> tuple[bytes, int]:
        key, version, correlation = request.api_key, request.api_version, request.correlation_id
        if key == API_VERSIONS:
            body = api_versions_response(version)
            return encode_response(key, version, correlation, body), ErrorCode.NONE
        runtime = self.runtime
        group_ids = getattr(request.body, "group_ids", ())
        if not runtime.ready:
            code = ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
            return error_response(key, version, correlation, code,
                                  "the coordinator is loading its log", group_ids=group_ids), code
        if key == DESCRIBE:
            estimate = describe_answer_bytes(runtime.core, group_ids, self.max_frame_bytes)
            if estimate > self.max_frame_bytes:
                return self._refuse(
                    request, problems,
                    f"the answer would take more than {self.max_frame_bytes} bytes "
                    f"({FIELD_KEYS['max_frame_bytes']}): describe fewer groups at once",
                    group_ids=group_ids)
            taken = await self._describe_snapshots(group_ids, version)
            if estimate <= OFFLOAD_DESCRIBE_BYTES:
                return encode_response(key, version, correlation,
                                       describing.response(taken, version)), ErrorCode.NONE
            # Building and encoding take about a microsecond per answer byte: in a thread,
            # from the snapshots, while the loop answers heartbeats.
            answer = await self._off_loop(_encode_described, version, correlation, taken)
            return answer, ErrorCode.NONE
        response: Any
        try:
            if key == INSTALL:
                response = await runtime.install_assignment(
                    request.body, checked if isinstance(checked, CheckedInstall) else None)
            elif key == HEARTBEAT:
                response = await runtime.heartbeat(
                    request.body, checked if isinstance(checked, CheckedHeartbeat) else None)
            else:  # PREPARE: the other KRPC APIs are answered above
                response = await runtime.prepare_assignment(request.body)
        except NotDurable:
            code = ErrorCode.COORDINATOR_NOT_AVAILABLE
            return error_response(key, version, correlation, code,
                                  "the change could not be written to the log; retry"), code
        if key == HEARTBEAT:
            return encode_heartbeat_response(correlation, response), response.error_code
        return encode_response(key, version, correlation, response), response.error_code
