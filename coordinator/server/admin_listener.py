"""The admin HTTP listener: hypercorn's HTTP/1.1 handling behind an accept loop of our own.

hypercorn alone accepts every connection and waits for a request as long as the client
keeps sending a byte now and then, so slow or half-sent requests could pile up until the
process ran out of file descriptors, and then the Kafka listener could not accept either.
Here the listener keeps to a budget of its own:

- at most `server.admin.max.connections` connections at once; one more is answered 503
  and closed at once (the answer fits in the fresh socket's buffer, so it costs no wait);
- each request, headers and body, must arrive within `server.admin.read.timeout.ms` of
  the connection's opening or of the end of the previous answer; past that a started
  request is answered 408 and the connection closed (an idle one is closed silently);
- a client that does not take an answer within that time is cut off as well.
"""

from __future__ import annotations

import errno
import json
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState
from hypercorn.utils import wrap_app

from coordinator.config import FIELD_KEYS, ServerConfig
from coordinator.server.kafka import ProblemLog

log = structlog.get_logger("connect_coordinator")

MAX_CONNECTIONS_KEY = FIELD_KEYS["admin_max_connections"]
READ_TIMEOUT_KEY = FIELD_KEYS["admin_read_timeout_ms"]
# How long a refusal may take to send before the connection is dropped without it.
REFUSAL_SEND_S = 0.5


def canned_answer(status: int, reason: str, error: str, message: str) -> bytes:
    """A whole HTTP/1.1 answer with the admin API's JSON error body, closing the
    connection: for the refusals made before hypercorn (or the app) sees a request."""
    body = json.dumps({"error": error, "message": message}).encode()
    head = (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n")
    return head.encode() + body


class RequestDeadlineStream:
    """A connection's stream as hypercorn sees it, holding each request to a deadline.

    The deadline starts when the connection opens and again after each answer is sent;
    receiving past it ends the connection (hypercorn closes it on TooSlowError). While the
    app works on a complete request hypercorn does not read, so only the client's own
    sending is timed. The only answer written here is the 408, and only while no answer
    to the request has been sent (the deadline is reset by every answer)."""

    def __init__(self, stream: trio.SocketStream, timeout_s: float,
                 connection: trio.CancelScope) -> None:
        self._stream = stream
        self._connection = connection
        self._timeout_s = timeout_s
        self._deadline = trio.current_time() + timeout_s
        self._request_started = False
        self.socket = stream.socket  # hypercorn reads the peer's address from it

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        with trio.move_on_at(self._deadline):
            data = await self._stream.receive_some(max_bytes)
            if data:
                self._request_started = True
            return data
        if self._request_started:
            seconds = self._timeout_s
            answer = canned_answer(
                408, "Request Timeout", "REQUEST_TIMEOUT",
                f"the request was not received within {seconds:g} s ({READ_TIMEOUT_KEY})")
            with trio.move_on_after(REFUSAL_SEND_S):
                try:
                    await self._stream.send_all(answer)
                except (trio.BrokenResourceError, trio.BusyResourceError,
                        trio.ClosedResourceError):
                    pass
        raise trio.TooSlowError

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        # A client that does not take its answer is cut off too (hypercorn's own sends
        # have no deadline, and are shielded from the shutdown's).
        with trio.move_on_after(self._timeout_s):
            await self._stream.send_all(data)
            # Only an answer's head starts the next request's time: not "100 Continue",
            # not a switch to HTTP/2 (the admin API is HTTP/1.1; an HTTP/2 connection
            # keeps the deadline of its first request and ends with it).
            head = bytes(data[:10])
            if head.startswith(b"HTTP/1.1 ") and not head.endswith(b"1"):
                self._deadline = trio.current_time() + self._timeout_s
                self._request_started = False
            return
        # hypercorn, told the stream broke, would wait for the unanswered request forever:
        # the whole connection ends here.
        self._connection.cancel()
        raise trio.BrokenResourceError(
            f"the answer was not taken within {self._timeout_s:g} s ({READ_TIMEOUT_KEY})")

    async def wait_send_all_might_not_block(self) -> None:
        await self._stream.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        await self._stream.send_eof()

    async def aclose(self) -> None:
        await self._stream.aclose()


class AdminListener:
    """Serves the admin app on a bound socket within the listener's budget."""

    def __init__(self, app: Any, http_config: HypercornConfig, config: ServerConfig) -> None:
        self._app = wrap_app(app, http_config.wsgi_max_body_size, "asgi")
        self._http_config = http_config
        self._max_connections = config.admin_max_connections
        self._timeout_s = config.admin_read_timeout_ms / 1000
        self._context = WorkerContext(None)
        self._problems = ProblemLog()
        self.open_connections = 0

    async def serve(self, listener: trio.SocketListener, *,
                    shutdown_trigger: Callable[[], Awaitable[Any]],
                    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Accept until `shutdown_trigger` returns, then give open connections the graceful
        timeout to finish (hypercorn stops keeping them alive once told so)."""
        try:
            async with trio.open_nursery() as connections:
                async with trio.open_nursery() as accepting:
                    accepting.start_soon(self._accept, listener, connections)
                    task_status.started()
                    await shutdown_trigger()
                    accepting.cancel_scope.cancel()
                listener.socket.close()
                await self._context.terminated.set()
                connections.cancel_scope.deadline = (trio.current_time()
                                                     + self._http_config.graceful_timeout)
        finally:
            listener.socket.close()  # synchronous: holds even when cancelled

    async def _accept(self, listener: trio.SocketListener, connections: trio.Nursery) -> None:
        while True:
            try:
                stream = await listener.accept()
            except OSError as error:
                if error.errno not in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS,
                                       errno.ENOMEM, errno.ECONNABORTED):
                    raise
                self._problems.warning("admin_accept_failed", error=str(error))
                await trio.sleep(0.1)  # the process is out of descriptors: back off
                continue
            if self.open_connections >= self._max_connections:
                await self._refuse(stream)
                continue
            self.open_connections += 1
            connections.start_soon(self._connection, stream)

    async def _refuse(self, stream: trio.SocketStream) -> None:
        message = (f"{self.open_connections} admin connections are open, the limit "
                   f"({MAX_CONNECTIONS_KEY}); retry later")
        self._problems.warning("admin_connection_refused", reason=message)
        with trio.move_on_after(REFUSAL_SEND_S):
            try:
                await stream.send_all(canned_answer(503, "Service Unavailable",
                                                    "TOO_MANY_CONNECTIONS", message))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
        stream.socket.close()

    async def _connection(self, stream: trio.SocketStream) -> None:
        try:
            with trio.CancelScope() as connection:
                server = TCPServer(self._app, self._http_config, self._context,
                                   ConnectionState({}),
                                   RequestDeadlineStream(stream, self._timeout_s,  # type: ignore[arg-type]
                                                         connection))
                await server.run()
        finally:
            self.open_connections -= 1
            stream.socket.close()  # synchronous: holds even when cancelled
