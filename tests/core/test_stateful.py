"""A Hypothesis state machine: joins, leaves, bounces, lost responses, timeouts, installs
(valid and invalid) and connector changes, with the group's invariants checked after every
step and convergence checked once the chaos stops.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from coordinator.units import Unit
from protocol.errors import ErrorCode

from .context import Context, client_assignor, wire_units

G = "g"
WORKERS = ["w1", "w2", "w3", "w4"]
STATIC = {"w3": "instance-3", "w4": "instance-4"}
CONNECTORS = ["A", "B", "C"]


@dataclass
class Worker:
    """What a well-behaved worker knows: its epoch and the units it runs."""

    member_id: str
    joined: bool = False
    epoch: int = 0
    owned: frozenset[Unit] = frozenset()  # the units it runs (and reports)
    stopping: frozenset[Unit] = frozenset()  # revoked, but not yet stopped
    compute: bool = False
    missed: bool = False  # a response was lost since the last one it read


@dataclass
class Seen:
    group_epoch: int = 0
    assignment_epoch: int = 0
    member_epochs: dict[str, int] = field(default_factory=dict)


class CoordinatorMachine(RuleBasedStateMachine):
    server_assignor: str | None = None

    def __init__(self) -> None:
        super().__init__()
        self.ctx = Context()
        self.workers = {w: Worker(w) for w in WORKERS}
        self.seen = Seen()
        self.rejoined: set[str] = set()

    @initialize(tasks=st.lists(st.integers(0, 3), min_size=1, max_size=3))
    def create_connectors(self, tasks: list[int]) -> None:
        for name, count in zip(CONNECTORS, tasks, strict=False):
            self.ctx.put_connector(G, name, count)

    # --- the worker side ---
    def _handle(self, worker: Worker, response: Any, slow: bool = False) -> None:
        code = response.error_code
        if code in (ErrorCode.NONE, ErrorCode.COMPUTE_ASSIGNMENT):
            assert response.member_epoch >= 1
            worker.epoch = response.member_epoch
            if response.assignment is not None:
                assigned = wire_units(response.assignment.assigned)
                revoked = worker.owned - assigned
                added = assigned - worker.owned
                # After a lost response the full set may differ both ways from what the
                # worker runs; otherwise a response never revokes and assigns at once.
                assert worker.missed or not (revoked and added), \
                    "a response revoked and assigned at once"
                if slow and revoked:
                    worker.stopping = revoked  # still running them for a while
                else:
                    worker.owned, worker.stopping = assigned, frozenset()
                    worker.missed = False
            worker.compute = code == ErrorCode.COMPUTE_ASSIGNMENT
        elif code in (ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.FENCED_MEMBER_EPOCH):
            self._reset(worker)
        else:
            raise AssertionError(f"unexpected error {code}: {response.error_message}")

    @staticmethod
    def _reset(worker: Worker) -> None:
        worker.joined, worker.epoch, worker.compute, worker.missed = False, 0, False, False
        worker.owned = worker.stopping = frozenset()

    def _join(self, worker: Worker) -> Any:
        self.rejoined.add(worker.member_id)
        worker.owned = worker.stopping = frozenset()
        response = self.ctx.join(G, worker.member_id,
                                 instance_id=STATIC.get(worker.member_id),
                                 server_assignor=self.server_assignor)
        if response.error_code == ErrorCode.UNRELEASED_INSTANCE_ID:
            return response  # the instance's previous member id is still active
        worker.joined = True
        self._handle(worker, response)
        return response

    @rule(name=st.sampled_from(WORKERS))
    def join(self, name: str) -> None:
        worker = self.workers[name]
        if not worker.joined:
            self._join(worker)

    @rule(name=st.sampled_from(WORKERS), lose=st.booleans(), slow=st.booleans())
    def heartbeat(self, name: str, lose: bool, slow: bool) -> None:
        worker = self.workers[name]
        if not worker.joined:
            return
        response = self.ctx.heartbeat(G, name, worker.epoch, owned=worker.owned)
        if not lose:
            self._handle(worker, response, slow)
        elif response.error_code in (ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.FENCED_MEMBER_EPOCH):
            self._handle(worker, response)  # (an error makes it rejoin either way)
        else:
            worker.missed = True  # a lost response: the worker never hears of the change

    @rule(name=st.sampled_from(WORKERS))
    def finish_stopping(self, name: str) -> None:
        worker = self.workers[name]
        worker.owned, worker.stopping = worker.owned - worker.stopping, frozenset()

    @rule(name=st.sampled_from(WORKERS), temporary=st.booleans())
    def leave(self, name: str, temporary: bool) -> None:
        worker = self.workers[name]
        if not worker.joined:
            return
        epoch = -2 if temporary and name in STATIC else -1
        response = self.ctx.heartbeat(G, name, epoch, instance_id=STATIC.get(name))
        # A worker whose session already expired learns it is no longer a member.
        assert response.error_code in (ErrorCode.NONE, ErrorCode.UNKNOWN_MEMBER_ID), \
            response.error_message
        if response.error_code == ErrorCode.NONE:
            assert response.member_epoch == epoch
        self._reset(worker)

    @rule(ms=st.sampled_from([500, 3_000, 11_000, 31_000]))
    def advance(self, ms: int) -> None:
        self.ctx.advance(ms)

    @rule(name=st.sampled_from(CONNECTORS), tasks=st.integers(0, 4), delete=st.booleans())
    def change_connector(self, name: str, tasks: int, delete: bool) -> None:
        if delete and name in self.ctx.core.store.groups[G].connectors:
            self.ctx.apply(self.ctx.core.delete_connector(G, name, self.ctx.now))
        elif not delete:
            self.ctx.put_connector(G, name, tasks)

    @rule(name=st.sampled_from(WORKERS), data=st.data(),
          kind=st.sampled_from(["valid", "partial", "unknown-unit", "twice", "unknown-member",
                                "error"]))
    def install(self, name: str, data: st.DataObject, kind: str) -> None:
        worker = self.workers[name]
        if not (worker.joined and worker.compute):
            return
        prepared = self.ctx.prepare(G, name, worker.epoch)
        if prepared.error_code != ErrorCode.NONE:
            assert prepared.error_code in (ErrorCode.UNKNOWN_MEMBER_ID,
                                           ErrorCode.FENCED_MEMBER_EPOCH)
            return
        members = [m.member_id for m in prepared.members]
        all_units = sorted(wire_units(prepared.connectors_and_tasks))
        assignment: dict[str, set[Unit]] = {m: set() for m in members}
        for unit in all_units:
            if kind == "partial" and data.draw(st.booleans()):
                continue
            assignment[data.draw(st.sampled_from(members))].add(unit)
        if kind == "unknown-unit":
            assignment[members[0]].add(("no-such-connector", 0))
        elif kind == "twice" and all_units and len(members) > 1:
            assignment[members[0]].add(all_units[0])
            assignment[members[1]].add(all_units[0])
        elif kind == "unknown-member":
            assignment["stranger"] = set()
        before = len(self.ctx.log)
        response = self.ctx.install(G, name, worker.epoch, prepared.group_epoch, assignment,
                                    error=1 if kind == "error" else 0)
        invalid = kind in ("unknown-unit", "unknown-member") or (
            kind == "twice" and all_units and len(members) > 1)
        if invalid:
            assert response.error_code == ErrorCode.INVALID_ASSIGNMENT
            assert len(self.ctx.log) == before  # nothing changed
        else:
            assert response.error_code == ErrorCode.NONE, response.error_message
        worker.compute = False

    # --- invariants ---
    @invariant()
    def one_owner_per_unit_and_ordered_epochs(self) -> None:
        group = self.ctx.core.store.groups.get(G)
        if group is None:
            return
        holders: dict[Unit, str] = {}
        for member in group.members.values():
            for unit in member.current.held:
                assert unit not in holders, f"{unit} held by {holders[unit]} and {member.member_id}"
                holders[unit] = member.member_id
        assert holders == group.owners
        assert group.assignment_epoch <= group.epoch
        assert group.epoch >= self.seen.group_epoch
        assert group.assignment_epoch >= self.seen.assignment_epoch
        self.seen.group_epoch, self.seen.assignment_epoch = group.epoch, group.assignment_epoch
        for member in group.members.values():
            epoch = member.current.epoch
            if epoch >= 0:
                assert epoch <= group.assignment_epoch
                if member.member_id not in self.rejoined:
                    assert epoch >= self.seen.member_epochs.get(member.member_id, 0)
            self.seen.member_epochs[member.member_id] = max(epoch, 0)
        self.rejoined.clear()

    @invariant()
    def workers_run_only_what_the_coordinator_lets_them(self) -> None:
        group = self.ctx.core.store.groups.get(G)
        if group is None:
            return
        running: dict[Unit, str] = {}
        for worker in self.workers.values():
            member = group.members.get(worker.member_id)
            if not worker.joined or member is None:
                continue  # a worker the coordinator dropped must stop on its own
            assert worker.owned <= member.current.held, (worker, member.current)
            for unit in worker.owned:
                assert unit not in running, f"{unit} runs on {running[unit]} and {worker}"
                running[unit] = worker.member_id

    @invariant()
    def replay_gives_the_same_state(self) -> None:
        if G not in self.ctx.core.store.groups:
            return
        fresh = self.ctx.replayed()
        assert fresh.describe_group(G) == self.ctx.core.describe_group(G)

    def teardown(self) -> None:
        """Stop the chaos: every worker (re)joins and heartbeats; the group must settle."""
        if G not in self.ctx.core.store.groups:
            return
        reason = 0
        for _ in range(40):
            for worker in self.workers.values():
                if not worker.joined:
                    self._join(worker)
                    continue
                worker.owned, worker.stopping = worker.owned - worker.stopping, frozenset()
                response = self.ctx.heartbeat(G, worker.member_id, worker.epoch,
                                              owned=worker.owned)
                self._handle(worker, response)
                if worker.compute:
                    self._install_everything(worker)
            self.ctx.advance(1_000)
            described = self.ctx.describe(G)
            if described.group_state == "STABLE" and len(described.members) == len(WORKERS):
                if not self.ctx.core.unassigned_units(G):
                    break
                # Units left out on purpose stay out until an assignor asks for a new run,
                # as a client assignor does through its Reason field.
                reason += 1
                first = self.workers[WORKERS[0]]
                self._handle(first, self.ctx.heartbeat(
                    G, first.member_id, first.epoch, owned=first.owned,
                    client_assignors=[client_assignor(reason=reason)]))
        described = self.ctx.describe(G)
        assert described.group_state == "STABLE", described
        held: list[Unit] = []
        for member in described.members:
            held.extend(wire_units(member.assigned))
            assert wire_units(member.assigned) == self.workers[member.member_id].owned
        assert sorted(held) == sorted(wire_units(described.connectors_and_tasks))

    def _install_everything(self, worker: Worker) -> None:
        prepared = self.ctx.prepare(G, worker.member_id, worker.epoch)
        if prepared.error_code != ErrorCode.NONE:
            return
        members = sorted(m.member_id for m in prepared.members)
        assignment: dict[str, set[Unit]] = {m: set() for m in members}
        for index, unit in enumerate(sorted(wire_units(prepared.connectors_and_tasks))):
            assignment[members[index % len(members)]].add(unit)
        response = self.ctx.install(G, worker.member_id, worker.epoch, prepared.group_epoch,
                                    assignment)
        assert response.error_code == ErrorCode.NONE, response.error_message
        worker.compute = False


class ServerAssignedMachine(CoordinatorMachine):
    server_assignor = "round-robin"


TestClientAssigned = CoordinatorMachine.TestCase
TestServerAssigned = ServerAssignedMachine.TestCase


class BalancedMachine(CoordinatorMachine):
    server_assignor = "balanced"


TestBalancedAssigned = BalancedMachine.TestCase
