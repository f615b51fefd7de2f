"""The core's state machine with classic members: classic Connect workers (JoinGroup,
SyncGroup, Heartbeat, LeaveGroup; parked in a classic group, answered at once when bridged)
and new-protocol workers join, step and leave one group, so that it is upgraded and
downgraded again and again, with time passing (sessions and rebalances time out), answers
lost on the way back, writes that fail (rolled back and rescheduled, as the shell does) and
restarts (a fresh core replays the durable records).

It checks the invariants of `test_stateful` and `test_stateful_durability` for this mix:
after every step no unit is run by two workers, a worker runs only what the coordinator
counts it as holding, the group epoch (a classic group's generation) never goes back,
across conversions too, the assignment epoch never passes it, and the state and timers are
those a fresh core replayed from the durable records has. Once the chaos stops, every
worker carries on and the group converges: of the type its workers call for, stable, every
unit run by exactly one worker, as the coordinator says.

The group's units come from its workers' assignments (no connectors set through the admin
API), as for real Connect workers: the only way a group can be downgraded. The admin API
sets the group's type (and a setting) at any moment, which decides only what the group
becomes once empty.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from coordinator.core.classic.conversion import classic_holdings
from coordinator.core.classic.engine import CLASSIC_PHASE_TIMER, CLASSIC_SESSION_TIMER, Parked
from coordinator.core.coordinator import GroupCoordinator
from coordinator.core.result import (
    REVOCATION_TIMER,
    SESSION_TIMER,
    Result,
    TimerSet,
)
from coordinator.units import Unit
from protocol.errors import ErrorCode
from tests.core.classic_context import ClassicContext
from tests.core.test_classic_bridge import UNITS
from tests.core.test_classic_conversion import ClassicWorker, NewWorker, no_double_holding

G = "g"
CLASSIC = ["c1", "c2", "c3"]
NEW = ["n1", "n2"]
SESSION_MS = 10_000  # the classic workers' (their JoinGroup's) and the group's


class WriteFailed(Exception):
    """The change's records could not be made durable: the worker is told to retry."""


class AnswerLost(Exception):
    """The coordinator did the change, but its answer never reached the worker."""


class ChaosContext(ClassicContext):
    """A ClassicContext whose next write can fail and whose next answer can be lost."""

    def __init__(self) -> None:
        super().__init__(assignment_interval_ms=0, session_timeout_ms=SESSION_MS)
        self.fail_at: int | None = None  # counts down over the calls of one worker step
        self.lose_at: int | None = None

    def apply(self, result: Result[Any]) -> Any:
        if self.fail_at is not None:
            self.fail_at -= 1
            if self.fail_at < 0:
                self.fail_at = None
                self.core.rollback(result)
                self.apply_timers(self.core.reschedule(sorted(result.touched_groups()),
                                                       self.now))
                raise WriteFailed
        answer = super().apply(result)
        if self.lose_at is not None:
            self.lose_at -= 1
            if self.lose_at < 0:
                self.lose_at = None
                if isinstance(result.response, Parked):
                    # The worker's connection is gone: the shell drops its waiter.
                    self.parked.discard(result.response.key)
                raise AnswerLost
        return answer


def _state(core: GroupCoordinator) -> Any:
    connect = {
        group_id: (group.epoch, group.assignment_epoch,
                   {m: (v.current, v.metadata) for m, v in group.members.items()},
                   {m: part.units for m, part in group.target.items()})
        for group_id, group in core.store.groups.items()}
    classic = {group_id: (asdict(group.meta), {m: asdict(v) for m, v in group.members.items()})
               for group_id, group in core.store.classic.groups.items()}
    return (connect, classic, dict(core.store.classic.bridged), dict(core.store.settings),
            dict(core.store.types))


class ConversionMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.ctx = ChaosContext()
        self.classic = {name: ClassicWorker(self.ctx, name) for name in CLASSIC}
        self.new = {name: NewWorker(self.ctx, name) for name in NEW}
        self.classic_gone = set(CLASSIC)  # not started yet, or left
        for worker in self.new.values():
            worker.gone = True
        # When each worker last heard an answer: a worker that heard none for a session
        # stops its units, as Connect's does (the coordinator frees them no earlier).
        self.heard: dict[str, int] = {}
        self.highest_epoch = 0

    def workers(self) -> list[Any]:
        return [*self.classic.values(), *self.new.values()]

    @initialize(rounds=st.integers(0, 4))
    def classic_workers_first(self, rounds: int) -> None:
        """Often the group starts as Connect clusters do today: classic workers that have
        settled their units (so that upgrades convert groups whose members run some)."""
        for _ in range(rounds):
            for name, worker in self.classic.items():
                self.classic_gone.discard(name)
                self._step(name, worker.step, None, None)
            self.ctx.advance(1_000)

    # ------------------------------------------------------------------ chaos around a step
    def _step(self, name: str, step: Any, fail_at: int | None, lose_at: int | None) -> None:
        """Run one worker step; `fail_at`/`lose_at`: the n-th request of the step has its
        write fail or its answer lost. Either way the worker learns nothing from it."""
        self.ctx.fail_at, self.ctx.lose_at = fail_at, lose_at
        try:
            step()
        except (WriteFailed, AnswerLost):
            self._learned_nothing(name)
        else:
            self.heard[name] = self.ctx.now
        finally:
            self.ctx.fail_at = self.ctx.lose_at = None

    def _learned_nothing(self, name: str) -> None:
        worker = self.classic.get(name)
        if worker is not None and worker.phase != "stable":
            # A JoinGroup or SyncGroup without an answer: Connect's worker joins again
            # (with what it runs; anything its lost answer said never happened for it).
            worker.phase = "join"

    @rule(name=st.sampled_from(CLASSIC), fail_at=st.none() | st.integers(0, 1),
          lose_at=st.none() | st.integers(0, 1), pause=st.booleans())
    def classic_step(self, name: str, fail_at: int | None, lose_at: int | None,
                     pause: bool) -> None:
        """`pause`: a JoinGroup answered in this step has its SyncGroup in the worker's
        next step, so others' requests (another's SyncGroup granting it units, say) can
        come between a leader's JoinGroup answer and its assignment."""
        worker = self.classic[name]
        if name in self.classic_gone:  # it starts (again): a new member
            self.classic_gone.discard(name)
            worker.member_id, worker.phase, worker.held = "", "join", frozenset()
        worker.pause_after_join = pause
        self._step(name, worker.step, fail_at, lose_at)

    @rule(name=st.sampled_from(CLASSIC), fail=st.booleans())
    def classic_leaves(self, name: str, fail: bool) -> None:
        worker = self.classic[name]
        if name in self.classic_gone or not worker.member_id:
            return
        # Connect stops its units, then leaves; it goes whatever the answer.
        worker.held = frozenset()
        self.ctx.fail_at = 0 if fail else None
        try:
            answer = self.ctx.leave((worker.member_id, None))
            # (one whose session expired, or only told its id, is no member)
            assert answer.error in (ErrorCode.NONE, ErrorCode.UNKNOWN_MEMBER_ID), answer
        except WriteFailed:
            pass
        finally:
            self.ctx.fail_at = None
        self.classic_gone.add(name)
        worker.phase = "join"

    @rule(name=st.sampled_from(NEW), fail_at=st.none() | st.integers(0, 2),
          lose_at=st.none() | st.integers(0, 2))
    def new_step(self, name: str, fail_at: int | None, lose_at: int | None) -> None:
        worker = self.new[name]
        if worker.gone:  # it starts (again)
            worker.gone, worker.epoch, worker.held = False, 0, frozenset()
        self._step(name, worker.step, fail_at, lose_at)
        if worker.last_error == ErrorCode.INCONSISTENT_GROUP_PROTOCOL:
            raise AssertionError(worker.last_message)

    @rule(name=st.sampled_from(NEW), fail=st.booleans())
    def new_leaves(self, name: str, fail: bool) -> None:
        worker = self.new[name]
        if worker.gone or worker.epoch <= 0:
            return
        group = self.ctx.core.store.groups.get(G)
        if group is None or name not in group.members:
            worker.gone, worker.held = True, frozenset()  # already expired: it just goes
            return
        self.ctx.fail_at = 0 if fail else None
        try:
            worker.leave()  # (stops its units and goes whatever the answer)
        except WriteFailed:
            worker.gone, worker.held = True, frozenset()
        finally:
            self.ctx.fail_at = None

    @rule(kind=st.sampled_from([None, "classic", "connect"]),
          interval=st.none() | st.sampled_from([-1, 2_000]), fail=st.booleans())
    def admin_sets_the_type(self, kind: str | None, interval: int | None, fail: bool) -> None:
        body: dict[str, Any] = {"connect.classic.group.type": kind}
        if interval is not None:  # (a setting that leaves sessions, hence safety, alone)
            body["connect.heartbeat.interval.ms"] = interval
        self.ctx.fail_at = 0 if fail else None
        try:
            self.ctx.apply(self.ctx.core.set_group_config(G, body, self.ctx.now))
        except WriteFailed:
            pass
        finally:
            self.ctx.fail_at = None

    @rule(ms=st.sampled_from([500, 3_000, 12_000, 31_000]))
    def advance(self, ms: int) -> None:
        self.ctx.advance(ms)
        for name, last in self.heard.items():
            if self.ctx.now - last >= SESSION_MS:
                if name in self.classic:
                    worker = self.classic[name]
                    worker.held, worker.phase, worker.member_id = frozenset(), "join", ""
                else:
                    new = self.new[name]
                    new.held, new.epoch = frozenset(), 0

    @rule()
    def restart(self) -> None:
        self.ctx.restart()
        for worker in self.classic.values():  # their parked calls are gone: they rejoin
            if worker.phase.startswith("wait"):
                worker.phase = "join"

    # ------------------------------------------------------------------ invariants
    @invariant()
    def no_unit_run_twice(self) -> None:
        no_double_holding(self.workers())

    def _holders(self) -> dict[str, frozenset[Unit]] | None:
        """What the coordinator counts each member as holding (None: no group)."""
        group = self.ctx.core.store.groups.get(G)
        if group is not None:
            return {m: member.current.held for m, member in group.members.items()}
        classic = self.ctx.core.store.classic.groups.get(G)
        if classic is not None:
            # What an upgrade now would count each member as holding: it must cover
            # what the worker runs, or the connect engine could hand it to another.
            return classic_holdings(classic)
        return None

    @invariant()
    def workers_run_only_what_the_coordinator_counts(self) -> None:
        holders = self._holders()
        if holders is None:
            return
        for worker in self.workers():
            member_id = worker.member_id if worker.name in self.classic else worker.name
            if member_id in holders:
                assert worker.held <= holders[member_id], (worker.name, worker.held, holders)

    @invariant()
    def one_holder_per_unit_and_ordered_epochs(self) -> None:
        group = self.ctx.core.store.groups.get(G)
        classic = self.ctx.core.store.classic.groups.get(G)
        assert group is None or classic is None, "a group of both types"
        if group is not None:
            holders: dict[Unit, str] = {}
            for member in group.members.values():
                for unit in member.current.held:
                    assert unit not in holders, f"{unit}: {holders[unit]}, {member.member_id}"
                    holders[unit] = member.member_id
            assert holders == group.owners
            assert group.assignment_epoch <= group.epoch
            for member in group.members.values():
                assert member.current.epoch <= group.assignment_epoch
            epoch, empty = group.epoch, not group.members
        elif classic is not None:
            epoch, empty = classic.generation, not classic.active()
        else:
            self.highest_epoch = 0
            return
        # Across conversions too: the classic generation is the group epoch and back. An
        # empty group may be replaced by one of the other type, which starts afresh.
        assert epoch >= self.highest_epoch, (epoch, self.highest_epoch)
        self.highest_epoch = 0 if empty else epoch

    @invariant()
    def state_and_timers_are_a_replay_of_the_log(self) -> None:
        fresh = GroupCoordinator(self.ctx.config, self.ctx.core.assignors)
        for record in self.ctx.log:
            fresh.replay(record)
        assert _state(fresh) == _state(self.ctx.core)
        derived = {op.key for op in fresh.timers_after_load(self.ctx.now)
                   if isinstance(op, TimerSet)}
        for kind in (SESSION_TIMER, REVOCATION_TIMER):
            assert {k for k in self.ctx.timers if k[0] == kind} == \
                {k for k in derived if k[0] == kind}, kind
        # Classic timers: every one a replay derives is armed. There may be more: those
        # of members only told their id (never written, as Kafka's pending members) and
        # stale ones, which find nothing to do when they fire.
        for kind in (CLASSIC_SESSION_TIMER, CLASSIC_PHASE_TIMER):
            assert {k for k in derived if k[0] == kind} <= \
                {k for k in self.ctx.timers if k[0] == kind}, kind

    # ------------------------------------------------------------------ chaos stops
    def teardown(self) -> None:
        """Every classic worker (back) in, new ones as they are; the group must settle."""
        self.classic_gone.clear()
        for worker in self.classic.values():
            worker.pause_after_join = False
        present = [w for w in self.workers() if not getattr(w, "gone", False)]
        expected = "connect" if any(not w.gone for w in self.new.values()) else "classic"
        for _ in range(60):
            if self._connect_group_without_new_members():
                # It stays one: classic workers that join it are bridged, and only a
                # new-protocol member's going downgrades (docs/classic-members.md, "Not
                # there yet").
                expected = "connect"
            for worker in present:
                worker.step()
                no_double_holding(present)
            self.ctx.advance(1_000)
            if self._converged(present, expected):
                return
        raise AssertionError(f"no convergence to a {expected} group: "
                             f"{[(w.name, w.held) for w in present]} {self._holders()}")

    def _connect_group_without_new_members(self) -> bool:
        group = self.ctx.core.store.groups.get(G)
        bridged = self.ctx.core.store.classic.bridged
        # (an empty one is not: it takes the type of its next joiner)
        return group is not None and bool(group.members) and all(
            (G, m) in bridged for m in group.members)

    def _converged(self, present: list[Any], expected: str) -> bool:
        core = self.ctx.core
        if expected == "connect":
            group = core.store.groups.get(G)
            if group is None or G in core.store.classic.groups:
                return False
            stable = core.describe_group(G).group_state == "STABLE" and \
                set(group.members) == {w.member_id if w.name in self.classic else w.name
                                       for w in present}
        else:
            classic = core.store.classic.groups.get(G)
            if classic is None or G in core.store.groups:
                return False
            stable = classic.state.label == "Stable" and len(classic.active()) == len(present)
        if not stable:
            return False
        held = [unit for worker in present for unit in worker.held]
        holders = self._holders() or {}
        counted = all(worker.held == holders.get(
            worker.member_id if worker.name in self.classic else worker.name)
            for worker in present)
        return sorted(held) == sorted(UNITS) and counted


TestConversionMachine = ConversionMachine.TestCase
TestConversionMachine.settings = settings(max_examples=60, stateful_step_count=50,
                                          deadline=None)


def test_the_round_waits_for_members_that_release_units_before_it_is_computed() -> None:
    """An example the machine found: a bridged round computed while a member was still
    releasing units showed those units as held, each assignment moved what the last one
    left behind, and the group never settled (the JoinGroup wait must count a member
    that releases units as rejoined only once it comes back without them)."""
    machine = ConversionMachine()
    machine.classic_workers_first(rounds=4)
    machine.classic_leaves(fail=False, name="c1")
    machine.restart()
    machine.classic_leaves(fail=False, name="c2")
    machine.restart()
    machine.classic_step(fail_at=0, lose_at=None, name="c1", pause=False)
    machine.new_step(fail_at=None, lose_at=None, name="n1")
    machine.teardown()  # raises when it does not converge


def test_units_released_after_the_leader_saw_them_held_are_handed_out() -> None:
    """An example the machine found: the bridged leader was shown a new-protocol member
    holding units its last assignment took from it; the member released them before the
    install, which handed them to nobody (Connect hands out what it revokes a round
    later), and no rejoin was left to start that round: they stayed unassigned."""
    machine = ConversionMachine()
    machine.classic_workers_first(rounds=4)
    machine.classic_step(fail_at=None, lose_at=0, name="c1", pause=True)
    for _ in range(10):
        machine.restart()
    machine.classic_leaves(fail=False, name="c1")
    for _ in range(25):
        machine.restart()
    machine.new_step(fail_at=None, lose_at=None, name="n1")
    for _ in range(6):
        machine.restart()
    machine.classic_leaves(fail=False, name="c3")
    machine.restart()
    machine.restart()
    machine.classic_step(fail_at=None, lose_at=None, name="c2", pause=False)
    machine.restart()
    machine.teardown()  # raises when it does not converge
