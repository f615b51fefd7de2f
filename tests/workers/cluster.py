"""Simulated workers (sans-IO WorkerState) talking to the real core, on one fake clock.

Events are processed in time order; at equal times a worker's own session check comes
before the coordinator's timers (a worker's deadline counts from when it sent its last
good heartbeat, the coordinator's from when it processed it: never earlier), and
heartbeats come last.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from coordinator.config import ServerConfig
from coordinator.units import Unit
from coordinator.workers.assignors import ClientSideAssignor, IncrementalCooperativeAssignor
from coordinator.workers.registry import UnitRegistry
from coordinator.workers.state import Actions, Phase, WorkerConfig, WorkerState
from protocol.messages import ConnectGroupHeartbeatResponse
from tests.core.context import Context

G = "connect-cluster"


class SimWorker:
    def __init__(self, cluster: Cluster, name: str, member_id: str | None = None,
                 assignors: Sequence[ClientSideAssignor] | None = None,
                 url: str | None = None, **config: Any) -> None:
        self.cluster = cluster
        self.name = name
        if assignors is None:
            assignors = [IncrementalCooperativeAssignor(cluster.delay_ms)]
        self.assignors = list(assignors)
        self.state = WorkerState(
            WorkerConfig(group_id=G, worker_url=url or f"http://{name}:8083",
                         member_id=member_id or name, **config),
            self.assignors)
        self.partitioned = False  # requests do not reach the coordinator
        self.lose_responses = False  # requests reach it, the answers get lost
        self.alive = True
        self.responses: list[ConnectGroupHeartbeatResponse] = []

    @property
    def running(self) -> frozenset[Unit]:
        return self.cluster.registry.running_on(self.name)

    def apply(self, actions: Actions) -> None:
        now = self.cluster.ctx.now
        registry = self.cluster.registry
        for unit in sorted(actions.stop):  # stop first
            if unit in registry.running_on(self.name):
                registry.stopped(unit, self.name, now)
        for unit in sorted(actions.start):
            registry.started(unit, self.name, now)
        assert actions.fatal is None, actions.fatal

    def due_ms(self) -> int | None:
        if not self.alive or self.state.phase in (Phase.LEFT, Phase.FAILED):
            return None
        deadline = self.state.session_deadline_ms
        wake = self.state.next_wakeup_ms
        return wake if deadline is None else min(wake, deadline)

    def heartbeat(self) -> ConnectGroupHeartbeatResponse | None:
        ctx = self.cluster.ctx
        request = self.state.heartbeat_request(ctx.now)
        if self.partitioned:
            self.apply(self.state.on_heartbeat_failed(ctx.now))
            return None
        response: ConnectGroupHeartbeatResponse = ctx.apply(ctx.core.heartbeat(request, ctx.now))
        if self.lose_responses:
            self.apply(self.state.on_heartbeat_failed(ctx.now))
            return None
        self.responses.append(response)
        self.apply(self.state.on_heartbeat_response(response, ctx.now))
        if self.state.compute_due:
            self.compute()
        return response

    def compute(self) -> None:
        ctx = self.cluster.ctx
        prepared = ctx.apply(ctx.core.prepare_assignment(self.state.prepare_request(), ctx.now))
        install = self.state.on_prepare_response(prepared, ctx.now)
        if install is not None:
            self.state.on_install_response(ctx.apply(ctx.core.install_assignment(install,
                                                                                 ctx.now)))
            self.cluster.installs += 1

    def crash(self) -> None:
        """The process dies: its units die with it, it never speaks again."""
        for unit in sorted(self.running):
            self.cluster.registry.stopped(unit, self.name, self.cluster.ctx.now)
        self.alive = False

    def shutdown(self) -> None:
        """A clean stop: units first, then the leave heartbeat."""
        ctx = self.cluster.ctx
        self.apply(Actions(stop=self.state.stop_all()))
        request = self.state.leave_request()
        if request is not None:
            ctx.apply(ctx.core.heartbeat(request, ctx.now))
        self.alive = False


class Cluster:
    def __init__(self, connectors: dict[str, int] | None = None, delay_ms: int = 60_000,
                 config: ServerConfig | None = None) -> None:
        self.ctx = Context(config)
        self.delay_ms = delay_ms
        self.registry = UnitRegistry()
        self.workers: dict[str, SimWorker] = {}
        self.installs = 0
        for name, tasks in (connectors or {"A": 2, "B": 1}).items():
            self.ctx.put_connector(G, name, tasks)

    def add(self, name: str, **kwargs: Any) -> SimWorker:
        worker = SimWorker(self, name, **kwargs)
        self.workers[name] = worker
        return worker

    def _check_no_double_runs(self) -> None:
        doubled = {unit: holders for unit, holders in self.registry.running().items()
                   if len(holders) > 1}
        assert not doubled, f"units running on two workers at {self.ctx.now}: {doubled}"

    def run(self, ms: int) -> None:
        """Let `ms` of fake time pass, processing every event in order."""
        end = self.ctx.now + ms
        same_time_steps = 0
        while True:
            due = [d for w in self.workers.values() if (d := w.due_ms()) is not None]
            due += list(self.ctx.timers.values())
            if not due or min(due) > end:
                break
            at = max(min(due), self.ctx.now)
            same_time_steps = same_time_steps + 1 if at == self.ctx.now else 0
            assert same_time_steps < 100, f"no progress at {at}"
            for worker in self.workers.values():
                if worker.due_ms() is not None:
                    worker.apply(worker.state.check_session(at))
            self.ctx.advance(at - self.ctx.now)
            for worker in list(self.workers.values()):
                rounds = 0
                while (d := worker.due_ms()) is not None and d <= self.ctx.now:
                    worker.heartbeat()
                    self._check_no_double_runs()
                    rounds += 1
                    assert rounds < 10, f"{worker.name} heartbeats in a loop"
        self.ctx.advance(end - self.ctx.now)

    def describe(self) -> Any:
        return self.ctx.describe(G)

    def assert_safe(self) -> None:
        self._check_no_double_runs()
        overlaps = self.registry.overlaps()
        assert not overlaps, "\n".join(str(o) for o in overlaps)
