"""Converting live groups between the classic and the connect type, against the core:
classic Connect workers (parked JoinGroup/SyncGroup in a classic group, answered at once
through the bridge) and new-protocol workers join and leave; no unit is ever held by two
workers, at any step, across upgrade, downgrade, restarts and rolled-back writes."""

from __future__ import annotations

from typing import Any

import pytest

from coordinator.connect_protocol import (
    ConnectAssignment,
    WorkerMetadata,
    decode_assignment,
    encode_assignment,
    encode_worker_metadata,
)
from coordinator.core.classic.bridge import _client_assignors
from coordinator.core.classic.engine import JOIN, SYNC, JoinAnswer, Parked, SyncAnswer
from coordinator.core.group import units_to_wire
from coordinator.units import Unit
from protocol.errors import ErrorCode
from protocol.messages import (
    ConnectGroupHeartbeatRequest,
    ConnectGroupInstallAssignmentRequest,
    ConnectGroupPrepareAssignmentRequest,
)
from protocol.messages.connect_group_install_assignment_request import MemberAssignment
from tests.core.classic_context import ClassicContext
from tests.core.context import wire_units
from tests.core.test_classic_bridge import UNITS, allocations, cooperative

E = ErrorCode


class ClassicWorker:
    """A Connect worker's classic loop (WorkerCoordinator, cooperative) that copes with
    both group types: parked requests in a classic group, immediate ones when bridged."""

    def __init__(self, ctx: ClassicContext, name: str) -> None:
        self.ctx, self.name = ctx, name
        self.member_id = ""
        self.generation = -1
        self.held: frozenset[Unit] = frozenset()
        self.phase = "join"
        # Set: its SyncGroup waits for its next step after the JoinGroup answer, so other
        # workers' requests come in between (a leader's assignment then lands on
        # holdings that moved since it was shown them).
        self.pause_after_join = False
        self.pending_sync: dict[str, bytes] = {}

    def metadata(self) -> bytes:
        return encode_worker_metadata(WorkerMetadata(
            2, f"http://{self.name}", 5, ConnectAssignment(2, assigned=self.held)))

    def step(self) -> None:
        ctx = self.ctx
        if self.phase == "stable":
            code = ctx.heartbeat(self.member_id, self.generation)
            if code == E.NONE:
                return
            if code == E.UNKNOWN_MEMBER_ID:
                self.member_id = ""
            self.phase = "join"
        if self.phase == "join":
            answer = ctx.join(self.member_id, protocols=(("sessioned", self.metadata()),
                                                         ("compatible", self.metadata())),
                              client_id=self.name)
            if isinstance(answer, Parked):
                self.phase = "wait_join"
                return
            ctx.take(JOIN, answer.member_id)  # (kept for `take`: not needed here)
            self._joined(answer)
        elif self.phase == "wait_join":
            taken = ctx.take(JOIN, self.member_id)
            if taken is not None:
                self._joined(taken)
        elif self.phase == "wait_sync":
            taken = ctx.take(SYNC, self.member_id)
            if taken is not None:
                self._synced(taken)
        elif self.phase == "sync":
            self._sync(self.pending_sync)

    def _joined(self, answer: JoinAnswer) -> None:
        if answer.error == E.MEMBER_ID_REQUIRED:
            self.member_id, self.phase = answer.member_id, "join"
            return
        if answer.error != E.NONE:
            if answer.error == E.UNKNOWN_MEMBER_ID:
                self.member_id = ""
            self.phase = "join"
            return
        self.generation = answer.generation
        assignments: dict[str, bytes] = {}
        if answer.leader == self.member_id:
            assignments = {m: encode_assignment(a)
                           for m, a in cooperative(allocations(answer)).items()}
        if self.pause_after_join:
            self.phase, self.pending_sync = "sync", assignments
            return
        self._sync(assignments)

    def _sync(self, assignments: dict[str, bytes]) -> None:
        synced = self.ctx.sync(self.member_id, self.generation, assignments=assignments)
        if isinstance(synced, Parked):
            self.phase = "wait_sync"
            return
        self._synced(synced)

    def _synced(self, synced: SyncAnswer) -> None:
        if synced.error != E.NONE:
            self.phase = "join"
            return
        told = decode_assignment(synced.assignment)
        assert not (told.assigned and told.revoked), "never revoke and grant at once"
        self.held = (self.held - told.revoked) | told.assigned
        self.phase = "join" if told.revoked else "stable"


class NewWorker:
    """A new-protocol worker: ConnectGroupHeartbeat, and Prepare/Install when chosen."""

    def __init__(self, ctx: ClassicContext, name: str) -> None:
        self.ctx, self.name = ctx, name
        self.epoch = 0
        self.held: frozenset[Unit] = frozenset()
        self.gone = False
        self.last_error = 0
        self.last_message: str | None = None

    def _request(self, epoch: int) -> ConnectGroupHeartbeatRequest:
        metadata = encode_worker_metadata(WorkerMetadata(2, f"http://{self.name}", 5))
        joining = epoch == 0
        return ConnectGroupHeartbeatRequest(
            group_id="g", member_id=self.name, member_epoch=epoch, instance_id=None,
            worker_url=f"http://{self.name}" if joining else None,
            rebalance_timeout_ms=30_000 if joining else -1, server_assignor=None,
            client_assignors=_client_assignors((("sessioned", metadata),)) if joining
            else None,
            owned_connectors_and_tasks=None if joining else units_to_wire(self.held))

    def step(self) -> None:
        if self.gone:
            return
        ctx = self.ctx
        response = ctx.apply(ctx.core.heartbeat(self._request(self.epoch), ctx.now))
        self.last_error, self.last_message = response.error_code, response.error_message
        if response.error_code not in (E.NONE, E.COMPUTE_ASSIGNMENT):
            if response.error_code in (E.UNKNOWN_MEMBER_ID, E.FENCED_MEMBER_EPOCH):
                self.epoch, self.held = 0, frozenset()
            return
        self.epoch = response.member_epoch
        if response.assignment is not None:
            self.held = wire_units(response.assignment.assigned)
        if response.error_code == E.COMPUTE_ASSIGNMENT:
            self._assign()

    def _assign(self) -> None:
        ctx = self.ctx
        prepared = ctx.apply(ctx.core.prepare_assignment(ConnectGroupPrepareAssignmentRequest(
            group_id="g", member_id=self.name, member_epoch=self.epoch), ctx.now))
        if prepared.error_code != E.NONE:
            return
        members = sorted(m.member_id for m in prepared.members)
        base, extra = divmod(len(UNITS), len(members))
        share = {m: base + (i < extra) for i, m in enumerate(members)}
        parts: dict[str, set[Unit]] = {}
        taken: set[Unit] = set()
        for member in prepared.members:
            keep = sorted(wire_units(member.target) & UNITS)[:share[member.member_id]]
            parts[member.member_id] = set(keep)
            taken |= set(keep)
        free = sorted(UNITS - taken)
        for member_id in members:
            while len(parts[member_id]) < share[member_id] and free:
                parts[member_id].add(free.pop())
        ctx.apply(ctx.core.install_assignment(ConnectGroupInstallAssignmentRequest(
            group_id="g", member_id=self.name, member_epoch=self.epoch,
            group_epoch=prepared.group_epoch, error=0,
            members=tuple(MemberAssignment(member_id=m, assigned=units_to_wire(u), version=2,
                                           metadata=b"") for m, u in parts.items())),
            ctx.now))

    def leave(self) -> None:
        ctx = self.ctx
        response = ctx.apply(ctx.core.heartbeat(ConnectGroupHeartbeatRequest(
            group_id="g", member_id=self.name, member_epoch=-1, instance_id=None,
            worker_url=None, rebalance_timeout_ms=-1, server_assignor=None,
            client_assignors=None, owned_connectors_and_tasks=None), ctx.now))
        assert response.error_code == E.NONE, response.error_message
        self.gone, self.held = True, frozenset()


def no_double_holding(workers: list[Any]) -> None:
    seen: dict[Unit, str] = {}
    for worker in workers:
        for unit in worker.held:
            assert unit not in seen, f"{unit} held by {seen[unit]} and {worker.name}"
            seen[unit] = worker.name


def run(ctx: ClassicContext, workers: list[Any], rounds: int = 30) -> None:
    for _ in range(rounds):
        for worker in workers:
            worker.step()
            no_double_holding(workers)
        ctx.advance(1_000)


def classic_group(ctx: ClassicContext, count: int = 3) -> list[Any]:
    workers: list[Any] = [ClassicWorker(ctx, f"w{i}") for i in range(1, count + 1)]
    run(ctx, workers)
    assert "g" in ctx.engine.store.groups
    assert frozenset().union(*(w.held for w in workers)) == UNITS
    return workers


def upgraded_group(ctx: ClassicContext) -> tuple[list[Any], NewWorker]:
    """A classic group of three that a new-protocol worker joined (upgraded), settled."""
    workers = classic_group(ctx)
    newcomer = NewWorker(ctx, "n1")
    workers.append(newcomer)
    run(ctx, workers)
    return workers, newcomer


def held_by_core(ctx: ClassicContext) -> dict[str, frozenset[Unit]]:
    group = ctx.core.store.groups["g"]
    return {member_id: member.current.assigned for member_id, member in group.members.items()}


def test_first_new_protocol_join_upgrades_a_classic_group() -> None:
    ctx = ClassicContext(assignment_interval_ms=0)
    workers = classic_group(ctx)
    generation = ctx.group().generation
    before = {w.member_id: w.held for w in workers}
    newcomer = NewWorker(ctx, "n1")
    response = ctx.apply(ctx.core.heartbeat(newcomer._request(0), ctx.now))
    assert response.error_code in (E.NONE, E.COMPUTE_ASSIGNMENT), response.error_message
    newcomer.epoch = response.member_epoch
    assert "g" not in ctx.engine.store.groups
    group = ctx.core.store.groups["g"]
    assert group.assignment_epoch == generation  # the classic generation ...
    assert group.epoch == generation + 1  # ... then the join bumps the epoch
    assert held_by_core(ctx) == {**before, "n1": frozenset()}  # each keeps what it holds
    assert {key for key in ctx.engine.store.bridged} == {("g", m) for m in before}
    # Everyone carries on: the classic workers through the bridge, and all converge.
    workers.append(newcomer)
    run(ctx, workers)
    assert sorted(len(w.held) for w in workers) == [1, 2, 2, 2]
    assert frozenset().union(*(w.held for w in workers)) == UNITS


def test_parked_classic_requests_get_rebalance_in_progress_on_upgrade() -> None:
    ctx = ClassicContext(assignment_interval_ms=0)
    workers = classic_group(ctx, 2)
    late = ClassicWorker(ctx, "w3")
    late.step()
    late.step()  # its JoinGroup is parked, waiting for the others to rejoin
    assert late.phase == "wait_join"
    NewWorker(ctx, "n1").step()
    answer = ctx.take(JOIN, late.member_id)
    assert isinstance(answer, JoinAnswer) and answer.error == E.REBALANCE_IN_PROGRESS
    del workers


def test_last_new_protocol_leave_downgrades_and_a_restart_keeps_it() -> None:
    ctx = ClassicContext(assignment_interval_ms=0)
    workers, newcomer = upgraded_group(ctx)
    epoch = ctx.core.store.groups["g"].epoch + 1  # (after the leave's bump)
    newcomer.leave()
    workers.remove(newcomer)
    assert "g" not in ctx.core.store.groups and not ctx.engine.store.bridged
    classic = ctx.group()
    assert classic.generation == epoch and classic.state.label == "PreparingRebalance"
    assert ("classic_phase", "g", "") in ctx.timers
    ctx.restart()  # the conversion is in the log: the classic group comes back
    assert ctx.group().generation == epoch and "g" not in ctx.core.store.groups
    run(ctx, workers)
    assert ctx.group().state.label == "Stable"
    assert frozenset().union(*(w.held for w in workers)) == UNITS


def test_a_sync_group_waiting_for_an_assignment_is_answered_when_the_group_downgrades(
) -> None:
    """A bridged worker's SyncGroup waits for the assignment a bridged worker computes;
    the group becomes classic meanwhile (its last new-protocol member leaves): it is
    answered REBALANCE_IN_PROGRESS, so the worker rejoins the classic group instead of
    waiting while that group's join phase ends without it."""
    ctx = ClassicContext(assignment_interval_ms=0, classic_join_wait_ms=0)
    workers, newcomer = upgraded_group(ctx)
    group = ctx.core.store.groups["g"]
    late_id = ctx.new_member(protocols=(("sessioned", ClassicWorker(ctx, "w4").metadata()),),
                             client_id="w4")
    joined = ctx.take(JOIN, late_id)
    assert isinstance(joined, JoinAnswer) and joined.error == E.NONE
    assert group.chosen_member is not None and ("g", group.chosen_member) in \
        ctx.engine.store.bridged and group.chosen_member != late_id
    assert isinstance(ctx.sync(late_id, joined.generation), Parked)
    newcomer.leave()
    assert "g" not in ctx.core.store.groups  # classic now
    answer = ctx.take(SYNC, late_id)
    assert isinstance(answer, SyncAnswer) and answer.error == E.REBALANCE_IN_PROGRESS


def test_a_held_join_group_is_answered_when_the_group_downgrades() -> None:
    """A classic worker joins a connect group; its JoinGroup is held until the others
    have rejoined in the round; the group becomes classic meanwhile: it is answered
    REBALANCE_IN_PROGRESS and joins the classic group instead."""
    ctx = ClassicContext(assignment_interval_ms=0)
    _workers, newcomer = upgraded_group(ctx)
    late = ctx.join("", protocols=(("sessioned", ClassicWorker(ctx, "w4").metadata()),),
                    client_id="w4")
    assert isinstance(late, JoinAnswer) and late.error == E.MEMBER_ID_REQUIRED
    held = ctx.join(late.member_id,
                    protocols=(("sessioned", ClassicWorker(ctx, "w4").metadata()),),
                    client_id="w4")
    assert isinstance(held, Parked)  # the classic workers have not rejoined yet
    newcomer.leave()
    assert "g" not in ctx.core.store.groups  # classic now
    answer = ctx.take(JOIN, late.member_id)
    assert isinstance(answer, JoinAnswer) and answer.error == E.REBALANCE_IN_PROGRESS


@pytest.mark.parametrize("policy", ["downgrade", "disabled"])
def test_the_policy_refuses_an_upgrade(policy: str) -> None:
    ctx = ClassicContext(assignment_interval_ms=0, connect_migration_policy=policy)
    classic_group(ctx, 2)
    before = len(ctx.log)
    newcomer = NewWorker(ctx, "n1")
    newcomer.step()
    assert newcomer.last_error == E.INCONSISTENT_GROUP_PROTOCOL
    assert newcomer.last_message and "group.connect.migration.policy" in newcomer.last_message
    assert len(ctx.log) == before and "g" in ctx.engine.store.groups


@pytest.mark.parametrize("policy", ["upgrade", "disabled"])
def test_the_policy_refuses_a_downgrade(policy: str) -> None:
    ctx = ClassicContext(assignment_interval_ms=0, connect_migration_policy="bidirectional")
    workers, newcomer = upgraded_group(ctx)
    ctx.core.config = ctx.config = type(ctx.config)(**{
        **{f: getattr(ctx.config, f) for f in ctx.config.__struct_fields__},
        "connect_migration_policy": policy})
    newcomer.leave()
    workers.remove(newcomer)
    assert "g" in ctx.core.store.groups and "g" not in ctx.engine.store.groups
    run(ctx, workers)  # the classic workers stay bridged and take the units back
    assert frozenset().union(*(w.held for w in workers)) == UNITS


def test_restart_right_after_an_upgrade() -> None:
    ctx = ClassicContext(assignment_interval_ms=0)
    workers = classic_group(ctx)
    newcomer = NewWorker(ctx, "n1")
    newcomer.step()
    ctx.restart()
    assert "g" in ctx.core.store.groups and "g" not in ctx.engine.store.groups
    workers.append(newcomer)
    run(ctx, workers)
    assert frozenset().union(*(w.held for w in workers)) == UNITS


def test_an_upgrade_that_cannot_be_written_is_rolled_back() -> None:
    ctx = ClassicContext(assignment_interval_ms=0)
    workers = classic_group(ctx)
    fresh = ClassicContext(assignment_interval_ms=0)
    fresh.log = list(ctx.log)
    fresh.now = ctx.now
    fresh.restart()  # a coordinator that loaded only what is durable
    newcomer = NewWorker(ctx, "n1")
    result = ctx.core.heartbeat(newcomer._request(0), ctx.now)
    assert result.response.error_code in (E.NONE, E.COMPUTE_ASSIGNMENT)
    assert "g" in ctx.core.store.groups
    ctx.core.rollback(result)  # the write failed: undo, then the one scheduling rule
    timers = ctx.core.reschedule(sorted(result.touched_groups()), ctx.now)
    assert "g" not in ctx.core.store.groups and not ctx.engine.store.bridged
    assert ctx.group().meta == fresh.group().meta
    assert ctx.group().members == fresh.group().members
    expected = fresh.core.reschedule(["g"], ctx.now)
    assert sorted(map(repr, timers)) == sorted(map(repr, expected))
    ctx.timers = {op.key: op.deadline_ms for op in timers if hasattr(op, "key")}
    run(ctx, workers)  # the classic group carries on
    assert ctx.group().state.label == "Stable"
    assert frozenset().union(*(w.held for w in workers)) == UNITS


def test_a_downgrade_that_cannot_be_written_is_rolled_back() -> None:
    ctx = ClassicContext(assignment_interval_ms=0)
    workers, newcomer = upgraded_group(ctx)
    group_before = ctx.core.store.groups["g"]
    members_before = {m: (v.current, v.metadata) for m, v in group_before.members.items()}
    result = ctx.core.heartbeat(ConnectGroupHeartbeatRequest(
        group_id="g", member_id="n1", member_epoch=-1, instance_id=None, worker_url=None,
        rebalance_timeout_ms=-1, server_assignor=None, client_assignors=None,
        owned_connectors_and_tasks=None), ctx.now)
    assert result.response.error_code == E.NONE
    assert "g" in ctx.engine.store.groups  # downgraded, in memory only
    ctx.core.rollback(result)
    ctx.core.reschedule(sorted(result.touched_groups()), ctx.now)
    assert "g" not in ctx.engine.store.groups
    group = ctx.core.store.groups["g"]
    assert {m: (v.current, v.metadata) for m, v in group.members.items()} == members_before
    assert "n1" in group.members


def test_a_server_assignor_joiner_cannot_upgrade_and_changes_nothing() -> None:
    ctx = ClassicContext(assignment_interval_ms=0)
    classic_group(ctx, 2)
    before = len(ctx.log)
    response = ctx.apply(ctx.core.heartbeat(ConnectGroupHeartbeatRequest(
        group_id="g", member_id="s1", member_epoch=0, instance_id=None,
        worker_url="http://s1", rebalance_timeout_ms=30_000, server_assignor="balanced",
        client_assignors=None, owned_connectors_and_tasks=None), ctx.now))
    assert response.error_code == E.INCONSISTENT_GROUP_PROTOCOL
    assert "client assignor" in response.error_message
    assert len(ctx.log) == before and "g" in ctx.engine.store.groups
    assert "g" not in ctx.core.store.groups


def test_a_follower_upgraded_before_its_sync_keeps_what_it_ran() -> None:
    ctx = ClassicContext(assignment_interval_ms=0)
    workers = classic_group(ctx)
    group = ctx.group()
    gone = next(w for w in workers if w.member_id != group.meta.leader)
    workers.remove(gone)
    ctx.leave((gone.member_id, None))  # its units are free: the next round grants them
    leader = next(w for w in workers if w.member_id == group.meta.leader)
    follower = next(w for w in workers if w is not leader)
    follower.step()  # it rejoins (parked) ...
    leader.step()  # ... the leader's join completes the round and it syncs
    assert group.state.label == "Stable" and follower.phase == "wait_join"
    granted = decode_assignment(group.members[follower.member_id].assignment).assigned
    assert granted  # the leader gave it units it has not heard of yet
    ran = follower.held
    NewWorker(ctx, "n1").step()  # the upgrade
    core_group = ctx.core.store.groups["g"]
    # The coordinator counts what the follower runs, not what it was never told.
    assert core_group.members[follower.member_id].current.assigned == ran
    follower.step()  # it takes its JoinGroup answer and syncs, now through the bridge
    assert follower.held == ran
    newcomer = NewWorker(ctx, "n1")
    newcomer.epoch = core_group.members["n1"].current.epoch
    workers.append(newcomer)
    run(ctx, workers)
    assert frozenset().union(*(w.held for w in workers)) == UNITS



def test_units_a_classic_leader_revokes_from_a_new_protocol_member_are_reassigned() -> None:
    """Connect's classic leader never grants a unit it revokes in the same round: it counts
    on a second round once the unit is released. A classic member's rejoin brings that
    round; a new-protocol member's release must bring it too, or the units are lost."""
    ctx = ClassicContext(assignment_interval_ms=0)
    first = NewWorker(ctx, "n1")
    run(ctx, [first], rounds=3)
    assert first.held == UNITS  # alone, it computed and took everything
    first._assign = lambda: None  # type: ignore[method-assign]  # now it never computes
    classic = ClassicWorker(ctx, "c1")
    workers: list[Any] = [first, classic]
    run(ctx, workers, rounds=90)  # the job passes to the classic worker: it revokes
    assert ctx.core.store.groups["g"].chosen_member == classic.member_id
    assert frozenset().union(*(w.held for w in workers)) == UNITS


def test_an_upgrade_counts_units_a_leader_revoked_whose_sync_answer_was_lost() -> None:
    """A worker that sent its SyncGroup may never have had the answer: until it says so
    (a new JoinGroup allocation), it still runs what the answer revoked, so the connect
    group must count them as its own, not hand them to the newcomer."""
    ctx = ClassicContext(assignment_interval_ms=0)
    (first,) = classic_group(ctx, 1)
    second = ClassicWorker(ctx, "w2")
    second.step()
    second.step()  # parked: the join phase waits for the first worker
    lost: list[Any] = []
    first._synced = lost.append  # type: ignore[method-assign]  # its answer never arrives
    first.step()  # heartbeat: rebalance; it rejoins, leads, and syncs revoking units
    assert ctx.group().state.label == "Stable" and lost and lost[0].error == E.NONE
    revoked = decode_assignment(lost[0].assignment).revoked
    assert revoked and revoked <= first.held  # revoked, and it still runs them
    newcomer = NewWorker(ctx, "n1")
    newcomer.step()  # the upgrade
    assert "g" in ctx.core.store.groups
    assert first.held <= held_by_core(ctx)[first.member_id]
    del first._synced
    first.phase = "join"
    workers: list[Any] = [first, second, newcomer]
    for _ in range(30):
        for worker in workers:
            worker.step()
            no_double_holding(workers)
        ctx.advance(1_000)
    assert frozenset().union(*(w.held for w in workers)) == UNITS


def test_a_rolled_back_downgrade_keeps_units_from_installs() -> None:
    """Undoing the delete of a group without a connectors record restores no record, not
    an empty one: an empty one would say the admin API set no connectors, and the group
    would refuse every install after that."""
    ctx = ClassicContext(assignment_interval_ms=0)
    workers, newcomer = upgraded_group(ctx)
    assert ctx.core.store.groups["g"].units_source == "installs"
    result = ctx.core.heartbeat(ConnectGroupHeartbeatRequest(
        group_id="g", member_id="n1", member_epoch=-1, instance_id=None, worker_url=None,
        rebalance_timeout_ms=-1, server_assignor=None, client_assignors=None,
        owned_connectors_and_tasks=None), ctx.now)
    assert "g" in ctx.engine.store.groups  # downgraded, in memory only
    ctx.core.rollback(result)
    group = ctx.core.store.groups["g"]
    assert group.connectors_value is None and group.units_source == "installs"


def test_units_a_member_drops_by_rejoining_while_revoking_are_reassigned() -> None:
    """As a release, a rejoin (epoch 0: it dropped everything) of a member revoking
    units the classic leader gave nobody must bring the second round."""
    ctx = ClassicContext(assignment_interval_ms=0)
    first = NewWorker(ctx, "n1")
    run(ctx, [first], rounds=3)
    first._assign = lambda: None  # type: ignore[method-assign]  # now it never computes
    classic = ClassicWorker(ctx, "c1")
    for _ in range(40):  # until the classic leader revoked units from n1
        classic.step()
        ctx.advance(1_000)
        member = ctx.core.store.groups["g"].members["n1"]
        response = ctx.apply(ctx.core.heartbeat(first._request(first.epoch), ctx.now))
        first.epoch = response.member_epoch
        if member.current.pending_revocation:
            break
    assert ctx.core.store.groups["g"].members["n1"].current.pending_revocation
    first.epoch, first.held = 0, frozenset()  # it restarts: epoch 0, running nothing
    workers: list[Any] = [first, classic]
    run(ctx, workers, rounds=60)
    assert frozenset().union(*(w.held for w in workers)) == UNITS


@pytest.mark.parametrize("restart", [False, True])
def test_after_an_upgrade_the_classic_leader_assigns_first(restart: bool) -> None:
    # Connect's assignor keeps its view of the previous assignment (the departed workers'
    # units it holds back) only in the worker that made it: the classic group's leader.
    ctx = ClassicContext(assignment_interval_ms=0)
    workers = [ClassicWorker(ctx, name) for name in ("z", "y")]
    run(ctx, workers)
    leader = ctx.group().meta.leader
    assert leader is not None and leader.startswith("z")
    newcomer = NewWorker(ctx, "n1")  # the lowest member id: first in line otherwise
    response = ctx.apply(ctx.core.heartbeat(newcomer._request(0), ctx.now))
    assert response.error_code == E.NONE, response.error_message  # not asked to assign
    newcomer.epoch = response.member_epoch
    if restart:
        ctx.restart()
    group = ctx.core.store.groups["g"]
    for worker in [*workers, newcomer]:
        worker.step()
    assert group.chosen_member == leader
    run(ctx, [*workers, newcomer])
    assert frozenset().union(*(w.held for w in [*workers, newcomer])) == UNITS
