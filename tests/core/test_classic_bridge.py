"""Classic members in a connect group (the bridge), against the core: Connect workers'
JoinGroup/SyncGroup/Heartbeat loop, with Connect's cooperative assignor on the worker the
coordinator chooses, beside a new-protocol member; no unit is ever held by two members."""

from __future__ import annotations

from typing import Any

from coordinator.connect_protocol import (
    ConnectAssignment,
    WorkerMetadata,
    decode_assignment,
    decode_worker_metadata,
    encode_assignment,
    encode_worker_metadata,
)
from coordinator.core.classic.engine import JOIN, SYNC, JoinAnswer, Parked, SyncAnswer
from coordinator.units import Unit, units_of
from protocol.errors import ErrorCode
from tests.core.classic_context import ClassicContext

E = ErrorCode
UNITS = units_of({"A": 3, "B": 2})


def cooperative(owned: dict[str, frozenset[Unit]], leader: str = ""
                ) -> dict[str, ConnectAssignment]:
    """Connect's incremental cooperative rule, simply: keep up to a fair share, revoke the
    rest, grant only units nobody holds; each member's part names the leader."""
    members = sorted(owned)
    base, extra = divmod(len(UNITS), len(members))
    share = {m: base + (i < extra) for i, m in enumerate(members)}
    held = set().union(*owned.values())
    free = sorted(UNITS - held)
    plan = {}
    for member in members:
        keep = frozenset(sorted(owned[member])[:share[member]])
        room = share[member] - len(keep)
        granted, free = frozenset(free[:room]), free[room:]
        plan[member] = ConnectAssignment(2, leader=leader, assigned=granted,
                                         revoked=owned[member] - keep)
    return plan


class ClassicWorker:
    """A Connect worker's classic group loop (WorkerCoordinator, cooperative)."""

    def __init__(self, ctx: ClassicContext, name: str) -> None:
        self.ctx, self.name = ctx, name
        self.member_id = ""
        self.generation = -1
        self.held: frozenset[Unit] = frozenset()
        self.rejoin = True
        self.waiting = False  # its SyncGroup is parked: nothing else goes out meanwhile
        self.joining = False  # its JoinGroup is held (it computes the round): the same

    def metadata(self) -> bytes:
        return encode_worker_metadata(WorkerMetadata(
            2, f"http://{self.name}", 5, ConnectAssignment(2, assigned=self.held)))

    def step(self) -> None:
        ctx = self.ctx
        if self.joining:
            joined = ctx.take(JOIN, self.member_id)
            if joined is not None:
                self.joining = False
                self._joined(joined)
            return
        if self.waiting:
            released = ctx.take(SYNC, self.member_id)
            if released is None:
                return
            self.waiting = False
            self._synced(released)
            return
        if not self.rejoin:
            code = ctx.heartbeat(self.member_id, self.generation)
            if code == E.NONE:
                return
            assert code in (E.REBALANCE_IN_PROGRESS, E.UNKNOWN_MEMBER_ID,
                            E.ILLEGAL_GENERATION), code
            if code == E.UNKNOWN_MEMBER_ID:
                self.member_id = ""
        answer = ctx.join(self.member_id, protocols=(("sessioned", self.metadata()),
                                                     ("compatible", self.metadata())),
                          client_id=self.name)
        if isinstance(answer, JoinAnswer) and answer.error == E.MEMBER_ID_REQUIRED:
            self.member_id = answer.member_id
            answer = ctx.join(self.member_id, protocols=(("sessioned", self.metadata()),),
                              client_id=self.name)
        if isinstance(answer, Parked):
            self.joining = True
            return
        assert answer.error == E.NONE, answer
        self._joined(answer)

    def _joined(self, answer: JoinAnswer) -> None:
        ctx = self.ctx
        assert isinstance(answer, JoinAnswer)
        if answer.error != E.NONE:  # a held JoinGroup answered with an error: again
            assert answer.error in (E.REBALANCE_IN_PROGRESS, E.UNKNOWN_MEMBER_ID), answer
            if answer.error == E.UNKNOWN_MEMBER_ID:
                self.member_id = ""
            self.rejoin = True
            return
        assert answer.protocol_name == "sessioned"
        self.generation = answer.generation
        assignments = self._assign(answer) if answer.leader == self.member_id else {}
        synced = ctx.sync(self.member_id, self.generation, assignments=assignments)
        if isinstance(synced, Parked):
            self.waiting = True
            return
        self._synced(synced)

    def _assign(self, answer: JoinAnswer) -> dict[str, bytes]:
        """As the leader: Connect's cooperative plan from every member's allocation."""
        plan = cooperative(allocations(answer), self.member_id)
        return {m: encode_assignment(a) for m, a in plan.items()}

    def _synced(self, synced: SyncAnswer) -> None:
        assert isinstance(synced, SyncAnswer)
        if synced.error != E.NONE:
            self.rejoin = True
            return
        told = decode_assignment(synced.assignment)
        assert not (told.assigned and told.revoked), "never revoke and grant at once"
        self.held = (self.held - told.revoked) | told.assigned
        self.rejoin = bool(told.revoked)  # Connect rejoins right after revoking


def allocations(answer: JoinAnswer) -> dict[str, frozenset[Unit]]:
    """What each member runs, by the metadata a leader's JoinGroup answer shows it."""
    assert answer.members, "a leader is never told an empty member list"
    owned = {}
    for member in answer.members:
        metadata = decode_worker_metadata(member.metadata)
        owned[member.member_id] = metadata.allocation.assigned \
            if metadata.allocation else frozenset()
    return owned


def no_double_holding(workers: list[ClassicWorker], extra: dict[str, frozenset[Unit]]
                      ) -> None:
    seen: dict[Unit, str] = {}
    holdings = [(w.name, w.held) for w in workers] + list(extra.items())
    for name, held in holdings:
        for unit in held:
            assert unit not in seen, f"{unit} held by {seen[unit]} and {name}"
            seen[unit] = name


def run(ctx: ClassicContext, workers: list[ClassicWorker], rounds: int = 30) -> None:
    for _ in range(rounds):
        for worker in workers:
            worker.step()
            no_double_holding(workers, {})
        ctx.advance(1_000)


def test_classic_workers_in_a_connect_group_converge() -> None:
    ctx = ClassicContext(assignment_interval_ms=0)
    ctx.apply(ctx.core.put_connector("g", "A", 3, ctx.now))
    ctx.apply(ctx.core.put_connector("g", "B", 2, ctx.now))
    workers = [ClassicWorker(ctx, "w1")]
    run(ctx, workers, 3)
    assert workers[0].held == UNITS
    workers.append(ClassicWorker(ctx, "w2"))
    workers.append(ClassicWorker(ctx, "w3"))
    run(ctx, workers)
    assert sorted(len(w.held) for w in workers) == [2, 2, 3]  # 7 units
    assert frozenset().union(*(w.held for w in workers)) == UNITS
    group = ctx.core.store.groups["g"]
    assert group.state == "STABLE"
    # The coordinator knows what each holds; Describe agrees with the workers.
    for worker in workers:
        assert group.members[worker.member_id].current.assigned == worker.held
    # A worker leaves: its units go to the others.
    gone = workers.pop()
    answer = ctx.leave((gone.member_id, None))
    assert answer.error == E.NONE
    run(ctx, workers)
    assert frozenset().union(*(w.held for w in workers)) == UNITS


def test_a_new_member_id_join_needs_member_id_first() -> None:
    ctx = ClassicContext()
    ctx.apply(ctx.core.put_connector("g", "A", 1, ctx.now))
    answer = ctx.join("", version=4, protocols=(("sessioned", encode_worker_metadata(
        WorkerMetadata(2, "http://w", 0))),))
    assert isinstance(answer, JoinAnswer) and answer.error == E.MEMBER_ID_REQUIRED
    assert "g" in ctx.core.store.groups and not ctx.core.store.groups["g"].members
    bad = ctx.join(answer.member_id, protocols=(("sessioned", b"\x00"),))
    assert isinstance(bad, JoinAnswer) and bad.error == E.INCONSISTENT_GROUP_PROTOCOL


def test_restart_keeps_bridged_members(tmp_path: Any) -> None:
    ctx = ClassicContext(assignment_interval_ms=0)
    ctx.apply(ctx.core.put_connector("g", "A", 3, ctx.now))
    ctx.apply(ctx.core.put_connector("g", "B", 2, ctx.now))
    workers = [ClassicWorker(ctx, "w1"), ClassicWorker(ctx, "w2")]
    run(ctx, workers, 10)
    held = {w.member_id: w.held for w in workers}
    ctx.restart()
    assert set(ctx.engine.store.bridged) == {("g", w.member_id) for w in workers}
    for worker in workers:  # they carry on: a heartbeat at their generation is fine
        assert ctx.heartbeat(worker.member_id, worker.generation) == E.NONE
        assert ctx.core.store.groups["g"].members[worker.member_id].current.assigned == \
            held[worker.member_id]
    del tmp_path


def test_an_invalid_classic_install_changes_nothing() -> None:
    ctx = ClassicContext(assignment_interval_ms=0)
    ctx.apply(ctx.core.put_connector("g", "A", 1, ctx.now))
    worker = ClassicWorker(ctx, "w1")
    worker.step()  # its assignor hands out B too, which the group does not run
    assert worker.held == frozenset() and worker.rejoin
    group = ctx.core.store.groups["g"]
    assert group.assignment_epoch < group.epoch  # no target was installed


def test_group_type_connect_puts_a_new_classic_group_on_the_connect_engine() -> None:
    ctx = ClassicContext(classic_group_type="connect")
    metadata = encode_worker_metadata(WorkerMetadata(2, "http://w", 0))
    first = ctx.join("", protocols=(("sessioned", metadata),))
    assert isinstance(first, JoinAnswer) and first.error == E.MEMBER_ID_REQUIRED
    answer = ctx.join(first.member_id, protocols=(("sessioned", metadata),))
    assert isinstance(answer, JoinAnswer) and answer.error == E.NONE
    assert "g" in ctx.core.store.groups and "g" not in ctx.engine.store.groups
    assert ("g", first.member_id) in ctx.engine.store.bridged
    # With the default (classic), the same joiner gets a classic group.
    classic = ClassicContext()
    classic.join("", protocols=(("sessioned", metadata),))
    assert "g" in classic.engine.store.groups and "g" not in classic.core.store.groups


def test_a_bridged_member_keeps_the_session_it_asked_for() -> None:
    ctx = ClassicContext(assignment_interval_ms=0)  # the group's session: 10 s
    ctx.apply(ctx.core.put_connector("g", "A", 1, ctx.now))
    metadata = encode_worker_metadata(WorkerMetadata(2, "http://w", 0))
    patient = ctx.join("", protocols=(("sessioned", metadata),), session_ms=30_000)
    assert isinstance(patient, JoinAnswer)
    ctx.join(patient.member_id, protocols=(("sessioned", metadata),), session_ms=30_000)
    hasty = ctx.join("", protocols=(("sessioned", metadata),), session_ms=6_000)
    assert isinstance(hasty, JoinAnswer)
    ctx.join(hasty.member_id, protocols=(("sessioned", metadata),), session_ms=6_000)
    ctx.advance(7_000)
    members = ctx.core.store.groups["g"].members
    assert hasty.member_id not in members and patient.member_id in members
    ctx.advance(20_000)
    assert patient.member_id in members
    ctx.advance(5_000)
    assert patient.member_id not in ctx.core.store.groups["g"].members


def test_the_leaders_delay_reaches_its_workers_and_their_rejoin_after_it_reassigns() -> None:
    """Connect's leader holds units back (a departed worker may return) by telling every
    worker a `delay`; each worker then rejoins when it is up, which must run the leader's
    assignor again so that the held-back units are handed out."""
    ctx = ClassicContext(classic_group_type="connect", assignment_interval_ms=0)
    worker = ClassicWorker(ctx, "w1")  # alone: the leader, the units its assignments name
    member = worker.member_id = ctx.new_member(
        protocols=(("sessioned", worker.metadata()),), client_id="w1")
    deadline = ctx.now + 5_000

    def lead() -> dict[str, bytes]:
        """The leader's assignor: A-1 is held back until the deadline."""
        wanted = units_of({"A": 1}) if ctx.now < deadline else units_of({"A": 2})
        return {member: encode_assignment(ConnectAssignment(
            2, leader=member, assigned=wanted - worker.held,
            delay_ms=max(deadline - ctx.now, 0)))}

    def join_and_sync(answer: Any, *, leads: bool = False) -> ConnectAssignment:
        assert isinstance(answer, JoinAnswer) and answer.error == E.NONE, answer
        leader = answer.leader == member and bool(answer.members)
        assert leader or not leads, f"not asked to assign: {answer}"
        worker.generation = answer.generation
        synced = ctx.sync(member, answer.generation, assignments=lead() if leader else {})
        assert isinstance(synced, SyncAnswer) and synced.error == E.NONE, synced
        told = decode_assignment(synced.assignment)
        worker.held = (worker.held - told.revoked) | told.assigned
        return told

    told = join_and_sync(ctx.take("join", member), leads=True)
    assert told.assigned == units_of({"A": 1})
    assert told.delay_ms == 5_000  # the worker schedules its rejoin
    # It settles (its new units are new metadata: one more round), still told to wait.
    while ctx.heartbeat(member, worker.generation) != E.NONE:
        told = join_and_sync(ctx.join(member, protocols=(("sessioned", worker.metadata()),),
                                      client_id="w1"))
        assert told.delay_ms == 5_000
    ctx.advance(5_000)
    assert ctx.heartbeat(member, worker.generation) == E.NONE  # nothing new for the group
    # The delay is over: the worker rejoins with what it holds, nothing else changed, and
    # is asked to assign again.
    told = join_and_sync(ctx.join(member, protocols=(("sessioned", worker.metadata()),),
                                  client_id="w1"), leads=True)
    assert told.assigned == units_of({"A": 2}) - units_of({"A": 1}) and told.delay_ms == 0
    while ctx.heartbeat(member, worker.generation) != E.NONE:  # settles, no more delays
        assert join_and_sync(ctx.join(
            member, protocols=(("sessioned", worker.metadata()),), client_id="w1")) \
            .assigned == frozenset()
    assert worker.held == units_of({"A": 2})


def test_workers_of_an_empty_config_topic_are_told_its_offset_minus_one() -> None:
    """Connect reports -1 as the config offset of an empty config topic; told 0, a worker
    cannot read up to it and forces a rebalance, again and again."""
    ctx = ClassicContext(classic_group_type="connect", assignment_interval_ms=0)
    metadata = encode_worker_metadata(WorkerMetadata(2, "http://w", -1))
    member = ctx.new_member(protocols=(("sessioned", metadata),), client_id="w")
    joined = ctx.take("join", member)
    assert isinstance(joined, JoinAnswer) and joined.leader == member
    empty = ConnectAssignment(2, leader=member, config_offset=-1)
    synced = ctx.sync(member, joined.generation, assignments={member: encode_assignment(empty)})
    assert isinstance(synced, SyncAnswer) and synced.error == E.NONE
    assert decode_assignment(synced.assignment).config_offset == -1


def test_a_rejoin_whose_allocation_differs_only_in_what_it_was_told_moves_nothing() -> None:
    """Connect's metadata carries its whole last assignment as its allocation (leader,
    offset, revoked units, delay): only the units it runs are what it owns. A rejoin that
    differs in the rest is no new metadata, or every told delay would start a round.
    (This worker is the group's only one, so the one that assigns: its rejoin starts a
    round all the same, with a new reason; its metadata stays what it was.)"""
    ctx = ClassicContext(classic_group_type="connect", assignment_interval_ms=0)
    runs = units_of({"A": 1})

    def metadata(delay_ms: int, leader: str) -> bytes:
        return encode_worker_metadata(WorkerMetadata(2, "http://w", 3, ConnectAssignment(
            2, leader=leader, config_offset=3, assigned=runs, delay_ms=delay_ms)))

    member = ctx.new_member(protocols=(("sessioned", metadata(0, "")),), client_id="w")
    joined = ctx.take("join", member)
    assert isinstance(joined, JoinAnswer)
    ctx.sync(member, joined.generation, assignments={member: encode_assignment(
        ConnectAssignment(2, leader=member, config_offset=3))})
    group = ctx.core.store.groups["g"]

    def assignor_metadata() -> bytes:
        known = group.members[member].metadata
        assert known is not None
        return known.client_assignors[0].metadata

    before = assignor_metadata()
    again = ctx.join(member, protocols=(("sessioned", metadata(57_000, member)),),
                     client_id="w")
    assert isinstance(again, JoinAnswer) and again.error == E.NONE
    assert assignor_metadata() == before


class RememberingWorker(ClassicWorker):
    """A worker that keeps Connect's leader bookkeeping: the generation of the last round
    it completed (JoinGroup then SyncGroup) and the one in which it last assigned. Connect's
    assignor keeps its view of the previous assignment (what holds a departed worker's
    units back) only while the two are the same; otherwise it starts from scratch and
    revokes from the others. It rejoins at once after revoking, as Connect does."""

    def __init__(self, ctx: ClassicContext, name: str) -> None:
        super().__init__(ctx, name)
        self.completed = -1
        self.assigned_in: int | None = None
        self.forgot: list[tuple[int, int]] = []  # (assigned in, completed) when asked again

    def step(self) -> None:
        while True:
            super().step()
            if self.waiting or self.joining or not self.rejoin:
                return

    def _assign(self, answer: JoinAnswer) -> dict[str, bytes]:
        self._note_assigning(answer)
        return super()._assign(answer)

    def _note_assigning(self, answer: JoinAnswer) -> None:
        if self.assigned_in is not None and self.assigned_in != self.completed:
            self.forgot.append((self.assigned_in, self.completed))
        self.assigned_in = answer.generation

    def _synced(self, synced: SyncAnswer) -> None:
        if isinstance(synced, SyncAnswer) and synced.error == E.NONE:
            self.completed = self.generation
        super()._synced(synced)


def test_the_chosen_worker_completes_no_round_in_which_it_does_not_assign() -> None:
    """Connect's leader must assign in every round it completes, or it forgets the
    previous assignment: a follower's bounce then moves tasks on the workers that stayed.
    With the default assignment interval, as the real workers meet it."""
    ctx = ClassicContext(classic_group_type="connect")
    ctx.apply(ctx.core.put_connector("g", "A", 3, ctx.now))
    ctx.apply(ctx.core.put_connector("g", "B", 2, ctx.now))
    workers = [RememberingWorker(ctx, f"w{n}") for n in (1, 2, 3)]
    run(ctx, workers, 20)
    assert frozenset().union(*(w.held for w in workers)) == UNITS
    group = ctx.core.store.groups["g"]
    leader = next(w for w in workers if w.member_id == group.chosen_member)
    follower = next(w for w in workers if w is not leader)
    ctx.leave((follower.member_id, None))  # a follower bounces: it leaves...
    workers.remove(follower)
    run(ctx, workers, 3)
    workers.append(RememberingWorker(ctx, "w4"))  # ...and comes back as a new member
    run(ctx, workers, 20)
    assert leader.assigned_in is not None
    assert leader.forgot == [], "the leader completed rounds in which it did not assign"
    no_double_holding(workers, {})
