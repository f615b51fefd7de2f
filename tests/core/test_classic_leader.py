"""The classic worker that assigns, against the core: which worker the coordinator asks
after a restart or a rolled-back write, and how its assignment is read when a member's
holdings moved between its JoinGroup answer and its SyncGroup."""

from __future__ import annotations

from coordinator.connect_protocol import (
    ConnectAssignment,
    decode_assignment,
    decode_worker_metadata,
    encode_assignment,
)
from coordinator.core.classic.engine import SYNC, JoinAnswer, JoinRequest, Parked, SyncAnswer
from coordinator.units import Unit, units_of
from protocol.errors import ErrorCode
from tests.core.classic_context import ClassicContext
from tests.core.test_classic_bridge import (
    UNITS,
    ClassicWorker,
    RememberingWorker,
    no_double_holding,
    run,
)

E = ErrorCode


def held_by_members(ctx: ClassicContext) -> dict[str, frozenset[Unit]]:
    """What the coordinator lets each member hold (runs or has yet to release)."""
    group = ctx.core.store.groups["g"]
    return {m: member.current.held for m, member in group.members.items()}


def no_unit_held_twice(ctx: ClassicContext, workers: list[ClassicWorker]) -> None:
    """Neither the coordinator nor the workers ever see a unit held by two members."""
    no_double_holding([], held_by_members(ctx))
    no_double_holding(workers, {})


def join(ctx: ClassicContext, worker: ClassicWorker) -> JoinAnswer:
    answer = ctx.join(worker.member_id, protocols=(("sessioned", worker.metadata()),),
                      client_id=worker.name)
    assert isinstance(answer, JoinAnswer)
    if answer.error == E.MEMBER_ID_REQUIRED:
        worker.member_id = answer.member_id
        answer = ctx.join(worker.member_id, protocols=(("sessioned", worker.metadata()),),
                          client_id=worker.name)
        assert isinstance(answer, JoinAnswer)
    assert answer.error == E.NONE, answer
    worker.generation = answer.generation
    return answer


def shown(answer: JoinAnswer) -> dict[str, frozenset[Unit]]:
    """What a leader's JoinGroup answer says each member holds."""
    owned = {}
    for member in answer.members:
        allocation = decode_worker_metadata(member.metadata).allocation
        owned[member.member_id] = allocation.assigned if allocation else frozenset()
    return owned


def sync(ctx: ClassicContext, worker: ClassicWorker,
         assignments: dict[str, bytes] | None = None) -> SyncAnswer:
    synced = ctx.sync(worker.member_id, worker.generation, assignments=assignments)
    if isinstance(synced, Parked):
        # It waits for the assignment the leader computes, at most half its 10 s session:
        # the leader has not sent it by then, so it is told what it may run now.
        assert ctx.take(SYNC, worker.member_id) is None
        ctx.advance(5_000)
        synced = ctx.take(SYNC, worker.member_id)
    assert isinstance(synced, SyncAnswer)
    if synced.error == E.NONE:
        told = decode_assignment(synced.assignment)
        assert not (told.assigned and told.revoked), "never revoke and grant at once"
        worker.held = (worker.held - told.revoked) | told.assigned
        worker.rejoin = bool(told.revoked)
    else:
        worker.rejoin = True
    return synced


def test_a_unit_granted_after_the_leaders_join_answer_and_handed_elsewhere_moves_safely(
) -> None:
    """The leader's JoinGroup is answered; another member then syncs and is granted a
    unit of the previous target; the leader, which saw that unit free, hands it to a
    third member. Its assignment is read against what it was shown: it is installed, the
    unit is released by the member that holds it before the third member gets it, and no
    unit is ever held by two members."""
    # (the leader answered before the others rejoin: as when its JoinGroup's wait ran out)
    ctx = ClassicContext(classic_group_type="connect", assignment_interval_ms=0,
                         classic_join_wait_ms=0)
    ctx.apply(ctx.core.put_connector("g", "A", 1, ctx.now))  # two units: A and A-0
    units = sorted(units_of({"A": 1}))
    leader, late, third = (ClassicWorker(ctx, "a"), ClassicWorker(ctx, "c"),
                           ClassicWorker(ctx, "b"))
    workers = [leader, late, third]
    group = ctx.core.store.groups["g"]

    # The leader alone first assigns nothing; `late` joins and the leader, asked again,
    # gives it one unit and keeps the other.
    answer = join(ctx, leader)
    assert answer.leader == leader.member_id
    sync(ctx, leader, {leader.member_id: encode_assignment(
        ConnectAssignment(2, leader=leader.member_id))})
    join(ctx, late)  # answered; its SyncGroup comes much later
    assert ctx.heartbeat(leader.member_id, leader.generation) == E.REBALANCE_IN_PROGRESS
    answer = join(ctx, leader)
    assert answer.leader == leader.member_id
    given = units[0]
    kept = units[1]
    sync(ctx, leader, {
        leader.member_id: encode_assignment(ConnectAssignment(
            2, leader=leader.member_id, assigned=frozenset({kept}))),
        late.member_id: encode_assignment(ConnectAssignment(
            2, leader=leader.member_id, assigned=frozenset({given})))})
    assert group.target[late.member_id].units == {given}
    assert leader.held == {kept}
    no_unit_held_twice(ctx, workers)

    # A third member joins: the leader is asked to assign and sees `given` held by nobody.
    join(ctx, third)
    assert ctx.heartbeat(leader.member_id, leader.generation) == E.REBALANCE_IN_PROGRESS
    answer = join(ctx, leader)
    assert answer.leader == leader.member_id
    seen = shown(answer)
    assert seen[late.member_id] == frozenset() and given not in frozenset().union(*seen.values())
    # Now `late` syncs and is granted `given` (the previous target's).
    synced = sync(ctx, late)
    assert synced.error == E.NONE and late.held == {given}
    no_unit_held_twice(ctx, workers)
    # The leader's assignment, from what it saw: `given` goes to the third member.
    plan = {member_id: ConnectAssignment(2, leader=leader.member_id)
            for member_id in seen}
    plan[third.member_id] = ConnectAssignment(2, leader=leader.member_id,
                                              assigned=frozenset({given}))
    epoch_before = group.assignment_epoch
    synced = sync(ctx, leader, {m: encode_assignment(a) for m, a in plan.items()})
    assert synced.error == E.NONE, synced
    assert not [e for e in ctx.events if e.name == "classic_install_invalid"]
    assert group.assignment_epoch > epoch_before  # installed
    assert group.target[third.member_id].units == {given}
    assert given not in group.target[late.member_id].units
    no_unit_held_twice(ctx, workers)

    # The third member is not given the unit while `late` still holds it...
    synced = sync(ctx, third)
    assert synced.error == E.NONE and given not in third.held
    no_unit_held_twice(ctx, workers)
    # ...`late` is told to release it, and only then does the third member get it.
    assert ctx.heartbeat(late.member_id, late.generation) == E.REBALANCE_IN_PROGRESS
    join(ctx, late)
    synced = sync(ctx, late)
    assert synced.error == E.NONE and given not in late.held
    no_unit_held_twice(ctx, workers)
    run(ctx, workers, 10)
    assert third.held >= {given}
    assert frozenset().union(*(w.held for w in workers)) == frozenset(units)
    no_unit_held_twice(ctx, workers)


def stable_group(ctx: ClassicContext) -> tuple[list[RememberingWorker], RememberingWorker]:
    """Two workers settled; the one that assigns is not the one the coordinator would
    pick first without memory (the lowest member id)."""
    ctx.apply(ctx.core.put_connector("g", "A", 3, ctx.now))
    ctx.apply(ctx.core.put_connector("g", "B", 2, ctx.now))
    first = RememberingWorker(ctx, "y")  # alone at first: chosen, and kept since
    workers = [first]
    run(ctx, workers, 3)
    workers.append(RememberingWorker(ctx, "x"))
    run(ctx, workers, 10)
    group = ctx.core.store.groups["g"]
    assert group.state == "STABLE" and group.chosen_member == first.member_id
    assert min(group.members) != first.member_id
    assert frozenset().union(*(w.held for w in workers)) == UNITS
    return workers, first


def test_after_a_restart_the_worker_that_computed_the_target_assigns_next() -> None:
    ctx = ClassicContext(classic_group_type="connect")
    workers, leader = stable_group(ctx)
    ctx.restart()
    group = ctx.core.store.groups["g"]
    assert group.chosen_member is None  # nothing transient survives a load
    newcomer = RememberingWorker(ctx, "w")
    workers.append(newcomer)
    run(ctx, workers, 20)
    assert all(w.assigned_in is None for w in workers if w is not leader), \
        "another worker assigned after the restart, knowing nothing of the last assignment"
    assert leader.forgot == []
    assert group.chosen_member == leader.member_id
    assert frozenset().union(*(w.held for w in workers)) == UNITS
    no_double_holding(workers, {})


def test_a_rolled_back_write_leaves_the_choice_as_a_fresh_load_would() -> None:
    ctx = ClassicContext(classic_group_type="connect")
    workers, leader = stable_group(ctx)
    # A new worker's join cannot be written: undone, then scheduled by the one rule.
    newcomer = RememberingWorker(ctx, "w")
    first = ctx.join("", protocols=(("sessioned", newcomer.metadata()),), client_id="w")
    assert isinstance(first, JoinAnswer) and first.error == E.MEMBER_ID_REQUIRED
    request_id = first.member_id
    result = ctx.engine.join(JoinRequest(
        "g", request_id, "connect", (("sessioned", newcomer.metadata()),), 10_000, 30_000,
        None, "w", "127.0.0.1", require_known_member_id=True, skip_assignment_supported=True),
        ctx.now)
    ctx.core.rollback(result)
    timers = ctx.core.reschedule(sorted(result.touched_groups()), ctx.now)
    ctx.timers = {op.key: op.deadline_ms for op in timers if hasattr(op, "key")}
    fresh = ClassicContext(classic_group_type="connect")
    fresh.log, fresh.now = list(ctx.log), ctx.now
    fresh.restart()
    # Both coordinators ask the same worker when a new round comes.
    for core_ctx in (ctx, fresh):
        group = core_ctx.core.store.groups["g"]
        assert group.chosen_member is None
        core_ctx.apply(core_ctx.core.put_connector("g", "C", 1, core_ctx.now))
        core_ctx.advance(0)
        assert group.chosen_member == leader.member_id, core_ctx
    run(ctx, workers, 20)  # (the workers' assignor knows only A and B)
    assert all(w.assigned_in is None for w in workers if w is not leader)
    assert leader.forgot == []
    assert frozenset().union(*(w.held for w in workers)) == UNITS


def test_a_unit_granted_after_the_leaders_join_answer_and_handed_to_nobody_is_released(
) -> None:
    """The same interleaving, but the leader (holding the unit back, say) hands it to
    nobody: read against what it was shown, the member that was granted it since is told
    to release it, and nobody is given it."""
    # (the leader answered before the others rejoin: as when its JoinGroup's wait ran out)
    ctx = ClassicContext(classic_group_type="connect", assignment_interval_ms=0,
                         classic_join_wait_ms=0)
    ctx.apply(ctx.core.put_connector("g", "A", 1, ctx.now))
    given, kept = sorted(units_of({"A": 1}))
    leader, late, third = (ClassicWorker(ctx, "a"), ClassicWorker(ctx, "c"),
                           ClassicWorker(ctx, "b"))
    workers = [leader, late, third]
    group = ctx.core.store.groups["g"]
    join(ctx, leader)
    sync(ctx, leader, {leader.member_id: encode_assignment(
        ConnectAssignment(2, leader=leader.member_id))})
    join(ctx, late)
    assert ctx.heartbeat(leader.member_id, leader.generation) == E.REBALANCE_IN_PROGRESS
    join(ctx, leader)
    sync(ctx, leader, {
        leader.member_id: encode_assignment(ConnectAssignment(
            2, leader=leader.member_id, assigned=frozenset({kept}))),
        late.member_id: encode_assignment(ConnectAssignment(
            2, leader=leader.member_id, assigned=frozenset({given})))})
    join(ctx, third)
    assert ctx.heartbeat(leader.member_id, leader.generation) == E.REBALANCE_IN_PROGRESS
    seen = shown(join(ctx, leader))
    assert sync(ctx, late).error == E.NONE and late.held == {given}
    plan = {member_id: ConnectAssignment(2, leader=leader.member_id) for member_id in seen}
    assert sync(ctx, leader, {m: encode_assignment(a) for m, a in plan.items()}).error \
        == E.NONE
    assert all(given not in part.units for part in group.target.values())
    assert ctx.heartbeat(late.member_id, late.generation) == E.REBALANCE_IN_PROGRESS
    join(ctx, late)
    synced = sync(ctx, late)
    assert synced.error == E.NONE and given in decode_assignment(synced.assignment).revoked
    assert given not in late.held
    no_unit_held_twice(ctx, workers)
