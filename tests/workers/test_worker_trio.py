"""Trio workers on a fake clock, talking in-process to the server's Runtime (no sockets)."""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from coordinator.assignors import load_assignors
from coordinator.config import ServerConfig
from coordinator.core.coordinator import GroupCoordinator
from coordinator.server.runtime import Runtime, TrioEpochClock
from coordinator.units import units_of
from coordinator.workers.assignors import IncrementalCooperativeAssignor
from coordinator.workers.registry import UnitRegistry
from coordinator.workers.state import Phase, WorkerConfig
from coordinator.workers.worker import Worker
from protocol.framing import (
    CONNECT_GROUP_HEARTBEAT,
    CONNECT_GROUP_INSTALL_ASSIGNMENT,
    CONNECT_GROUP_PREPARE_ASSIGNMENT,
)
from protocol.messages import ConnectGroupDescribeRequest

G = "trio-cluster"
CONNECTORS = {"A": 3, "B": 2}
ALL = units_of(CONNECTORS)
CONFIG = ServerConfig(assignment_interval_ms=0, assignor_offload_enable=False)


class InProcessClient:
    """KafkaClient's request API, answered by a Runtime; `hang` makes it stop answering."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.hang = False

    async def request(self, api_key: int, body: Any, api_version: int = 0) -> Any:
        if self.hang:
            await trio.sleep_forever()
        operation = {
            CONNECT_GROUP_HEARTBEAT: self.runtime.heartbeat,
            CONNECT_GROUP_PREPARE_ASSIGNMENT: self.runtime.prepare_assignment,
            CONNECT_GROUP_INSTALL_ASSIGNMENT: self.runtime.install_assignment,
        }[api_key]
        return await operation(body)

    async def aclose(self) -> None:
        pass


def settled(runtime: Runtime, workers: list[Worker]) -> bool:
    group = runtime.describe(ConnectGroupDescribeRequest(group_ids=(G,))).groups[0]
    running = [w.running_units for w in workers]
    return (group.group_state == "STABLE" and len(group.members) == len(workers)
            and frozenset().union(*running) == ALL and sum(map(len, running)) == len(ALL))


async def until(condition: Any, timeout_s: float = 120) -> None:
    with trio.fail_after(timeout_s):
        while not condition():  # noqa: ASYNC110 - polls state owned by other tasks
            await trio.sleep(0.05)


async def test_a_worker_the_coordinator_stops_answering_stops_its_units_in_time(
        autojump_clock: trio.testing.MockClock) -> None:
    registry = UnitRegistry()
    async with trio.open_nursery() as nursery:
        runtime = Runtime(GroupCoordinator(CONFIG, load_assignors(CONFIG.server_assignors)),
                          CONFIG, clock=TrioEpochClock(0))
        await nursery.start(runtime.run)
        for name, tasks in CONNECTORS.items():
            await runtime.put_connector(G, name, tasks)
        clients = {name: InProcessClient(runtime) for name in ("W1", "W2")}
        workers = []
        for name, client in clients.items():

            async def connect(client: InProcessClient = client) -> Any:
                return client

            config = WorkerConfig(group_id=G, worker_url=f"http://{name}:8083", member_id=name)
            worker = Worker(config, registry, connect=connect, name=name,
                            assignors=[IncrementalCooperativeAssignor(20_000)])
            workers.append(worker)
            await nursery.start(worker.run)
        await until(lambda: settled(runtime, workers))
        lost = workers[1].running_units
        assert lost

        # W2's coordinator connection hangs: requests time out, and W2 stops its units
        # once its session is over, before the coordinator could give them to W1.
        clients["W2"].hang = True
        await until(lambda: not workers[1].running_units, timeout_s=11)
        assert workers[1].state.phase is Phase.JOINING
        await until(lambda: settled(runtime, workers[:1]))
        assert workers[0].running_units == ALL

        # W2 is back: it rejoins and the group is balanced again.
        clients["W2"].hang = False
        await until(lambda: settled(runtime, workers))
        assert len(workers[1].running_units) in (2, 3)
        for worker in workers:
            worker.shutdown()
        await until(lambda: all(w.state.phase is Phase.LEFT for w in workers))
        nursery.cancel_scope.cancel()
    assert not registry.overlaps(), registry.overlaps()
    assert not registry.running()
