"""Simulated Connect workers of one process, with the faults the simulator injects.

A :class:`WorkerHost` starts, kills, bounces and pauses :class:`Worker` s, and counts what
their connections see. Every connection goes through a :class:`FaultyLink`, which can hold
a worker's requests (a pause: a stopped JVM, a long GC) or lose a share of them or of their
answers (a flaky network).

The simulator drives one host in its own process, or several in child processes
(``python -m coordinator.workers.host``) through JSON lines on stdin/stdout; a
:class:`RemoteHost` is the parent's end of that. Unit runs are stamped with the machine's
monotonic clock, which every process shares, so runs recorded in different processes can be
checked for overlap against each other.
"""

from __future__ import annotations

import itertools
import json
import random
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import trio

from coordinator.cli import module_command
from coordinator.client import KafkaClient
from coordinator.units import Unit, format_unit
from coordinator.workers.assignors import (
    AssignmentPlan,
    ClientSideAssignor,
    EagerAssignor,
    GroupView,
    IncrementalCooperativeAssignor,
    Leader,
)
from coordinator.workers.classic import ClassicWorker
from coordinator.workers.registry import UnitRegistry
from coordinator.workers.state import WorkerConfig
from coordinator.workers.worker import TRANSPORT_ERRORS, Worker, WorkerFailed
from protocol.errors import ErrorCode, error_name
from protocol.framing import CONNECT_GROUP_HEARTBEAT


class ChaosDrop(ConnectionResetError):
    """A request or its answer lost on purpose."""


def monotonic_ms() -> float:
    return time.monotonic_ns() / 1e6


class WallClockRegistry(UnitRegistry):
    """Stamps runs with the machine-wide monotonic clock, comparable across processes."""

    def _now(self, now_ms: float | None) -> float:
        return monotonic_ms()


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """How the simulated workers are set up (the same in every process)."""

    host: str
    port: int
    group: str
    assignor: str  # "client:incremental-cooperative", "client:eager" or "server:NAME"
    session_timeout_ms: int
    rebalance_timeout_ms: int
    rebalance_delay_ms: int
    static: bool = False
    request_timeout_ms: int = 5_000
    # Workers of the classic protocol (`coordinator/workers/classic.py`), by name, and the
    # units their leader hands out (a Connect leader reads them from its config topic).
    classic_workers: tuple[str, ...] = ()
    units: tuple[tuple[str, int], ...] = ()
    # The group's connectors were never set through the admin API, so the coordinator
    # knows its units only from the workers' assignments: new-protocol leaders, like
    # classic ones, assign `units` (what a Connect leader reads from its config topic).
    units_from_config_topic: bool = False

    def assignors(self) -> list[ClientSideAssignor]:
        kind, _, name = self.assignor.partition(":")
        if kind == "server":
            return []
        if self.units_from_config_topic:
            units = frozenset((connector, task) for connector, task in self.units)
            if name == "eager":
                return [ConfigTopicEagerAssignor(units)]
            return [ConfigTopicIncrementalAssignor(units, self.rebalance_delay_ms)]
        if name == "eager":
            return [EagerAssignor()]
        return [IncrementalCooperativeAssignor(self.rebalance_delay_ms)]

    def server_assignor(self) -> str | None:
        kind, _, name = self.assignor.partition(":")
        return name if kind == "server" else None

    def to_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}


class ConfigTopicIncrementalAssignor(IncrementalCooperativeAssignor):
    """Assigns the units of the worker's config topic, not those the coordinator knows."""

    def __init__(self, units: frozenset[Unit], scheduled_rebalance_max_delay_ms: int) -> None:
        super().__init__(scheduled_rebalance_max_delay_ms)
        self.config_units = units

    def assign(self, view: GroupView, now_ms: int, leader: Leader) -> AssignmentPlan:
        return super().assign(replace(view, units=self.config_units), now_ms, leader)


class ConfigTopicEagerAssignor(EagerAssignor):
    """Eager, with the units of the worker's config topic."""

    def __init__(self, units: frozenset[Unit]) -> None:
        super().__init__()
        self.config_units = units

    def assign(self, view: GroupView, now_ms: int, leader: Leader) -> AssignmentPlan:
        return super().assign(replace(view, units=self.config_units), now_ms, leader)


@dataclass(slots=True)
class Traffic:
    """What the workers' connections saw: requests, answers by error code, lost ones."""

    heartbeats: int = 0
    requests: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    transport_errors: int = 0
    dropped: int = 0
    compute_assignment: int = 0

    def add(self, other: dict[str, Any]) -> None:
        self.heartbeats += other["heartbeats"]
        self.requests += other["requests"]
        self.errors.update(other["errors"])
        self.transport_errors += other["transport_errors"]
        self.dropped += other["dropped"]
        self.compute_assignment += other["compute_assignment"]

    def to_json(self) -> dict[str, Any]:
        return {"heartbeats": self.heartbeats, "requests": self.requests,
                "errors": dict(sorted(self.errors.items())),
                "transport_errors": self.transport_errors, "dropped": self.dropped,
                "compute_assignment": self.compute_assignment}


class FaultyLink:
    """One worker's way to the coordinator, with the faults currently switched on."""

    def __init__(self, traffic: Traffic, rng: random.Random) -> None:
        self.traffic = traffic
        self.rng = rng
        self.paused_until = 0.0  # trio time
        self.drop_share = 0.0
        self.drop_until = 0.0

    async def _hold_while_paused(self) -> None:
        if trio.current_time() < self.paused_until:
            await trio.sleep_until(self.paused_until)
            raise ChaosDrop("the worker was paused")

    def _dropping(self) -> bool:
        return trio.current_time() < self.drop_until and self.rng.random() < self.drop_share

    async def connect(self, host: str, port: int, client_id: str) -> FaultyClient:
        await self._hold_while_paused()
        try:
            client = await KafkaClient.connect(host, port, client_id=client_id)
        except TRANSPORT_ERRORS:
            self.traffic.transport_errors += 1
            raise
        return FaultyClient(client, self)


class FaultyClient:
    """A KafkaClient seen through a FaultyLink (the Worker uses request and aclose only)."""

    def __init__(self, client: KafkaClient, link: FaultyLink) -> None:
        self._client = client
        self._link = link

    async def request(self, api_key: int, body: Any, api_version: int = 0) -> Any:
        link, traffic = self._link, self._link.traffic
        await link._hold_while_paused()
        if link._dropping() and link.rng.random() < 0.5:
            traffic.dropped += 1
            raise ChaosDrop("request dropped by the simulator")
        traffic.requests += 1
        if api_key == CONNECT_GROUP_HEARTBEAT:
            traffic.heartbeats += 1
        try:
            response = await self._client.request(api_key, body, api_version)
        except TRANSPORT_ERRORS:
            traffic.transport_errors += 1
            raise
        code = getattr(response, "error_code", 0)
        if code == ErrorCode.COMPUTE_ASSIGNMENT:
            traffic.compute_assignment += 1  # an instruction, not an error
        elif code:
            traffic.errors[error_name(code)] += 1
        if link._dropping():
            traffic.dropped += 1  # processed by the coordinator, the answer never arrives
            raise ChaosDrop("response dropped by the simulator")
        return response

    async def aclose(self) -> None:
        await self._client.aclose()


@dataclass(slots=True)
class _Slot:
    """One worker name and its current incarnation (a restart is a new Worker)."""

    name: str
    link: FaultyLink
    classic: bool = False  # which protocol its next incarnation speaks
    incarnation: int = 0
    worker: Worker | None = None
    scope: trio.CancelScope | None = None
    done: trio.Event | None = None


class WorkerHost:
    """The simulated workers of this process."""

    def __init__(self, spec: WorkerSpec, names: list[str], nursery: trio.Nursery,
                 seed: int = 0) -> None:
        self.spec = spec
        self.registry = WallClockRegistry()
        self.traffic = Traffic()
        self.failures: list[str] = []
        self._nursery = nursery
        self._rng = random.Random(seed)
        self._slots = {name: _Slot(name, FaultyLink(self.traffic, random.Random(
            f"{seed}/{name}")), classic=name in spec.classic_workers) for name in names}

    @property
    def names(self) -> list[str]:
        return list(self._slots)

    # ------------------------------------------------------------------ lifetime of workers
    def _new_worker(self, slot: _Slot) -> Any:
        spec = self.spec
        slot.incarnation += 1
        if slot.classic:
            classic_link = slot.link
            units = frozenset((name, task) for name, task in spec.units)

            async def classic_connect() -> Any:
                return await classic_link.connect(spec.host, spec.port, slot.name)

            return ClassicWorker(
                slot.name, spec.group, (spec.host, spec.port), self.registry, lambda: units,
                session_timeout_ms=spec.session_timeout_ms,
                heartbeat_interval_ms=max(100, spec.session_timeout_ms // 4),
                rebalance_timeout_ms=spec.rebalance_timeout_ms, connect=classic_connect)
        # A restarted Connect worker gets a new member id; a static one keeps its instance id.
        member_id = f"{slot.name}-{slot.incarnation}-{uuid.uuid4().hex[:8]}"
        config = WorkerConfig(
            group_id=spec.group, worker_url=f"http://{slot.name}:8083", member_id=member_id,
            instance_id=slot.name if spec.static else None,
            rebalance_timeout_ms=spec.rebalance_timeout_ms,
            session_timeout_ms=spec.session_timeout_ms,
            server_assignor=spec.server_assignor(),
            retry_backoff_ms=50, retry_backoff_max_ms=1_000)
        link = slot.link

        async def connect() -> Any:
            return await link.connect(spec.host, spec.port, member_id)

        return Worker(config, self.registry, connect=connect, assignors=spec.assignors(),
                      request_timeout_ms=spec.request_timeout_ms, name=slot.name)

    async def start(self, name: str) -> None:
        slot = self._slots[name]
        if slot.done is not None and not slot.done.is_set():
            return  # already running
        worker = self._new_worker(slot)
        slot.worker = worker
        slot.scope = trio.CancelScope()
        slot.done = trio.Event()
        self._nursery.start_soon(self._run, slot, worker, slot.scope, slot.done)

    async def _run(self, slot: _Slot, worker: Worker, scope: trio.CancelScope,
                   done: trio.Event) -> None:
        try:
            with scope:
                await worker.run()
        except WorkerFailed as failure:
            self.failures.append(f"{slot.name}: {failure}")
        except Exception as error:  # a bug in the worker: report it, keep the others going
            self.failures.append(f"{slot.name} crashed: {error!r}")
        finally:
            done.set()

    async def kill(self, name: str) -> None:
        """The worker's process dies: no leave, its units die with it."""
        slot = self._slots[name]
        if slot.scope is not None and slot.done is not None:
            slot.scope.cancel()
            await slot.done.wait()

    async def stop(self, name: str) -> None:
        """A clean shutdown: units stop, then the worker leaves the group."""
        slot = self._slots[name]
        if slot.worker is not None and slot.done is not None:
            slot.worker.shutdown()
            with trio.move_on_after(self.spec.request_timeout_ms / 1000 + 5) as waited:
                await slot.done.wait()
            if waited.cancelled_caught:
                await self.kill(name)

    async def restart(self, name: str, downtime_s: float, graceful: bool) -> None:
        await (self.stop(name) if graceful else self.kill(name))
        await trio.sleep(downtime_s)
        await self.start(name)

    async def switch(self, name: str, classic: bool) -> None:
        """Roll the worker to the other protocol: it shuts down cleanly and comes back at
        once with the same name and url, speaking the classic protocol or the new one."""
        await self.stop(name)
        self._slots[name].classic = classic
        await self.start(name)

    def pause(self, name: str, seconds: float) -> None:
        link = self._slots[name].link
        link.paused_until = trio.current_time() + seconds

    def drop(self, share: float, seconds: float) -> None:
        """Lose `share` of every worker's requests (half before, half after the coordinator
        saw them) for `seconds`."""
        until = trio.current_time() + seconds
        for slot in self._slots.values():
            slot.link.drop_share = share
            slot.link.drop_until = until

    async def close(self) -> None:
        async with trio.open_nursery() as nursery:
            for name in self._slots:
                nursery.start_soon(self.stop, name)

    # ------------------------------------------------------------------ views
    def status(self) -> dict[str, Any]:
        running: dict[str, list[str]] = {}
        for unit, holders in self.registry.running().items():
            running[format_unit(unit)] = holders
        return {"running": running, "traffic": self.traffic.to_json(),
                "failures": list(self.failures)}

    def runs(self) -> list[dict[str, Any]]:
        return [{"unit": list(run.unit), "worker": run.worker, "started_ms": run.started_ms,
                 "stopped_ms": run.stopped_ms} for run in self.registry.runs]


# ---------------------------------------------------------------------------- other processes
#
# The parent writes one JSON object per line: {"id": N, "op": NAME, "args": {...}}; the
# child answers each with {"id": N, "result": ...} or {"id": N, "error": "..."}, in the order
# the operations finish (a restart with downtime must not hold up a status poll).


class RemoteHost:
    """A WorkerHost in a child process, with the same operations (all async)."""

    def __init__(self, process: trio.Process) -> None:
        self._process = process
        self._ids = itertools.count(1)
        self._waiting: dict[int, trio.MemorySendChannel[dict[str, Any]]] = {}
        self._send_lock = trio.Lock()

    @classmethod
    async def open(cls, nursery: trio.Nursery, spec: WorkerSpec, names: list[str],
                   seed: int) -> RemoteHost:
        setup = json.dumps({"spec": spec.to_json(), "names": names, "seed": seed})
        command = module_command("coordinator.workers.host", setup)
        process = await nursery.start(partial(
            trio.run_process, command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            check=False))
        host = cls(process)
        nursery.start_soon(host._read_answers)
        return host

    async def _read_answers(self) -> None:
        assert self._process.stdout is not None
        buffered = b""
        async for chunk in self._process.stdout:
            buffered += chunk
            *lines, buffered = buffered.split(b"\n")
            for line in lines:
                answer = json.loads(line)
                channel = self._waiting.pop(answer["id"], None)
                if channel is not None:
                    channel.send_nowait(answer)
        for channel in self._waiting.values():
            channel.send_nowait({"error": "the worker process ended"})

    async def call(self, op: str, **args: Any) -> Any:
        assert self._process.stdin is not None
        call_id = next(self._ids)
        send, receive = trio.open_memory_channel[dict[str, Any]](1)
        self._waiting[call_id] = send
        async with self._send_lock:
            await self._process.stdin.send_all(
                json.dumps({"id": call_id, "op": op, "args": args}).encode() + b"\n")
        answer = await receive.receive()
        if "error" in answer:
            raise RuntimeError(f"worker process: {answer['error']}")
        return answer["result"]

    async def start(self, name: str) -> None:
        await self.call("start", name=name)

    async def kill(self, name: str) -> None:
        await self.call("kill", name=name)

    async def restart(self, name: str, downtime_s: float, graceful: bool) -> None:
        await self.call("restart", name=name, downtime_s=downtime_s, graceful=graceful)

    async def switch(self, name: str, classic: bool) -> None:
        await self.call("switch", name=name, classic=classic)

    async def pause(self, name: str, seconds: float) -> None:
        await self.call("pause", name=name, seconds=seconds)

    async def drop(self, share: float, seconds: float) -> None:
        await self.call("drop", share=share, seconds=seconds)

    async def status(self) -> dict[str, Any]:
        return await self.call("status")  # type: ignore[no-any-return]

    async def runs(self) -> list[dict[str, Any]]:
        return await self.call("runs")  # type: ignore[no-any-return]

    async def close(self) -> None:
        await self.call("close")

    async def disconnect(self) -> None:
        """End the child process (after `close` and `runs`)."""
        assert self._process.stdin is not None
        await self._process.stdin.aclose()


async def _serve_parent(setup: dict[str, Any]) -> None:
    spec = WorkerSpec(**setup["spec"])
    stdin = trio.lowlevel.FdStream(sys.stdin.fileno())
    stdout = trio.lowlevel.FdStream(sys.stdout.fileno())
    write_lock = trio.Lock()
    async with trio.open_nursery() as workers:
        host = WorkerHost(spec, setup["names"], workers, setup["seed"])

        async def answer(call: dict[str, Any]) -> None:
            op, args = call["op"], call.get("args", {})
            reply: dict[str, Any] = {"id": call["id"]}
            try:
                if op in ("status", "runs"):
                    reply["result"] = getattr(host, op)()
                elif op in ("pause", "drop"):
                    reply["result"] = getattr(host, op)(**args)
                elif op in ("start", "stop", "kill", "restart", "switch", "close"):
                    reply["result"] = await getattr(host, op)(**args)
                else:
                    reply["error"] = f"unknown operation {op!r}"
            except Exception as error:  # reported to the parent, which decides
                reply["error"] = repr(error)
            async with write_lock:
                await stdout.send_all(json.dumps(reply).encode() + b"\n")

        async with trio.open_nursery() as calls:
            buffered = b""
            while chunk := await stdin.receive_some(65536):
                buffered += chunk
                *lines, buffered = buffered.split(b"\n")
                for line in lines:
                    calls.start_soon(answer, json.loads(line))
        workers.cancel_scope.cancel()


def main() -> None:
    from coordinator.logs import configure_logging

    # stdout carries the answers to the parent: the workers' logs go to stderr.
    configure_logging("warning", json=True)
    # A terminal's Ctrl-C reaches this process too: the parent decides, and ends this one
    # by closing its stdin (or this one ends at EOF when the parent is gone).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    trio.run(_serve_parent, json.loads(sys.argv[1]))


def unit_of(raw: list[Any]) -> Unit:
    return (str(raw[0]), int(raw[1]))


if __name__ == "__main__":
    main()
