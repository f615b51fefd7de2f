"""Trio workers against the real coordinator over TCP."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import trio

from coordinator.config import ServerConfig
from coordinator.server.app import ServerHandle, run_server
from coordinator.units import units_of
from coordinator.workers.assignors import IncrementalCooperativeAssignor
from coordinator.workers.registry import UnitRegistry
from coordinator.workers.state import Phase, WorkerConfig
from coordinator.workers.worker import Worker
from protocol.messages import ConnectGroupDescribeRequest
from protocol.messages.connect_group_describe_response import DescribedGroup

# The server leaks its listening socket when it stops (coordinator/server/kafka.py closes
# listeners after a point its cancellation can skip; reported to the server's owner). Only
# that warning is ignored here; the workers' own sockets are closed.
pytestmark = pytest.mark.filterwarnings(
    "ignore:Exception ignored in. <socket.socket:pytest.PytestUnraisableExceptionWarning")

G = "tcp-cluster"
CONNECTORS = {"A": 3, "B": 2}
ALL = units_of(CONNECTORS)
CONFIG = ServerConfig(assignment_interval_ms=0, assignor_offload_enable=False,
                      heartbeat_interval_ms=100, session_timeout_ms=1_000,
                      shutdown_timeout_ms=500)


async def start_server(nursery: trio.Nursery, port: int = 0) -> ServerHandle:
    handle: ServerHandle = await nursery.start(run_server, CONFIG, ("127.0.0.1", port),
                                               ("127.0.0.1", 0))
    return handle


def describe(handle: ServerHandle) -> DescribedGroup:
    group: DescribedGroup = handle.runtime.describe(
        ConnectGroupDescribeRequest(group_ids=(G,))).groups[0]
    return group


def new_worker(name: str, port: int, registry: UnitRegistry, delay_ms: int = 300) -> Worker:
    config = WorkerConfig(group_id=G, worker_url=f"http://{name}:8083",
                          rebalance_timeout_ms=2_000, session_timeout_ms=1_000,
                          retry_backoff_ms=20, retry_backoff_max_ms=200)
    return Worker(config, registry, address=("127.0.0.1", port),
                  assignors=[IncrementalCooperativeAssignor(delay_ms)],
                  request_timeout_ms=500, name=name)


async def eventually(condition: Callable[[], bool], timeout_s: float = 10) -> None:
    with trio.fail_after(timeout_s):
        while not condition():  # noqa: ASYNC110 - polls state owned by other tasks
            await trio.sleep(0.02)


def settled(handle: ServerHandle, registry: UnitRegistry, workers: list[Worker]) -> bool:
    group = describe(handle)
    running = [w.running_units for w in workers]
    return (group.group_state == "STABLE" and len(group.members) == len(workers)
            and frozenset().union(*running) == ALL and sum(map(len, running)) == len(ALL))


async def test_two_workers_reach_stable_over_tcp() -> None:
    registry = UnitRegistry()
    async with trio.open_nursery() as nursery:
        server = await start_server(nursery)
        for name, tasks in CONNECTORS.items():
            await server.runtime.put_connector(G, name, tasks)
        workers = [new_worker(name, server.kafka_port, registry) for name in ("W1", "W2")]
        for worker in workers:
            await nursery.start(worker.run)
        await eventually(lambda: settled(server, registry, workers))
        sizes = sorted(len(w.running_units) for w in workers)
        assert sizes == [3, 4]  # a connector each, the five tasks split 3 / 2
        epochs = {w.state.member_epoch for w in workers}
        assert epochs == {describe(server).group_epoch}

        # W2 shuts down cleanly (units first, then the leave); after the delay W1 runs all.
        workers[1].shutdown()
        await eventually(lambda: workers[1].state.phase is Phase.LEFT)
        await eventually(lambda: settled(server, registry, workers[:1]))
        assert workers[0].running_units == ALL
        for worker in workers:
            worker.shutdown()
        server.stop()
    assert not registry.overlaps(), registry.overlaps()
    assert not registry.running()


async def test_workers_wait_for_the_coordinator_and_survive_its_restart() -> None:
    registry = UnitRegistry()
    async with trio.open_nursery() as nursery:
        # Find a free port, then start the workers before anything listens on it.
        probe = await start_server(nursery)
        port = probe.kafka_port
        probe.stop()
        await trio.sleep(0.2)
        workers = [new_worker(name, port, registry) for name in ("W1", "W2", "W3")]
        for worker in workers:
            await nursery.start(worker.run)
        await trio.sleep(0.3)  # they retry with backoff meanwhile
        assert all(w.state.phase is Phase.JOINING for w in workers)

        async with trio.open_nursery() as server_nursery:
            server = await start_server(server_nursery, port)
            for name, tasks in CONNECTORS.items():
                await server.runtime.put_connector(G, name, tasks)
            await eventually(lambda: settled(server, registry, workers))
            server.stop()

        # The coordinator is gone: every worker stops its units once its session is lost.
        await eventually(lambda: all(not w.running_units for w in workers), timeout_s=5)

        # A fresh coordinator (its memory was not durable): the workers join it anew.
        async with trio.open_nursery() as server_nursery:
            server = await start_server(server_nursery, port)
            for name, tasks in CONNECTORS.items():
                await server.runtime.put_connector(G, name, tasks)
            await eventually(lambda: settled(server, registry, workers))
            for worker in workers:
                worker.shutdown()
            await eventually(lambda: all(w.state.phase is Phase.LEFT for w in workers))
            server.stop()
    assert not registry.overlaps(), registry.overlaps()
