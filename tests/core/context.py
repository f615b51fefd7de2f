"""A test harness for the sans-IO core: feed requests, move a fake clock, fire timers.

Every record a call emits is kept, so a test can replay the whole log into a fresh
coordinator and compare (the start-up path), and can assert on records directly.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from coordinator.assignors import load_assignors
from coordinator.config import ServerConfig
from coordinator.core.coordinator import GroupCoordinator
from coordinator.core.group import units_to_wire
from coordinator.core.result import (
    AssignorRun,
    Record,
    Result,
    TimerCancel,
    TimerClearGroup,
    TimerKey,
    TimerSet,
)
from coordinator.units import CONNECTOR, Unit
from protocol.errors import ErrorCode
from protocol.messages import (
    ConnectGroupDescribeRequest,
    ConnectGroupHeartbeatRequest,
    ConnectGroupInstallAssignmentRequest,
    ConnectGroupPrepareAssignmentRequest,
)
from protocol.messages.connect_group_heartbeat_request import ClientAssignor
from protocol.messages.connect_group_install_assignment_request import MemberAssignment

ICA = "incremental-cooperative"


def units(*names: str) -> frozenset[Unit]:
    """units("A", "A-0", "B-1") -> {("A", -1), ("A", 0), ("B", 1)}."""
    result: set[Unit] = set()
    for name in names:
        connector, _, task = name.partition("-")
        result.add((connector, int(task)) if task else (connector, CONNECTOR))
    return frozenset(result)


def wire_units(value: Any) -> frozenset[Unit]:
    found: set[Unit] = {(name, CONNECTOR) for name in value.connectors}
    found.update((task.connector, task.task) for task in value.tasks)
    return frozenset(found)


def client_assignor(name: str = ICA, low: int = 1, high: int = 2, reason: int = 0,
                    version: int | None = None, metadata: bytes = b"") -> ClientAssignor:
    return ClientAssignor(name=name, minimum_version=low, maximum_version=high, reason=reason,
                          version=high if version is None else version, metadata=metadata)


class Context:
    def __init__(self, config: ServerConfig | None = None, start_ms: int = 1_000_000,
                 run_jobs: bool = True) -> None:
        self.config = config or ServerConfig(assignment_interval_ms=0)
        self.assignors = load_assignors(self.config.server_assignors)
        self.core = GroupCoordinator(self.config, self.assignors)
        self.now = start_ms
        self.timers: dict[TimerKey, int] = {}
        self.log: list[Record] = []
        self.last: Result[Any] | None = None
        # Offloaded assignor runs: finished at once when run_jobs, else left for the test.
        self.run_jobs = run_jobs
        self.jobs: list[AssignorRun] = []

    # --- plumbing ---
    def apply(self, result: Result[Any]) -> Any:
        self.last = result
        self.log.extend(result.records)
        self.apply_timers(result.timers)
        self.jobs.extend(result.jobs)
        response = result.response
        while self.run_jobs and self.jobs:
            self.finish_job(self.jobs.pop(0))
        self.last = result
        return response

    def apply_timers(self, operations: Iterable[Any]) -> None:
        for op in operations:
            if isinstance(op, TimerSet):
                self.timers[op.key] = op.deadline_ms
            elif isinstance(op, TimerCancel):
                self.timers.pop(op.key, None)
            elif isinstance(op, TimerClearGroup):
                for key in [k for k in self.timers if k[1] == op.group_id]:
                    del self.timers[key]

    def finish_job(self, job: AssignorRun, outcome: Any = None) -> None:
        """Complete an offloaded run, as the worker pool would (or with a given outcome)."""
        if outcome is None:
            try:
                outcome = self.assignors[job.assignor].assign(job.spec)
            except Exception as error:
                outcome = error
        self.apply(self.core.complete_assignor_run(job, outcome, self.now))

    def advance(self, ms: int) -> list[TimerKey]:
        """Move the clock, firing due timers in deadline order; returns the fired keys."""
        end = self.now + ms
        fired = []
        while True:
            due = [(deadline, key) for key, deadline in self.timers.items() if deadline <= end]
            if not due:
                break
            deadline, key = min(due)
            del self.timers[key]
            self.now = max(self.now, deadline)
            self.apply(self.core.on_timer(key, self.now))
            fired.append(key)
        self.now = end
        return fired

    def replayed(self) -> GroupCoordinator:
        fresh = GroupCoordinator(self.config, self.assignors)
        for record in self.log:
            fresh.replay(record)
        return fresh

    # --- the APIs ---
    def heartbeat(self, group: str, member: str, epoch: int, *, instance_id: str | None = None,
                  worker_url: str | None = None, rebalance_timeout_ms: int = -1,
                  server_assignor: str | None = None,
                  client_assignors: Iterable[ClientAssignor] | None = None,
                  owned: Iterable[Unit] | None = None) -> Any:
        request = ConnectGroupHeartbeatRequest(
            group_id=group, member_id=member, member_epoch=epoch, instance_id=instance_id,
            worker_url=worker_url, rebalance_timeout_ms=rebalance_timeout_ms,
            server_assignor=server_assignor,
            client_assignors=None if client_assignors is None else tuple(client_assignors),
            owned_connectors_and_tasks=None if owned is None else units_to_wire(owned),
        )
        return self.apply(self.core.heartbeat(request, self.now))

    def join(self, group: str, member: str, *, instance_id: str | None = None,
             client: bool = True, server_assignor: str | None = None,
             assignors: Iterable[ClientAssignor] | None = None,
             rebalance_timeout_ms: int = 30_000, worker_url: str | None = None) -> Any:
        client_assignors = None
        if server_assignor is None and client:
            client_assignors = list(assignors) if assignors is not None else [client_assignor()]
        return self.heartbeat(group, member, 0, instance_id=instance_id,
                              worker_url=worker_url or f"http://{member}:8083",
                              rebalance_timeout_ms=rebalance_timeout_ms,
                              server_assignor=server_assignor, client_assignors=client_assignors)

    def prepare(self, group: str, member: str, epoch: int) -> Any:
        return self.apply(self.core.prepare_assignment(
            ConnectGroupPrepareAssignmentRequest(group_id=group, member_id=member,
                                                 member_epoch=epoch), self.now))

    def install(self, group: str, member: str, epoch: int, group_epoch: int,
                assignment: Mapping[str, Iterable[Unit]], error: int = 0) -> Any:
        members = tuple(
            MemberAssignment(member_id=mid, assigned=units_to_wire(u), version=1, metadata=b"")
            for mid, u in assignment.items()
        )
        return self.apply(self.core.install_assignment(
            ConnectGroupInstallAssignmentRequest(group_id=group, member_id=member,
                                                 member_epoch=epoch, group_epoch=group_epoch,
                                                 error=error, members=members), self.now))

    def describe(self, group: str) -> Any:
        return self.core.describe(ConnectGroupDescribeRequest(group_ids=(group,)),
                                  self.now).groups[0]

    def put_connector(self, group: str, name: str, tasks: int) -> Any:
        return self.apply(self.core.put_connector(group, name, tasks, self.now))

    # --- conveniences ---
    def member_view(self, group: str, member: str) -> Any:
        for described in self.describe(group).members:
            if described.member_id == member:
                return described
        raise AssertionError(f"{member} is not a member of {group}")

    def compute_and_install(self, group: str, member: str, epoch: int,
                            assign: Callable[[Any], Mapping[str, Iterable[Unit]]]) -> Any:
        """What a chosen worker does on COMPUTE_ASSIGNMENT: Prepare, assign, Install."""
        prepared = self.prepare(group, member, epoch)
        assert prepared.error_code == ErrorCode.NONE, prepared.error_message
        response = self.install(group, member, epoch, prepared.group_epoch, assign(prepared))
        assert response.error_code == ErrorCode.NONE, response.error_message
        return prepared
