"""Connect workers and tools of other Kafka releases through the coordinator in proxy
mode. Kafka 4.4 clients open every connection with ApiVersions v5, newer than the proxy
serves: they must get UNSUPPORTED_VERSION with the versions served and retry on the same
connection (KIP-511), then run as the default release's workers do."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from coordinator.realkafka import (
    Broker,
    ensure_jars,
    run_tool,
    start_coordinator,
    start_workers,
)
from tests.interop.checks import wait_all_running_and_agreed
from tests.interop.test_proxy import _metric

NEWEST = "4.4.0"
GROUP = "owned-connect-44"
RECORDS = 2_000


def test_kafka_4_4_workers_form_an_owned_group_through_the_proxy(
        kafka_broker: Broker, tmp_path: Path, processes: list[Any]) -> None:
    # (Connect's own test connectors are not published for 4.4: the workers run none.)
    ensure_jars(NEWEST)
    coordinator = start_coordinator(tmp_path / "coordinator", kafka_broker.bootstrap,
                                    "owned-.*")
    processes.append(coordinator)
    workers = start_workers(tmp_path, 2, coordinator.bootstrap, GROUP, processes,
                            kafka_version=NEWEST)
    agreed = wait_all_running_and_agreed(coordinator, workers, GROUP, {}, 150)
    assert agreed["view"]["type"] == "classic"
    for worker in workers:
        assert worker.rest("GET", "/connectors") == []
        assert "Timed out waiting for a node assignment" not in worker.process.log_text()
    # The group is the coordinator's, and no connection was closed over a version.
    metrics = coordinator.metrics()
    assert _metric(metrics, "connect_coordinator_proxy_owned_group_requests_total",
                   api="JoinGroup") >= 2
    closed_over_a_version = [
        line for line in coordinator.process.log_text().splitlines()
        if "proxy_connection_closed" in line and "not served" in line]
    assert not closed_over_a_version, closed_over_a_version[:3]
    # Kafka 4.4's own tools through the proxy: the groups listed, records produced and
    # consumed (in a consumer group the broker keeps).
    listed = run_tool("org.apache.kafka.tools.GroupsCommand", tmp_path / "groups",
                      "--bootstrap-server", coordinator.bootstrap, "--list",
                      version=NEWEST)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert GROUP in listed.stdout, listed.stdout
    topic = "perf-44"
    produced = run_tool(
        "org.apache.kafka.tools.ProducerPerformance", tmp_path / "producer",
        "--topic", topic, "--num-records", str(RECORDS), "--record-size", "100",
        "--throughput", "-1",
        "--command-property", f"bootstrap.servers={coordinator.bootstrap}", "acks=all",
        version=NEWEST)
    assert produced.returncode == 0, produced.stdout + produced.stderr
    assert f"{RECORDS} records sent" in produced.stdout
    consumed = run_tool(
        "org.apache.kafka.tools.ConsumerPerformance", tmp_path / "consumer",
        "--bootstrap-server", coordinator.bootstrap, "--topic", topic,
        "--num-records", str(RECORDS), "--group", "perf-44-not-owned", "--timeout", "60000",
        version=NEWEST)
    assert consumed.returncode == 0, consumed.stdout + consumed.stderr
