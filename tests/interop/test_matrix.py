"""Connect workers of each release line the tests know (<interop.releases> in pom.xml: the
latest 3.9, 4.3 and 4.4 that Maven Central serves) x Connect's protocols (`eager`,
`sessioned`) x the group's type on the coordinator (classic, or the connect engine with
the workers bridged), through the coordinator in proxy mode: three workers form the group,
one is bounced cleanly and one is killed, and after each step every task runs, the
coordinator's view and Connect's agree, no task ran on two workers at once and no source
task's sequence numbers have a gap, at the source or at the sink.

The full matrix takes about a minute a cell: it runs with INTEROP_MATRIX=full. By default
one cell per release line runs (each line's first protocol and group type, in turn, so
that every protocol and type meets some release). Connect's test connectors are not
published for every release, so every cell runs the project's own source and sink
(tests/interop/connectors), compiled with javac against the release's jars at the first
cell of that release and put on the workers' plugin path."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from coordinator.realkafka import (
    Broker,
    Coordinator,
    InteropUnavailable,
    StopHung,
    Worker,
    all_running,
    ensure_jars,
    interop_releases,
    restart_worker,
    start_coordinator,
    start_workers,
    verifiable_connectors,
    wait_for,
)
from tests.interop.checks import assert_no_gaps, assert_no_task_on_two_workers, worker_id
from tests.programs import in_ci

PROTOCOLS = ("eager", "sessioned")
GROUP_TYPES = ("classic", "connect")
SOURCE_TASKS = 4
SINK_TASKS = 1


def cells() -> list[tuple[str, str, str]]:
    releases = sorted(interop_releases())
    every = [(release, protocol, group_type) for release in releases
             for protocol in PROTOCOLS for group_type in GROUP_TYPES]
    if os.environ.get("INTEROP_MATRIX", "").lower() == "full":
        return every
    combinations = [(protocol, group_type) for protocol in PROTOCOLS
                    for group_type in GROUP_TYPES]
    return [(release, *combinations[index % len(combinations)])
            for index, release in enumerate(releases)]


def held_by_worker(view: dict[str, Any]) -> dict[tuple[str, int], str]:
    """(connector, task) -> worker id, by the coordinator's view of either group type."""
    held = {}
    for member in view["members"]:
        units = member.get("holds") or member.get("assigned") or {}
        for task in units.get("tasks", []):
            held[(task["connector"], task["task"])] = worker_id(member["worker_url"])
    return held


def agreed(coordinator: Coordinator, workers: list[Worker], group: str,
           tasks: dict[str, int]) -> bool:
    view = coordinator.admin(f"/groups/{group}")
    if view["state"].upper() != "STABLE" or len(view["members"]) != len(workers):
        return False
    urls = {worker_id(member["worker_url"]) for member in view["members"]}
    if urls != {f"{w.host}:{w.rest_port}" for w in workers}:
        return False
    running = {}
    for name, count in tasks.items():
        status = all_running(workers[0], name, count)
        if status is None:
            return False
        running.update({(name, task["id"]): task["worker_id"] for task in status["tasks"]})
    return held_by_worker(view) == running


def wait_agreed(coordinator: Coordinator, workers: list[Worker], group: str,
                tasks: dict[str, int], what: str) -> None:
    wait_for(lambda: agreed(coordinator, workers, group, tasks), 180,
             f"{what}: every task RUNNING, the coordinator's view and Connect's agreeing",
             interval_s=1.0)


@pytest.fixture
def started() -> Iterator[list[Any]]:
    processes: list[Any] = []
    try:
        yield processes
    finally:
        for process in reversed(processes):
            try:
                process.stop()
            except Exception:  # noqa: BLE001 - stop the others all the same
                pass


@pytest.mark.parametrize(("release", "protocol", "group_type"), cells())
def test_a_release_protocol_and_group_type_through_a_bounce_and_a_kill(
        kafka_broker: Broker, tmp_path: Path, started: list[Any], release: str,
        protocol: str, group_type: str) -> None:
    ensure_jars(release)
    try:
        connectors = verifiable_connectors(release, own=True)
    except InteropUnavailable as error:  # no javac
        if in_ci():
            pytest.fail(f"{error} and CI is set: the interop tests must run in CI")
        pytest.skip(str(error))
    extra = ["--set", "group.connect.classic.group.type=connect"] \
        if group_type == "connect" else []
    coordinator = start_coordinator(tmp_path / "coordinator", kafka_broker.bootstrap,
                                    "owned-.*", extra=extra)
    started.append(coordinator)
    name = f"matrix-{release}-{protocol}-{group_type}".replace(".", "-")
    group = f"owned-{name}"
    workers = start_workers(tmp_path, 3, coordinator.bootstrap, group, started,
                            kafka_version=release,
                            overrides={"connect.protocol": protocol,
                                       **connectors.worker_overrides})
    workers[-1].rest("POST", "/connectors", {"name": "source", "config": {
        "connector.class": connectors.source, "tasks.max": str(SOURCE_TASKS),
        "topic": name, "throughput": "20"}})
    workers[-1].rest("POST", "/connectors", {"name": "sink", "config": {
        "connector.class": connectors.sink, "tasks.max": str(SINK_TASKS),
        "topics": name}})
    tasks = {"source": SOURCE_TASKS, "sink": SINK_TASKS}
    wait_agreed(coordinator, workers, group, tasks, "the group formed")
    assert coordinator.admin(f"/groups/{group}")["type"] == group_type
    # One clean bounce, then one SIGKILL (its member stays until its session ends).
    for step, kill in (("a clean bounce", False), ("a kill", True)):
        worker = workers[1]
        if kill:
            worker.process.kill()
        else:
            try:
                worker.stop_cleanly()
            except StopHung:  # Connect's own; a kill after all
                pass
        workers[1] = restart_worker(worker)
        started.append(workers[1])
        wait_agreed(coordinator, workers, group, tasks, f"after {step}")
    assert_no_task_on_two_workers(workers)
    time.sleep(3)  # a few records of every task
    assert_no_gaps(workers, SOURCE_TASKS, duplicates_allowed=True)
