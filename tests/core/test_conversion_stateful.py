"""A Hypothesis state machine over one group that classic Connect workers and
new-protocol workers join and leave, so that it is upgraded and downgraded again and
again, with time passing, lost answers and restarts. After every step: no unit is held by
two workers, and the coordinator's state is what replaying its log gives."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from coordinator.core.coordinator import GroupCoordinator
from tests.core.classic_context import ClassicContext
from tests.core.test_classic_conversion import ClassicWorker, NewWorker, no_double_holding

CLASSIC = ["c1", "c2", "c3"]
NEW = ["n1", "n2"]


def _state(core: GroupCoordinator) -> Any:
    connect = {
        group_id: (group.epoch, group.assignment_epoch,
                   {m: (v.current, v.metadata) for m, v in group.members.items()},
                   {m: part.units for m, part in group.target.items()})
        for group_id, group in core.store.groups.items()}
    classic = {group_id: (asdict(group.meta), {m: asdict(v) for m, v in group.members.items()})
               for group_id, group in core.store.classic.groups.items()}
    return connect, classic, dict(core.store.classic.bridged)


class ConversionMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.ctx = ClassicContext(assignment_interval_ms=0)
        self.classic = {name: ClassicWorker(self.ctx, name) for name in CLASSIC}
        self.new = {name: NewWorker(self.ctx, name) for name in NEW}
        for worker in self.new.values():
            worker.gone = True  # not started yet
        self.last_contact: dict[str, int] = {}
        self.session_ms = 10_000  # the classic workers' and the group's

    def _contact(self, name: str) -> None:
        self.last_contact[name] = self.ctx.now

    def workers(self) -> list[Any]:
        return [*self.classic.values(), *self.new.values()]

    @rule(name=st.sampled_from(CLASSIC))
    def classic_step(self, name: str) -> None:
        self.classic[name].step()
        self._contact(name)

    @rule(name=st.sampled_from(NEW))
    def new_step(self, name: str) -> None:
        worker = self.new[name]
        if worker.gone:
            worker.gone, worker.epoch, worker.held = False, 0, frozenset()
        worker.step()
        self._contact(name)

    @rule(name=st.sampled_from(NEW))
    def new_leaves(self, name: str) -> None:
        worker = self.new[name]
        if not worker.gone and worker.epoch > 0 and self.ctx.core.store.groups.get("g") \
                and name in self.ctx.core.store.groups["g"].members:
            worker.leave()

    @rule(ms=st.sampled_from([500, 3_000, 12_000]))
    def advance(self, ms: int) -> None:
        self.ctx.advance(ms)
        # A worker silent for a whole session has been expelled: like Connect's worker,
        # it stops its units before it does anything else (the coordinator gives them
        # to others only once that session has passed).
        for name, last in self.last_contact.items():
            if self.ctx.now - last >= self.session_ms:
                if name in self.classic:
                    worker = self.classic[name]
                    worker.held, worker.phase, worker.member_id = frozenset(), "join", ""
                else:
                    new = self.new[name]
                    new.held, new.epoch = frozenset(), 0

    @rule()
    def restart(self) -> None:
        self.ctx.restart()
        for worker in self.classic.values():  # their parked calls time out: they rejoin
            if worker.phase.startswith("wait"):
                worker.phase = "join"

    @invariant()
    def no_unit_held_twice(self) -> None:
        no_double_holding(self.workers())

    @invariant()
    def state_is_the_replay_of_the_log(self) -> None:
        fresh = GroupCoordinator(self.ctx.config, self.ctx.core.assignors)
        for record in self.ctx.log:
            fresh.replay(record)
        assert _state(fresh) == _state(self.ctx.core)


TestConversionMachine = ConversionMachine.TestCase
TestConversionMachine.settings = settings(max_examples=60, stateful_step_count=50,
                                          deadline=None)
