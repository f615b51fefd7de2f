"""A Hypothesis state machine over classic groups: joins (new, known, static), syncs,
heartbeats, leaves, lost answers, time passing and restarts, with the classic rules checked
after every step: the generation never goes back, one leader and one protocol per
generation, SyncGroup hands out the leader's bytes verbatim, and the state is always what
replaying the log gives."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from coordinator.core.classic.engine import JoinAnswer, SyncAnswer
from coordinator.core.classic.state import ClassicStore
from protocol.errors import ErrorCode
from tests.core.classic_context import JOIN, SYNC, ClassicContext

WORKERS = ["w1", "w2", "w3", "w4"]
STATIC = {"w4": "instance-4"}


@dataclass
class Worker:
    member_id: str = ""
    generation: int = -1


def _state(store: ClassicStore) -> dict[str, Any]:
    return {group_id: (asdict(group.meta), {m: asdict(v) for m, v in group.members.items()})
            for group_id, group in store.groups.items()}


class ClassicMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.ctx = ClassicContext(initial_rebalance_delay_ms=500, max_size=6,
                                  classic_max_pending_members=3)
        self.workers = {name: Worker() for name in WORKERS}
        self.highest_generation = 0
        self.leaders: dict[int, tuple[str, str | None]] = {}  # generation -> leader, protocol
        self.sent: dict[tuple[int, str], bytes] = {}  # (generation, member) -> bytes

    # ------------------------------------------------------------------ answers
    def _joined(self, name: str, answer: Any) -> None:
        if not isinstance(answer, JoinAnswer):
            return
        worker = self.workers[name]
        if answer.error == ErrorCode.MEMBER_ID_REQUIRED:
            worker.member_id = answer.member_id
        elif answer.error == ErrorCode.NONE:
            worker.member_id, worker.generation = answer.member_id, answer.generation
            seen = self.leaders.setdefault(answer.generation,
                                           (answer.leader, answer.protocol_name))
            assert seen == (answer.leader, answer.protocol_name), (seen, answer)
            if answer.leader == answer.member_id:
                assert answer.members, "a leader is told the members"
        elif answer.error in (ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.FENCED_INSTANCE_ID):
            worker.member_id, worker.generation = "", -1

    def _synced(self, name: str, answer: Any, generation: int) -> None:
        if isinstance(answer, SyncAnswer) and answer.error == ErrorCode.NONE:
            member_id = self.workers[name].member_id
            expected = self.sent.get((generation, member_id), b"")
            assert answer.assignment == expected, (answer.assignment, expected)

    def _collect(self) -> None:
        """Answers released to parked requests."""
        for (kind, _, member_id), answer in list(self.ctx.released.items()):
            name = next((n for n, w in self.workers.items() if w.member_id == member_id), None)
            if name is None:
                continue
            if kind == JOIN:
                self._joined(name, answer)
            elif kind == SYNC:
                self._synced(name, answer, self.workers[name].generation)
        self.ctx.released.clear()

    # ------------------------------------------------------------------ rules
    @rule(name=st.sampled_from(WORKERS), lost=st.booleans())
    def join(self, name: str, lost: bool) -> None:
        worker = self.workers[name]
        answer = self.ctx.join(worker.member_id, instance_id=STATIC.get(name),
                               client_id=name)
        if isinstance(answer, JoinAnswer) and answer.error == ErrorCode.MEMBER_ID_REQUIRED:
            self._joined(name, answer)  # a client rejoins at once with the id it was given
            answer = self.ctx.join(worker.member_id, client_id=name)
        if not lost:
            self._joined(name, answer)
        else:
            self.ctx.released.pop((JOIN, "g", worker.member_id), None)
        self._collect()

    @rule()
    def everyone_syncs(self) -> None:
        """Every worker in the group rejoins, the join phase ends, then every worker syncs
        (the leader first, as it is the one that brings the assignment)."""
        for name, worker in self.workers.items():
            if worker.member_id:
                self._joined(name, self.ctx.join(worker.member_id,
                                                 instance_id=STATIC.get(name), client_id=name))
        self._collect()
        self.ctx.advance(600)
        self._collect()
        group = self.ctx.engine.store.groups.get("g")
        leader = group.meta.leader if group is not None else None
        names = sorted(self.workers, key=lambda n: self.workers[n].member_id != leader)
        for name in names:
            if self.workers[name].generation >= 0:
                self.sync(name)

    @rule(name=st.sampled_from(WORKERS))
    def sync(self, name: str) -> None:
        worker = self.workers[name]
        if not worker.member_id or worker.generation < 0:
            return
        group = self.ctx.engine.store.groups.get("g")
        assignments: dict[str, bytes] = {}
        if group is not None and group.meta.leader == worker.member_id:
            assignments = {m: f"{m}@{worker.generation}".encode() for m in group.active()}
        installing = bool(assignments) and group is not None \
            and group.state.name == "COMPLETING_REBALANCE" \
            and group.generation == worker.generation
        answer = self.ctx.sync(worker.member_id, worker.generation, assignments=assignments,
                               instance_id=STATIC.get(name))
        if installing and isinstance(answer, SyncAnswer) and answer.error == ErrorCode.NONE:
            for member_id, data in assignments.items():  # what the leader installed
                self.sent[worker.generation, member_id] = data
        self._collect()
        self._synced(name, answer, worker.generation)

    @rule(name=st.sampled_from(WORKERS))
    def heartbeat(self, name: str) -> None:
        worker = self.workers[name]
        if worker.member_id:
            code = self.ctx.heartbeat(worker.member_id, worker.generation,
                                      instance_id=STATIC.get(name))
            assert code in (ErrorCode.NONE, ErrorCode.REBALANCE_IN_PROGRESS,
                            ErrorCode.ILLEGAL_GENERATION, ErrorCode.UNKNOWN_MEMBER_ID,
                            ErrorCode.FENCED_INSTANCE_ID), code
            if code in (ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.FENCED_INSTANCE_ID):
                worker.member_id, worker.generation = "", -1

    @rule(name=st.sampled_from(WORKERS))
    def leave(self, name: str) -> None:
        worker = self.workers[name]
        if worker.member_id:
            self.ctx.leave((worker.member_id, STATIC.get(name)))
            worker.member_id, worker.generation = "", -1
        self._collect()

    @rule(ms=st.sampled_from([100, 1_000, 5_000, 12_000, 31_000]))
    def advance(self, ms: int) -> None:
        self.ctx.advance(ms)
        self._collect()

    @rule(rebalance_ms=st.sampled_from([1_000, 30_000]))
    def abandoned_join(self, rebalance_ms: int) -> None:
        """A client told MEMBER_ID_REQUIRED that never comes back (or is refused)."""
        answer = self.ctx.join("", client_id="gone", rebalance_ms=rebalance_ms)
        assert isinstance(answer, JoinAnswer) and answer.error in (
            ErrorCode.MEMBER_ID_REQUIRED, ErrorCode.GROUP_MAX_SIZE_REACHED,
            ErrorCode.COORDINATOR_NOT_AVAILABLE), answer

    @rule()
    def restart(self) -> None:
        self.ctx.restart()

    # ------------------------------------------------------------------ invariants
    @invariant()
    def generation_never_goes_back(self) -> None:
        group = self.ctx.engine.store.groups.get("g")
        if group is not None:
            assert group.generation >= self.highest_generation
            self.highest_generation = group.generation

    @invariant()
    def state_is_the_replay_of_the_log(self) -> None:
        replayed = ClassicStore()
        for record in self.ctx.log:
            replayed.replay(record)
        assert _state(replayed) == _state(self.ctx.engine.store)
        assert replayed.pending_total == self.ctx.engine.store.pending_total

    @invariant()
    def pending_members_are_bounded(self) -> None:
        store = self.ctx.engine.store
        pending = [m for group in store.groups.values() for m in group.members.values()
                   if m.pending]
        assert len(pending) == store.pending_total <= 3
        assert all(not m.protocols for m in pending)
        for group in store.groups.values():
            assert len(group.members) <= 6

    @invariant()
    def protocol_support_counts_the_members(self) -> None:
        for group in self.ctx.engine.store.groups.values():
            active = [member for member in group.members.values() if not member.pending]
            support: Counter[str] = Counter()
            for member in active:
                support.update({protocol.name for protocol in member.protocols})
            assert (group.protocol_support, group.supporting) == (support, len(active))

    @invariant()
    def parked_requests_belong_to_members(self) -> None:
        group = self.ctx.engine.store.groups.get("g")
        for kind, _, member_id in self.ctx.parked:
            assert group is not None and member_id in group.members, (kind, member_id)


ClassicMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40,
                                            deadline=None)
test_classic_state_machine = ClassicMachine.TestCase
