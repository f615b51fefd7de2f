"""The admin HTTP listener under hostile connections, against a real `serve` process: its
own connection cap and its deadline for a whole request, so that no number of half-sent
requests takes the file descriptors the Kafka listener needs."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.helpers import ServerProcess
from tests.server.hostile import alive, running_server

ADMIN_CAP = 16


@pytest.fixture(scope="module")
def capped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    # A long read deadline: the held connections stay held while the test counts.
    settings = [f"server.admin.max.connections={ADMIN_CAP}",
                "server.admin.read.timeout.ms=120000"]
    with running_server(tmp_path_factory.mktemp("admin-cap"), settings) as process:
        yield process


@pytest.fixture(scope="module")
def deadlined(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    settings = ["server.admin.read.timeout.ms=1000"]
    with running_server(tmp_path_factory.mktemp("admin-deadline"), settings) as process:
        yield process


def open_fds(process: ServerProcess) -> int:
    assert process.process is not None
    return len(os.listdir(Path("/proc") / str(process.process.pid) / "fd"))


HALF_PUT = (b"PUT /groups/g/connectors/c HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"tasks\"")


def held_connection(port: int) -> socket.socket:
    """A keep-alive connection that was served once (so the server counts it), then left
    with half a PUT body."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    answer = b""
    while not answer.endswith(b'"ok"}'):
        data = sock.recv(4096)
        assert data, answer
        answer += data
    assert answer.startswith(b"HTTP/1.1 200")
    sock.sendall(HALF_PUT)
    return sock


def answer_until_closed(sock: socket.socket, timeout_s: float) -> bytes:
    """What the server sends until it closes the connection (TimeoutError if it does not
    within `timeout_s`)."""
    sock.settimeout(timeout_s)
    answer = b""
    while True:
        try:
            data = sock.recv(4096)
        except ConnectionResetError:
            return answer
        if not data:
            return answer
        answer += data


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts fds in /proc")
def test_half_sent_admin_bodies_cannot_take_the_kafka_listeners_fds(
        capped: ServerProcess) -> None:
    baseline = open_fds(capped)
    held = [held_connection(capped.admin_port) for _ in range(ADMIN_CAP)]
    extra: list[socket.socket] = []
    try:
        for _ in range(100):  # each closed at once (a 503, or a reset if it came first)
            sock = socket.create_connection(("127.0.0.1", capped.admin_port), timeout=10)
            extra.append(sock)
            try:
                sock.sendall(HALF_PUT)
            except (BrokenPipeError, ConnectionResetError):
                pass  # closed at once, before the request was even sent
            answer = answer_until_closed(sock, 10.0)
            assert answer == b"" or answer.startswith(b"HTTP/1.1 503"), answer[:200]
        assert open_fds(capped) <= baseline + ADMIN_CAP + 8
        refusals = [e for e in capped.events() if e.get("event") == "admin_connection_refused"]
        assert 1 <= len(refusals) <= 10  # logged, rate-limited (a line, then a count)
        assert alive(capped)  # a new Kafka connection, and a heartbeat answered on it
    finally:
        for sock in held + extra:
            sock.close()
    assert "Traceback" not in capped.output()
    # The cap's slots are free again once the held connections are gone.
    deadline = time.monotonic() + 10
    while True:
        with socket.create_connection(("127.0.0.1", capped.admin_port), timeout=10) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            if answer_until_closed(sock, 10.0).startswith(b"HTTP/1.1 200"):
                break
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_an_admin_connection_over_the_cap_is_told_why(capped: ServerProcess) -> None:
    held = [held_connection(capped.admin_port) for _ in range(ADMIN_CAP)]
    try:
        with socket.create_connection(("127.0.0.1", capped.admin_port), timeout=10) as sock:
            answer = answer_until_closed(sock, 10.0)
        assert answer.startswith(b"HTTP/1.1 503"), answer[:200]
        assert b"server.admin.max.connections" in answer
    finally:
        for sock in held:
            sock.close()


def test_a_slow_admin_body_gets_408_and_a_close(deadlined: ServerProcess) -> None:
    with socket.create_connection(("127.0.0.1", deadlined.admin_port), timeout=10) as sock:
        started = time.monotonic()
        sock.sendall(HALF_PUT.replace(b"Content-Length: 100", b"Content-Length: 100000"))
        sock.settimeout(0.1)
        answer = b""
        while time.monotonic() - started < 30:  # a byte every 100 ms: never idle
            try:
                sock.sendall(b" ")
                data = sock.recv(4096)
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                break
            if not data:
                break
            answer += data
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert b"server.admin.read.timeout.ms" in answer
        answer_until_closed(sock, 10.0)  # and the connection is closed (or already was)
    assert alive(deadlined)
    assert "Traceback" not in deadlined.output()


def test_slow_admin_headers_are_cut_off(deadlined: ServerProcess) -> None:
    request = b"GET /groups HTTP/1.1\r\nHost: x\r\n" + b"X-Pad: " + b"a" * 1000 + b"\r\n\r\n"
    with socket.create_connection(("127.0.0.1", deadlined.admin_port), timeout=10) as sock:
        sock.settimeout(0.1)
        started = time.monotonic()
        closed = False
        for byte in request:  # a byte every 100 ms: 100 s for the whole request
            try:
                sock.sendall(bytes([byte]))
                data = sock.recv(4096)
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            if not data or data.startswith(b"HTTP/1.1 408"):
                closed = True
                break
        assert closed
        assert time.monotonic() - started < 30


class LimitedServerProcess(ServerProcess):
    """`serve` under a low limit of open files, as a small container would run it."""

    def __init__(self, tmp: Path, settings: list[str], max_files: int) -> None:
        super().__init__(tmp / "data", tmp, settings)
        self.max_files = max_files

    def command(self) -> list[str]:
        return ["sh", "-c", f'ulimit -n {self.max_files} && exec "$@"', "serve",
                *super().command()]


def test_the_kafka_listener_keeps_accepting_under_an_admin_flood_at_a_low_fd_limit(
        tmp_path: Path) -> None:
    import trio

    process = LimitedServerProcess(tmp_path, [], max_files=256)  # the default admin cap
    trio.run(process.start)
    flood: list[socket.socket] = []
    try:
        for _ in range(600):  # more than the process may open
            sock = socket.create_connection(("127.0.0.1", process.admin_port), timeout=10)
            flood.append(sock)
            try:
                sock.sendall(HALF_PUT)
            except (BrokenPipeError, ConnectionResetError):
                pass
        assert alive(process)  # a new Kafka connection is accepted and answered
        assert not any(e.get("event") == "accept_failed" for e in process.events())
    finally:
        for sock in flood:
            sock.close()
        process.kill()


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts fds in /proc")
def test_an_admin_client_that_does_not_read_its_answers_is_cut_off(
        deadlined: ServerProcess) -> None:
    baseline = open_fds(deadlined)
    with socket.create_connection(("127.0.0.1", deadlined.admin_port), timeout=10) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.settimeout(0.5)
        requests = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * 2_000
        sent = 0
        try:  # answers pile up unread until the server stops reading too
            while sent < len(requests):
                sent += sock.send(requests[sent:sent + 65536])
        except (TimeoutError, BrokenPipeError, ConnectionResetError):
            pass
        assert open_fds(deadlined) > baseline  # the connection is held for now
        deadline = time.monotonic() + 30
        while open_fds(deadlined) > baseline:  # until the server lets it go
            assert time.monotonic() < deadline, "the unread connection is still held"
            time.sleep(0.1)
    assert alive(deadlined)
    assert "Traceback" not in deadlined.output()
