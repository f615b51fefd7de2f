"""A bridged worker's SyncGroup waits for the assignment another bridged worker is
computing, as a broker's followers wait for their leader's SyncGroup: a leader bounce
then reaches every worker in one round instead of at each one's next heartbeat after the
install. The wait is bounded, and a rolled-back install leaves it waiting again.

The JoinGroup wait is off here (`classic_join_wait_ms=0`): each worker's JoinGroup is
answered at once, so that the SyncGroup wait is seen alone, as when the JoinGroup wait
ran out (test_classic_join_wait has the two together)."""

from __future__ import annotations

from coordinator.connect_protocol import (
    decode_assignment,
    decode_worker_metadata,
    encode_assignment,
)
from coordinator.core.classic.engine import SYNC, JoinAnswer, SyncAnswer, SyncRequest
from coordinator.core.reconcile import MemberState
from coordinator.core.result import TimerSet
from tests.core.classic_context import ClassicContext
from tests.core.test_classic_bridge import (
    UNITS,
    ClassicWorker,
    E,
    cooperative,
    no_double_holding,
    run,
)

WAIT_MS = 5_000  # half the workers' 10 s session: the default wait's bound for them


def settled(ctx: ClassicContext, count: int = 3) -> list[ClassicWorker]:
    ctx.apply(ctx.core.put_connector("g", "A", 3, ctx.now))
    ctx.apply(ctx.core.put_connector("g", "B", 2, ctx.now))
    workers = [ClassicWorker(ctx, f"w{n}") for n in range(1, count + 1)]
    run(ctx, workers, 20)
    group = ctx.core.store.groups["g"]
    assert group.state == "STABLE"
    assert frozenset().union(*(w.held for w in workers)) == UNITS
    return workers


def leader_leaves(ctx: ClassicContext, workers: list[ClassicWorker]
                  ) -> tuple[ClassicWorker, ClassicWorker, ClassicWorker]:
    """The worker that assigns leaves: (it, the one chosen next, the other)."""
    group = ctx.core.store.groups["g"]
    leader = next(w for w in workers if w.member_id == group.chosen_member)
    assert ctx.leave((leader.member_id, None)).error == E.NONE
    successor = next(w for w in workers if w.member_id == group.chosen_member)
    follower = next(w for w in workers if w not in (leader, successor))
    assert group.epoch > group.assignment_epoch
    return leader, successor, follower


def a_follower_waits(ctx: ClassicContext
                     ) -> tuple[ClassicWorker, ClassicWorker, ClassicWorker]:
    """The leader leaves, and the other follower's heartbeat comes first: it rejoins at
    once, and its SyncGroup waits for the successor's assignment."""
    leader, successor, follower = leader_leaves(ctx, settled(ctx))
    follower.step()
    assert follower.waiting
    assert ctx.take(SYNC, follower.member_id) is None
    return leader, successor, follower


def test_after_a_leader_leaves_a_follower_gets_its_new_tasks_with_the_successors_install(
) -> None:
    ctx = ClassicContext(classic_group_type="connect", assignment_interval_ms=0,
                         classic_join_wait_ms=0)
    leader, successor, follower = a_follower_waits(ctx)
    departed = leader.held
    # The successor is asked to assign at its heartbeat; its SyncGroup installs, and the
    # follower's waiting SyncGroup is answered by the same change, with its new part.
    successor.step()
    follower.step()
    assert not follower.waiting
    assert follower.held | successor.held == UNITS
    assert follower.held & departed, "the follower got none of the departed worker's units"
    no_double_holding([follower, successor], {})
    # No heartbeat interval passed: both heard of the new assignment in the same round.
    assert ctx.core.store.groups["g"].epoch == ctx.core.store.groups["g"].assignment_epoch


def test_a_waiting_sync_group_is_answered_when_its_wait_runs_out() -> None:
    ctx = ClassicContext(classic_group_type="connect", assignment_interval_ms=0,
                         classic_join_wait_ms=0)
    _leader, successor, follower = a_follower_waits(ctx)
    held = follower.held
    ctx.advance(WAIT_MS - 1)
    assert ctx.take(SYNC, follower.member_id) is None
    ctx.advance(1)
    answer = ctx.released[(SYNC, "g", follower.member_id)]
    assert isinstance(answer, SyncAnswer) and answer.error == E.NONE
    told = decode_assignment(answer.assignment)
    assert not told.assigned and not told.revoked  # what it runs: nothing new yet
    follower.step()
    assert follower.held == held and not follower.waiting
    group = ctx.core.store.groups["g"]
    assert follower.member_id in group.members
    assert group.chosen_member == successor.member_id  # still asked; it assigns later
    run(ctx, [successor, follower], 10)
    assert follower.held | successor.held == UNITS


def test_a_rolled_back_install_leaves_the_sync_group_waiting_and_answered_by_its_timer(
) -> None:
    ctx = ClassicContext(classic_group_type="connect", assignment_interval_ms=0,
                         classic_join_wait_ms=0)
    _leader, successor, follower = a_follower_waits(ctx)
    held = follower.held
    # The successor rejoins and assigns, but its install cannot be written.
    assert ctx.heartbeat(successor.member_id, successor.generation) == E.REBALANCE_IN_PROGRESS
    joined = ctx.join(successor.member_id, protocols=(("sessioned", successor.metadata()),),
                      client_id=successor.name)
    assert isinstance(joined, JoinAnswer) and joined.leader == successor.member_id
    owned = {}
    for member in joined.members:
        allocation = decode_worker_metadata(member.metadata).allocation
        owned[member.member_id] = allocation.assigned if allocation else frozenset()
    plan = {m: encode_assignment(a) for m, a in cooperative(owned, successor.member_id).items()}
    result = ctx.engine.sync(SyncRequest("g", successor.member_id, joined.generation,
                                         tuple(plan.items()), None), ctx.now)
    assert [key for key, _ in result.releases] == [(SYNC, "g", follower.member_id)]
    ctx.core.rollback(result)
    timers = ctx.core.reschedule(sorted(result.touched_groups()), ctx.now)
    ctx.timers = {op.key: op.deadline_ms for op in timers if isinstance(op, TimerSet)}
    group = ctx.core.store.groups["g"]
    assert group.epoch > group.assignment_epoch  # nothing installed
    # The answer was never sent: the request waits again, and its re-derived timer answers
    # it with what the follower may run, not with the install that never was.
    assert ctx.take(SYNC, follower.member_id) is None
    ctx.advance(0)
    answer = ctx.released[(SYNC, "g", follower.member_id)]
    assert isinstance(answer, SyncAnswer) and answer.error == E.NONE
    assert not decode_assignment(answer.assignment).assigned
    follower.step()
    assert follower.held == held
    run(ctx, [successor, follower], 10)
    assert follower.held | successor.held == UNITS
    no_double_holding([follower, successor], {})


def test_with_no_wait_a_follower_hears_of_its_new_part_only_after_the_install() -> None:
    ctx = ClassicContext(classic_group_type="connect", assignment_interval_ms=0,
                         classic_join_wait_ms=0,
                         classic_sync_wait_ms=0)
    workers = settled(ctx)
    _leader, successor, follower = leader_leaves(ctx, workers)
    held = follower.held
    assert ctx.heartbeat(follower.member_id, follower.generation) == E.NONE
    successor.step()
    assert follower.held == held  # told nothing yet
    follower.step()  # its next heartbeat: rejoin, and its part at once
    assert follower.held | successor.held == UNITS


def test_a_member_that_must_release_units_is_told_at_once_while_a_round_is_pending(
) -> None:
    """Its SyncGroup does not wait: it releases now (revoke before assign), and a member
    held at a SyncGroup could not release in time for its rebalance timeout."""
    ctx = ClassicContext(classic_group_type="connect", assignment_interval_ms=0,
                         classic_join_wait_ms=0)
    workers = settled(ctx, 4)  # seven units: 2, 2, 2, 1
    group = ctx.core.store.groups["g"]
    leader = next(w for w in workers if w.member_id == group.chosen_member)
    newcomer = ClassicWorker(ctx, "w5")
    newcomer.step()
    assert newcomer.waiting
    leader.step()  # assigns: the newcomer's share is revoked from the others
    newcomer.step()
    assert not newcomer.waiting
    releasing = [w for w in workers if w is not leader
                 and not w.held <= group.target[w.member_id].units]
    assert releasing, "the assignment revoked nothing from a follower"
    follower = releasing[0]
    held = follower.held
    # Another worker joins before it heard: the leader is asked to assign again.
    ctx.new_member(protocols=(("sessioned", ClassicWorker(ctx, "w6").metadata()),),
                   client_id="w6")
    assert group.epoch > group.assignment_epoch
    follower.step()  # its heartbeat: it must release, and another round is pending
    assert group.members[follower.member_id].current.state is MemberState.UNREVOKED
    assert not follower.waiting
    assert follower.held < held  # told to release at once


def test_a_member_with_units_to_start_is_told_at_once_while_a_round_is_pending() -> None:
    """The successor's install gives the follower units; a new worker joins before the
    follower heard of them, so another round is pending when it rejoins: its SyncGroup
    does not wait for that round, it starts its units now."""
    ctx = ClassicContext(classic_group_type="connect", assignment_interval_ms=0,
                         classic_join_wait_ms=0)
    workers = settled(ctx)
    leader, successor, follower = leader_leaves(ctx, workers)
    held = follower.held
    successor.step()  # assigns, the departed worker's units to both
    group = ctx.core.store.groups["g"]
    assert group.epoch == group.assignment_epoch
    assert group.target[follower.member_id].units > held
    ctx.new_member(protocols=(("sessioned", ClassicWorker(ctx, "w4").metadata()),),
                   client_id="w4")
    assert group.epoch > group.assignment_epoch
    follower.step()
    assert not follower.waiting
    assert follower.held == group.target[follower.member_id].units > held
    no_double_holding([follower, successor], {})
    del leader


def test_a_waiting_member_chosen_when_the_leader_leaves_is_told_to_rejoin_at_once(
) -> None:
    """Every follower waits at its SyncGroup for the leader's assignment; the leader
    leaves instead. The successor's SyncGroup is answered REBALANCE_IN_PROGRESS by the
    leave itself, so it rejoins and assigns without waiting for its wait to run out."""
    ctx = ClassicContext(classic_group_type="connect", assignment_interval_ms=0,
                         classic_join_wait_ms=0)
    workers = settled(ctx)
    group = ctx.core.store.groups["g"]
    leader = next(w for w in workers if w.member_id == group.chosen_member)
    followers = [w for w in workers if w is not leader]
    newcomer = ClassicWorker(ctx, "w4")
    newcomer.step()  # a new round: the leader is asked to assign
    for worker in followers:
        worker.step()
    assert all(w.waiting for w in [newcomer, *followers])
    assert ctx.leave((leader.member_id, None)).error == E.NONE
    successor = next(w for w in [newcomer, *followers] if w.member_id == group.chosen_member)
    answer = ctx.take(SYNC, successor.member_id)
    assert isinstance(answer, SyncAnswer) and answer.error == E.REBALANCE_IN_PROGRESS
    successor.waiting = False
    successor._synced(answer)  # (as its step would: it rejoins)
    successor.step()  # rejoins, assigns: the others' SyncGroups are answered
    others = [w for w in [newcomer, *followers] if w is not successor]
    for worker in others:
        worker.step()
    assert not any(w.waiting for w in others)
    survivors = [newcomer, *followers]
    assert frozenset().union(*(w.held for w in survivors)) == UNITS  # no heartbeat passed
    no_double_holding(survivors, {})
