"""Raw KRPC frames for hostile-input tests: a `serve` subprocess, frames built by hand, and
a connection that reports what the server did (answered, closed, or nothing)."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import trio

from coordinator.client import KafkaClient
from protocol._codec import INT32, uvarint
from protocol.framing import FrameBuffer, decode_response, encode_request
from protocol.messages import (
    ConnectGroupDescribeRequest,
    ConnectGroupHeartbeatRequest,
    ConnectorsAndTasks,
)
from tests.integration.helpers import ServerProcess

HEARTBEAT, PREPARE, INSTALL, DESCRIBE = 1000, 1001, 1002, 1003
CLIENT_ID = "hostile"


def start_server(tmp: Path, settings: list[str]) -> ServerProcess:
    """A `serve` subprocess with `settings`, started (synchronously: for module fixtures)."""
    process = ServerProcess(tmp / "data", tmp, settings)
    trio.run(process.start)
    return process


@contextlib.contextmanager
def running_server(tmp: Path, settings: list[str]) -> Iterator[ServerProcess]:
    process = start_server(tmp, settings)
    try:
        yield process
    finally:
        process.kill()


def framed(payload: bytes) -> bytes:
    return INT32.pack(len(payload)) + payload


def request_frame(api_key: int, body: Any, correlation_id: int = 7) -> bytes:
    """A valid framed request (size prefix included)."""
    return encode_request(api_key, 0, correlation_id, CLIENT_ID, body)


def header_bytes(api_key: int, correlation_id: int = 7, tagged: bytes = b"\x00") -> bytes:
    """A request header v2 (flexible) with `tagged` as its tagged-field section."""
    client = CLIENT_ID.encode()
    return (api_key.to_bytes(2, "big") + b"\x00\x00" + INT32.pack(correlation_id)
            + len(client).to_bytes(2, "big") + client + tagged)


def unknown_tag(tag: int = 5, data: bytes = b"\x00") -> bytes:
    """A tagged-field section holding one field the server does not know."""
    return b"\x01" + uvarint(tag) + uvarint(len(data)) + data


def with_body_tag(frame: bytes, tag: int = 5) -> bytes:
    """`frame` (a valid request whose body ends with an empty tagged-field section) with
    an unknown tagged field in that section."""
    payload = frame[4:]
    assert payload[-1] == 0
    return framed(payload[:-1] + unknown_tag(tag))


def with_header_tag(frame: bytes, tag: int = 5) -> bytes:
    payload = frame[4:]
    at = 8 + 2 + len(CLIENT_ID)
    assert payload[at] == 0
    return framed(payload[:at] + unknown_tag(tag) + payload[at + 1:])


def huge_describe() -> bytes:
    """A describe whose group-id array declares 2^32 - 1 elements (22 bytes framed)."""
    return framed(header_bytes(DESCRIBE) + uvarint(2**32) + b"\x00")


def huge_owned_tasks() -> bytes:
    """A heartbeat whose owned-task array declares 2^32 - 1 elements."""
    body = (b"\x02g" + b"\x02m" + INT32.pack(1) + b"\x00\x00" + INT32.pack(-1) + b"\x00\x00"
            + b"\x01" + b"\x01" + uvarint(2**32) + b"\x00" + b"\x00")
    return framed(header_bytes(HEARTBEAT) + body)


def null_group_ids() -> bytes:
    """A describe with null (compact length 0) for its non-nullable group-id array."""
    return framed(header_bytes(DESCRIBE) + b"\x00" + b"\x00")


def heartbeat(group_id: str = "g", member_id: str = "m", epoch: int = 0, **fields: Any
              ) -> ConnectGroupHeartbeatRequest:
    if epoch == 0:
        fields.setdefault("worker_url", "http://w:8083")
        fields.setdefault("rebalance_timeout_ms", 30_000)
    return ConnectGroupHeartbeatRequest(group_id=group_id, member_id=member_id,
                                        member_epoch=epoch, **fields)


def owned(connectors: tuple[str, ...] = (), tasks: tuple[Any, ...] = ()) -> ConnectorsAndTasks:
    return ConnectorsAndTasks(connectors=connectors, tasks=tasks)


def describe(*group_ids: str) -> ConnectGroupDescribeRequest:
    return ConnectGroupDescribeRequest(group_ids=group_ids)


class RawConnection:
    """A blocking socket: send bytes, read one answer frame, or see the connection end."""

    def __init__(self, port: int, timeout_s: float = 10.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
        self.frames = FrameBuffer(256 * 1024 * 1024)

    def __enter__(self) -> RawConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def answer(self) -> bytes | None:
        """The next answer frame, or None if the server closed the connection."""
        while True:
            frame = self.frames.next_frame()
            if frame is not None:
                return frame
            try:
                data = self.sock.recv(65536)
            except ConnectionResetError:
                return None
            if not data:
                return None
            self.frames.feed(data)

    def ask(self, frame: bytes, api_key: int) -> Any:
        """Send a framed request and decode its answer (None if the server closed)."""
        self.send(frame)
        answer = self.answer()
        if answer is None:
            return None
        return decode_response(answer, api_key, 0)[1]

    def closed_within(self, seconds: float) -> bool:
        """Whether the server closes the connection within `seconds` (reading nothing)."""
        self.sock.settimeout(seconds)
        started = time.monotonic()
        try:
            while time.monotonic() - started < seconds:
                data = self.sock.recv(65536)
                if not data:
                    return True
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False
        return False


def alive(process: ServerProcess, patience_s: float = 3.0) -> bool:
    """The process runs and answers a heartbeat of a fresh member (a connection refused
    for a moment, while closed ones are still being noticed, is tried again)."""
    deadline = time.monotonic() + patience_s
    while True:
        if process.process is None or process.process.poll() is not None:
            return False
        with RawConnection(process.kafka_port) as connection:
            response = connection.ask(request_frame(HEARTBEAT, heartbeat("alive", "probe")),
                                      HEARTBEAT)
        if response is not None:
            return response.error_code == 0  # type: ignore[no-any-return]
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


async def client_of(process: ServerProcess) -> KafkaClient:
    return await KafkaClient.connect("127.0.0.1", process.kafka_port)


# -- Kafka's own APIs (classic groups and lookups) -----------------------------------------


def classic_frame(api_key: int, version: int, struct: str = "", /, **values: Any) -> bytes:
    """A framed request of one of Kafka's APIs, built with protocol.classic's `build`."""
    from protocol import classic as wire
    kind = (getattr(wire.module(api_key, version, "request"), struct) if struct
            else wire.REQUEST_CLASSES[api_key, version])
    return encode_request(api_key, version, 7, CLIENT_ID, wire.build(kind, **values))


def classic_body(api_key: int, version: int, struct: str, /, **values: Any) -> Any:
    from protocol import classic as wire
    return wire.build(getattr(wire.module(api_key, version, "request"), struct), **values)


def join_with_protocols(names: list[str], group_id: str = "target", version: int = 9,
                        member_id: str = "") -> bytes:
    """A JoinGroup listing a protocol of each name (one byte of metadata each)."""
    from protocol import classic as wire
    protocols = tuple(classic_body(wire.JOIN_GROUP, version, "JoinGroupRequestProtocol",
                                   name=name, metadata=b"m") for name in names)
    return classic_frame(wire.JOIN_GROUP, version, group_id=group_id, member_id=member_id,
                         protocol_type="connect", session_timeout=10_000,
                         rebalance_timeout=10_000, protocols=protocols)


def leave_naming(count: int, group_id: str = "target") -> bytes:
    """A LeaveGroup v5 naming `count` members (none of them in the group)."""
    from protocol import classic as wire
    members = tuple(classic_body(wire.LEAVE_GROUP, 5, "MemberIdentity",
                                 member_id=f"m{index}", group_instance_id=None)
                    for index in range(count))
    return classic_frame(wire.LEAVE_GROUP, 5, group_id=group_id, members=members)


def describe_groups_naming(count: int) -> bytes:
    from protocol import classic as wire
    return classic_frame(wire.DESCRIBE_GROUPS, 5,
                         groups=tuple(f"group-{index}" for index in range(count)))


def find_coordinators_naming(count: int) -> bytes:
    from protocol import classic as wire
    return classic_frame(wire.FIND_COORDINATOR, 4, key_type=0,
                         coordinator_keys=tuple(f"group-{index}" for index in range(count)))


def classic_answer(frame: bytes, api_key: int, version: int) -> Any:
    return decode_response(frame, api_key, version)[1]


class HealthyMember:
    """A Connect member of group "healthy" heartbeating every `interval_s` on its own
    connection, in a thread, while a test attacks the server; each answer's latency and
    error code is kept. `answered_after(n)` waits for heartbeats to go on."""

    def __init__(self, port: int, member_id: str = "healthy-1", interval_s: float = 0.1
                 ) -> None:
        import threading
        self.port = port
        self.member_id = member_id
        self.interval_s = interval_s
        self.answers: list[tuple[float, int]] = []  # (latency s, error code)
        self._stop = threading.Event()
        self._count = threading.Condition()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> HealthyMember:
        self._thread.start()
        assert self.answered_after(0, 30.0), "the healthy member did not join"
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def _run(self) -> None:
        with RawConnection(self.port, timeout_s=120.0) as connection:
            epoch = 0
            correlation = 0
            while not self._stop.is_set():
                correlation += 1
                request = heartbeat("healthy", self.member_id, epoch)
                started = time.monotonic()
                response = connection.ask(request_frame(HEARTBEAT, request, correlation),
                                          HEARTBEAT)
                latency = time.monotonic() - started
                code = -1 if response is None else int(response.error_code)
                if code == 0:
                    epoch = response.member_epoch
                with self._count:
                    self.answers.append((latency, code))
                    self._count.notify_all()
                if response is None:
                    return
                self._stop.wait(self.interval_s)

    def answered_after(self, seen: int, timeout_s: float) -> bool:
        """Whether more than `seen` heartbeats are answered within `timeout_s`."""
        with self._count:
            return self._count.wait_for(lambda: len(self.answers) > seen, timeout_s)

    def errors(self) -> list[int]:
        return [code for _, code in self.answers if code != 0]

    def longest_s(self) -> float:
        return max(latency for latency, _ in self.answers)
