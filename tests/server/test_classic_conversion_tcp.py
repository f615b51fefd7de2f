"""A live group converted both ways over TCP: kafka-python classic members (Connect's
encoding, cooperative) form a classic group; a new-protocol fake worker joins (upgrade:
the group becomes a connect group, the classic members carry on through the bridge), then
leaves (downgrade: a classic group again, rebalanced by its own leader). No unit is held by
two members at any poll, and each phase converges to every unit held once."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
import trio

from coordinator.config import ServerConfig
from coordinator.server.app import ServerHandle, run_server
from coordinator.units import Unit
from tests.server.test_classic_kafka_python import (
    GROUP,
    UNITS,
    ConnectMember,
    Holdings,
    converged,
    run_member,
)
from tests.server.test_metrics_catalogue import P, scrape

pytest.importorskip("kafka.coordinator.base")
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


async def test_upgrade_then_downgrade_with_kafka_python_members(nursery: trio.Nursery) -> None:
    from coordinator.workers.assignors import IncrementalCooperativeAssignor
    from coordinator.workers.registry import UnitRegistry
    from coordinator.workers.state import WorkerConfig
    from coordinator.workers.worker import Worker

    config = ServerConfig(assignment_interval_ms=0, assignor_offload_enable=False,
                          shutdown_timeout_ms=2_000, initial_rebalance_delay_ms=300,
                          classic_min_session_timeout_ms=1_000)
    handle: ServerHandle = await nursery.start(run_server, config, ("127.0.0.1", 0),
                                               ("127.0.0.1", 0))
    core = handle.runtime.core
    holdings = Holdings()
    members: list[ConnectMember] = []
    fake: list[Worker] = []
    stop = threading.Event()
    violations: list[str] = []

    def every_holder() -> list[tuple[str, frozenset[Unit]]]:
        return [(m.name, m.held) for m in members] + [(w.name, w.running_units) for w in fake]

    def check() -> frozenset[Unit]:
        seen: dict[Unit, str] = {}
        for name, held in every_holder():
            for unit in held:
                if unit in seen:
                    violations.append(f"{unit} held by {seen[unit]} and {name}")
                seen[unit] = name
        return frozenset(seen)

    async def wait_for(condition: Callable[[], bool], timeout_s: float) -> None:
        with trio.fail_after(timeout_s):
            while not condition():  # noqa: ASYNC110 - state of other threads and tasks
                await trio.sleep(0.05)

    def connect_stable() -> bool:
        group = core.store.groups.get(GROUP)
        return (check() == UNITS and group is not None and group.state == "STABLE"
                and all(held for _, held in every_holder()))

    def classic_stable() -> bool:
        classic = core.store.classic.groups.get(GROUP)
        return (check() == UNITS and classic is not None
                and classic.state.label == "Stable" and converged(members))

    async with trio.open_nursery() as workers, trio.open_nursery() as threads:
        try:
            for name in ("c1", "c2"):
                member = await trio.to_thread.run_sync(ConnectMember, name,
                                                       handle.kafka_port, holdings)
                members.append(member)
                threads.start_soon(trio.to_thread.run_sync, run_member, member, stop,
                                   members)
            await wait_for(classic_stable, 40)
            generation = core.store.classic.groups[GROUP].generation
            # A new-protocol worker joins: the classic group is upgraded.
            worker = Worker(WorkerConfig(group_id=GROUP, worker_url="http://f1:8083",
                                         rebalance_timeout_ms=5_000, session_timeout_ms=6_000,
                                         retry_backoff_ms=20, retry_backoff_max_ms=200),
                            UnitRegistry(), address=("127.0.0.1", handle.kafka_port),
                            assignors=[IncrementalCooperativeAssignor(300)],
                            request_timeout_ms=2_000, name="f1")
            fake.append(worker)
            await workers.start(worker.run)
            await wait_for(connect_stable, 40)
            assert GROUP not in core.store.classic.groups
            assert core.store.groups[GROUP].epoch > generation
            # It leaves: the group is classic again and its own leader rebalances it.
            worker.shutdown()
            await wait_for(lambda: GROUP not in core.store.groups, 20)
            fake.clear()
            await wait_for(classic_stable, 60)
            check()
        finally:
            stop.set()  # (the member threads cannot be cancelled, only told to stop)
            workers.cancel_scope.cancel()
    assert violations == [] and holdings.violations == []
    for member in members:
        await trio.to_thread.run_sync(member.leave)
    scraped = await scrape(handle)  # the real exposition
    assert scraped.by_label(P + "group_conversions_total", "direction") == {
        "upgrade": 1.0, "downgrade": 1.0}
    assert scraped.value(P + "classic_rebalances_total", reason="downgraded") == 1.0
    # The classic members' calls were answered by both types of group in turn.
    joins = scraped.by_label(P + "classic_join_seconds_count", "group_type")
    assert joins["classic"] >= 2 and joins["connect"] >= 2
