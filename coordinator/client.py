"""A small async KRPC client (trio): used by the CLI, the tests and the benchmarks."""

from __future__ import annotations

import itertools
from typing import Any

import trio

from protocol.framing import FrameBuffer, decode_response, encode_request

MAX_RESPONSE_BYTES = 256 * 1024 * 1024


class KafkaClient:
    """One connection; requests may be pipelined from several tasks (answers come back in
    order, matched by correlation id)."""

    def __init__(self, stream: trio.SocketStream, client_id: str = "connect-coordinator") -> None:
        self.stream = stream
        self.client_id = client_id
        self._correlation = itertools.count(1)
        self._waiting: dict[int, tuple[int, int, trio.MemorySendChannel[Any]]] = {}
        self._send_lock = trio.Lock()
        self._frames = FrameBuffer(MAX_RESPONSE_BYTES)
        self._receiving = trio.Lock()

    @classmethod
    async def connect(cls, host: str, port: int, client_id: str = "connect-coordinator"
                      ) -> KafkaClient:
        return cls(await trio.open_tcp_stream(host, port), client_id)

    # Ctrl-C comes at a checkpoint, not between two bytecodes: there it could fall between
    # making a lock's `__aexit__` coroutine and awaiting it ("was never awaited", a warning
    # on the way out of a script stopped with Ctrl-C).
    @trio.lowlevel.enable_ki_protection
    async def request(self, api_key: int, body: Any, api_version: int = 0) -> Any:
        correlation = next(self._correlation)
        send, receive = trio.open_memory_channel[Any](1)
        self._waiting[correlation] = (api_key, api_version, send)
        async with self._send_lock:
            await self.stream.send_all(
                encode_request(api_key, api_version, correlation, self.client_id, body))
        while True:
            try:
                return receive.receive_nowait()
            except trio.WouldBlock:
                pass
            async with self._receiving:
                try:
                    return receive.receive_nowait()
                except trio.WouldBlock:
                    await self._read_one()

    async def _read_one(self) -> None:
        frame = self._frames.next_frame()
        while frame is None:
            data = await self.stream.receive_some(65536)
            if not data:
                raise ConnectionError("the coordinator closed the connection")
            self._frames.feed(data)
            frame = self._frames.next_frame()
        correlation = int.from_bytes(frame[:4], "big", signed=True)
        api_key, api_version, send = self._waiting.pop(correlation)
        _, body = decode_response(frame, api_key, api_version)
        send.send_nowait(body)

    async def aclose(self) -> None:
        await self.stream.aclose()

    async def __aenter__(self) -> KafkaClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


# ------------------------------------------------------------------- reaching a coordinator
BOOTSTRAP_HINT = "--bootstrap takes the Kafka listener (serve --listen, default 127.0.0.1:19092)"
# An HTTP server's answer starts with "HTTP/1.1 ...": read as a Kafka frame's 4-byte size
# prefix that is 1,213,486,160 bytes.
HTTP_AS_FRAME_SIZE = int.from_bytes(b"HTTP", "big")
CONNECT_GROUP_DESCRIBE = 1003


class Unreachable(Exception):
    """No coordinator answered at an address: the message is one line naming the cause."""


async def ask_coordinator(host: str, port: int, body: Any, timeout_s: float,
                          hint: str = BOOTSTRAP_HINT) -> Any:
    """Sends one ConnectGroupDescribe (`body`) on a connection of its own and returns the
    answer. Only this coordinator answers that API: a refused connection, silence, an HTTP
    server or a Kafka broker each end in `Unreachable`, naming what was found there."""
    from protocol.framing import FrameTooLarge, ProtocolError

    where = f"{host}:{port}"
    try:
        with trio.fail_after(timeout_s):
            client = await KafkaClient.connect(host, port)
    except trio.TooSlowError:
        raise Unreachable(f"cannot connect to {where} (no answer within {timeout_s:g} s): "
                          f"is the coordinator running there? {hint}") from None
    except OSError as error:
        # trio tells each address it tried in an exception group under the OSError.
        cause: BaseException = error.__cause__ or error
        while isinstance(cause, BaseExceptionGroup) and cause.exceptions:
            cause = cause.exceptions[0]
        reason = getattr(cause, "strerror", None) or str(cause)
        raise Unreachable(f"cannot connect to {where} ({reason}): is the coordinator "
                          f"running there? {hint}") from None
    try:
        async with client:
            with trio.fail_after(timeout_s):
                return await client.request(CONNECT_GROUP_DESCRIBE, body, api_version=1)
    except trio.TooSlowError:
        raise Unreachable(f"no answer from {where} within {timeout_s:g} s: is it "
                          f"a coordinator? {hint}") from None
    except FrameTooLarge as error:
        if error.size == HTTP_AS_FRAME_SIZE:
            raise Unreachable(f"{where} answered in HTTP: that looks like the admin HTTP "
                              f"port, not the Kafka port; {hint}") from None
        raise Unreachable(f"{where} does not speak the Kafka protocol ({error}); "
                          f"{hint}") from None
    except (OSError, ProtocolError) as error:
        raise Unreachable(f"{where} broke off the request ({error}): is it a coordinator? "
                          f"{hint}") from None
