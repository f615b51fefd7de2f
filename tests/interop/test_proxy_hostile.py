"""Hostile clients of the proxy, against a real KRaft broker: the requests the proxy reads
itself (FindCoordinator, ListGroups, the group APIs) with counts declared far beyond their
bytes and unknown tagged fields; connections beyond the cap, idle or half-sent; the APIs
the proxy does not relay (DescribeQuorum) and SASL, refused with a clear answer; and an
upstream outage that does not flood the log.
"""

from __future__ import annotations

import json
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.hostile import huge_find_coordinator, huge_join_group, huge_list_groups
from coordinator.proxy import wire
from coordinator.realkafka import Broker, Coordinator, free_port, start_coordinator, wait_for
from protocol._codec import INT32, uvarint
from protocol.errors import ErrorCode
from tests.server.hostile import HEARTBEAT, RawConnection, heartbeat, request_frame

OWNED = "owned-.*"
CLIENT_ID = b"h"


def flexible_header(api_key: int, version: int, correlation_id: int = 7) -> bytes:
    return (struct.pack(">hhi", api_key, version, correlation_id)
            + struct.pack(">h", len(CLIENT_ID)) + CLIENT_ID + b"\x00")


def framed(payload: bytes) -> bytes:
    return INT32.pack(len(payload)) + payload


def compact(text: str) -> bytes:
    data = text.encode()
    return uvarint(len(data) + 1) + data


def find_coordinator_with_unknown_tag(key: str = "owned-tagged") -> bytes:
    """A valid FindCoordinator v4 with a tagged field no version defines."""
    body = b"\x00" + uvarint(2) + compact(key) + b"\x01" + uvarint(77) + uvarint(1) + b"\x00"
    return framed(flexible_header(wire.FIND_COORDINATOR, 4) + body)


HOSTILE_FRAMES = {
    "FindCoordinator v4 of 2^32-2 keys": huge_find_coordinator,
    "ListGroups v4 of 2^32-2 states": huge_list_groups,
    "JoinGroup v9 of 2^32-2 protocols": huge_join_group,
}


def error_code_of(answer: bytes, api_key: int, version: int) -> int:
    _, body = wire.decode_response(answer, api_key, version)
    if api_key == wire.FIND_COORDINATOR and version >= 4:
        return int(body.coordinators[0].error_code) if body.coordinators else -1
    return int(body.error_code)


class Proxy:
    """A `serve` in proxy mode; its process, port and log."""

    def __init__(self, coordinator: Coordinator) -> None:
        self.coordinator = coordinator
        self.kafka_port = coordinator.port
        self.process = coordinator.process.popen

    def alive(self) -> bool:
        return self.process.poll() is None

    def output(self) -> str:
        return self.coordinator.process.log_text()

    def events(self, name: str) -> list[dict[str, object]]:
        lines = []
        for line in self.output().splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if isinstance(entry, dict) and entry.get("event") == name:
                lines.append(entry)
        return lines

    def healthy_heartbeat_s(self, member: str = "healthy-member") -> float:
        with RawConnection(self.kafka_port) as connection:
            started = time.perf_counter()
            response = connection.ask(request_frame(HEARTBEAT, heartbeat("healthy", member)),
                                      HEARTBEAT)
            elapsed = time.perf_counter() - started
        assert response is not None, "the healthy member's connection was closed"
        assert response.error_code == 0, response.error_message
        return elapsed


def start_proxy(folder: Path, upstream: str, *settings: str) -> Proxy:
    extra: list[str] = []
    for setting in settings:
        extra += ["--set", setting]
    return Proxy(start_coordinator(folder, upstream, OWNED, extra=extra))


@pytest.fixture
def proxy(kafka_broker: Broker, tmp_path: Path) -> Iterator[Proxy]:
    started = start_proxy(tmp_path / "coordinator", kafka_broker.bootstrap)
    yield started
    started.coordinator.stop()


@pytest.mark.parametrize("name", sorted(HOSTILE_FRAMES))
def test_a_count_declared_beyond_the_frame_is_refused_and_the_proxy_lives(
        proxy: Proxy, name: str) -> None:
    frame = HOSTILE_FRAMES[name]()
    assert len(frame) < 64
    with RawConnection(proxy.kafka_port) as attacker:
        attacker.send(frame)
        answer = attacker.answer()
    assert proxy.alive(), f"the coordinator died on {name}: {proxy.coordinator.process.tail()}"
    if answer is not None:  # an answer is INVALID_REQUEST; else the connection was closed
        api_key, version = struct.unpack_from(">hh", frame, 4)
        assert error_code_of(answer, api_key, version) == ErrorCode.INVALID_REQUEST
    proxy.healthy_heartbeat_s()
    assert "Traceback" not in proxy.output()


def test_an_unknown_tagged_field_in_a_request_the_proxy_reads_is_skipped(
        proxy: Proxy) -> None:
    with RawConnection(proxy.kafka_port) as client:
        client.send(find_coordinator_with_unknown_tag())
        answer = client.answer()
    assert answer is not None
    _, body = wire.decode_response(answer, wire.FIND_COORDINATOR, 4)
    assert [entry.key for entry in body.coordinators] == ["owned-tagged"]
    assert body.coordinators[0].error_code == ErrorCode.NONE
    assert "Traceback" not in proxy.output()
    assert proxy.alive()


def open_connections(port: int, count: int) -> list[socket.socket]:
    return [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(count)]


def closed_by_server(sock: socket.socket, within_s: float) -> bool:
    sock.settimeout(within_s)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_the_proxy_caps_connections_and_closes_idle_and_half_sent_ones(
        kafka_broker: Broker, tmp_path: Path) -> None:
    proxy = start_proxy(tmp_path / "coordinator", kafka_broker.bootstrap,
                        "server.max.connections=10", "server.connection.idle.timeout.ms=1000",
                        "server.connection.read.timeout.ms=1000")
    try:
        held = open_connections(proxy.kafka_port, 10)
        try:
            # The eleventh is closed at once: no room.
            extra = socket.create_connection(("127.0.0.1", proxy.kafka_port), timeout=10)
            assert closed_by_server(extra, 5.0), "a connection beyond the cap was kept"
            extra.close()
            # Idle ones are closed after the idle timeout (generous bound: the machine
            # may be loaded), a half-sent frame after the read timeout.
            assert all(closed_by_server(sock, 15.0) for sock in held)
        finally:
            for sock in held:
                sock.close()
        half = socket.create_connection(("127.0.0.1", proxy.kafka_port), timeout=10)
        half.sendall(request_frame(HEARTBEAT, heartbeat("healthy", "m"))[:10])
        assert closed_by_server(half, 15.0), "a half-sent frame was held"
        half.close()
        # Room again, and a healthy member is served.
        wait_for(lambda: _heartbeat_ok(proxy), 15, "a heartbeat once the idle are gone")
        assert proxy.events("connection_refused")
        assert proxy.events("connection_timed_out")
    finally:
        proxy.coordinator.stop()


def _heartbeat_ok(proxy: Proxy) -> bool:
    try:
        proxy.healthy_heartbeat_s()
    except (AssertionError, OSError):
        return False
    return True


def test_describe_quorum_is_refused_not_forwarded(proxy: Proxy, kafka_broker: Broker) -> None:
    from kio.schema.describe_quorum.v2.request import DescribeQuorumRequest

    frame = wire.encode_request(wire.DESCRIBE_QUORUM, 2, 9, DescribeQuorumRequest(topics=()))
    with RawConnection(proxy.kafka_port) as client:
        client.send(frame)
        answer = client.answer()
    assert answer is not None, "closed instead of answered"
    _, body = wire.decode_response(answer, wire.DESCRIBE_QUORUM, 2)
    assert body.error_code == ErrorCode.UNSUPPORTED_VERSION
    broker_port = int(kafka_broker.bootstrap.rpartition(":")[2])
    assert struct.pack(">i", broker_port) not in answer


def test_a_sasl_handshake_is_refused_at_once(proxy: Proxy) -> None:
    from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest

    frame = wire.encode_request(17, 1, 3, SaslHandshakeRequest(mechanism="PLAIN"))
    with RawConnection(proxy.kafka_port, timeout_s=5) as client:
        started = time.monotonic()
        client.send(frame)
        answer = client.answer()
        assert time.monotonic() - started < 5
    assert answer is not None
    _, body = wire.decode_response(answer, 17, 1)
    assert body.error_code == ErrorCode.UNSUPPORTED_SASL_MECHANISM
    assert tuple(body.mechanisms) == ()
    assert proxy.events("sasl_not_supported")


def test_an_upstream_outage_makes_a_bounded_number_of_log_lines(tmp_path: Path) -> None:
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    proxy = start_proxy(tmp_path / "coordinator", dead,
                        "proxy.upstream.connect.timeout.ms=1000")
    try:
        from kio.schema.metadata.v12.request import MetadataRequest

        metadata = wire.encode_request(wire.METADATA, 12, 5, MetadataRequest(
            topics=None, allow_auto_topic_creation=False,
            include_topic_authorized_operations=False))
        attempts = 200
        for _ in range(attempts):
            with RawConnection(proxy.kafka_port) as client:
                client.send(metadata)
                assert client.answer() is None  # closed: the upstream is unreachable
        assert proxy.alive()
        unreachable = proxy.events("proxy_upstream_unreachable")
        closed = proxy.events("proxy_connection_closed")
        assert unreachable and closed
        # A few lines per interval and event, not one per connection.
        assert len(unreachable) < 20, len(unreachable)
        assert len(closed) < 20, len(closed)
    finally:
        proxy.coordinator.stop()


def test_a_large_request_read_by_the_proxy_is_answered(proxy: Proxy) -> None:
    """An owned group's JoinGroup of 200 KB (decoded in the listener's thread): read whole
    and answered by the coordinator's classic engine (not refused as malformed)."""
    from datetime import timedelta

    from kio.schema.join_group.v9.request import JoinGroupRequest, JoinGroupRequestProtocol
    from kio.static.primitive import i32Timedelta

    ten_s = i32Timedelta.parse(timedelta(seconds=10))
    join = JoinGroupRequest(group_id="owned-large", session_timeout=ten_s,
                            rebalance_timeout=ten_s, member_id="",
                            group_instance_id=None, protocol_type="consumer", reason=None,
                            protocols=(JoinGroupRequestProtocol(name="range",
                                                                metadata=b"m" * 200_000),))
    frame = wire.encode_request(wire.JOIN_GROUP, 9, 21, join)
    with RawConnection(proxy.kafka_port) as client:
        client.send(frame)
        answer = client.answer()
    assert answer is not None
    correlation, body = wire.decode_response(answer, wire.JOIN_GROUP, 9)
    assert correlation == 21
    assert body.error_code in (ErrorCode.MEMBER_ID_REQUIRED,
                               ErrorCode.INCONSISTENT_GROUP_PROTOCOL), body.error_code
