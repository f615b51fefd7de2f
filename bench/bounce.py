"""`bench bounce`: what one worker's bounce costs a group of three real Connect workers.

Starts a KRaft broker from Apache Kafka's jars, then for each side in turn three Connect
workers running a verifiable source (6 tasks) and sink (2 tasks): Connect's own test
connectors where they are published for the workers' release, else the project's
(tests/interop/connectors, compiled against that release's jars):

- direct:  the workers against the broker, their group on the broker's own classic group
           coordinator;
- classic: through the coordinator in proxy mode, the group a classic group on it;
- connect: through the coordinator, the group on its connect engine
           (group.connect.classic.group.type=connect: the real workers are bridged).

Each bounce stops one worker cleanly (SIGTERM; by default one that is not Connect's
leader, whose memory of the last assignment is what holds a departed worker's tasks back)
and starts it again at once. It measures the time from the SIGTERM until every connector
and task is RUNNING again (Connect's REST status, polled on a worker that was not
bounced), and, from the logs of the two workers that were not bounced, how many task runs
stopped and started there between the SIGTERM and a few seconds after that moment.
Prints each bounce, the medians side by side and the ratio of the connect side's time to
the direct side's.

Each bounce first waits a random part of the workers' heartbeat interval (seeded, the same
series on every side). Connect's leader hears of a departure at its next heartbeat and
starts its scheduled delay then, so where that heartbeat falls after the leave is part of
every bounce's time; without the wait, the bench's own fixed schedule would set it, the
same way bounce after bounce, and differently on each side. The waits are spread evenly
over the interval (one in each of as many equal slices as there are bounces, shuffled):
where the workers' heartbeats fall relative to the bench's schedule differs by side, and
waits drawn independently can bunch, so that one side's bounces meet early heartbeats and
another's late ones; spread waits give every side the whole interval.

A worker that does not stop within 30 s of its SIGTERM is killed, and that bounce is not
counted: Connect 4.3.1 at times hangs on SIGTERM (Jetty's shutdown hook and Connect's own
stop its REST server at once; the log says "Unable to destroy"), on every side alike, in
about one bounce of a hundred here.

The workers are configured as Apache Kafka's own Connect system tests configure theirs
(scheduled.rebalance.max.delay.ms=60000, session.timeout.ms=10000,
offset.flush.interval.ms=5000) unless told otherwise. Needs a checkout (the jars' pom),
java and mvn (see coordinator/realkafka.py).
"""

from __future__ import annotations

import argparse
import math
import random
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from coordinator.realkafka import (
    Coordinator,
    InteropUnavailable,
    StopHung,
    VerifiableConnectors,
    Worker,
    all_running,
    connector_states,
    ensure_jars,
    kafka_version,
    log_time,
    require_java,
    restart_worker,
    start_broker,
    start_coordinator,
    start_workers,
    stop_together,
    task_intervals,
    verifiable_connectors,
    wait_answering,
    wait_for,
)

SIDES = ("direct", "classic", "connect")
TASKS = {"source": 6, "sink": 2}
# Apache Kafka's Connect system tests (tests/kafkatest/.../connect): their template's
# session timeout and flush interval, and the scheduled delay their distributed test sets.
SYSTEM_TEST_WORKERS: dict[str, object] = {
    "scheduled.rebalance.max.delay.ms": 60_000,
    "session.timeout.ms": 10_000,
    "offset.flush.interval.ms": 5_000,
}


@dataclass
class Bounce:
    leader: bool  # the worker bounced was Connect's leader
    seconds: float  # SIGTERM to every connector and task RUNNING again
    stopped: int  # task runs that ended on the workers not bounced
    started: int  # task runs that began there
    moved: list[str] = field(default_factory=list)
    joins: float = 0.0  # JoinGroups completed per worker not bounced


def _every_task_running(worker: Worker) -> bool:
    return all(all_running(worker, name, count) is not None for name, count in TASKS.items())


def _some_task_not_running(worker: Worker) -> bool:
    for name in TASKS:
        status = connector_states(worker, name)
        if status is None or status["connector"]["state"] != "RUNNING" or any(
                task["state"] != "RUNNING" for task in status["tasks"]):
            return True
    return False


def _describe_progress(watcher: Worker, workers: list[Worker], tasks: set[str],
                       since: float) -> str:
    """What a bounce still waits for: the connectors and tasks not RUNNING (by the
    watcher's REST status, with the worker each is on) and `tasks` not begun again."""
    waiting = []
    for name in TASKS:
        status = connector_states(watcher, name)
        if status is None:
            waiting.append(f"{name}: no status")
            continue
        if status["connector"]["state"] != "RUNNING":
            waiting.append(f"{name}: {status['connector']['state']}")
        waiting += [f"{name}-{task['id']}: {task['state']} on {task.get('worker_id')}"
                    for task in status["tasks"] if task["state"] != "RUNNING"]
    begun = _begun_since(workers, since)
    if tasks - begun:
        waiting.append(f"not begun again: {', '.join(sorted(tasks - begun))}")
    waiting += [f"{worker.process.name} exited ({worker.process.popen.returncode})"
                for worker in workers if worker.process.exited()]
    return "; ".join(waiting) or "nothing: it all ran at the last look"


def _runs_in(worker: Worker, since: float, until: float) -> tuple[int, int, list[str]]:
    """(runs that ended, runs that began) in [since, until] in the worker's log."""
    stopped = started = 0
    moved = []
    for task, runs in task_intervals(worker.process.log_text(), [], math.inf).items():
        for start, end in runs:
            if since <= start <= until:
                started += 1
                moved.append(f"+{task}")
            if since <= end <= until:
                stopped += 1
                moved.append(f"-{task}")
    return stopped, started, moved


JOINED = re.compile(r"Joined group at generation \d+ .*got assignment: Assignment\{.*"
                    r"leaderUrl='([^']*)'")
# Kafka's group clients log each JoinGroup that completed: the worker's own (its client
# id connect-HOST:PORT), not its sink tasks' consumers, whose groups are the broker's.
JOIN_COMPLETED = re.compile(r"^\[([^\]]+)\] \w+ \[Worker clientId=connect-[^\]]*\] "
                            r"Successfully joined group with generation")


def joins_in(worker: Worker, since: float, until: float) -> int:
    """The JoinGroups the worker completed in [since, until], by its log."""
    return joins_in_log(worker.process.log_text(), since, until)


def joins_in_log(log_text: str, since: float, until: float) -> int:
    count = 0
    for line in log_text.splitlines():
        match = JOIN_COMPLETED.match(line)
        if match is not None and since <= log_time(match.group(1)) <= until:
            count += 1
    return count


def connect_leader(workers: list[Worker]) -> int | None:
    """The index of the worker Connect's latest assignment names as leader (its logs)."""
    latest: tuple[str, str] | None = None
    for worker in workers:
        for line in worker.process.log_text().splitlines():
            match = JOINED.search(line)
            if match is not None and (latest is None or line[:25] >= latest[0]):
                latest = (line[:25], match.group(1))
    if latest is None:
        return None
    for index, worker in enumerate(workers):
        if latest[1].rstrip("/") == worker.url:
            return index
    return None


def pick(workers: list[Worker], number: int, which: str) -> int:
    """The worker to bounce: in rotation, or the leader, or the next worker that is not."""
    if which == "rotation":
        return number % len(workers)
    leader = connect_leader(workers)
    if leader is None:
        raise RuntimeError("no leader named in the workers' logs")
    if which == "leader":
        return leader
    followers = [index for index in range(len(workers)) if index != leader]
    return followers[number % len(followers)]


def _running_tasks(worker: Worker) -> set[str]:
    """The tasks whose last run in the worker's log has not ended."""
    return {task for task, runs in task_intervals(worker.process.log_text(), [],
                                                  math.inf).items()
            if runs and runs[-1][1] == math.inf}


def _begun_since(workers: list[Worker], since: float) -> set[str]:
    """The tasks that began a run after `since` in one of the workers' logs."""
    begun: set[str] = set()
    for worker in workers:
        for task, runs in task_intervals(worker.process.log_text(), [], math.inf).items():
            if any(start >= since for start, _ in runs):
                begun.add(task)
    return begun


def _started_again(workers: list[Worker], tasks: set[str], since: float) -> bool:
    """Whether each of `tasks` began a run after `since` in one of the workers' logs."""
    return tasks <= _begun_since(workers, since)


def bounce(workers: list[Worker], index: int, settle_s: float, timeout_s: float) -> Bounce:
    others = [worker for position, worker in enumerate(workers) if position != index]
    watcher = others[0]
    moving = _running_tasks(workers[index])
    began = time.time()
    try:
        workers[index].stop_cleanly()
    finally:  # (hung and killed, it is started again all the same)
        workers[index] = restart_worker(workers[index], wait=False)
    # The stopping worker marks its tasks UNASSIGNED as it shuts down; wait to see that
    # (or at most a few seconds) so that the status read next is not the one from before.
    try:
        wait_for(lambda: _some_task_not_running(watcher), 5, "a task not RUNNING",
                 interval_s=0.1)
    except TimeoutError:
        pass
    # On a busy machine the status topic can lag past that wait, and a status read from
    # before the bounce would end it at once: every task the bounced worker ran must also
    # have started again somewhere (its log or the others').
    wait_for(lambda: _every_task_running(watcher)
             and _started_again(workers, moving, began - 1),
             timeout_s, "every connector and task RUNNING after the bounce", interval_s=0.25,
             explain=lambda: _describe_progress(watcher, workers, moving, began - 1))
    seconds = time.time() - began
    # Its rounds end with the bounced worker's return: counted until it rejoined the group
    # and every task runs again (an eager group stops everything once more then), plus a
    # settling time for the stops, starts and JoinGroups that follow.
    wait_for(lambda: joins_in(workers[index], began, time.time()) > 0, timeout_s,
             "the bounced worker back in the group", interval_s=0.25)
    wait_for(lambda: _every_task_running(watcher), timeout_s,
             "every connector and task RUNNING after the return", interval_s=0.25)
    time.sleep(settle_s)
    wait_answering(workers[index])
    stopped = started = joins = 0
    moved: list[str] = []
    ended_at = time.time()
    for worker in others:
        ended, begun, names = _runs_in(worker, began, ended_at)
        stopped, started = stopped + ended, started + begun
        moved += names
        joins += joins_in(worker, began, ended_at)
    return Bounce(False, seconds, stopped, started, moved, joins / len(others))


def spread_waits(chance: random.Random, count: int, interval_s: float) -> list[float]:
    """`count` waits within `interval_s`, one at a random point of each of `count` equal
    slices of it, in a random order (see the module docstring)."""
    slice_s = interval_s / count
    waits = [(index + chance.random()) * slice_s for index in range(count)]
    chance.shuffle(waits)
    return waits


def create_connectors(worker: Worker, topic: str,
                      connectors: VerifiableConnectors | None = None) -> None:
    """The source and sink of `TASKS`, through `worker`'s REST API (Connect's test
    connectors unless told otherwise)."""
    connectors = connectors or verifiable_connectors()
    worker.rest("POST", "/connectors", {"name": "source", "config": {
        "connector.class": connectors.source, "tasks.max": str(TASKS["source"]),
        "topic": topic, "throughput": "20"}})
    worker.rest("POST", "/connectors", {"name": "sink", "config": {
        "connector.class": connectors.sink, "tasks.max": str(TASKS["sink"]),
        "topics": topic}})


def run_side(root: Path, side: str, broker_bootstrap: str, bounces: int, which: str,
             overrides: dict[str, object], settle_s: float, timeout_s: float,
             waits_s: list[float] | None = None, kafka_version: str | None = None,
             connectors: VerifiableConnectors | None = None) -> list[Bounce]:
    connectors = connectors or verifiable_connectors(kafka_version)
    started: list[Any] = []
    workers: list[Worker] = []
    coordinator: Coordinator | None = None
    try:
        if side == "direct":
            bootstrap, group = broker_bootstrap, f"bench-bounce-{side}"
        else:
            extra = ["--set", "group.connect.classic.group.type=connect"] \
                if side == "connect" else []
            coordinator = start_coordinator(root / "coordinator", broker_bootstrap,
                                            "owned-.*", extra=extra)
            started.append(coordinator)
            bootstrap, group = coordinator.bootstrap, f"owned-bench-bounce-{side}"
        workers = start_workers(root, 3, bootstrap, group, started,
                                overrides={**overrides, **connectors.worker_overrides},
                                kafka_version=kafka_version)
        create_connectors(workers[0], f"bench-bounce-{side}", connectors)
        wait_for(lambda: _every_task_running(workers[0]), timeout_s,
                 "every connector and task RUNNING", interval_s=0.5)
        if coordinator is not None:
            view = coordinator.admin(f"/groups/{group}")
            if view["type"] != ("connect" if side == "connect" else "classic"):
                raise RuntimeError(f"the group is a {view['type']} group on the coordinator")
        time.sleep(settle_s)
        results = []
        for number in range(bounces):
            if waits_s:
                time.sleep(waits_s[number % len(waits_s)])
            index = pick(workers, number, which)
            leader = connect_leader(workers)
            try:
                result = bounce(workers, index, settle_s, timeout_s)
            except StopHung as hung:
                print(f"  {side:8} bounce {number + 1}: not counted: {hung}", flush=True)
                wait_for(lambda: _every_task_running(workers[0]), timeout_s,
                         "every connector and task RUNNING after a worker hung", interval_s=0.5)
                continue
            result.leader = index == leader
            results.append(result)
            role = "the leader" if result.leader else "a follower"
            print(f"  {side:8} bounce {number + 1} ({role}): all RUNNING after "
                  f"{result.seconds:5.1f} s; "
                  f"on the other workers {result.stopped} task runs stopped, "
                  f"{result.started} started, {result.joins:.1f} JoinGroups each "
                  f"{' '.join(sorted(result.moved))}", flush=True)
        return results
    finally:
        # The workers as they are now (restarted ones included) and every one started.
        running = {id(worker.process): worker.process for worker in
                   [*workers, *(p for p in started if isinstance(p, Worker))]}
        stop_together(list(running.values()))
        for process in reversed(started):
            try:
                process.stop()
            except Exception:  # noqa: BLE001 - stop the others all the same
                pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="connect-coordinator bench bounce",
        description="What a worker bounce costs three real Connect workers: directly on "
                    "the broker's group coordinator, through this coordinator with the "
                    "group classic, and with the group on the connect engine.")
    parser.add_argument("--bounces", type=int, default=3, help="bounces per side")
    parser.add_argument("--sides", default=",".join(SIDES),
                        help=f"comma-separated, of {', '.join(SIDES)}")
    parser.add_argument("--scheduled-delay-ms", type=int,
                        default=int(str(SYSTEM_TEST_WORKERS["scheduled.rebalance.max.delay.ms"])),
                        help="the workers' scheduled.rebalance.max.delay.ms")
    parser.add_argument("--bounce", choices=("follower", "leader", "rotation"),
                        default="follower",
                        help="which worker to bounce: one that is not Connect's leader "
                             "(default), the leader (a new leader knows nothing of the "
                             "delay: it hands the departed worker's tasks out at once), "
                             "or each in turn")
    parser.add_argument("--protocol", choices=("sessioned", "compatible", "eager"),
                        default="sessioned", help="the workers' connect.protocol")
    parser.add_argument("--connect-version", default=None,
                        help="the Kafka release the workers run (default: the tests' "
                             "default release; any in the pom's interop releases)")
    parser.add_argument("--settle", type=float, default=5.0,
                        help="seconds after all RUNNING in which stops and starts still count")
    parser.add_argument("--timeout", type=float, default=180.0)
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the random wait (up to one heartbeat interval, spread "
                             "over it, the same series on every side) before each bounce")
    parser.add_argument("--work-dir", type=Path, default=None,
                        help="keep the processes' folders (logs) here instead of a "
                             "temporary folder")
    args = parser.parse_args(argv)
    sides = [side.strip() for side in args.sides.split(",") if side.strip()]
    unknown = [side for side in sides if side not in SIDES]
    if unknown or not sides or args.bounces < 1:
        parser.error(f"sides are {', '.join(SIDES)}; bounces at least 1")
    try:
        require_java()
        ensure_jars()
        ensure_jars(args.connect_version)
        connectors = verifiable_connectors(args.connect_version)
    except InteropUnavailable as error:
        print(f"bench bounce: {error}", file=sys.stderr)
        return 2
    overrides = dict(SYSTEM_TEST_WORKERS)
    overrides["scheduled.rebalance.max.delay.ms"] = args.scheduled_delay_ms
    overrides["connect.protocol"] = args.protocol
    print(f"3 workers of Kafka {args.connect_version or kafka_version()}, a source of "
          f"{TASKS['source']} tasks and a sink of {TASKS['sink']} ({connectors.source}, "
          f"{connectors.sink}); {args.bounces} clean bounces per side (the worker bounced: "
          f"{args.bounce}); workers: "
          + ", ".join(f"{key}={value}" for key, value in overrides.items()), flush=True)
    heartbeat_s = int(str(overrides.get("heartbeat.interval.ms", 3_000))) / 1000
    waits_s = spread_waits(random.Random(args.seed), args.bounces, heartbeat_s)
    results: dict[str, list[Bounce]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-bounce-") as scratch:
        root = args.work_dir.resolve() if args.work_dir is not None else Path(scratch)
        broker = start_broker(root / "broker")
        try:
            for side in sides:
                results[side] = run_side(root / side, side, broker.bootstrap, args.bounces,
                                         args.bounce, overrides, args.settle, args.timeout,
                                         waits_s, args.connect_version, connectors)
        finally:
            broker.stop()
    print("median       all RUNNING   stopped elsewhere   started elsewhere   "
          "JoinGroups per other worker")
    medians = {}
    for side, bounces in results.items():
        if not bounces:
            print(f"  {side:9}  no bounce counted")
            continue
        medians[side] = statistics.median(b.seconds for b in bounces)
        uncounted = f"  ({args.bounces - len(bounces)} not counted: the worker hung)" \
            if len(bounces) < args.bounces else ""
        print(f"  {side:9}  {medians[side]:9.1f} s  "
              f"{statistics.median(b.stopped for b in bounces):18}  "
              f"{statistics.median(b.started for b in bounces):18}  "
              f"{statistics.median(b.joins for b in bounces):26.1f}{uncounted}")
    if "direct" in medians:
        for side in ("classic", "connect"):
            if side in medians:
                print(f"  {side}/direct all RUNNING: {medians[side] / medians['direct']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
