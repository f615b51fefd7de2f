"""The KRPC listener: one task per connection, pipelined requests answered in order.

A bad frame closes only its own connection; a failure while handling one request is
answered with UNKNOWN_SERVER_ERROR. The server never dies because of a client.
"""

from __future__ import annotations

import time
from typing import Any

import structlog
import trio

from coordinator.metrics import api_name
from coordinator.server import classic
from coordinator.server.classic import Address
from coordinator.server.runtime import NotDurable, Runtime
from protocol.classic import (
    CLASSIC_APIS,
    FIND_COORDINATOR,
    JOIN_GROUP,
    LEAVE_GROUP,
    LIST_GROUPS,
    METADATA,
    SYNC_GROUP,
)
from protocol.classic import HEARTBEAT as HEARTBEAT_V
from protocol.errors import ErrorCode
from protocol.fastpath import encode_heartbeat_response
from protocol.framing import (
    API_VERSIONS,
    DecodedRequest,
    FrameBuffer,
    FrameError,
    FrameTooLarge,
    MalformedRequest,
    UnsupportedApi,
    api_versions_response,
    decode_request,
    encode_response,
    error_response,
)

log = structlog.get_logger("connect_coordinator.kafka")
HEARTBEAT, PREPARE, INSTALL, DESCRIBE = 1000, 1001, 1002, 1003
RECEIVE_BYTES = 65536


class KafkaServer:
    def __init__(self, runtime: Runtime, max_frame_bytes: int) -> None:
        self.runtime = runtime
        self.max_frame_bytes = max_frame_bytes
        self.in_flight = 0
        self._idle = trio.Event()
        self._idle.set()
        self._accepting: trio.CancelScope | None = None
        self._connections: trio.CancelScope | None = None
        self._operations = {
            HEARTBEAT: runtime.heartbeat,
            PREPARE: runtime.prepare_assignment,
            INSTALL: runtime.install_assignment,  # large ones are checked in a thread first
        }

    async def serve(self, host: str, port: int, *,
                    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen until `stop_accepting`; then finish what is in flight. Reports the port."""
        listeners = await trio.open_tcp_listeners(port, host=host)
        bound = listeners[0].socket.getsockname()[1]
        try:
            with trio.CancelScope() as self._connections:
                async with trio.open_nursery() as nursery:
                    with trio.CancelScope() as self._accepting:
                        task_status.started(bound)
                        async with trio.open_nursery() as accept_nursery:
                            for listener in listeners:
                                accept_nursery.start_soon(self._accept, listener, nursery)
                    self._close(listeners)
        finally:
            self._close(listeners)
        log.info("kafka_listener_closed")

    @staticmethod
    def _close(listeners: list[trio.SocketListener]) -> None:
        for listener in listeners:
            listener.socket.close()  # synchronous: holds even when we are being cancelled

    async def _accept(self, listener: trio.SocketListener, nursery: trio.Nursery) -> None:
        while True:
            try:
                stream = await listener.accept()
            except OSError as error:  # e.g. too many open files: back off, keep serving
                log.warning("accept_failed", error=str(error))
                await trio.sleep(0.1)
                continue
            nursery.start_soon(self._connection, stream)

    async def drain(self, timeout_s: float) -> None:
        """Graceful shutdown: stop accepting, wait for in-flight requests, then close."""
        if self._accepting is not None:
            self._accepting.cancel()
        # Parked JoinGroup/SyncGroup requests would hold the drain until their groups
        # move on: they are told to find the coordinator again.
        self.runtime.waiters.release_all(ErrorCode.COORDINATOR_NOT_AVAILABLE)
        with trio.move_on_after(timeout_s):
            await self._idle.wait()
        if self._connections is not None:
            self._connections.cancel()

    async def _connection(self, stream: trio.SocketStream) -> None:
        metrics = self.runtime.metrics
        metrics.connections.inc()
        frames = FrameBuffer(self.max_frame_bytes)
        try:
            peer = stream.socket.getpeername()
            local = stream.socket.getsockname()
        except OSError:
            peer = local = None
        address = Address(str(local[0]), int(local[1])) if local else Address("", -1)
        try:
            async with stream:
                while True:
                    try:
                        data = await stream.receive_some(RECEIVE_BYTES)
                    except trio.BrokenResourceError:
                        return
                    if not data:
                        if frames.buffered_bytes:
                            metrics.reject("truncated")
                            log.warning("truncated_frame", peer=peer,
                                        buffered=frames.buffered_bytes)
                        return
                    try:
                        frames.feed(data)
                    except FrameError as error:
                        reason = "oversize" if isinstance(error, FrameTooLarge) else "malformed"
                        metrics.reject(reason)
                        log.warning("bad_frame_closing_connection", peer=peer, error=str(error))
                        return
                    # Answers to the frames of one read go out in one write, in order.
                    answers: list[bytes] = []
                    closing = False
                    for frame in frames:
                        answer = await self._answer(frame, peer, address)
                        if answer is None:
                            metrics.reject("malformed")
                            closing = True
                            break
                        answers.append(answer)
                    if answers:
                        try:
                            await stream.send_all(b"".join(answers))
                        except (trio.BrokenResourceError, trio.ClosedResourceError):
                            return
                    if closing:
                        return
        finally:
            metrics.connections.dec()

    async def wait_idle(self) -> None:
        """Until no request is being answered."""
        await self._idle.wait()

    async def answer_frame(self, frame: bytes, peer: Any, address: Address) -> bytes | None:
        """One request frame's framed response, or None when its connection must close
        (the proxy hands the requests of owned groups here; `address` is the one the
        coordinator is known by)."""
        return await self._answer(frame, peer, address)

    async def _answer(self, frame: bytes, peer: Any, address: Address) -> bytes | None:
        """The framed response, or None when the connection must close."""
        started = time.perf_counter()
        try:
            request = decode_request(frame)
        except UnsupportedApi as error:
            self._count(error.api_key, ErrorCode.UNSUPPORTED_VERSION, started)
            return error_response(error.api_key, error.api_version, error.correlation_id,
                                  ErrorCode.UNSUPPORTED_VERSION, str(error))
        except MalformedRequest as error:
            log.warning("malformed_request_closing_connection", peer=peer, error=str(error))
            return None
        self.in_flight += 1
        self._idle = trio.Event() if self.in_flight == 1 else self._idle
        try:
            if request.api_key in CLASSIC_APIS:
                answer, code = await self._classic(request, peer, address)
            else:
                answer, code = await self._dispatch(request)
        except Exception as error:
            log.exception("request_failed", api=api_name(request.api_key))
            code = ErrorCode.UNKNOWN_SERVER_ERROR
            answer = error_response(request.api_key, request.api_version,
                                    request.correlation_id, code,
                                    f"internal error: {type(error).__name__}: {error}")
        finally:
            self.in_flight -= 1
            if self.in_flight == 0:
                self._idle.set()
        self._count(request.api_key, code, started)
        return answer

    def _count(self, api_key: int, code: int, started: float) -> None:
        self.runtime.metrics.observe_request(api_key, code, time.perf_counter() - started)

    async def _classic(self, request: DecodedRequest, peer: Any,
                       address: Address) -> tuple[bytes, int]:
        """Kafka's own APIs: finding the coordinator, and classic groups."""
        key, version, correlation = request.api_key, request.api_version, request.correlation_id
        body = request.body
        response: Any
        code: int = ErrorCode.NONE
        if key == METADATA:
            response = classic.metadata_response(version, body, address)
        elif key == FIND_COORDINATOR:
            response, code = classic.find_coordinator_response(version, body, address)
        else:
            runtime = self.runtime
            if not runtime.ready:
                code = ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
                return error_response(key, version, correlation, code, "loading",
                                      group_ids=getattr(body, "groups", ())), code
            engine = runtime.core.classic
            try:
                if key == JOIN_GROUP:
                    host = str(peer[0]) if peer else ""
                    join = classic.join_request(body, version, request.client_id, host)
                    answer = await runtime.classic(engine.join, join)
                    response, code = classic.join_response(version, answer), answer.error
                elif key == SYNC_GROUP:
                    answer = await runtime.classic(engine.sync, classic.sync_request(body))
                    response, code = classic.sync_response(version, answer), answer.error
                elif key == HEARTBEAT_V:
                    beat = await runtime.classic(engine.heartbeat,
                                                 classic.heartbeat_request(body))
                    response, code = classic.heartbeat_response(version, beat.error), beat.error
                elif key == LEAVE_GROUP:
                    left = await runtime.classic(engine.leave,
                                                 classic.leave_request(body, version))
                    response = classic.leave_response(version, left.error, left.members)
                    code = left.error
                elif key == LIST_GROUPS:
                    response = classic.list_groups_response(version, body, runtime.core)
                else:
                    response = classic.describe_groups_response(version, body, runtime.core)
            except NotDurable:
                code = ErrorCode.COORDINATOR_NOT_AVAILABLE
                return error_response(key, version, correlation, code, "not durable",
                                      group_ids=getattr(body, "groups", ())), code
        return encode_response(key, version, correlation, response), code

    async def _dispatch(self, request: DecodedRequest) -> tuple[bytes, int]:
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
            response: Any = runtime.core.describe(request.body, runtime.now_ms())
            return encode_response(key, version, correlation, response), ErrorCode.NONE
        try:
            response = await self._operations[key](request.body)
        except NotDurable:
            code = ErrorCode.COORDINATOR_NOT_AVAILABLE
            return error_response(key, version, correlation, code,
                                  "the change could not be written to the log; retry"), code
        if key == HEARTBEAT:
            return encode_heartbeat_response(correlation, response), response.error_code
        return encode_response(key, version, correlation, response), response.error_code
