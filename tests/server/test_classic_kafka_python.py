"""A real third-party classic client against the coordinator: members built on
kafka-python's `BaseCoordinator` (its JoinGroup/SyncGroup/Heartbeat state machine, its own
heartbeat thread), with protocol type `connect` and Connect's metadata and assignment
encoding, form a classic group of their own over TCP.

The members follow Connect's incremental cooperative protocol: a member's metadata carries
what it holds (its allocation); the leader never hands out a unit another member still
holds, it asks that member to revoke it first; a member that revokes rejoins at once. The
test checks at every poll of every member that no unit is held by two members, and that
the group converges to a balanced assignment of every unit, through joins and a leave.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio

from coordinator.config import ServerConfig
from coordinator.connect_protocol import (
    SESSIONED_VERSION,
    ConnectAssignment,
    WorkerMetadata,
    decode_assignment,
    decode_worker_metadata,
    encode_assignment,
    encode_worker_metadata,
)
from coordinator.server.app import ServerHandle, run_server
from coordinator.units import Unit, units_of

kafka_base = pytest.importorskip("kafka.coordinator.base")
kafka_net = pytest.importorskip("kafka.net.compat")

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

CONFIG = ServerConfig(assignment_interval_ms=0, assignor_offload_enable=False,
                      shutdown_timeout_ms=2_000, initial_rebalance_delay_ms=300,
                      classic_min_session_timeout_ms=1_000)
UNITS = units_of({"source": 4, "sink": 3})  # 9 units: 2 connectors and 7 tasks
GROUP = "connect-cluster"


class Holdings:
    """Who holds which unit, across every member's thread; a double hold is recorded."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.holder: dict[Unit, str] = {}
        self.violations: list[str] = []

    def take(self, member: str, units: frozenset[Unit]) -> None:
        with self.lock:
            for unit in units:
                other = self.holder.get(unit)
                if other is not None and other != member:
                    self.violations.append(f"{unit} given to {member} while {other} holds it")
                self.holder[unit] = member

    def drop(self, member: str, units: frozenset[Unit]) -> None:
        with self.lock:
            for unit in units:
                if self.holder.get(unit) == member:
                    del self.holder[unit]

    def check(self, members: list[ConnectMember]) -> None:
        """Every member's own view, at a poll: no unit in two members' sets."""
        with self.lock:
            seen: dict[Unit, str] = {}
            for member in members:
                for unit in member.held:
                    if unit in seen and seen[unit] != member.name:
                        self.violations.append(f"{unit} held by {seen[unit]} and {member.name}")
                    seen[unit] = member.name


def balanced_assignment(owned: dict[str, frozenset[Unit]]
                        ) -> dict[str, tuple[frozenset[Unit], frozenset[Unit]]]:
    """member -> (newly granted, to revoke): keep what fits, revoke the surplus, grant
    only units nobody holds (a revoked unit goes out in a later round)."""
    members = sorted(owned)
    base, extra = divmod(len(UNITS), len(members))
    capacity = {m: base + (1 if i < extra else 0) for i, m in enumerate(members)}
    held_anywhere = set().union(*owned.values()) if owned else set()
    keep = {m: frozenset(sorted(owned[m] & UNITS)[:capacity[m]]) for m in members}
    revoke = {m: owned[m] - keep[m] for m in members}
    free = sorted(UNITS - held_anywhere)
    plan = {}
    for member in members:
        room = capacity[member] - len(keep[member])
        granted, free = frozenset(free[:max(room, 0)]), free[max(room, 0):]
        plan[member] = (granted, revoke[member])
    return plan


class ConnectMember(kafka_base.BaseCoordinator):  # type: ignore[misc]
    """A worker's group membership, as Connect's `WorkerCoordinator` does it (cooperative)."""

    def __init__(self, name: str, port: int, holdings: Holdings) -> None:
        self.name = name
        self.held: frozenset[Unit] = frozenset()
        self.holdings = holdings
        self.generation_seen = -1
        self.joined_as = ""
        self.client = kafka_net.KafkaNetClient(bootstrap_servers=f"127.0.0.1:{port}",
                                               client_id=name)
        self.client._manager._net.start()
        if self.client._manager.broker_version_data is None:
            self.client._manager.bootstrap(10_000)
        super().__init__(self.client, group_id=GROUP, session_timeout_ms=6_000,
                         heartbeat_interval_ms=300, max_poll_interval_ms=10_000,
                         retry_backoff_ms=50,
                         api_version=self.client._manager.broker_version)

    def protocol_type(self) -> str:
        return "connect"

    def group_protocols(self) -> list[tuple[str, bytes]]:
        allocation = ConnectAssignment(SESSIONED_VERSION, assigned=self.held)
        metadata = WorkerMetadata(SESSIONED_VERSION, f"http://{self.name}:8083", 0, allocation)
        return [("sessioned", encode_worker_metadata(metadata))]

    def _perform_assignment(self, leader_id: str, protocol: str,
                            members: list[Any]) -> dict[str, bytes]:
        assert protocol == "sessioned"
        owned = {}
        for member in members:
            metadata = decode_worker_metadata(member.metadata)
            owned[member.member_id] = metadata.allocation.assigned \
                if metadata.allocation else frozenset()
        return {
            member_id: encode_assignment(ConnectAssignment(
                SESSIONED_VERSION, leader=leader_id, leader_url=f"http://{self.name}:8083",
                assigned=granted, revoked=revoked))
            for member_id, (granted, revoked) in balanced_assignment(owned).items()}

    async def _on_join_complete_async(self, generation: int, member_id: str, protocol: str,
                                      assignment_bytes: bytes) -> None:
        assignment = decode_assignment(assignment_bytes)
        # Revoked units are stopped before anything new starts (Connect's onRevoked).
        self.holdings.drop(self.name, assignment.revoked)
        self.held = self.held - assignment.revoked
        self.holdings.take(self.name, assignment.assigned)
        self.held = self.held | assignment.assigned
        self.generation_seen = generation
        self.joined_as = member_id
        if assignment.revoked:
            self.request_rejoin()  # the next JoinGroup's allocation acknowledges it

    def leave(self) -> None:
        self.holdings.drop(self.name, self.held)
        self.held = frozenset()
        self.close(timeout_ms=5_000)
        self.client.close()


def run_member(member: ConnectMember, stop: threading.Event, members: list[ConnectMember]
               ) -> None:
    while not stop.is_set():
        member.ensure_active_group(timeout_ms=500)
        member.poll_heartbeat()
        member.holdings.check(members)
        time.sleep(0.05)


def converged(members: list[ConnectMember]) -> bool:
    held = [m.held for m in members]
    sizes = sorted(len(h) for h in held)
    return (frozenset().union(*held) == UNITS and sum(sizes) == len(UNITS)
            and sizes[-1] - sizes[0] <= 1 and len({m.generation_seen for m in members}) == 1
            and not any(m.need_rejoin() for m in members))


@pytest.fixture
async def server(nursery: trio.Nursery) -> AsyncIterator[ServerHandle]:
    handle: ServerHandle = await nursery.start(run_server, CONFIG, ("127.0.0.1", 0),
                                               ("127.0.0.1", 0))
    yield handle
    handle.stop()


async def _wait_converged(members: list[ConnectMember], timeout_s: float) -> None:
    with trio.fail_after(timeout_s):
        while not converged(members):  # noqa: ASYNC110 - state lives in other threads
            await trio.sleep(0.1)
        await trio.sleep(1.0)  # and it stays so (no rebalance follows)
        assert converged(members)


async def _admin_holds(server: ServerHandle) -> dict[str, frozenset[Unit]]:
    def get() -> Any:
        url = f"http://127.0.0.1:{server.admin_port}/groups/{GROUP}"
        with urllib.request.urlopen(url, timeout=10) as response:
            return json.loads(response.read())

    view = await trio.to_thread.run_sync(get)
    assert view["type"] == "classic" and view["state"] == "STABLE"
    return {member["worker_url"]: frozenset(
        {(name, -1) for name in member["holds"]["connectors"]}
        | {(task["connector"], task["task"]) for task in member["holds"]["tasks"]})
        for member in view["members"]}


async def test_kafka_python_members_converge_without_double_holding(
        server: ServerHandle) -> None:
    holdings = Holdings()
    members: list[ConnectMember] = []
    stops: dict[str, threading.Event] = {}

    async def start(name: str, nursery: trio.Nursery) -> ConnectMember:
        member = await trio.to_thread.run_sync(ConnectMember, name, server.kafka_port,
                                               holdings)
        members.append(member)
        stops[name] = threading.Event()
        nursery.start_soon(trio.to_thread.run_sync, run_member, member, stops[name], members)
        return member

    async with trio.open_nursery() as nursery:
        for name in ("w1", "w2"):
            await start(name, nursery)
        await _wait_converged(members, 40)
        generation = members[0].generation_seen
        await start("w3", nursery)  # a third worker: units move to it by revocation
        await _wait_converged(members, 40)
        assert members[0].generation_seen > generation
        # The admin API reads who holds what from the same bytes: it agrees with them.
        assert await _admin_holds(server) == {f"http://{m.name}:8083": m.held
                                              for m in members}
        leaving = members[1]
        stops[leaving.name].set()
        await trio.sleep(0.3)
        members.remove(leaving)
        await trio.to_thread.run_sync(leaving.leave)  # its units go to the others
        await _wait_converged(members, 40)
        for stop in stops.values():
            stop.set()
    for member in members:
        await trio.to_thread.run_sync(member.leave)
    assert holdings.violations == []
    assert len(members) == 2


async def test_kafka_python_members_in_a_connect_group_beside_new_protocol_workers(
        nursery: trio.Nursery) -> None:
    """The bridge: classic members and new-protocol fake workers in one connect group."""
    from coordinator.workers.assignors import IncrementalCooperativeAssignor
    from coordinator.workers.registry import UnitRegistry
    from coordinator.workers.state import WorkerConfig
    from coordinator.workers.worker import Worker

    config = ServerConfig(assignment_interval_ms=0, assignor_offload_enable=False,
                          shutdown_timeout_ms=2_000, classic_min_session_timeout_ms=1_000)
    handle: ServerHandle = await nursery.start(run_server, config, ("127.0.0.1", 0),
                                               ("127.0.0.1", 0))
    await handle.runtime.put_connector(GROUP, "source", 4)  # a connect group
    await handle.runtime.put_connector(GROUP, "sink", 3)
    holdings = Holdings()
    registry = UnitRegistry()
    fake = [Worker(WorkerConfig(group_id=GROUP, worker_url=f"http://{name}:8083",
                                rebalance_timeout_ms=5_000, session_timeout_ms=6_000,
                                retry_backoff_ms=20, retry_backoff_max_ms=200),
                   registry, address=("127.0.0.1", handle.kafka_port),
                   assignors=[IncrementalCooperativeAssignor(300)], request_timeout_ms=2_000,
                   name=name) for name in ("f1",)]
    members: list[ConnectMember] = []
    stop = threading.Event()
    violations: list[str] = []

    def check() -> bool:
        seen: dict[Unit, str] = {}
        holders = [(m.name, m.held) for m in members] + [
            (w.name, w.running_units) for w in fake]
        for name, held in holders:
            for unit in held:
                if unit in seen:
                    violations.append(f"{unit} held by {seen[unit]} and {name}")
                seen[unit] = name
        group = handle.runtime.core.store.groups[GROUP]
        # Connect's assignor balances connectors and tasks apart: every worker gets some.
        return (frozenset(seen) == UNITS and all(held for _, held in holders)
                and group.state == "STABLE"
                and all(m.joined_as in group.members
                        and group.members[m.joined_as].current.assigned == m.held
                        for m in members))

    async with trio.open_nursery() as workers, trio.open_nursery() as threads:
        try:
            for worker in fake:
                await workers.start(worker.run)
            for name in ("c1", "c2"):
                member = await trio.to_thread.run_sync(ConnectMember, name,
                                                       handle.kafka_port, holdings)
                members.append(member)
                threads.start_soon(trio.to_thread.run_sync, run_member, member, stop,
                                   members)
            with trio.fail_after(40):
                while not check():  # noqa: ASYNC110 - state of other threads and tasks
                    await trio.sleep(0.05)
        finally:
            stop.set()  # (the member threads cannot be cancelled, only told to stop)
            workers.cancel_scope.cancel()
    assert violations == []
    from coordinator.server.admin import group_view
    view = group_view(handle.runtime, GROUP)
    assert view["type"] == "connect"
    assert sorted(m["protocol"] for m in view["members"]) == ["classic", "classic", "connect"]
    leaving = members.pop()
    await trio.to_thread.run_sync(leaving.leave)
    for member in members:
        await trio.to_thread.run_sync(member.leave)
    assert violations == []
