"""Migration with real workers: three unmodified Connect workers form a classic group owned
by the coordinator (proxy mode) and run a VerifiableSource and a VerifiableSink; then
simulated workers of the new protocol join the same group, which converts to a connect
group with the real workers bridged (upgrade), and leave again one after the other: after
the first leave Connect's leader hands the departed worker's units out once its delay is
over, after the last one the group converts back to a classic group (downgrade). The real
tasks run throughout.

The simulated workers cannot run Connect tasks, but they hold the units they are given
(from the moment the coordinator grants one until they release it), so their runs count
in the check that no (connector, task) ever ran on two workers at overlapping times. They
learn the group's units as any new-protocol worker does, from the coordinator: the group's
units come from its workers' own assignments (the real leader reads them from its config
topic).
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import time
from pathlib import Path
from typing import Any

from coordinator.cli import module_command
from coordinator.realkafka import (
    REPO_ROOT,
    VERIFIABLE_SINK,
    VERIFIABLE_SOURCE,
    Broker,
    TaskRuns,
    start_coordinator,
    start_workers,
    stop_together,
    wait_for,
)
from coordinator.units import CONNECTOR
from coordinator.workers.host import WorkerSpec
from tests.interop.checks import (
    assert_no_gaps,
    assert_no_task_on_two_workers,
    describe_runs,
    wait_all_running_and_agreed,
)
from tests.interop.test_proxy import _metric

GROUP = "owned-migration"
TOPIC = "migration-verifiable"
TASKS = {"source": 6, "sink": 2}
SIMULATED = ("simulated-1", "simulated-2")


class SimulatedWorkers:
    """New-protocol simulated workers in a child process (`coordinator.workers.host`),
    driven one operation at a time through its JSON lines; `stop()` ends it by its PID."""

    def __init__(self, folder: Path, spec: WorkerSpec, names: tuple[str, ...]) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        setup = json.dumps({"spec": spec.to_json(), "names": list(names), "seed": 0})
        with open(folder / "stderr.txt", "ab") as errors:
            self.popen = subprocess.Popen(
                module_command("coordinator.workers.host", setup), stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=errors, start_new_session=True,
                env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)))
        self._ids = 0
        self._buffered = b""

    def call(self, op: str, timeout_s: float = 30.0, **args: Any) -> Any:
        assert self.popen.stdin is not None and self.popen.stdout is not None
        self._ids += 1
        self.popen.stdin.write(json.dumps({"id": self._ids, "op": op, "args": args}).encode()
                               + b"\n")
        self.popen.stdin.flush()
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buffered:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self.popen.stdout], [], [], max(left, 0))
            if not ready:
                raise TimeoutError(f"the simulated workers did not answer {op!r}")
            chunk = os.read(self.popen.stdout.fileno(), 65536)
            if not chunk:
                raise RuntimeError("the simulated workers' process ended")
            self._buffered += chunk
        line, self._buffered = self._buffered.split(b"\n", 1)
        answer = json.loads(line)
        assert answer["id"] == self._ids, answer
        if "error" in answer:
            raise RuntimeError(f"simulated workers: {answer['error']}")
        return answer["result"]

    def task_runs(self) -> dict[str, TaskRuns]:
        """Each worker's task runs named as Connect names tasks (`source-3`), in epoch
        seconds: the runs are stamped with the machine's monotonic clock."""
        monotonic_to_epoch = time.time() - time.monotonic()
        now = time.time()
        by_worker: dict[str, TaskRuns] = {}
        for run in self.call("runs"):
            name, task = run["unit"]
            if task == CONNECTOR:
                continue  # the logs' check covers tasks
            stopped = run["stopped_ms"]
            span = (run["started_ms"] / 1000 + monotonic_to_epoch,
                    stopped / 1000 + monotonic_to_epoch if stopped is not None else now)
            by_worker.setdefault(f"simulated:{run['worker']}", {}).setdefault(
                f"{name}-{task}", []).append(span)
        return by_worker

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(timeout=30)
        for pipe in (self.popen.stdin, self.popen.stdout):
            if pipe is not None:
                pipe.close()


def _group_view(coordinator: Any) -> dict[str, Any]:
    view: dict[str, Any] = coordinator.admin(f"/groups/{GROUP}")
    return view


def _every_unit() -> set[str]:
    units = set(TASKS)
    units.update(f"{name}-{task}" for name, count in TASKS.items() for task in range(count))
    return units


def _held(assigned: dict[str, Any]) -> set[str]:
    return set(assigned["connectors"]) | {f"{task['connector']}-{task['task']}"
                                          for task in assigned["tasks"]}


def _mixed_and_settled(coordinator: Any, simulated: int) -> dict[str, Any] | None:
    """The connect group of the three real workers and `simulated` simulated ones once
    every member holds its whole target, every connector and task is held by someone
    (units its leader held back included: the coordinator knows a group's units only
    from its workers' assignments) and each simulated worker holds some task."""
    view = _group_view(coordinator)
    if view["type"] != "connect" or len(view["members"]) != 3 + simulated:
        return None
    if view["group_epoch"] != view["assignment_epoch"]:
        return None
    held: set[str] = set()
    for member in view["members"]:
        if member["assigned"] != member["target"] or _held(member["pending_revocation"]):
            return None
        if member["protocol"] == "connect" and not member["assigned"]["tasks"]:
            return None
        held |= _held(member["assigned"])
    return view if held == _every_unit() else None


def test_classic_group_of_real_workers_upgraded_and_downgraded_by_new_protocol_workers(
        kafka_broker: Broker, tmp_path: Path, processes: list[Any]) -> None:
    coordinator = start_coordinator(tmp_path / "coordinator", kafka_broker.bootstrap,
                                    "owned-.*")
    processes.append(coordinator)
    workers = start_workers(tmp_path, 3, coordinator.bootstrap, GROUP, processes)
    workers[0].rest("POST", "/connectors", {"name": "source", "config": {
        "connector.class": VERIFIABLE_SOURCE, "tasks.max": str(TASKS["source"]),
        "topic": TOPIC, "throughput": "20"}})
    workers[0].rest("POST", "/connectors", {"name": "sink", "config": {
        "connector.class": VERIFIABLE_SINK, "tasks.max": str(TASKS["sink"]),
        "topics": TOPIC}})
    before = wait_all_running_and_agreed(coordinator, workers, GROUP, TASKS)["view"]
    assert before["type"] == "classic"

    # Upgrade: new-protocol workers join the classic group of the real ones.
    spec = WorkerSpec(host=coordinator.host, port=coordinator.port, group=GROUP,
                      assignor="client:incremental-cooperative", session_timeout_ms=10_000,
                      rebalance_timeout_ms=60_000,
                      rebalance_delay_ms=int(str(workers[0].properties[
                          "scheduled.rebalance.max.delay.ms"])))
    simulated = SimulatedWorkers(tmp_path / "simulated", spec, SIMULATED)
    processes.append(simulated)
    for name in SIMULATED:
        simulated.call("start", name=name)
    mixed = wait_for(lambda: _mixed_and_settled(coordinator, 2), 120,
                     "the group to be a connect group of 5 settled members, each simulated "
                     "worker holding tasks", interval_s=1.0)
    protocols = sorted(member["protocol"] for member in mixed["members"])
    assert protocols == ["classic"] * 3 + ["connect"] * 2, mixed
    status = simulated.call("status")
    assert status["failures"] == [], status
    time.sleep(3)  # the real workers run what they kept, the simulated ones hold theirs

    # One leaves: the group stays a connect group. Connect's leader holds the departed
    # worker's units back for scheduled.rebalance.max.delay.ms, then hands them out.
    simulated.call("stop", name=SIMULATED[1])
    wait_for(lambda: _mixed_and_settled(coordinator, 1), 120,
             "the units of the simulated worker that left to be held again", interval_s=1.0)

    # Downgrade: the last new-protocol worker leaves (it stops its units first).
    simulated.call("close", timeout_s=60)
    after = wait_all_running_and_agreed(coordinator, workers, GROUP, TASKS)["view"]
    assert after["type"] == "classic" and len(after["members"]) == 3
    metrics = coordinator.metrics()
    for direction in ("upgrade", "downgrade"):
        assert _metric(metrics, "connect_coordinator_group_conversions_total",
                       direction=direction) == 1
    time.sleep(3)  # a few records of every task after the last move
    runs = simulated.task_runs()
    assert runs and all(runs.values()), "the simulated workers held no task"
    assert_no_gaps(workers, TASKS["source"], duplicates_allowed=False)
    assert_no_task_on_two_workers(workers, others=runs), \
        {name: describe_runs(task_runs) for name, task_runs in runs.items()}
    stop_together([worker.process for worker in workers])
