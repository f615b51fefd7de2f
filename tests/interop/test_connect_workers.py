"""Real Connect workers through the coordinator in proxy mode, with their group not owned
by it: the group is the broker's (forwarded), and everything else -- internal topics,
connectors' records, REST forwarding to the leader -- runs through the proxy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from coordinator.realkafka import (
    VERIFIABLE_SINK,
    VERIFIABLE_SOURCE,
    Broker,
    all_running,
    start_coordinator,
    start_workers,
    verifiable_lines,
    wait_for,
)
from tests.interop.test_proxy import _metric

SOURCE_TASKS = 6


def test_three_workers_run_a_verifiable_source_and_sink_through_the_proxy(
        kafka_broker: Broker, tmp_path: Path, processes: list[Any]) -> None:
    coordinator = start_coordinator(tmp_path / "coordinator", kafka_broker.bootstrap,
                                    "owned-.*")
    processes.append(coordinator)
    group = "connect-forwarded"
    workers = start_workers(tmp_path, 3, coordinator.bootstrap, group, processes)
    topic = "verifiable-through-proxy"
    # Created through two different workers: at least one of them is not the group's
    # leader, and Connect forwards that call to the leader (whose URL it got in the
    # group's assignment, through the proxy).
    workers[2].rest("POST", "/connectors", {
        "name": "source", "config": {
            "connector.class": VERIFIABLE_SOURCE, "tasks.max": str(SOURCE_TASKS),
            "topic": topic, "throughput": "20"}})
    workers[1].rest("POST", "/connectors", {
        "name": "sink", "config": {
            "connector.class": VERIFIABLE_SINK, "tasks.max": "2", "topics": topic}})
    source = wait_for(lambda: all_running(workers[0], "source", SOURCE_TASKS), 120,
                      "the source's 6 tasks to run")
    wait_for(lambda: all_running(workers[1], "sink", 2), 120, "the sink's 2 tasks to run")
    worker_ids = {task["worker_id"] for task in source["tasks"]}
    assert len(worker_ids) == 3, source  # spread over the three workers
    # Records flow end to end: every source task's records reach the sink.
    def sunk_from_every_task() -> bool:
        sunk = {line["task"] for worker in workers for line in verifiable_lines(worker)
                if line.get("name") == "sink"}
        return sunk >= set(range(SOURCE_TASKS))

    wait_for(sunk_from_every_task, 60, "the sink to receive records of every source task")
    # The group is the broker's: its JoinGroup/SyncGroup went upstream, none was ours.
    metrics = coordinator.metrics()
    assert _metric(metrics, "connect_coordinator_proxy_forwarded_requests_total",
                   api="JoinGroup") >= 3
    assert _metric(metrics, "connect_coordinator_proxy_owned_group_requests_total",
                   api="JoinGroup") == 0
    # Every worker reached Kafka only through the proxy: its group coordinator (and the
    # sink task's consumer group's) is the broker's local port on the proxy.
    node_port = f"{coordinator.host}:{coordinator.port + 1 + kafka_broker.node_id}"
    logs = [worker.process.log_text() for worker in workers]
    for log in logs:
        assert f"groupId={group}] Discovered group coordinator {node_port} " in log
        assert kafka_broker.bootstrap not in log
    # The sink task's consumer group is the broker's too (forwarded, not claimed).
    assert any(f"groupId=connect-sink] Discovered group coordinator {node_port} " in log
               for log in logs)
