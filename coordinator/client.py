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
