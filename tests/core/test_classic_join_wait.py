"""While a round is pending in a connect group, a bridged worker's JoinGroup waits until
every bridged worker expected in the round has rejoined (the worker chosen to assign,
and each one a heartbeat tells to rejoin), as a broker's join barrier holds them: the
assignment is computed from everyone's fresh metadata, every JoinGroup of the round is
answered at the same moment (Connect times its heartbeats from that answer, so the
workers' heartbeats keep in step) and the install reaches them all. The wait is bounded,
ends when an awaited member goes, and is in flight: a rolled-back change and a restart
leave nothing of it behind."""

from __future__ import annotations

from coordinator.core.classic.bridge import JOIN_WAIT_TIMER
from coordinator.core.classic.engine import JOIN, SYNC, JoinAnswer, JoinRequest, Parked
from coordinator.core.result import TimerSet
from tests.core.classic_context import ClassicContext
from tests.core.test_classic_bridge import UNITS, ClassicWorker, E, no_double_holding, run
from tests.core.test_classic_sync_wait import WAIT_MS, leader_leaves, settled


def successor_held(ctx: ClassicContext
                   ) -> tuple[ClassicWorker, ClassicWorker, ClassicWorker]:
    """The leader leaves and the worker chosen next hears of it first: its JoinGroup is
    held for the other worker, which has not rejoined yet."""
    leader, successor, follower = leader_leaves(ctx, settled(ctx))
    successor.step()
    assert successor.joining
    assert ctx.take(JOIN, successor.member_id) is None
    assert (JOIN_WAIT_TIMER, "g", successor.member_id) in ctx.timers
    return leader, successor, follower


def set_timers(ctx: ClassicContext, group_ids: set[str]) -> None:
    """The timers the shell keeps after a rollback: the groups' own, re-derived."""
    for key in [key for key in ctx.timers if key[1] in group_ids]:
        del ctx.timers[key]
    for operation in ctx.core.reschedule(sorted(group_ids), ctx.now):
        if isinstance(operation, TimerSet):
            ctx.timers[operation.key] = operation.deadline_ms


def follower_rejoins(ctx: ClassicContext, follower: ClassicWorker) -> object:
    """The follower's heartbeat, then its JoinGroup as the engine's Result (not applied)."""
    assert ctx.heartbeat(follower.member_id, follower.generation) == E.REBALANCE_IN_PROGRESS
    request = JoinRequest("g", follower.member_id, "connect",
                          (("sessioned", follower.metadata()),), 10_000, 30_000, None,
                          follower.name, "127.0.0.1", require_known_member_id=True,
                          skip_assignment_supported=True)
    return ctx.engine.join(request, ctx.now)


def test_the_successor_assigns_once_the_follower_rejoined_and_both_end_the_round_together(
) -> None:
    ctx = ClassicContext(classic_group_type="connect", assignment_interval_ms=0)
    leader, successor, follower = successor_held(ctx)
    departed = leader.held
    follower.step()  # its heartbeat: it rejoins (releasing the successor's JoinGroup), waits
    assert follower.waiting
    answer = ctx.released[(JOIN, "g", successor.member_id)]
    assert isinstance(answer, JoinAnswer) and answer.leader == successor.member_id
    assert {m.member_id for m in answer.members} == {successor.member_id, follower.member_id}
    assert (JOIN_WAIT_TIMER, "g", successor.member_id) not in ctx.timers
    successor.step()  # assigns: its install answers the follower's SyncGroup
    assert (SYNC, "g", follower.member_id) in ctx.released
    group = ctx.core.store.groups["g"]
    assert group.epoch == group.assignment_epoch  # one round, no heartbeat interval passed
    assert group.target[follower.member_id].units & departed


def test_both_hold_every_unit_after_the_round_with_no_heartbeat_interval_passed() -> None:
    ctx = ClassicContext(classic_group_type="connect", assignment_interval_ms=0)
    leader, successor, follower = successor_held(ctx)
    departed = leader.held
    follower.step()
    successor.step()
    follower.step()  # takes its SyncGroup's answer: the install's part
    assert not follower.waiting and not successor.joining
    assert follower.held | successor.held == UNITS
    assert follower.held & departed and successor.held & departed
    no_double_holding([follower, successor], {})


def test_the_held_join_group_is_answered_when_its_wait_runs_out() -> None:
    ctx = ClassicContext(classic_group_type="connect", assignment_interval_ms=0,
                         classic_join_wait_ms=2_000)  # below half the 10 s session
    _leader, successor, follower = successor_held(ctx)
    ctx.advance(1_999)
    assert ctx.take(JOIN, successor.member_id) is None
    ctx.advance(1)
    successor.step()  # answered as the leader with the members there are: it assigns
    assert not successor.joining
    group = ctx.core.store.groups["g"]
    assert group.epoch == group.assignment_epoch
    follower.step()  # hears of its part at its next heartbeat
    run(ctx, [successor, follower], 5)
    assert follower.held | successor.held == UNITS
    no_double_holding([follower, successor], {})


def test_the_wait_is_at_most_half_the_chosen_workers_session() -> None:
    ctx = ClassicContext(classic_group_type="connect", assignment_interval_ms=0)
    _leader, successor, _follower = successor_held(ctx)
    deadline = ctx.timers[(JOIN_WAIT_TIMER, "g", successor.member_id)]
    assert deadline == ctx.now + WAIT_MS  # the default wait, 10 s, bounded by 10 s / 2


def test_an_awaited_member_that_leaves_ends_the_wait_at_once() -> None:
    ctx = ClassicContext(classic_group_type="connect", assignment_interval_ms=0)
    _leader, successor, follower = successor_held(ctx)
    assert ctx.leave((follower.member_id, None)).error == E.NONE
    answer = ctx.released[(JOIN, "g", successor.member_id)]
    assert isinstance(answer, JoinAnswer) and answer.leader == successor.member_id
    assert [m.member_id for m in answer.members] == [successor.member_id]
    successor.step()
    assert successor.held == UNITS


def test_a_chosen_worker_that_leaves_while_held_is_answered_unknown_member() -> None:
    ctx = ClassicContext(classic_group_type="connect", assignment_interval_ms=0)
    _leader, successor, follower = successor_held(ctx)
    assert ctx.leave((successor.member_id, None)).error == E.NONE
    answer = ctx.released[(JOIN, "g", successor.member_id)]
    assert isinstance(answer, JoinAnswer) and answer.error == E.UNKNOWN_MEMBER_ID
    run(ctx, [follower], 5)
    assert follower.held == UNITS


def test_a_rolled_back_rejoin_puts_the_held_join_group_back_and_its_timer_answers_it(
) -> None:
    ctx = ClassicContext(classic_group_type="connect", assignment_interval_ms=0)
    _leader, successor, follower = successor_held(ctx)
    result = follower_rejoins(ctx, follower)
    assert [key for key, _ in result.releases] == [(JOIN, "g", successor.member_id)]
    # The follower's JoinGroup cannot be written: its answer and the release never go out.
    ctx.core.rollback(result)
    set_timers(ctx, result.touched_groups())
    bridge = ctx.core.classic.bridge
    assert follower.member_id not in bridge._rejoined.get("g", set())
    assert ctx.take(JOIN, successor.member_id) is None
    ctx.advance(0)  # its re-derived timer: answered now, as the leader
    answer = ctx.take(JOIN, successor.member_id)
    assert isinstance(answer, JoinAnswer) and answer.leader == successor.member_id
    successor.joining = False
    successor._joined(answer)
    run(ctx, [successor, follower], 5)
    assert follower.held | successor.held == UNITS
    no_double_holding([follower, successor], {})


def test_a_rolled_back_held_join_group_leaves_no_wait_behind() -> None:
    ctx = ClassicContext(classic_group_type="connect", assignment_interval_ms=0)
    _leader, successor, follower = leader_leaves(ctx, settled(ctx))
    assert ctx.heartbeat(successor.member_id, successor.generation) == E.REBALANCE_IN_PROGRESS
    request = JoinRequest("g", successor.member_id, "connect",
                          (("sessioned", successor.metadata()),), 10_000, 30_000, None,
                          successor.name, "127.0.0.1", require_known_member_id=True,
                          skip_assignment_supported=True)
    result = ctx.engine.join(request, ctx.now)
    assert isinstance(result.response, Parked)
    ctx.core.rollback(result)  # the shell answers the request with the write's error
    set_timers(ctx, result.touched_groups())
    assert not any(key[0] == JOIN_WAIT_TIMER for key in ctx.timers)
    assert "g" not in ctx.core.classic.bridge._held_joins
    run(ctx, [successor, follower], 10)  # it rejoins; the round completes
    assert follower.held | successor.held == UNITS


def test_a_restart_drops_the_held_join_group_with_its_connection() -> None:
    ctx = ClassicContext(classic_group_type="connect", assignment_interval_ms=0)
    _leader, successor, follower = successor_held(ctx)
    ctx.restart()
    assert not any(key[0] == JOIN_WAIT_TIMER for key in ctx.timers)
    successor.joining = False  # its connection is gone: it rejoins
    successor.rejoin = True
    run(ctx, [successor, follower], 10)
    assert follower.held | successor.held == UNITS
    no_double_holding([follower, successor], {})


def test_with_no_join_wait_the_successor_assigns_at_once() -> None:
    ctx = ClassicContext(classic_group_type="connect", assignment_interval_ms=0,
                         classic_join_wait_ms=0)
    _leader, successor, follower = leader_leaves(ctx, settled(ctx))
    successor.step()
    assert not successor.joining
    group = ctx.core.store.groups["g"]
    assert group.epoch == group.assignment_epoch
    assert ctx.heartbeat(follower.member_id, follower.generation) == E.REBALANCE_IN_PROGRESS


def test_a_follower_that_rejoins_first_is_answered_with_the_successor_in_one_change(
) -> None:
    ctx = ClassicContext(classic_group_type="connect", assignment_interval_ms=0)
    leader, successor, follower = leader_leaves(ctx, settled(ctx))
    follower.step()  # its heartbeat first: it rejoins, and waits for the successor
    assert follower.joining and not follower.waiting
    assert ctx.take(JOIN, follower.member_id) is None
    # The successor's JoinGroup, the last awaited, is answered at once, and the same
    # change answers the follower's: both time their heartbeats from this moment.
    assert ctx.heartbeat(successor.member_id, successor.generation) == \
        E.REBALANCE_IN_PROGRESS
    request = JoinRequest("g", successor.member_id, "connect",
                          (("sessioned", successor.metadata()),), 10_000, 30_000, None,
                          successor.name, "127.0.0.1", require_known_member_id=True,
                          skip_assignment_supported=True)
    result = ctx.engine.join(request, ctx.now)
    assert isinstance(result.response, JoinAnswer)
    assert result.response.leader == successor.member_id
    assert [key for key, _ in result.releases] == [(JOIN, "g", follower.member_id)]
    ctx.apply(result)
    successor._joined(result.response)  # assigns
    follower.step()  # its JoinGroup's answer, then its SyncGroup: the install's part
    assert not follower.joining and not follower.waiting
    assert follower.held | successor.held == UNITS
    assert follower.held & leader.held
    no_double_holding([follower, successor], {})


def test_a_new_workers_join_group_waits_for_the_others_to_rejoin() -> None:
    ctx = ClassicContext(classic_group_type="connect", assignment_interval_ms=0)
    workers = settled(ctx)
    newcomer = ClassicWorker(ctx, "w4")
    newcomer.step()  # a new round: the chosen worker and the others must rejoin first
    assert newcomer.joining
    group = ctx.core.store.groups["g"]
    for worker in workers[:-1]:
        worker.step()  # its heartbeat: it rejoins, and waits too
        assert worker.joining
    assert (JOIN, "g", newcomer.member_id) not in ctx.released  # one is still to come
    workers[-1].step()  # the last: every JoinGroup of the round is answered with its own
    assert all((JOIN, "g", w.member_id) in ctx.released for w in [*workers[:-1], newcomer])
    run(ctx, [*workers, newcomer], 3)
    assert group.epoch == group.assignment_epoch
    assert newcomer.held and frozenset().union(*(w.held for w in [*workers, newcomer])) \
        == UNITS
    no_double_holding([*workers, newcomer], {})


def test_a_member_held_at_both_waits_keeps_its_session() -> None:
    """Its heartbeats wait behind a held request on its connection: a JoinGroup held for
    its whole wait, then a SyncGroup held for its own, must not cost it its session (it
    starts again when the JoinGroup is answered and when the SyncGroup comes)."""
    ctx = ClassicContext(classic_group_type="connect", assignment_interval_ms=0)
    _leader, successor, follower = leader_leaves(ctx, settled(ctx))
    group = ctx.core.store.groups["g"]

    def successor_beats(ms: int) -> None:  # alive, but it never rejoins
        for _ in range(ms // 1_000):
            ctx.advance(1_000)
            ctx.heartbeat(successor.member_id, successor.generation)

    follower.step()  # held: the successor has not rejoined
    assert follower.joining
    successor_beats(WAIT_MS)  # the wait runs out: answered as a follower
    assert (JOIN, "g", follower.member_id) in ctx.released
    ctx.advance(1)
    follower.step()  # its SyncGroup, held: the successor is still to assign
    assert follower.waiting
    successor_beats(WAIT_MS - 1_000)
    ctx.advance(999)  # a session (10 s) after its JoinGroup came; its SyncGroup waits on
    assert follower.waiting and follower.member_id in group.members


def test_a_join_group_held_after_the_wait_ran_out_is_answered_by_the_install() -> None:
    """Two workers had not rejoined when the wait ran out; one rejoins later and waits
    for the other; the install ends the round, and answers it."""
    ctx = ClassicContext(classic_group_type="connect", assignment_interval_ms=0)
    workers = settled(ctx, 5)
    _leader, successor, follower = leader_leaves(ctx, workers)
    late, _later = [w for w in workers if w.member_id in ctx.core.store.groups["g"].members
                   and w not in (successor, follower)]
    follower.step()
    successor.step()
    assert follower.joining and successor.joining
    ctx.advance(WAIT_MS)  # the two others never came: the round goes on without them
    assert ctx.take(JOIN, follower.member_id) is not None
    follower.joining = False  # (it took its answer; it syncs later)
    late.step()  # rejoins now, and waits for the one still missing
    assert late.joining
    successor.step()  # takes its answer as leader, assigns: the install ends the round
    assert (JOIN, "g", late.member_id) in ctx.released
