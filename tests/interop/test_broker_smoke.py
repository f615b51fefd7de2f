"""The harness itself: the broker from the jars answers the Kafka protocol."""

from __future__ import annotations

from pathlib import Path

from coordinator.realkafka import Broker, run_tool


def test_broker_serves_a_topic_created_with_the_tools(kafka_broker: Broker,
                                                      tmp_path: Path) -> None:
    created = run_tool("org.apache.kafka.tools.TopicCommand", tmp_path / "create",
                       "--bootstrap-server", kafka_broker.bootstrap, "--create",
                       "--topic", "harness-smoke", "--partitions", "2")
    assert created.returncode == 0, created.stdout + created.stderr
    listed = run_tool("org.apache.kafka.tools.TopicCommand", tmp_path / "list",
                      "--bootstrap-server", kafka_broker.bootstrap, "--list")
    assert "harness-smoke" in listed.stdout.split()
