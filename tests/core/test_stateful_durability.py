"""The core's state machine with failed writes and restarts at any step.

On top of the joins, leaves, lost responses, timeouts and installs of `test_stateful`:
any change may fail to be written (it is rolled back and its groups rescheduled, as the
shell does), the coordinator may restart (a fresh core replays the durable records and
derives its timers), and offloaded runs go through the worker pool's own transport (packed,
pickled, compacted, expanded) and land whenever the test says. After every step the state,
the timers and the runs in flight are those a fresh core replayed from the durable records
would have; no unit is held twice; the assignment epoch never passes the group epoch.
"""

from __future__ import annotations

import pickle
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule

from coordinator.assignors.transport import SpecPacker, run_packed
from coordinator.config import ServerConfig
from coordinator.core.coordinator import GroupCoordinator
from coordinator.core.result import (
    ASSIGNMENT_TIMER,
    REVOCATION_TIMER,
    SESSION_TIMER,
    Result,
    TimerSet,
)
from protocol.errors import ErrorCode

from .context import Context
from .test_stateful import CONNECTORS, STATIC, WORKERS, CoordinatorMachine

G = "g"


class WriteFailed(Exception):
    """The change's records could not be made durable (the shell answers "retry")."""


class DurableContext(Context):
    """A Context whose log can fail a write and whose coordinator can restart."""

    def __init__(self, config: ServerConfig) -> None:
        super().__init__(config, run_jobs=False)
        self.fail_next = False
        self.packers: dict[str, SpecPacker] = {}

    def apply(self, result: Result[Any]) -> Any:
        if self.fail_next:
            self.fail_next = False
            self.core.rollback(result)
            self.apply_timers(self.core.reschedule(sorted(result.touched_groups()), self.now))
            raise WriteFailed
        return super().apply(result)

    def land(self, index: int) -> None:
        """The pool returns run `index`: packed, pickled, run, compacted as `serve` does."""
        job = self.jobs.pop(index % len(self.jobs))
        packer = self.packers.setdefault(job.group_id, SpecPacker())
        packed = packer.pack(self.assignors[job.assignor], job.spec)
        outcome = run_packed(pickle.loads(pickle.dumps(packed)))
        packer.returned(packed, outcome)
        self.finish_job(job, outcome)

    def restart(self) -> None:
        """A new process: the durable records replayed, timers derived, no run in flight."""
        self.core = self.replayed()
        self.timers = {}
        self.jobs = []
        self.packers = {}
        self.apply_timers(self.core.timers_after_load(self.now))


class DurabilityMachine(CoordinatorMachine):
    server_assignor = "balanced"

    def __init__(self) -> None:
        super().__init__()
        self.ctx = DurableContext(ServerConfig(assignment_interval_ms=0,
                                               scheduled_rebalance_max_delay_ms=20_000))

    def _failing(self, call: Any) -> Any:
        self.ctx.fail_next = True
        try:
            return call()
        except WriteFailed:
            return None
        finally:
            self.ctx.fail_next = False

    @rule(name=st.sampled_from(WORKERS))
    def heartbeat_whose_write_fails(self, name: str) -> None:
        worker = self.workers[name]
        if worker.joined:
            if self._failing(lambda: self.ctx.heartbeat(G, name, worker.epoch,
                                                        owned=worker.owned)) is None:
                worker.missed = True  # answered "retry": it learns nothing

    @rule(name=st.sampled_from(WORKERS))
    def leave_whose_write_fails(self, name: str) -> None:
        worker = self.workers[name]
        if worker.joined:
            self._failing(lambda: self.ctx.heartbeat(G, name, -1, instance_id=STATIC.get(name)))
            self._reset(worker)  # the worker goes away whatever the answer

    @rule(name=st.sampled_from(WORKERS))
    def join_whose_write_fails(self, name: str) -> None:
        worker = self.workers[name]
        if not worker.joined:
            self._failing(lambda: self._join(worker))
            if self.ctx.last is not None and worker.joined and not worker.epoch:
                worker.joined = False

    @rule(name=st.sampled_from(CONNECTORS), tasks=st.integers(0, 4))
    def connector_change_whose_write_fails(self, name: str, tasks: int) -> None:
        self._failing(lambda: self.ctx.put_connector(G, name, tasks))

    @rule(index=st.integers(0, 3), fail=st.booleans())
    def land_a_run(self, index: int, fail: bool) -> None:
        if not self.ctx.jobs:
            return
        if fail:
            self._failing(lambda: self.ctx.land(index))
        else:
            self.ctx.land(index)

    @rule()
    def restart(self) -> None:
        self.ctx.restart()

    @rule(ms=st.sampled_from([500, 3_000, 11_000, 31_000]))
    def advance(self, ms: int) -> None:
        super().advance(ms)

    # --- invariants ---
    @invariant()
    def scheduling_is_what_a_fresh_replay_derives(self) -> None:
        group = self.ctx.core.store.groups.get(G)
        if group is None:
            return
        fresh = GroupCoordinator(self.ctx.config, self.ctx.assignors)
        for record in self.ctx.log:
            fresh.replay(record)
        derived = {op.key: op.deadline_ms for op in fresh.timers_after_load(self.ctx.now)
                   if isinstance(op, TimerSet)}
        for kind in (SESSION_TIMER, REVOCATION_TIMER):
            assert {k for k in self.ctx.timers if k[0] == kind} == \
                {k for k in derived if k[0] == kind}, kind
        # A durable rerun deadline is armed, at that deadline.
        if group.members and group.epoch == group.assignment_epoch and \
                group.rerun_at_ms is not None:
            assert self.ctx.timers.get((ASSIGNMENT_TIMER, G, "")) == derived[
                (ASSIGNMENT_TIMER, G, "")] == max(group.rerun_at_ms, self.ctx.now)
        # A group waiting for a target makes progress: its run is in flight, or the
        # assignment timer is armed, or a worker was chosen to compute it.
        if group.members and group.epoch > group.assignment_epoch:
            run = group.assignor_run
            assert (run is not None and run in self.ctx.jobs) or \
                (ASSIGNMENT_TIMER, G, "") in self.ctx.timers or \
                group.chosen_member is not None, "a group waits for a target nobody computes"
        # Runs in flight are for a group epoch the group durably reached.
        if group.assignor_run is not None:
            assert group.assignor_run.group_epoch <= fresh.store.groups[G].epoch

    def teardown(self) -> None:
        # Chaos stops: land what is in flight as it comes, then converge as the base does.
        original_advance = self.ctx.advance

        def advance_and_land(ms: int) -> list[Any]:
            while self.ctx.jobs:
                self.ctx.land(0)
            return original_advance(ms)

        self.ctx.advance = advance_and_land  # type: ignore[method-assign]
        while self.ctx.jobs:
            self.ctx.land(0)
        super().teardown()


assert ErrorCode.NONE == 0
TestDurability = DurabilityMachine.TestCase
