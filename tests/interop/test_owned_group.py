"""Three unmodified Connect workers whose group this coordinator OWNS (proxy mode,
`proxy.groups` matches their group.id): the group is a classic group on the coordinator,
and everything else (internal topics, the connectors' records, the sink's consumer group)
is the real broker's, through the proxy.

One coordinator (on a data dir), three workers and two connectors serve the module's
tests in order: the group forms, then workers bounce (clean restarts in rotation and one
SIGKILL, as Apache Kafka's connect_distributed_test.py::test_bounce does), then the
coordinator is SIGKILLed and restarted on its data dir. After each step: every task
RUNNING, the coordinator's view and Connect's status agree, each source task's sequence
numbers have no gaps (at the source and at the sink), and the workers' logs show no
(connector, task) running on two workers at overlapping times.
"""

from __future__ import annotations

import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from coordinator.realkafka import (
    STOP_HUNG,
    VERIFIABLE_SINK,
    VERIFIABLE_SOURCE,
    Broker,
    Coordinator,
    StopHung,
    Worker,
    overlapping_runs,
    restart_worker,
    run_tool,
    start_coordinator,
    start_process,
    start_workers,
    stop_together,
    task_intervals,
    wait_for,
)
from tests.interop.checks import (
    assert_no_gaps,
    assert_no_task_on_two_workers,
    seqnos,
    wait_all_running_and_agreed,
    worker_id,
)
from tests.interop.test_proxy import _metric

GROUP = "owned-connect"
SOURCE_TASKS = 6
SINK_TASKS = 2
TOPIC = "owned-verifiable"


@dataclass
class Cluster:
    coordinator: Coordinator
    upstream: str
    workers: list[Worker]
    root: Path
    data_dir: Path
    started: list[Any]


@pytest.fixture(scope="module")
def cluster(kafka_broker: Broker, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("owned-group")
    started: list[Any] = []
    try:
        data_dir = root / "coordinator-data"
        coordinator = start_coordinator(root / "coordinator", kafka_broker.bootstrap,
                                        "owned-.*", data_dir=data_dir)
        started.append(coordinator)
        workers = start_workers(root, 3, coordinator.bootstrap, GROUP, started)
        yield Cluster(coordinator, kafka_broker.bootstrap, workers, root, data_dir, started)
    finally:
        # The workers first, together, while the coordinator still answers their leaves.
        stop_together([process.process for process in started if isinstance(process, Worker)])
        for process in reversed(started):
            try:
                process.stop()
            except Exception:  # noqa: BLE001 - stop the others all the same
                pass


# -- checks ---------------------------------------------------------------------------------


def _wait_all_running_and_agreed(cluster: Cluster, timeout_s: float = 150) -> dict[str, Any]:
    return wait_all_running_and_agreed(cluster.coordinator, cluster.workers, GROUP,
                                       {"source": SOURCE_TASKS, "sink": SINK_TASKS},
                                       timeout_s)


def _assert_no_gaps(cluster: Cluster, *, duplicates_allowed: bool) -> None:
    assert_no_gaps(cluster.workers, SOURCE_TASKS, duplicates_allowed=duplicates_allowed)


def _assert_no_task_on_two_workers(cluster: Cluster) -> None:
    assert_no_task_on_two_workers(cluster.workers)


def _bounce(cluster: Cluster, index: int, *, kill: bool) -> bool:
    """Stop (or SIGKILL) a worker and start it again; whether it stopped cleanly."""
    worker = cluster.workers[index]
    clean = not kill
    if kill:
        worker.process.kill()
    else:
        try:
            worker.stop_cleanly()
        except StopHung as hung:  # Connect's own; a kill after all
            warnings.warn(str(hung), stacklevel=2)
            clean = False
    again = restart_worker(worker, wait=False)
    cluster.started.append(again)
    cluster.workers[index] = again
    return clean


# -- the tests, in order --------------------------------------------------------------------


def test_three_real_workers_form_one_group_owned_by_the_coordinator(
        cluster: Cluster) -> None:
    workers = cluster.workers
    workers[-1].rest("POST", "/connectors", {  # through a follower: forwarded to the leader
        "name": "source", "config": {
            "connector.class": VERIFIABLE_SOURCE, "tasks.max": str(SOURCE_TASKS),
            "topic": TOPIC, "throughput": "20"}})
    workers[-1].rest("POST", "/connectors", {
        "name": "sink", "config": {
            "connector.class": VERIFIABLE_SINK, "tasks.max": str(SINK_TASKS),
            "topics": TOPIC}})
    agreed = _wait_all_running_and_agreed(cluster)
    view = agreed["view"]
    assert view["type"] == "classic" and view["protocol"] == "sessioned"
    assert {worker_id(m["worker_url"]) for m in view["members"]} == \
        {f"{w.host}:{w.rest_port}" for w in workers}
    assert len(set(agreed["running"].values())) == 3  # the tasks spread over the three
    # The group's requests were answered by the coordinator, none went upstream.
    metrics = cluster.coordinator.metrics()
    for api in ("JoinGroup", "SyncGroup"):
        assert _metric(metrics, "connect_coordinator_proxy_owned_group_requests_total",
                       api=api) >= 3
    coordinator = f"{cluster.coordinator.host}:{cluster.coordinator.port}"
    for worker in workers:
        log = worker.process.log_text()
        assert f"Discovered group coordinator {coordinator} " in log, worker.process.tail()
    # Kafka's own tool lists the group through the proxy: the owned group as the
    # coordinator has it (classic), the sink's consumer group as the broker has it.
    listed = run_tool("org.apache.kafka.tools.GroupsCommand", cluster.root / "groups",
                      "--bootstrap-server", cluster.coordinator.bootstrap, "--list")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    rows = {line.split()[0]: line.lower().split()[1:] for line in listed.stdout.splitlines()
            if line.strip()}
    assert "classic" in rows[GROUP] and "connect" in rows[GROUP], listed.stdout
    assert "connect-sink" in rows, listed.stdout
    time.sleep(3)  # a few records of every task
    _assert_no_gaps(cluster, duplicates_allowed=False)
    _assert_no_task_on_two_workers(cluster)


def test_bounced_workers_clean_and_killed(cluster: Cluster) -> None:
    clean = True
    for index in range(len(cluster.workers)):  # clean restarts, in rotation
        clean = _bounce(cluster, index, kill=False) and clean
        _wait_all_running_and_agreed(cluster)
    # Clean bounces replay nothing (unless Connect hung on one and was killed: warned).
    _assert_no_gaps(cluster, duplicates_allowed=not clean)
    _bounce(cluster, 0, kill=True)
    _wait_all_running_and_agreed(cluster)
    time.sleep(3)
    _assert_no_gaps(cluster, duplicates_allowed=True)  # a SIGKILL may replay some
    _assert_no_task_on_two_workers(cluster)


def test_coordinator_sigkilled_and_restarted_on_its_data_dir(cluster: Cluster) -> None:
    before = cluster.coordinator.admin(f"/groups/{GROUP}")
    produced_before = {task: max(numbers)
                       for task, numbers in seqnos(cluster.workers, "source").items()}
    old = cluster.coordinator
    old.process.kill()
    time.sleep(2)
    again = start_coordinator(old.process.folder, cluster.upstream, "owned-.*", port=old.port,
                              admin_port=old.admin_port, data_dir=cluster.data_dir)
    cluster.started.append(again)
    cluster.coordinator = again
    replayed = again.admin(f"/groups/{GROUP}")
    assert replayed["generation"] >= before["generation"]
    assert {m["member_id"] for m in replayed["members"]} == \
        {m["member_id"] for m in before["members"]}
    _wait_all_running_and_agreed(cluster)
    # The workers carry on with the new process: they heartbeat to it, and every source
    # task produces beyond where it was at the kill.
    wait_for(lambda: _metric(again.metrics(),
                             "connect_coordinator_proxy_owned_group_requests_total",
                             api="Heartbeat") >= 3, 30, "heartbeats to the new coordinator")

    def produced_more() -> bool:
        now = seqnos(cluster.workers, "source")
        return all(max(now[task]) > seqno for task, seqno in produced_before.items())

    wait_for(produced_more, 60, "every source task to produce more", interval_s=1.0)
    _assert_no_gaps(cluster, duplicates_allowed=True)
    _assert_no_task_on_two_workers(cluster)


def test_the_log_check_sees_a_task_run_on_two_workers_at_once() -> None:
    """The overlap check itself, on log lines in Connect's layout (no JVM needed)."""
    first = ("[2026-01-01 10:00:00,000] INFO Creating task source-1 (o.a.k.c.r.Worker)\n"
             "[2026-01-01 10:00:09,000] INFO Graceful stop of task source-1 succeeded. "
             "(o.a.k.c.r.Worker)\n")
    second_late = "[2026-01-01 10:00:09,500] INFO Creating task source-1 (o.a.k.c.r.Worker)\n"
    second_early = "[2026-01-01 10:00:08,000] INFO Creating task source-1 (o.a.k.c.r.Worker)\n"
    end = datetime(2026, 1, 1, 10, 1).timestamp()
    runs = task_intervals(first, [], end)
    assert list(runs) == ["source-1"] and len(runs["source-1"]) == 1
    assert overlapping_runs({"a": runs, "b": task_intervals(second_late, [], end)}) == []
    assert len(overlapping_runs({"a": runs, "b": task_intervals(second_early, [], end)})) == 1
    # A stop ends with the last line that says so (here: its producer closed).
    stopped = ("[2026-01-01 10:00:00,000] INFO Creating task source-1 (o.a.k.c.r.Worker)\n"
               "[2026-01-01 10:00:09,000] INFO Stopping task source-1 (o.a.k.c.r.Worker)\n"
               "[2026-01-01 10:00:09,800] INFO App info kafka.producer for "
               "connector-producer-source-1 unregistered (o.a.k.c.u.AppInfoParser)\n")
    assert len(overlapping_runs({"a": task_intervals(stopped, [], end),
                                 "b": task_intervals(second_late, [], end)})) == 1
    # A run Connect gave up on (its graceful stop failed) ends there, however late its
    # clients close.
    abandoned = ("[2026-01-01 10:00:00,000] INFO Creating task source-1 (o.a.k.c.r.Worker)\n"
                 "[2026-01-01 10:00:04,000] INFO Stopping task source-1 (o.a.k.c.r.Worker)\n"
                 "[2026-01-01 10:00:09,000] ERROR Graceful stop of task source-1 failed. "
                 "(o.a.k.c.r.Worker)\n"
                 "[2026-01-01 10:00:39,000] INFO App info kafka.producer for "
                 "connector-producer-source-1 unregistered (o.a.k.c.u.AppInfoParser)\n")
    assert task_intervals(abandoned, [], end) == {"source-1": [(
        datetime(2026, 1, 1, 10, 0, 0).timestamp(), datetime(2026, 1, 1, 10, 0, 9).timestamp())]}
    assert overlapping_runs({"a": task_intervals(abandoned, [], end),
                             "b": task_intervals(second_late, [], end)}) == []
    # A SIGKILL ends the runs open at that moment; a later start is a new run.
    killed = "[2026-01-01 10:00:00,000] INFO Creating task source-1 (o.a.k.c.r.Worker)\n"
    killed_at = datetime(2026, 1, 1, 10, 0, 5).timestamp()
    assert task_intervals(killed, [killed_at], end) == {"source-1": [(
        datetime(2026, 1, 1, 10, 0, 0).timestamp(), killed_at)]}


def test_a_worker_that_hangs_on_sigterm_is_killed_and_said_so(tmp_path: Path) -> None:
    """A stand-in for a Connect worker whose stop hangs (no JVM needed): it ignores
    SIGTERM after logging what Connect's REST server logs then. The clean stop kills it,
    says why, and the kill's time ends the runs its log left open."""
    script = ("import signal, sys, time\n"
              "signal.signal(signal.SIGTERM, lambda *_: print("
              f"{'[2026-01-01 10:00:00,000] ' + STOP_HUNG!r}, flush=True))\n"
              "print('ready', flush=True)\n"
              "time.sleep(60)\n")
    process = start_process("worker-x", [sys.executable, "-c", script], tmp_path)
    wait_for(lambda: "ready" in process.stdout_text(), 10, "the stand-in to start")
    worker = Worker(process, "127.0.0.1", 1)
    with pytest.raises(StopHung, match="did not stop within 1 s.*Unable to destroy"):
        worker.stop_cleanly(grace_s=1.0)
    assert process.exited() and len(process.killed_at) == 1
    started = "[2026-01-01 10:00:00,000] INFO Creating task source-1 (o.a.k.c.r.Worker)\n"
    runs = task_intervals(started, process.killed_at, process.killed_at[0] + 60)
    assert runs["source-1"][0][1] == process.killed_at[0]
