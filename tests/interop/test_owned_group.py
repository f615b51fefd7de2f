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

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from coordinator.realkafka import (
    VERIFIABLE_SINK,
    VERIFIABLE_SOURCE,
    Broker,
    Coordinator,
    Worker,
    all_running,
    restart_worker,
    run_tool,
    start_coordinator,
    start_workers,
    stop_together,
    verifiable_lines,
    wait_for,
)
from tests.interop.test_proxy import _metric

GROUP = "owned-connect"
SOURCE_TASKS = 6
SINK_TASKS = 2
TOPIC = "owned-verifiable"
MARKS = ("committed", "flushed")


@dataclass
class Cluster:
    coordinator: Coordinator
    upstream: str
    workers: list[Worker]
    root: Path
    data_dir: Path
    started: list[Any]
    # Worker log file -> the times (epoch s) its process was SIGKILLed: a task it ran
    # then ended then, with no log line to say so.
    kills: dict[Path, list[float]] = field(default_factory=dict)


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


def _worker_id(url: str) -> str:
    """Connect's worker id (host:port) from its REST url."""
    return url.removeprefix("http://").removeprefix("https://").rstrip("/")


def _agreed_assignment(cluster: Cluster) -> dict[str, Any] | None:
    """Both views once every task runs and they agree: the coordinator's (who holds
    what, from the admin API) and Connect's (GET /connectors/NAME/status)."""
    statuses = {}
    for name, tasks in (("source", SOURCE_TASKS), ("sink", SINK_TASKS)):
        status = all_running(cluster.workers[0], name, tasks)
        if status is None:
            return None
        statuses[name] = status
    view = cluster.coordinator.admin(f"/groups/{GROUP}")
    if view["state"] != "Stable" or len(view["members"]) != 3:
        return None
    held: dict[tuple[str, int], str] = {}
    for member in view["members"]:
        for task in member["holds"]["tasks"]:
            held[(task["connector"], task["task"])] = _worker_id(member["worker_url"])
    running = {(name, task["id"]): task["worker_id"]
               for name, status in statuses.items() for task in status["tasks"]}
    if held != running:
        return None
    return {"view": view, "running": running}


def _wait_all_running_and_agreed(cluster: Cluster, timeout_s: float = 150) -> dict[str, Any]:
    agreed: dict[str, Any] = wait_for(lambda: _agreed_assignment(cluster), timeout_s,
                                      "every task RUNNING, the coordinator's view and "
                                      "Connect's status agreeing", interval_s=1.0)
    return agreed


def _seqnos(workers: list[Worker], name: str, mark: str | None = None
            ) -> dict[int, list[int]]:
    """Sequence numbers per task from the Verifiable connectors' stdout lines: a source
    prints one when it produces a record and one marked `committed` once its offset is
    committed; a sink one when it receives a record and one marked `flushed`."""
    by_task: dict[int, list[int]] = {}
    for worker in workers:
        for line in verifiable_lines(worker):
            if line.get("name") != name:
                continue
            if mark is None and not any(key in line for key in MARKS) or \
                    mark is not None and line.get(mark):
                by_task.setdefault(int(line["task"]), []).append(int(line["seqno"]))
    return by_task


def _assert_no_gaps(cluster: Cluster, *, duplicates_allowed: bool) -> None:
    """Each source task's sequence numbers run from 0 with no gap; every record whose
    offset the source committed reaches the sink, which receives none out of nowhere."""
    produced = _seqnos(cluster.workers, "source")
    assert set(produced) == set(range(SOURCE_TASKS)), sorted(produced)
    for task, numbers in produced.items():
        distinct = sorted(set(numbers))
        assert distinct == list(range(len(distinct))), f"source task {task} has gaps"
        if not duplicates_allowed:
            assert len(numbers) == len(distinct), f"source task {task} produced duplicates"
    committed = {task: set(numbers)
                 for task, numbers in _seqnos(cluster.workers, "source", "committed").items()}
    assert set(committed) == set(range(SOURCE_TASKS)), sorted(committed)

    def caught_up() -> dict[int, list[int]] | None:
        sunk = _seqnos(cluster.workers, "sink")
        if all(numbers <= set(sunk.get(task, ())) for task, numbers in committed.items()):
            return sunk
        return None

    sunk = wait_for(caught_up, 90, "the sink to receive every committed source record",
                    interval_s=1.0)
    for task, numbers in sunk.items():
        distinct = sorted(set(numbers))
        assert distinct == list(range(len(distinct))), f"the sink lost records of task {task}"


LOG_LINE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\] \w+ (.*)$")
TASK_STARTED = re.compile(r"^Creating task ([\w.-]+-\d+)$")
# A run ends with the last of these: the worker stops the task, the stop completes, the
# task's producer (source) or consumer (sink) is closed.
TASK_STOPPING = (
    re.compile(r"^Stopping task ([\w.-]+-\d+)$"),
    re.compile(r"^Graceful stop of task ([\w.-]+-\d+) (?:succeeded|failed)"),
    re.compile(r"^App info kafka\.(?:producer|consumer) for "
               r"connector-(?:producer|consumer)-([\w.-]+-\d+) unregistered$"),
)


def _log_time(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def task_intervals(log_text: str, kills: list[float], now: float
                   ) -> dict[str, list[tuple[float, float]]]:
    """(start, end) of every run of each task in one worker's log, over its restarts: from
    "Creating task" to the last line that says it stopped (the stop, its completion, its
    client closed) before it starts again; a run still open when the process was SIGKILLed
    ends at the kill, one still open at the end of the log ends `now`."""
    runs: dict[str, list[list[float]]] = {}
    running: dict[str, list[float]] = {}  # started, not stopping yet
    stopping: dict[str, list[float]] = {}  # the last run, while more stop lines may come
    pending_kills = sorted(kills)

    def close_killed_before(moment: float) -> None:
        while pending_kills and pending_kills[0] <= moment:
            killed_at = pending_kills.pop(0)
            for task, run in list(running.items()):
                run[1] = killed_at
                del running[task]
            stopping.clear()

    for line in log_text.splitlines():
        match = LOG_LINE.match(line)
        if match is None:
            continue
        moment, message = _log_time(match.group(1)), match.group(2)
        close_killed_before(moment)
        message = message.rsplit(" (", 1)[0]  # the logger name
        if started := TASK_STARTED.match(message):
            task = started.group(1)
            if task not in running:
                run = [moment, now]
                runs.setdefault(task, []).append(run)
                running[task] = run
                stopping.pop(task, None)
            continue
        for pattern in TASK_STOPPING:
            if stopped := pattern.match(message):
                task = stopped.group(1)
                run_or_none = running.pop(task, None) or stopping.get(task)
                if run_or_none is not None:
                    run_or_none[1] = moment
                    stopping[task] = run_or_none
                break
    close_killed_before(now)
    return {task: [(start, end) for start, end in task_runs] for task, task_runs in runs.items()}


def overlapping_runs(by_worker: dict[str, dict[str, list[tuple[float, float]]]]
                     ) -> list[str]:
    """Every pair of runs of one task on two workers whose times overlap."""
    found = []
    workers = sorted(by_worker)
    for index, first in enumerate(workers):
        for second in workers[index + 1:]:
            for task, runs in by_worker[first].items():
                for start, end in runs:
                    for other_start, other_end in by_worker[second].get(task, []):
                        if start < other_end and other_start < end:
                            found.append(f"{task}: {first} [{start:.3f}, {end:.3f}] and "
                                         f"{second} [{other_start:.3f}, {other_end:.3f}]")
    return found


def _assert_no_task_on_two_workers(cluster: Cluster) -> None:
    now = time.time()
    by_worker = {str(worker.process.log_path): task_intervals(
        worker.process.log_text(), cluster.kills.get(worker.process.log_path, []), now)
        for worker in cluster.workers}
    for runs in by_worker.values():
        assert runs, "no task start found in a worker's log: the log format changed?"
    assert overlapping_runs(by_worker) == []


def _bounce(cluster: Cluster, index: int, *, kill: bool) -> None:
    worker = cluster.workers[index]
    if kill:
        cluster.kills.setdefault(worker.process.log_path, []).append(time.time())
        worker.process.kill()
    else:
        worker.stop()
    again = restart_worker(worker, wait=False)
    cluster.started.append(again)
    cluster.workers[index] = again


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
    assert {_worker_id(m["worker_url"]) for m in view["members"]} == \
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
    for index in range(len(cluster.workers)):  # clean restarts, in rotation
        _bounce(cluster, index, kill=False)
        _wait_all_running_and_agreed(cluster)
    _assert_no_gaps(cluster, duplicates_allowed=False)  # clean bounces replay nothing
    _bounce(cluster, 0, kill=True)
    _wait_all_running_and_agreed(cluster)
    time.sleep(3)
    _assert_no_gaps(cluster, duplicates_allowed=True)  # a SIGKILL may replay some
    _assert_no_task_on_two_workers(cluster)


def test_coordinator_sigkilled_and_restarted_on_its_data_dir(cluster: Cluster) -> None:
    before = cluster.coordinator.admin(f"/groups/{GROUP}")
    produced_before = {task: max(numbers)
                       for task, numbers in _seqnos(cluster.workers, "source").items()}
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
        now = _seqnos(cluster.workers, "source")
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
    # A SIGKILL ends the runs open at that moment; a later start is a new run.
    killed = "[2026-01-01 10:00:00,000] INFO Creating task source-1 (o.a.k.c.r.Worker)\n"
    killed_at = datetime(2026, 1, 1, 10, 0, 5).timestamp()
    assert task_intervals(killed, [killed_at], end) == {"source-1": [(
        datetime(2026, 1, 1, 10, 0, 0).timestamp(), killed_at)]}
