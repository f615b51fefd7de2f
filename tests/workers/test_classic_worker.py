"""The fake workers' classic mode over TCP: classic workers alone in a classic group, and
beside new-protocol workers in a connect group (the bridge). The unit registry records
every start and stop: no unit may ever run on two workers at once."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import trio

from coordinator.config import ServerConfig
from coordinator.server.app import ServerHandle, run_server
from coordinator.units import units_of
from coordinator.workers.assignors import IncrementalCooperativeAssignor
from coordinator.workers.classic import ClassicWorker, cooperative_plan
from coordinator.workers.registry import UnitRegistry
from coordinator.workers.state import WorkerConfig
from coordinator.workers.worker import Worker

pytestmark = pytest.mark.filterwarnings(
    "ignore:Exception ignored in. <socket.socket:pytest.PytestUnraisableExceptionWarning")

G = "classic-cluster"
CONNECTORS = {"A": 3, "B": 2}
ALL = units_of(CONNECTORS)
CONFIG = ServerConfig(assignment_interval_ms=0, assignor_offload_enable=False,
                      heartbeat_interval_ms=100, session_timeout_ms=2_000,
                      shutdown_timeout_ms=500, initial_rebalance_delay_ms=200,
                      classic_min_session_timeout_ms=1_000)


def test_cooperative_plan_never_grants_a_held_unit() -> None:
    owned = {"a": ALL, "b": frozenset()}
    plan = cooperative_plan(ALL, owned)
    assert plan["b"][0] == frozenset()  # everything is held: nothing granted yet
    assert len(plan["a"][1]) == 3 and not plan["a"][0]
    second = cooperative_plan(ALL, {"a": ALL - plan["a"][1], "b": frozenset()})
    assert second["b"][0] == plan["a"][1]


def classic(name: str, port: int, registry: UnitRegistry) -> ClassicWorker:
    return ClassicWorker(name, G, ("127.0.0.1", port), registry, lambda: ALL,
                         session_timeout_ms=2_000, heartbeat_interval_ms=100,
                         rebalance_timeout_ms=3_000)


async def settle(workers: list[object], timeout_s: float = 20) -> None:
    def running() -> list[frozenset[tuple[str, int]]]:
        return [w.running_units for w in workers]  # type: ignore[attr-defined]

    with trio.fail_after(timeout_s):
        while True:
            held = running()
            if frozenset().union(*held) == ALL and sum(map(len, held)) == len(ALL) \
                    and all(held):
                await trio.sleep(0.5)
                if running() == held:
                    return
            await trio.sleep(0.05)


async def test_classic_workers_in_a_classic_group() -> None:
    registry = UnitRegistry()
    async with trio.open_nursery() as nursery:
        server: ServerHandle = await nursery.start(run_server, CONFIG, ("127.0.0.1", 0),
                                                   ("127.0.0.1", 0))
        workers = [classic(f"c{i}", server.kafka_port, registry) for i in (1, 2)]
        for worker in workers:
            await nursery.start(worker.run)
        await settle(workers)
        assert G in server.runtime.core.store.classic.groups
        third = classic("c3", server.kafka_port, registry)
        await nursery.start(third.run)
        workers.append(third)
        await settle(workers)
        workers[0].stop()
        await settle(workers[1:])
        for worker in workers:
            worker.stop()
        await trio.sleep(0.5)
        server.stop()
    assert registry.overlaps() == []


def new_protocol_worker(port: int, registry: UnitRegistry) -> Worker:
    return Worker(WorkerConfig(group_id=G, worker_url="http://n1:8083",
                               rebalance_timeout_ms=3_000, session_timeout_ms=2_000,
                               retry_backoff_ms=20, retry_backoff_max_ms=200),
                  registry, address=("127.0.0.1", port),
                  assignors=[IncrementalCooperativeAssignor(300)],
                  request_timeout_ms=2_000, name="n1")


async def test_classic_and_new_protocol_workers_share_a_connect_group() -> None:
    registry = UnitRegistry()
    async with trio.open_nursery() as nursery:
        server: ServerHandle = await nursery.start(run_server, CONFIG, ("127.0.0.1", 0),
                                                   ("127.0.0.1", 0))
        for name, tasks in CONNECTORS.items():
            await server.runtime.put_connector(G, name, tasks)
        new = new_protocol_worker(server.kafka_port, registry)
        await nursery.start(new.run)
        workers: list[object] = [new]
        for name in ("c1", "c2"):
            worker = classic(name, server.kafka_port, registry)
            await nursery.start(worker.run)
            workers.append(worker)
        await settle(workers)
        group = server.runtime.core.store.groups[G]
        assert len(group.members) == 3 and G not in server.runtime.core.store.classic.groups
        for worker in workers[1:]:
            worker.stop()  # type: ignore[attr-defined]
        await settle(workers[:1])
        nursery.cancel_scope.cancel()
    assert registry.overlaps() == []


async def until(condition: Callable[[], bool], timeout_s: float = 10) -> None:
    with trio.fail_after(timeout_s):
        while True:
            if condition():
                return
            await trio.sleep(0.05)


async def test_classic_workers_get_a_classic_group_once_new_protocol_workers_left() -> None:
    """An empty group takes the type of its next joiner: the connect group its only
    new-protocol worker left becomes a classic group for the classic workers (the
    server's group.connect.classic.group.type is classic), with the join barrier."""
    registry = UnitRegistry()
    async with trio.open_nursery() as nursery:
        server: ServerHandle = await nursery.start(run_server, CONFIG, ("127.0.0.1", 0),
                                                   ("127.0.0.1", 0))
        core = server.runtime.core
        new = new_protocol_worker(server.kafka_port, registry)
        await nursery.start(new.run)
        await until(lambda: G in core.store.groups and bool(core.store.groups[G].members))
        new.shutdown()
        await until(lambda: not core.store.groups[G].members)
        assert G not in core.store.classic.groups  # an empty connect group
        workers = [classic(f"c{i}", server.kafka_port, registry) for i in (1, 2)]
        for worker in workers:
            await nursery.start(worker.run)
        await settle(workers)
        assert G not in core.store.groups and not core.store.classic.bridged
        group = core.store.classic.groups[G]
        assert sorted(group.members) == sorted(w.member_id for w in workers)
        assert group.state.label == "Stable"
        for worker in workers:
            worker.stop()
        await trio.sleep(0.5)
        server.stop()
    assert registry.overlaps() == []
