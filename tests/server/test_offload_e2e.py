"""Offloaded server assignor runs end to end: a real server, real TCP, real worker processes.

The assignor object is pickled to a trio-parallel worker process, so the test assignors are
module-level classes here (the worker imports this module by name to unpickle them) and are
handed to the server by patching ``coordinator.server.app.load_assignors``.
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
from structlog.testing import capture_logs

import coordinator.server.app as app_module
from coordinator.assignors import builtin_assignors
from coordinator.assignors.api import AssignmentResult, AssignmentSpec, ServerAssignor
from coordinator.assignors.round_robin import RoundRobinAssignor
from coordinator.client import KafkaClient
from coordinator.config import ServerConfig
from coordinator.core.group import units_to_wire
from coordinator.server.app import ServerHandle, run_server
from coordinator.units import CONNECTOR, Unit
from protocol.errors import ErrorCode
from protocol.messages import ConnectGroupHeartbeatRequest
from tests.core.context import wire_units

from .conftest import http

G = "offload-group"
HEARTBEAT = 1000
SLOW_SECONDS = 1.5
# A request the run held would wait for the whole run; one answered beside it takes a few
# milliseconds, or a good part of a second on a machine busy with other work.
NOT_HELD_S = SLOW_SECONDS * 2 / 3


class SlowAssignor:
    """Round-robin, but a run with two or more members first sleeps SLOW_SECONDS."""

    name = "slow"

    def assign(self, spec: AssignmentSpec) -> AssignmentResult:
        if len(spec.members) >= 2:
            time.sleep(SLOW_SECONDS)
        return RoundRobinAssignor().assign(spec)


class CrashingAssignor:
    """Round-robin for a lone member; raises as soon as a second member shows up."""

    name = "crashing"

    def assign(self, spec: AssignmentSpec) -> AssignmentResult:
        if len(spec.members) >= 2:
            raise RuntimeError("the crashing assignor crashed on purpose")
        return RoundRobinAssignor().assign(spec)


def _config(**overrides: Any) -> ServerConfig:
    values: dict[str, Any] = {
        "assignment_interval_ms": 0,
        "assignor_offload_enable": True,
        "heartbeat_interval_ms": 1_000,
        "session_timeout_ms": 30_000,
        "shutdown_timeout_ms": 2_000,
    }
    values.update(overrides)
    return ServerConfig(**values)


@asynccontextmanager
async def serving(
    config: ServerConfig, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[ServerHandle]:
    extra: dict[str, ServerAssignor] = {"slow": SlowAssignor(), "crashing": CrashingAssignor()}

    def load(names: Iterable[str]) -> dict[str, ServerAssignor]:
        known = {**builtin_assignors(), **extra}
        return {name: known[name] for name in names}

    monkeypatch.setattr(app_module, "load_assignors", load)
    async with trio.open_nursery() as nursery:
        handle: ServerHandle = await nursery.start(
            run_server, config, ("127.0.0.1", 0), ("127.0.0.1", 0)
        )
        try:
            yield handle
        finally:
            handle.stop()


class Worker:
    """A well-behaved Connect worker: owns exactly what the coordinator last handed it."""

    def __init__(self, client: KafkaClient, member_id: str, assignor: str,
                 worker_url: str | None = None) -> None:
        self.client = client
        self.member_id = member_id
        self.assignor = assignor
        self.worker_url = worker_url or f"http://{member_id}:8083"
        self.epoch = 0
        self.owned: frozenset[Unit] = frozenset()

    async def join(self) -> Any:
        response = await self.client.request(HEARTBEAT, ConnectGroupHeartbeatRequest(
            group_id=G, member_id=self.member_id, member_epoch=0, worker_url=self.worker_url,
            rebalance_timeout_ms=30_000, server_assignor=self.assignor))
        return self._absorb(response)

    async def heartbeat(self) -> Any:
        response = await self.client.request(HEARTBEAT, ConnectGroupHeartbeatRequest(
            group_id=G, member_id=self.member_id, member_epoch=self.epoch,
            owned_connectors_and_tasks=units_to_wire(self.owned)))
        return self._absorb(response)

    async def leave(self) -> Any:
        return await self.client.request(HEARTBEAT, ConnectGroupHeartbeatRequest(
            group_id=G, member_id=self.member_id, member_epoch=-1))

    def _absorb(self, response: Any) -> Any:
        assert response.error_code == ErrorCode.NONE, response.error_message
        self.epoch = response.member_epoch
        if response.assignment is not None:
            self.owned = wire_units(response.assignment.assigned)
        return response


async def connect(handle: ServerHandle) -> KafkaClient:
    return await KafkaClient.connect("127.0.0.1", handle.kafka_port)


async def group_view(handle: ServerHandle) -> dict[str, Any]:
    status, view = await http(handle, "GET", f"/groups/{G}")
    assert status == 200, view
    return dict(view)


def is_settled(view: dict[str, Any], workers: Iterable[Worker]) -> bool:
    """The group is STABLE and every given worker has seen the assignment epoch."""
    members = {m["member_id"]: m for m in view["members"]}
    return view["state"] == "STABLE" and all(
        w.member_id in members and w.epoch == view["assignment_epoch"] for w in workers
    )


async def settle(handle: ServerHandle, workers: list[Worker], limit: float = 8.0) -> dict:
    """Heartbeat all workers until the group is stable at its assignment epoch."""
    with trio.fail_after(limit):
        while True:
            for worker in workers:
                await worker.heartbeat()
            view = await group_view(handle)
            if is_settled(view, workers):
                return view
            await trio.sleep(0.05)


async def assignor_runs(handle: ServerHandle) -> dict[str, float]:
    status, text = await http(handle, "GET", "/metrics")
    assert status == 200
    runs = {}
    pattern = r'^connect_coordinator_assignor_runs_total\{outcome="(\w+)"\} (\S+)$'
    for match in re.finditer(pattern, text, re.MULTILINE):
        runs[match.group(1)] = float(match.group(2))
    assert set(runs) == {"ok", "failed", "timeout"}, text
    return runs


def owned_by(view: dict[str, Any], member_id: str) -> set[str]:
    for member in view["members"]:
        if member["member_id"] == member_id:
            assigned = member["assigned"]
            return {*assigned["connectors"],
                    *(f"{t['connector']}-{t['task']}" for t in assigned["tasks"])}
    raise AssertionError(f"{member_id} is not a member: {view['members']}")


async def put_connector(handle: ServerHandle, name: str, tasks: int) -> None:
    status, body = await http(handle, "PUT", f"/groups/{G}/connectors/{name}", {"tasks": tasks})
    assert status == 200, body


# ---------------------------------------------------------------------------- 1. slow run


async def test_heartbeats_are_answered_while_a_slow_run_is_in_flight(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with serving(_config(server_assignors=("slow",)), monkeypatch) as handle:
        await put_connector(handle, "A", 3)
        async with await connect(handle) as c1, await connect(handle) as c2:
            w1, w2 = Worker(c1, "W1", "slow"), Worker(c2, "W2", "slow")
            await w1.join()
            view = await settle(handle, [w1])  # a fast run: one member; warms the pool
            assert len(w1.owned) == 4
            first_epoch = view["assignment_epoch"]

            started = time.perf_counter()
            joined_at = time.time()
            await w2.join()
            assert time.perf_counter() - started < NOT_HELD_S  # the join is not held by the run
            group = handle.runtime.core.store.groups[G]
            assert group.assignor_run is not None
            slow_run = group.assignor_run.run_id

            answered_in_flight = 0
            with trio.fail_after(SLOW_SECONDS + 5), capture_logs() as logs:
                while group.assignor_run is not None:
                    started = time.perf_counter()
                    response = await w1.heartbeat()
                    elapsed = time.perf_counter() - started
                    assert elapsed < NOT_HELD_S, f"a heartbeat took {elapsed:.3f} s"
                    if group.assignor_run is not None:
                        answered_in_flight += 1
                        assert response.member_epoch == first_epoch
                        assert len(w1.owned) == 4  # nothing moves before the target lands
                    await trio.sleep(0.1)
                while not handle.runtime.recent_runs \
                        or handle.runtime.recent_runs[-1].run_id != slow_run:  # noqa: ASYNC110
                    await trio.sleep(0.01)  # its records are being written
            assert answered_in_flight >= 8  # ~1.5 s of heartbeats every 0.1 s

            view = await settle(handle, [w1, w2])
            assert view["assignment_epoch"] > first_epoch
            assert {len(w1.owned), len(w2.owned)} == {2}
            assert w1.owned.isdisjoint(w2.owned)
            runs = await assignor_runs(handle)
            assert runs == {"ok": 2, "failed": 0, "timeout": 0}
            # The pool's own metrics saw both runs, the slow one for at least its sleep.
            status, text = await http(handle, "GET", "/metrics")
            samples = dict(re.findall(
                r"^(connect_coordinator_assignor_\S+) (\S+)$", text, re.MULTILINE))
            assert float(samples["connect_coordinator_assignor_queue_seconds_count"]) == 2
            assert float(samples[
                'connect_coordinator_assignor_run_seconds_sum{assignor="slow"}']) >= 1.4
            assert float(samples["connect_coordinator_assignor_runs_in_flight"]) == 0
            assert float(samples["connect_coordinator_assignor_pool_busy_ratio"]) == 0

            # When each run was in flight (what `bench heartbeats` times heartbeats against):
            # the slow one from the join's answer until after its sleep, and then logged.
            runs_seen = list(handle.runtime.recent_runs)
            assert [times.run_id for times in runs_seen][-1] == slow_run
            times = runs_seen[-1]
            assert times.group_id == G and times.outcome == "ok"
            assert joined_at <= times.submitted < times.returned <= times.landed
            assert times.returned - times.submitted >= SLOW_SECONDS - 0.1
            landed = [e for e in logs if e["event"] == "assignor_run_landed"]
            assert [(e["run"], e["submitted_at"], e["landed_at"]) for e in landed] == [
                (slow_run, round(times.submitted, 6), round(times.landed, 6))]


# ---------------------------------------------------------------------------- 2. batching


async def test_joins_within_the_assignment_interval_share_one_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = _config(server_assignors=("round-robin",), assignment_interval_ms=1_000)
    async with serving(config, monkeypatch) as handle:
        await put_connector(handle, "A", 7)
        clients = [await connect(handle) for _ in range(4)]
        try:
            workers = [Worker(c, f"W{i}", "round-robin") for i, c in enumerate(clients, 1)]
            await workers[0].join()
            await settle(handle, workers[:1])
            assert (await assignor_runs(handle))["ok"] == 1
            landed = time.perf_counter()

            for worker in workers[1:]:  # three joins, 150 ms apart: all inside the interval
                await worker.join()
                await workers[0].heartbeat()
                await trio.sleep(0.15)
            assert (await assignor_runs(handle))["ok"] == 1  # the interval holds them back

            view = await settle(handle, workers)
            assert time.perf_counter() - landed >= 0.9
            assert sorted(len(w.owned) for w in workers) == [2, 2, 2, 2]
            assert view["unassigned"]["names"] == []
            assert await assignor_runs(handle) == {"ok": 2, "failed": 0, "timeout": 0}
        finally:
            for client in clients:
                await client.aclose()


# ---------------------------------------------------------------------------- 3. balanced delay


async def _three_stable_balanced(handle: ServerHandle, clients: list[KafkaClient]
                                 ) -> tuple[list[Worker], dict[str, Any]]:
    status, body = await http(handle, "PUT", f"/groups/{G}/config",
                              {"scheduled.rebalance.max.delay.ms": 1_500})
    assert status == 200, body
    for name in ("A", "B", "C"):  # 3 connectors, 3 tasks: two units for each of 3 workers
        await put_connector(handle, name, 1)
    workers = [Worker(c, f"W{i}", "balanced") for i, c in enumerate(clients[:3], 1)]
    for worker in workers:
        await worker.join()
    view = await settle(handle, workers)
    assert sorted(len(w.owned) for w in workers) == [2, 2, 2]
    assert view["unassigned"]["names"] == []
    return workers, view


async def _leave_and_check_held_back(handle: ServerHandle, workers: list[Worker]
                                     ) -> tuple[set[str], dict[str, Any]]:
    w1, w2, w3 = workers
    before = await group_view(handle)
    gone = owned_by(before, "W3")
    assert len(gone) == 2
    kept = {"W1": owned_by(before, "W1"), "W2": owned_by(before, "W2")}
    response = await w3.leave()
    assert (response.error_code, response.member_epoch) == (ErrorCode.NONE, -1)
    view = await settle(handle, [w1, w2], limit=3)
    assert set(view["unassigned"]["names"]) == gone
    assert {m["member_id"] for m in view["members"]} == {"W1", "W2"}
    assert {"W1": owned_by(view, "W1"), "W2": owned_by(view, "W2")} == kept
    return gone, kept


async def test_balanced_gives_a_returning_worker_its_units_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with serving(_config(), monkeypatch) as handle:
        clients = [await connect(handle) for _ in range(4)]
        try:
            workers, _ = await _three_stable_balanced(handle, clients)
            left = time.perf_counter()
            gone, kept = await _leave_and_check_held_back(handle, workers)

            # The same worker (same URL) comes back under a new member id within the delay.
            back = Worker(clients[3], "W3-again", "balanced", worker_url="http://W3:8083")
            await back.join()
            view = await settle(handle, [workers[0], workers[1], back])
            assert time.perf_counter() - left < 1.5  # it really came back within the delay
            assert owned_by(view, "W3-again") == gone
            assert {"W1": owned_by(view, "W1"), "W2": owned_by(view, "W2")} == kept
            assert view["unassigned"]["names"] == []
        finally:
            for client in clients:
                await client.aclose()


async def test_balanced_spreads_the_units_after_the_delay(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with serving(_config(), monkeypatch) as handle:
        clients = [await connect(handle) for _ in range(3)]
        try:
            workers, _ = await _three_stable_balanced(handle, clients)
            left = time.perf_counter()
            gone, kept = await _leave_and_check_held_back(handle, workers)
            w1, w2 = workers[:2]

            # Nobody returns: the units stay unassigned while the delay runs ...
            await trio.sleep(max(0.0, 0.8 - (time.perf_counter() - left)))
            await w1.heartbeat()
            await w2.heartbeat()
            assert set((await group_view(handle))["unassigned"]["names"]) == gone

            # ... and are spread over the remaining workers once it is over.
            with trio.fail_after(6):
                while True:
                    view = await settle(handle, [w1, w2])
                    if not view["unassigned"]["names"]:
                        break
                    await trio.sleep(0.1)
            assert time.perf_counter() - left >= 1.4
            assert {*map(_unit, kept["W1"])} < w1.owned  # sticky: nothing taken away
            assert {*map(_unit, kept["W2"])} < w2.owned
            assert w1.owned.isdisjoint(w2.owned)
            assert w1.owned | w2.owned == {*map(_unit, gone), *map(_unit, kept["W1"]),
                                           *map(_unit, kept["W2"])}
        finally:
            for client in clients:
                await client.aclose()


def _unit(name: str) -> Unit:
    connector, _, task = name.rpartition("-")
    if connector and task.isdigit():
        return (connector, int(task))
    return (name, CONNECTOR)


# ---------------------------------------------------------------------------- 4. crash


async def test_a_crashing_run_keeps_the_target_and_is_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = _config(server_assignors=("crashing",))
    async with serving(config, monkeypatch) as handle:
        await put_connector(handle, "A", 3)
        async with await connect(handle) as c1, await connect(handle) as c2:
            w1, w2 = Worker(c1, "W1", "crashing"), Worker(c2, "W2", "crashing")
            await w1.join()
            view = await settle(handle, [w1])
            epoch = view["assignment_epoch"]
            owned = w1.owned
            assert len(owned) == 4

            with capture_logs() as logs:
                await w2.join()
                with trio.fail_after(6):
                    while (await assignor_runs(handle))["failed"] < 1:
                        started = time.perf_counter()
                        response = await w1.heartbeat()
                        assert time.perf_counter() - started < NOT_HELD_S
                        assert response.member_epoch == epoch
                        await trio.sleep(0.05)
                for _ in range(5):  # still answered, still the old target
                    response = await w1.heartbeat()
                    assert response.error_code == ErrorCode.NONE
                    assert response.member_epoch == epoch
                    assert w1.owned == owned
                    await w2.heartbeat()
                    assert w2.owned == frozenset()
                    await trio.sleep(0.05)

            view = await group_view(handle)
            assert view["assignment_epoch"] == epoch
            assert view["group_epoch"] > epoch
            assert owned_by(view, "W1") == {"A", "A-0", "A-1", "A-2"}
            assert owned_by(view, "W2") == set()
            runs = await assignor_runs(handle)
            assert runs["ok"] == 1 and runs["failed"] >= 1 and runs["timeout"] == 0
            failed = [e for e in logs if e["event"] == "assignor_failed"]
            assert failed and "crashed on purpose" in failed[0]["error"]
            landed = [e for e in logs if e["event"] == "assignor_run_landed"]
            assert landed and landed[0]["outcome"] == "failed"
            assert landed[0]["assignor"] == "crashing" and landed[0]["duration_ms"] >= 0
            # One line at info per run, when it has landed; its start only at debug.
            assert {e["log_level"] for e in landed} == {"info"}
            started = [e for e in logs if e["event"] == "assignor_run_started"]
            assert started and {e["log_level"] for e in started} == {"debug"}


# ---------------------------------------------------------------------------- 5. resident specs


async def test_a_pool_process_that_did_not_do_the_groups_last_run_is_sent_it_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run carries only what changed since the group's last run; the pool process that
    did that run still holds the rest. One that does not (a new process, or one that did
    other groups' runs) asks for the run whole, and it lands as usual."""
    async with serving(_config(server_assignors=("balanced",)), monkeypatch) as handle:
        await put_connector(handle, "A", 40)
        async with await connect(handle) as c1, await connect(handle) as c2:
            workers = [Worker(c1, "W1", "balanced"), Worker(c2, "W2", "balanced")]
            for worker in workers:
                await worker.join()
            await settle(handle, workers)
            packer = handle.runtime._packers[G]
            whole = packer.whole
            await put_connector(handle, "A", 41)
            await settle(handle, workers)
            assert packer.whole == whole  # one group's runs, one after the other: told

            # A token no pool process has seen: the next run is not told against anything
            # they hold.
            packer.token = "a-packer-no-pool-process-has-seen"
            await put_connector(handle, "A", 42)
            view = await settle(handle, workers)
            assert packer.whole == whole + 1
            owned = [w.owned for w in workers]
            assert owned[0].isdisjoint(owned[1])
            assert owned[0] | owned[1] == {("A", CONNECTOR), *(("A", t) for t in range(42))}
            assert view["unassigned"]["names"] == []
            assert (await assignor_runs(handle))["failed"] == 0


async def test_each_groups_runs_go_to_the_pool_process_that_did_its_last_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two groups' runs in flight at once, round after round, on two pool processes: each
    group's run goes back to the process that holds its last spec, so after each group's
    first run none is packed whole again."""
    config = _config(server_assignors=("balanced",), background_threads=2)
    async with serving(config, monkeypatch) as handle:
        runtime = handle.runtime
        groups = ["pool-a", "pool-b"]
        for group_id in groups:
            await runtime.put_connector(group_id, "A", 40)
            await runtime.heartbeat(ConnectGroupHeartbeatRequest(
                group_id=group_id, member_id="W1", member_epoch=0,
                worker_url="http://w1:8083", rebalance_timeout_ms=30_000,
                server_assignor="balanced"))

        async def landed(count: int) -> None:
            with trio.fail_after(10):
                while runtime.runs_landed < count:  # noqa: ASYNC110 - the pool lands them
                    await trio.sleep(0.01)

        await landed(2)
        for tasks in range(41, 47):
            landed_before = runtime.runs_landed
            async with trio.open_nursery() as nursery:
                for group_id in groups:
                    nursery.start_soon(runtime.put_connector, group_id, "A", tasks)
            await landed(landed_before + 2)
        assert [runtime._packers[g].whole for g in groups] == [1, 1]
        assert (await assignor_runs(handle))["ok"] == 14
