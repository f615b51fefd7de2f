"""The checks the interop tests make on real Connect workers, whatever drives them: every
source task's sequence numbers without gaps (at the source and at the sink), and no
(connector, task) running on two workers at overlapping times, read from the workers'
logs (and from the run records of any simulated workers in the same group)."""

from __future__ import annotations

import re
import time
from typing import Any

from coordinator.realkafka import (
    LOG_LINE,
    Coordinator,
    TaskRuns,
    Worker,
    all_running,
    log_time,
    overlapping_runs,
    task_intervals,
    verifiable_lines,
    wait_for,
)
from tests.interop.test_proxy import _metric

MARKS = ("committed", "flushed")
# The group client of a Connect worker (not its consumers) found its coordinator.
REDISCOVERED = re.compile(r"^\[Worker clientId=connect-[^\]]*\] Discovered group coordinator ")
HEARTBEATS = "connect_coordinator_proxy_owned_group_requests_total"


def worker_id(url: str) -> str:
    """Connect's worker id (host:port) from its REST url."""
    return url.removeprefix("http://").removeprefix("https://").rstrip("/")


def agreed_assignment(coordinator: Coordinator, workers: list[Worker], group: str,
                      tasks: dict[str, int]) -> dict[str, Any] | None:
    """Both views once every task runs and they agree: the coordinator's (who holds
    what in the classic group, from the admin API) and Connect's (GET
    /connectors/NAME/status); `tasks`: each connector's task count."""
    statuses = {}
    for name, count in tasks.items():
        status = all_running(workers[0], name, count)
        if status is None:
            return None
        statuses[name] = status
    view = coordinator.admin(f"/groups/{group}")
    if view["state"] != "STABLE" or len(view["members"]) != len(workers) or \
            any("holds" not in member for member in view["members"]):
        return None
    held: dict[tuple[str, int], str] = {}
    for member in view["members"]:
        for task in member["holds"]["tasks"]:
            held[(task["connector"], task["task"])] = worker_id(member["worker_url"])
    running = {(name, task["id"]): task["worker_id"]
               for name, status in statuses.items() for task in status["tasks"]}
    if held != running:
        return None
    return {"view": view, "running": running}


def wait_all_running_and_agreed(coordinator: Coordinator, workers: list[Worker], group: str,
                                tasks: dict[str, int], timeout_s: float = 150
                                ) -> dict[str, Any]:
    agreed: dict[str, Any] = wait_for(
        lambda: agreed_assignment(coordinator, workers, group, tasks), timeout_s,
        "every task RUNNING, the coordinator's view and Connect's status agreeing",
        interval_s=1.0)
    return agreed


def seqnos(workers: list[Worker], name: str, mark: str | None = None
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


def assert_no_gaps(workers: list[Worker], source_tasks: int, *, duplicates_allowed: bool,
                   source: str = "source", sink: str = "sink") -> None:
    """Each source task's sequence numbers run from 0 with no gap; every record whose
    offset the source committed reaches the sink, which receives none out of nowhere."""
    produced = seqnos(workers, source)
    assert set(produced) == set(range(source_tasks)), sorted(produced)
    for task, numbers in produced.items():
        distinct = sorted(set(numbers))
        assert distinct == list(range(len(distinct))), f"source task {task} has gaps"
        if not duplicates_allowed:
            assert len(numbers) == len(distinct), f"source task {task} produced duplicates"
    committed = {task: set(numbers)
                 for task, numbers in seqnos(workers, source, "committed").items()}
    assert set(committed) == set(range(source_tasks)), sorted(committed)

    def caught_up() -> dict[int, list[int]] | None:
        sunk = seqnos(workers, sink)
        if all(numbers <= set(sunk.get(task, ())) for task, numbers in committed.items()):
            return sunk
        return None

    sunk = wait_for(caught_up, 90, "the sink to receive every committed source record",
                    interval_s=1.0)
    for task, numbers in sunk.items():
        distinct = sorted(set(numbers))
        assert distinct == list(range(len(distinct))), f"the sink lost records of task {task}"


def assert_no_task_on_two_workers(workers: list[Worker],
                                  others: dict[str, TaskRuns] | None = None) -> None:
    """No task's runs on two workers overlap: the real workers' runs from their logs (a
    run open when its process was SIGKILLed, by a test or after a stop that hung, ends
    at the kill), and `others`: runs of simulated workers by name, in epoch seconds."""
    now = time.time()
    by_worker: dict[str, TaskRuns] = {str(worker.process.log_path): task_intervals(
        worker.process.log_text(), worker.process.killed_at, now) for worker in workers}
    for runs in by_worker.values():
        assert runs, "no task start found in a worker's log: the log format changed?"
    by_worker.update(others or {})
    assert overlapping_runs(by_worker) == []


def describe_runs(runs: TaskRuns) -> dict[str, Any]:
    """Runs in a form for an assertion message."""
    return {task: [(round(start, 3), round(end, 3)) for start, end in spans]
            for task, spans in sorted(runs.items())}


def wait_reconnected(coordinator: Coordinator, workers: list[Worker], since: float,
                     timeout_s: float = 60.0, heartbeat_interval_s: float = 3.0) -> None:
    """Every worker's group client talks to the coordinator again after `since` (a
    restart): two heartbeat intervals have passed and at least two heartbeats per worker
    were served. A worker stopped before that may close before its LeaveGroup is sent
    (Connect gives its close no time to connect), and its old member then stays in the
    group until its session ends. A worker whose client had a request in flight at the
    kill finds the coordinator again (its log says "Discovered group coordinator"); one
    that had none reconnects to the same address at its next heartbeat and logs nothing,
    so the log alone cannot tell (it is named in the failure message)."""
    def rediscovered(worker: Worker) -> bool:
        for line in worker.process.log_text().splitlines():
            match = LOG_LINE.match(line)
            if match is not None and log_time(match.group(1)) >= since \
                    and REDISCOVERED.match(match.group(2)):
                return True
        return False

    def heartbeats() -> float:
        try:
            return _metric(coordinator.metrics(), HEARTBEATS, api="Heartbeat")
        except AssertionError:  # none served yet
            return 0.0

    def state() -> str:
        try:
            nodes = coordinator.admin("/proxy").get("nodes")
        except Exception as error:  # noqa: BLE001 - a failure message, whatever happened
            nodes = f"unknown ({error})"
        return (f"{heartbeats():.0f} heartbeats served; the coordinator's broker ports: "
                f"{nodes}; " + ", ".join(
                    f"{worker.process.name} "
                    + ("rediscovered it" if rediscovered(worker) else "logged no rediscovery")
                    + (f", exited ({worker.process.popen.returncode})"
                       if worker.process.exited() else "")
                    + f" (its last group log line: {last_group_line(worker)})"
                    for worker in workers))

    wait_for(lambda: time.time() - since >= 2 * heartbeat_interval_s
             and heartbeats() >= 2 * len(workers), timeout_s,
             "heartbeats from every worker to the restarted coordinator", interval_s=0.25,
             explain=state)


def last_group_line(worker: Worker) -> str:
    """The last line the worker's group client logged, for a failure message."""
    for line in reversed(worker.process.log_text().splitlines()):
        match = LOG_LINE.match(line)
        if match is not None and match.group(2).startswith("[Worker clientId=connect-"):
            return line[:300]
    return "none"


def wait_stable(coordinator: Coordinator, group: str, for_s: float = 3.0,
                timeout_s: float = 60.0) -> None:
    """The coordinator's group STABLE for `for_s` on end (a heartbeat interval): the
    rounds that creating connectors starts are over. A worker stopped in one of them may
    close with its SyncGroup still waiting for the leader's assignment, its LeaveGroup
    queued behind it on the connection and never sent (as on a broker, where it would
    wait behind a JoinGroup held at the join barrier)."""
    since: list[float] = []

    def settled() -> bool:
        if coordinator.admin(f"/groups/{group}")["state"].upper() != "STABLE":
            since.clear()
            return False
        if not since:
            since.append(time.monotonic())
        return time.monotonic() - since[0] >= for_s

    wait_for(settled, timeout_s, f"group {group} stable for {for_s} s", interval_s=0.25)


def group_summary(coordinator: Coordinator, group: str) -> str:
    """The coordinator's view of a connect group in one line, for a failure message."""
    try:
        view = coordinator.admin(f"/groups/{group}")
    except Exception as error:  # noqa: BLE001 - a failure message, whatever happened
        return f"no view of {group}: {error}"
    members = ", ".join(
        f"{m['worker_url']} epoch {m['member_epoch']} {m['state']}"
        f" {len(m['assigned'].get('tasks', []))} tasks"
        for m in view.get("members", []))
    return (f"{group} {view.get('state')} epochs {view.get('group_epoch')}/"
            f"{view.get('assignment_epoch')}, unassigned {view['unassigned']['names']}"
            f", members: {members}" if "unassigned" in view else f"{group}: {view}")

