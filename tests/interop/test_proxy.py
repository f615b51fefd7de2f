"""Proxy mode against a real KRaft broker: Kafka's own perf tools through the coordinator,
the bytes a client sees (no upstream address ever), groups not owned served by the broker,
and an unreachable upstream.
"""

from __future__ import annotations

import json
import re
import socket
import struct
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kio.schema.describe_cluster.v1.request import DescribeClusterRequest
from kio.schema.find_coordinator.v3.request import FindCoordinatorRequest as FindV3
from kio.schema.find_coordinator.v6.request import FindCoordinatorRequest as FindV6
from kio.schema.metadata.v12.request import MetadataRequest
from kio.static.primitive import i8

from coordinator.proxy import wire
from coordinator.realkafka import (
    Broker,
    Coordinator,
    free_port,
    run_tool,
    start_coordinator,
    wait_for,
)
from protocol import framing
from protocol.framing import CONNECT_GROUP_DESCRIBE
from protocol.messages import ConnectGroupDescribeRequest
from tests.programs import require_binary

OWNED = "owned-.*"
RECORDS = 20_000


class RawClient:
    """A blocking client that keeps every response's bytes as the wire carried them."""

    def __init__(self, host: str, port: int, timeout_s: float = 30.0) -> None:
        self.socket = socket.create_connection((host, port), timeout=timeout_s)
        self.correlation = 0
        self.sent: list[tuple[int, int, int]] = []  # (correlation, api key, version)

    def send(self, api_key: int, version: int, body: object) -> int:
        self.correlation += 1
        if api_key in wire.CONNECT_GROUP_APIS:  # the coordinator's own APIs
            frame = framing.encode_request(api_key, version, self.correlation, "test", body)
        else:
            frame = wire.encode_request(api_key, version, self.correlation, body)
        self.socket.sendall(frame)
        self.sent.append((self.correlation, api_key, version))
        return self.correlation

    def _exactly(self, count: int) -> bytes:
        data = b""
        while len(data) < count:
            chunk = self.socket.recv(count - len(data))
            if not chunk:
                raise ConnectionError("closed by the proxy")
            data += chunk
        return data

    def receive(self) -> bytes:
        size = struct.unpack(">i", self._exactly(4))[0]
        return self._exactly(size)

    def call(self, api_key: int, version: int, body: object) -> tuple[bytes, object]:
        self.send(api_key, version, body)
        raw = self.receive()
        return raw, wire.decode_response(raw, api_key, version)[1]

    def close(self) -> None:
        self.socket.close()


def _address_bytes(host: str, port: int) -> bytes:
    """How a (host, port) pair sits in every address-carrying response: the host's bytes
    right before the int32 port (both string encodings end with the content)."""
    return host.encode() + struct.pack(">i", port)


@pytest.fixture
def coordinator(kafka_broker: Broker, tmp_path: Path) -> Iterator[Coordinator]:
    started = start_coordinator(tmp_path / "coordinator", kafka_broker.bootstrap, OWNED)
    yield started
    started.stop()


def _metric(text: str, name: str, **labels: str) -> float:
    wanted = ",".join(f'{key}="{value}"' for key, value in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith(f"{name}{{{wanted}}} "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no sample {name}{{{wanted}}}")


def test_perf_tools_through_the_proxy_count_every_record(
        kafka_broker: Broker, coordinator: Coordinator, tmp_path: Path) -> None:
    topic = "perf-through-proxy"
    produced = run_tool(
        "org.apache.kafka.tools.ProducerPerformance", tmp_path / "producer",
        "--topic", topic, "--num-records", str(RECORDS), "--record-size", "1024",
        "--throughput", "-1",
        "--command-property", f"bootstrap.servers={coordinator.bootstrap}", "acks=all")
    assert produced.returncode == 0, produced.stdout + produced.stderr
    assert f"{RECORDS} records sent" in produced.stdout
    consumed = run_tool(
        "org.apache.kafka.tools.ConsumerPerformance", tmp_path / "consumer",
        "--bootstrap-server", coordinator.bootstrap, "--topic", topic,
        "--num-records", str(RECORDS), "--group", "perf-not-owned", "--timeout", "60000")
    assert consumed.returncode == 0, consumed.stdout + consumed.stderr
    # The broker itself holds exactly what went through the proxy.
    offsets = run_tool("org.apache.kafka.tools.GetOffsetShell", tmp_path / "offsets",
                       "--bootstrap-server", kafka_broker.bootstrap, "--topic", topic)
    assert offsets.returncode == 0, offsets.stderr
    end_offsets = sum(int(line.rsplit(":", 1)[1]) for line in offsets.stdout.split())
    assert end_offsets == RECORDS
    count, megabytes = _consumed(consumed.stdout)
    assert count == RECORDS
    # Every byte of every value (the tool prints MB with four decimals).
    assert megabytes == pytest.approx(RECORDS * 1024 / 2**20, abs=1e-4)
    metrics = coordinator.metrics()
    produce_bytes = _metric(metrics, "connect_coordinator_proxy_forwarded_request_bytes_total",
                            api="Produce")
    fetch_bytes = _metric(metrics, "connect_coordinator_proxy_forwarded_response_bytes_total",
                          api="Fetch")
    assert produce_bytes > RECORDS * 1024
    assert fetch_bytes > RECORDS * 1024
    # The proxy's series pass Prometheus' own linter.
    linted = subprocess.run([require_binary("promtool"), "check", "metrics"], input=metrics,
                            capture_output=True, text=True, timeout=60, check=False)
    assert linted.returncode == 0, linted.stdout + linted.stderr


def _consumed(stdout: str) -> tuple[int, float]:
    """(data.consumed.in.nMsg, data.consumed.in.MB) of ConsumerPerformance's summary."""
    header = next(line for line in stdout.splitlines() if "data.consumed.in.nMsg" in line)
    columns = [column.strip() for column in header.split(",")]
    rows = [line for line in stdout.splitlines()
            if re.match(r"^\d{4}-", line) and len(line.split(",")) == len(columns)]
    values = rows[-1].split(",")
    return (int(float(values[columns.index("data.consumed.in.nMsg")])),
            float(values[columns.index("data.consumed.in.MB")]))


def test_no_response_names_an_upstream_address(kafka_broker: Broker,
                                               coordinator: Coordinator) -> None:
    client = RawClient(coordinator.host, coordinator.port)
    upstream = _address_bytes(kafka_broker.host, kafka_broker.port)
    node_port = coordinator.port + 1 + kafka_broker.node_id
    try:
        raw_versions = client.call(wire.API_VERSIONS, 3, _api_versions_request())[0]
        assert upstream not in raw_versions
        raw, metadata = client.call(wire.METADATA, 12, MetadataRequest(
            topics=None, allow_auto_topic_creation=False,
            include_topic_authorized_operations=False))
        assert upstream not in raw
        assert [(b.node_id, b.host, b.port) for b in metadata.brokers] == [
            (kafka_broker.node_id, coordinator.host, node_port)]
        assert _address_bytes(coordinator.host, node_port) in raw
        raw, cluster = client.call(wire.DESCRIBE_CLUSTER, 1, DescribeClusterRequest(
            include_cluster_authorized_operations=False))
        assert upstream not in raw
        assert [(b.broker_id, b.port) for b in cluster.brokers] == [(kafka_broker.node_id,
                                                                    node_port)]
        # A group that is not ours: the broker's coordinator, at its local port (on a
        # fresh broker, once its offsets topic exists: retried as clients do).
        raw, found = wait_for(lambda: _found(client.call(
            wire.FIND_COORDINATOR, 3, FindV3(key="someone-elses", key_type=i8(0)))), 60,
            "the broker's group coordinator")
        assert upstream not in raw
        assert (found.node_id, found.host, found.port) == (kafka_broker.node_id,
                                                           coordinator.host, node_port)
        # Batched, mixed: ours answered by the coordinator itself, the other rewritten.
        raw, found = wait_for(lambda: _found(client.call(wire.FIND_COORDINATOR, 6, FindV6(
            key_type=i8(0), coordinator_keys=("owned-connect", "someone-elses")))), 60,
            "both coordinators")
        assert upstream not in raw
        by_key = {entry.key: (entry.node_id, entry.port) for entry in found.coordinators}
        assert by_key == {"owned-connect": (2_000_000_000, coordinator.port),
                          "someone-elses": (kafka_broker.node_id, node_port)}
        # The documented mapping, as the admin API serves it.
        with urllib.request.urlopen(f"{coordinator.admin_url}/proxy", timeout=10) as answer:
            mapping = json.load(answer)
        assert mapping["nodes"][str(kafka_broker.node_id)] == {
            "local": f"{coordinator.host}:{node_port}", "upstream": kafka_broker.bootstrap}
        assert mapping["bootstrap"] == coordinator.bootstrap
        # Through the broker's own listener port too.
        node_client = RawClient(coordinator.host, node_port)
        try:
            raw, metadata = node_client.call(wire.METADATA, 12, MetadataRequest(
                topics=None, allow_auto_topic_creation=False,
                include_topic_authorized_operations=False))
            assert upstream not in raw
            assert metadata.brokers[0].port == node_port
        finally:
            node_client.close()
    finally:
        client.close()


def _found(answer: tuple[bytes, Any]) -> tuple[bytes, Any] | None:
    """A FindCoordinator answer without error, or None (to retry)."""
    body = answer[1]
    entries = body.coordinators if hasattr(body, "coordinators") else (body,)
    return answer if all(entry.error_code == 0 for entry in entries) else None


def _api_versions_request() -> object:
    from kio.schema.api_versions.v3.request import ApiVersionsRequest

    return ApiVersionsRequest(client_software_name="interop-test",
                              client_software_version="1")


def test_api_versions_are_the_intersection_plus_the_coordinators_own(
        coordinator: Coordinator) -> None:
    client = RawClient(coordinator.host, coordinator.port)
    try:
        _, body = client.call(wire.API_VERSIONS, 3, _api_versions_request())
    finally:
        client.close()
    ranges = {entry.api_key: (entry.min_version, entry.max_version) for entry in body.api_keys}
    assert ranges[wire.PRODUCE][1] == 9
    assert ranges[wire.FETCH][1] == 15
    assert wire.SHARE_FETCH not in ranges and wire.DESCRIBE_QUORUM not in ranges
    assert ranges[wire.METADATA][1] <= wire.known_versions(wire.METADATA)[1]
    assert ranges[CONNECT_GROUP_DESCRIBE] == (0, 1)
    assert wire.JOIN_GROUP in ranges  # forwarded for groups that are not ours


def test_responses_keep_request_order_across_local_and_forwarded(
        coordinator: Coordinator) -> None:
    client = RawClient(coordinator.host, coordinator.port)
    try:
        # Pipelined: forwarded, local, forwarded, local, forwarded.
        client.send(wire.METADATA, 12, MetadataRequest(
            topics=None, allow_auto_topic_creation=False,
            include_topic_authorized_operations=False))
        client.send(wire.FIND_COORDINATOR, 6, FindV6(key_type=i8(0),
                                                     coordinator_keys=("owned-a",)))
        client.send(wire.FIND_COORDINATOR, 6, FindV6(key_type=i8(0),
                                                     coordinator_keys=("not-ours",)))
        client.send(CONNECT_GROUP_DESCRIBE, 0,
                    ConnectGroupDescribeRequest(group_ids=("owned-a",)))
        client.send(wire.API_VERSIONS, 3, _api_versions_request())
        correlations = [struct.unpack(">i", client.receive()[:4])[0]
                        for _ in range(len(client.sent))]
    finally:
        client.close()
    assert correlations == [correlation for correlation, _, _ in client.sent]


def test_a_group_not_owned_is_the_brokers(kafka_broker: Broker, coordinator: Coordinator,
                                          tmp_path: Path) -> None:
    topic, group = "not-owned-topic", "plain-consumers"
    produced = run_tool(
        "org.apache.kafka.tools.ProducerPerformance", tmp_path / "producer", "--topic", topic,
        "--num-records", "500", "--record-size", "100", "--throughput", "-1",
        "--command-property", f"bootstrap.servers={coordinator.bootstrap}")
    assert produced.returncode == 0, produced.stderr
    consumed = run_tool(
        "org.apache.kafka.tools.ConsumerPerformance", tmp_path / "consumer",
        "--bootstrap-server", coordinator.bootstrap, "--topic", topic, "--num-records", "500",
        "--group", group, "--timeout", "60000")
    assert consumed.returncode == 0, consumed.stdout + consumed.stderr
    # The broker, asked directly, knows the group and its committed offsets.
    described = run_tool("org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
                         tmp_path / "describe", "--bootstrap-server", kafka_broker.bootstrap,
                         "--describe", "--group", group)
    assert described.returncode == 0, described.stdout + described.stderr
    assert topic in described.stdout
    metrics = coordinator.metrics()
    for api in ("JoinGroup", "SyncGroup", "FindCoordinator"):
        assert _metric(metrics, "connect_coordinator_proxy_owned_group_requests_total",
                       api=api) == 0
    assert _metric(metrics, "connect_coordinator_proxy_forwarded_requests_total",
                   api="FindCoordinator") >= 1


def test_an_unreachable_upstream_closes_or_errs_never_hangs(tmp_path: Path) -> None:
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    coordinator = start_coordinator(tmp_path / "coordinator", dead, OWNED,
                                    extra=["--set", "proxy.upstream.connect.timeout.ms=1000"])
    try:
        client = RawClient(coordinator.host, coordinator.port, timeout_s=20)
        try:
            # Owned groups do not need the upstream.
            _, found = client.call(wire.FIND_COORDINATOR, 6, FindV6(
                key_type=i8(0), coordinator_keys=("owned-x",)))
            assert found.coordinators[0].node_id == 2_000_000_000
            # Another group's coordinator: a retriable error, not a hang.
            _, found = client.call(wire.FIND_COORDINATOR, 6, FindV6(
                key_type=i8(0), coordinator_keys=("not-ours",)))
            assert found.coordinators[0].error_code == 15  # COORDINATOR_NOT_AVAILABLE
            # Anything else: the connection is closed (the client retries elsewhere).
            client.send(wire.METADATA, 12, MetadataRequest(
                topics=None, allow_auto_topic_creation=False,
                include_topic_authorized_operations=False))
            with pytest.raises(ConnectionError):
                client.receive()
        finally:
            client.close()
        # A real client gives up with a clear error instead of hanging.
        started = time.monotonic()
        produced = run_tool(
            "org.apache.kafka.tools.ProducerPerformance", tmp_path / "producer",
            "--topic", "nowhere", "--num-records", "1", "--record-size", "10",
            "--throughput", "-1", "--command-property",
            f"bootstrap.servers={coordinator.bootstrap}", "max.block.ms=5000", timeout_s=120)
        assert time.monotonic() - started < 120
        assert "TimeoutException" in produced.stdout + produced.stderr
        wait_for(lambda: "proxy_upstream_unreachable" in coordinator.process.stdout_text(),
                 10, "the coordinator to log the unreachable upstream")
        lines = [json.loads(line) for line in coordinator.process.stdout_text().splitlines()
                 if "proxy_upstream_unreachable" in line]
        assert dead in " ".join(lines[0]["errors"])
    finally:
        coordinator.stop()
