"""A follower bounce of three real Connect workers whose group is on the connect engine
(`group.connect.classic.group.type=connect`: the workers bridged): the workers that were
not bounced must neither stop nor start a task. Connect's leader holds the departed
worker's tasks back for its scheduled delay and then hands them to the returning worker,
as it does on a broker, only if it keeps its view of the previous assignment: it keeps it
while it assigned in every round it completed. The same holds after the coordinator was
killed and restarted on its data dir: it asks the same worker to assign."""

from __future__ import annotations

import time
import warnings
from pathlib import Path
from typing import Any

from bench.bounce import TASKS, bounce, connect_leader, create_connectors, pick
from coordinator.realkafka import (
    Broker,
    StopHung,
    all_running,
    start_coordinator,
    start_workers,
    wait_for,
)
from tests.interop.checks import (
    assert_no_task_on_two_workers,
    group_summary,
    wait_reconnected,
    wait_stable,
)

# The bounced worker must be back before it ends, or its tasks rightly go to the others:
# a worker's restart took 15 s on a loaded 2-core machine, so three times that. (A bounce
# lasts about this long: Connect hands the tasks held back out when the delay is over.)
SCHEDULED_DELAY_MS = 45_000


def test_a_follower_bounce_moves_no_task_on_the_other_workers(
        kafka_broker: Broker, tmp_path: Path, processes: list[Any]) -> None:
    _follower_bounce(kafka_broker, tmp_path, processes, restart_coordinator=False)


def test_after_a_coordinator_restart_the_leader_keeps_its_view_through_a_bounce(
        kafka_broker: Broker, tmp_path: Path, processes: list[Any]) -> None:
    """The coordinator is killed and restarted on its data dir first: it must ask the same
    worker to assign as before, or the new one starts from scratch and moves tasks."""
    _follower_bounce(kafka_broker, tmp_path, processes, restart_coordinator=True)


def _follower_bounce(kafka_broker: Broker, tmp_path: Path, processes: list[Any], *,
                     restart_coordinator: bool) -> None:
    data_dir = tmp_path / "coordinator-data" if restart_coordinator else None
    extra = ["--set", "group.connect.classic.group.type=connect"]
    coordinator = start_coordinator(tmp_path / "coordinator", kafka_broker.bootstrap,
                                    "owned-.*", extra=extra, data_dir=data_dir)
    processes.append(coordinator)
    # A group (and so internal topics and connectors) of each test's own on the shared
    # broker: Connect answers 409 to a connector its config topic already holds.
    name = "engine-bounce-restart" if restart_coordinator else "engine-bounce"
    group = f"owned-{name}"
    workers = start_workers(tmp_path, 3, coordinator.bootstrap, group, processes, overrides={
        "scheduled.rebalance.max.delay.ms": SCHEDULED_DELAY_MS})
    create_connectors(workers[0], name)
    for name, count in TASKS.items():
        wait_for(lambda name=name, count=count: all_running(workers[0], name, count), 120,
                 f"every task of {name} RUNNING")
    assert coordinator.admin(f"/groups/{group}")["type"] == "connect"
    wait_for(lambda: connect_leader(workers) is not None, 30, "a leader named in the logs")
    wait_stable(coordinator, group)
    if restart_coordinator:
        coordinator.process.kill()
        killed = time.time()
        coordinator = start_coordinator(
            coordinator.process.folder, kafka_broker.bootstrap, "owned-.*", extra=extra,
            port=coordinator.port, admin_port=coordinator.admin_port, data_dir=data_dir)
        processes.append(coordinator)
        assert coordinator.admin(f"/groups/{group}")["type"] == "connect"
        # Bounced before it heartbeats to the new process, a worker may close before its
        # LeaveGroup is sent: its old member would then hold its tasks for a session.
        wait_reconnected(coordinator, workers, killed)
        wait_stable(coordinator, group)
    for attempt in (1, 2):
        index = pick(workers, 0, "follower")
        leader = connect_leader(workers)
        assert leader is not None and leader != index
        leader_log = workers[leader].process.log_path
        logged_before = len(leader_log.read_text())
        try:
            result = bounce(workers, index, settle_s=3.0,
                            timeout_s=SCHEDULED_DELAY_MS / 1000 + 60)
            break
        except StopHung as hung:
            # Connect's own shutdown hung and the worker was killed: not the bounce this
            # test is about. Once the group has healed (the leader hands the killed
            # worker's tasks back after its delay), a second bounce.
            if attempt == 2:
                raise
            warnings.warn(f"{hung}; bouncing again", stacklevel=1)
            for name, count in TASKS.items():
                wait_for(lambda name=name, count=count: all_running(workers[0], name, count),
                         SCHEDULED_DELAY_MS / 1000 + 60, f"every task of {name} RUNNING")
            wait_stable(coordinator, group)
        except TimeoutError as error:
            raise TimeoutError(f"{error}; {group_summary(coordinator, group)}") from None
        finally:
            processes.append(workers[index])  # the bounced worker's new process, stopped too
    assert (result.stopped, result.started) == (0, 0), result.moved
    # Connect's leader kept its view of the previous assignment through the bounce (it
    # logs this at debug level, which the workers' logs keep for its assignor).
    assert "Clearing the view of previous assignments" not in \
        leader_log.read_text()[logged_before:]
    assert connect_leader(workers) == leader
    assert_no_task_on_two_workers(workers)
