"""Classic group conformance, from Kafka's documented classic group behaviour (the
JoinGroup/SyncGroup/Heartbeat/LeaveGroup protocol and KIP-345/394/800's rules), against
the core."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from coordinator.core.classic.engine import (
    CLASSIC_SESSION_TIMER,
    JoinAnswer,
    JoinRequest,
    LeaveRequest,
    Parked,
    SyncAnswer,
)
from coordinator.core.classic.state import ClassicState
from coordinator.core.result import TimerClearGroup, TimerSet
from protocol.errors import ErrorCode
from tests.core.classic_context import JOIN, SYNC, ClassicContext

E = ErrorCode


def stable_pair(ctx: ClassicContext) -> tuple[str, str, int]:
    """Two members in a stable group: (leader, follower, generation)."""
    first = ctx.new_member()
    assert ctx.take(JOIN, first).generation == 1  # alone, without an initial delay
    second = ctx.new_member()  # a join phase: the first must rejoin
    assert ctx.take(JOIN, second) is None
    ctx.join(first)
    answers = {m: ctx.take(JOIN, m) for m in (first, second)}
    assert answers[first].generation == answers[second].generation == 2
    leader = answers[first].leader
    follower = second if leader == first else first
    generation = answers[first].generation
    assert ctx.sync(follower, generation) == Parked((SYNC, "g", follower))
    leader_sync = ctx.sync(leader, generation, assignments={leader: b"L", follower: b"F"})
    assert isinstance(leader_sync, SyncAnswer) and leader_sync.assignment == b"L"
    assert ctx.take(SYNC, follower).assignment == b"F"
    assert ctx.group().state is ClassicState.STABLE
    return leader, follower, generation


def test_member_id_required_from_v4_and_not_before() -> None:
    ctx = ClassicContext()
    answer = ctx.join("", version=4)
    assert isinstance(answer, JoinAnswer)
    assert answer.error == E.MEMBER_ID_REQUIRED and answer.member_id
    # Told MEMBER_ID_REQUIRED is not membership: the group is still empty.
    assert ctx.group().active() == {}
    joined = ctx.join(answer.member_id, version=4)
    assert isinstance(joined, JoinAnswer) and joined.error == E.NONE  # alone: completes
    assert joined.leader == answer.member_id and joined.generation == 1
    # Version 3 and older get a member id with the join itself.
    old = ctx.join("", "old", version=3)
    assert isinstance(old, JoinAnswer) and old.error == E.NONE and old.member_id
    # An id the coordinator never handed out is unknown.
    assert ctx.join("made-up").error == E.UNKNOWN_MEMBER_ID  # type: ignore[union-attr]


def test_join_barrier_waits_for_every_member_then_answers_all() -> None:
    ctx = ClassicContext()
    leader, follower, generation = stable_pair(ctx)
    # A known member rejoining starts a join phase: the others learn of it by heartbeat.
    assert ctx.join(leader) == Parked((JOIN, "g", leader))
    assert ctx.group().state is ClassicState.PREPARING_REBALANCE
    assert ctx.heartbeat(follower, generation) == E.REBALANCE_IN_PROGRESS
    ctx.advance(8_000)  # it waits (the rebalance timeout is 30 s) ...
    assert ctx.heartbeat(follower, generation) == E.REBALANCE_IN_PROGRESS
    ctx.advance(8_000)
    assert ctx.take(JOIN, leader) is None and ("join", "g", leader) in ctx.parked
    follower_answer = ctx.join(follower)  # ... until the last member joins
    leader_answer = ctx.take(JOIN, leader)
    assert isinstance(follower_answer, JoinAnswer) and leader_answer is not None
    assert leader_answer.generation == follower_answer.generation == generation + 1
    assert leader_answer.leader == follower_answer.leader == leader
    # The leader gets every member's metadata of the selected protocol; a follower none.
    assert {m.member_id for m in leader_answer.members} == {leader, follower}
    assert all(m.metadata == b"meta-2" for m in leader_answer.members)
    assert follower_answer.members == ()
    assert leader_answer.protocol_name == "sessioned"


def test_initial_rebalance_delay_collects_members_that_start_together() -> None:
    ctx = ClassicContext(initial_rebalance_delay_ms=3_000)
    first = ctx.new_member()
    ctx.advance(2_000)
    second = ctx.new_member()
    ctx.advance(2_000)  # 4 s: the first delay has passed, but the second join extended it
    assert ctx.take(JOIN, first) is None
    ctx.advance(1_000)  # 5 s = the second join + 3 s
    one, two = ctx.take(JOIN, first), ctx.take(JOIN, second)
    assert one.generation == two.generation == 1
    assert one.leader == two.leader == first
    assert len(one.members) == 2 and two.members == ()


def test_protocol_vote_and_inconsistent_protocols() -> None:
    ctx = ClassicContext()
    leader, _, _ = stable_pair(ctx)
    answer = ctx.join("", protocol_type="consumer")
    assert answer.error == E.INCONSISTENT_GROUP_PROTOCOL  # type: ignore[union-attr]
    answer = ctx.join("", protocols=(("range", b""),))
    assert answer.error == E.INCONSISTENT_GROUP_PROTOCOL  # type: ignore[union-attr]
    # A member that supports only `compatible` makes the group pick it.
    other = ctx.new_member(protocols=(("compatible", b"c"), ("default", b"d")))
    assert ctx.group().state is ClassicState.PREPARING_REBALANCE
    for member in list(ctx.group().active()):
        if member != other:
            ctx.join(member)
    leader_answer = ctx.take(JOIN, leader)
    assert leader_answer.protocol_name == "compatible"


def test_heartbeat_during_completing_rebalance_is_accepted() -> None:
    ctx = ClassicContext()
    first = ctx.new_member()
    assert ctx.take(JOIN, first) is not None
    assert ctx.group().state is ClassicState.COMPLETING_REBALANCE
    generation = ctx.group().generation
    assert ctx.heartbeat(first, generation) == E.NONE
    assert ctx.heartbeat(first, generation - 1) == E.ILLEGAL_GENERATION
    assert ctx.heartbeat("nobody", generation) == E.UNKNOWN_MEMBER_ID
    assert ctx.heartbeat(first, generation, group_id="other") == E.UNKNOWN_MEMBER_ID


def test_new_member_during_completing_rebalance_sends_syncs_back_to_join() -> None:
    ctx = ClassicContext()
    first = ctx.new_member()
    second = ctx.new_member()
    ctx.join(first)
    a, b = ctx.take(JOIN, first), ctx.take(JOIN, second)
    follower = second if a.leader == first else first
    generation = a.generation
    assert ctx.sync(follower, generation) == Parked((SYNC, "g", follower))
    third = ctx.new_member()
    assert ctx.take(SYNC, follower).error == E.REBALANCE_IN_PROGRESS
    assert ctx.group().state is ClassicState.PREPARING_REBALANCE
    assert ctx.sync(follower, generation).error == E.REBALANCE_IN_PROGRESS  # type: ignore[union-attr]
    ctx.join(first)
    ctx.join(second)
    answers = [ctx.take(JOIN, m) for m in (first, second, third)]
    assert {answer.generation for answer in answers} == {generation + 1}
    del b


def test_new_member_into_a_stable_group() -> None:
    ctx = ClassicContext()
    leader, follower, generation = stable_pair(ctx)
    newcomer = ctx.new_member()
    assert ctx.heartbeat(leader, generation) == E.REBALANCE_IN_PROGRESS
    assert ctx.heartbeat(follower, generation) == E.REBALANCE_IN_PROGRESS
    ctx.join(leader)
    assert ctx.take(JOIN, newcomer) is None
    ctx.join(follower)
    answers = {m: ctx.take(JOIN, m) for m in (leader, follower, newcomer)}
    assert all(a.generation == generation + 1 for a in answers.values())
    assert answers[leader].leader == leader  # the leader that rejoined stays leader
    assert len(answers[leader].members) == 3


def test_leader_leaves_during_sync() -> None:
    ctx = ClassicContext()
    first = ctx.new_member()
    second = ctx.new_member()
    ctx.join(first)
    a = ctx.take(JOIN, first)
    ctx.take(JOIN, second)
    leader, follower = a.leader, (second if a.leader == first else first)
    assert ctx.sync(follower, a.generation) == Parked((SYNC, "g", follower))
    left = ctx.leave((leader, None))
    assert left.error == E.NONE
    assert ctx.take(SYNC, follower).error == E.REBALANCE_IN_PROGRESS
    # The follower rejoins alone and leads the next generation.
    answer = ctx.join(follower)
    assert isinstance(answer, JoinAnswer)
    assert answer.leader == follower and answer.generation == a.generation + 1


def test_sync_timeout_removes_members_that_never_synced() -> None:
    ctx = ClassicContext()
    leader, follower, generation = stable_pair(ctx)
    ctx.join(leader)
    ctx.join(follower)
    answer = ctx.take(JOIN, leader)
    ctx.take(JOIN, follower)
    # The leader never sends SyncGroup: after the rebalance timeout both are out.
    ctx.sync(follower, answer.generation)
    ctx.heartbeat(follower, answer.generation)
    ctx.advance(30_000)
    assert leader not in ctx.group().members
    assert ctx.take(SYNC, follower).error in (E.UNKNOWN_MEMBER_ID, E.REBALANCE_IN_PROGRESS)
    del generation


def test_session_expiry_during_a_rebalance() -> None:
    ctx = ClassicContext()
    leader, follower, generation = stable_pair(ctx)
    ctx.advance(5_000)
    assert ctx.heartbeat(leader, generation) == E.NONE
    ctx.join(leader)  # a join phase starts; the follower has gone silent
    ctx.advance(5_001)  # the follower's session (10 s since its last request) ends
    assert follower not in ctx.group().members
    answer = ctx.take(JOIN, leader)  # the barrier no longer waits for it
    assert answer is not None and answer.generation == generation + 1
    assert [m.member_id for m in answer.members] == [leader]


def test_a_parked_member_is_not_expired_while_it_waits() -> None:
    ctx = ClassicContext()
    leader, follower, generation = stable_pair(ctx)
    ctx.join(leader)  # parked for up to the rebalance timeout (30 s), silent meanwhile
    for _ in range(4):
        ctx.advance(5_000)
        assert ctx.heartbeat(follower, generation) == E.REBALANCE_IN_PROGRESS
    assert leader in ctx.group().members  # 20 s silent, past its 10 s session
    ctx.join(follower)
    assert ctx.take(JOIN, leader).generation == generation + 1


def test_member_that_does_not_rejoin_is_removed_at_the_join_deadline() -> None:
    ctx = ClassicContext()
    leader, follower, generation = stable_pair(ctx)
    ctx.join(leader)
    for _ in range(12):  # the follower keeps heartbeating but never rejoins
        ctx.advance(2_500)
        assert ctx.heartbeat(follower, generation) in (E.REBALANCE_IN_PROGRESS,
                                                       E.UNKNOWN_MEMBER_ID)
    assert follower not in ctx.group().members
    assert ctx.take(JOIN, leader).generation == generation + 1


def test_static_member_replacement_keeps_the_assignment_without_a_rebalance() -> None:
    ctx = ClassicContext()
    a = ctx.join("", instance_id="worker-a")  # static: no MEMBER_ID_REQUIRED
    assert isinstance(a, JoinAnswer) and a.error == E.NONE
    old = a.member_id
    b = ctx.new_member(instance_id=None)
    ctx.join(old, instance_id="worker-a")
    first, second = ctx.take(JOIN, old), ctx.take(JOIN, b)
    generation = first.generation
    leader = first.leader
    follower = b if leader == old else old
    ctx.sync(follower, generation, instance_id="worker-a" if follower == old else None)
    ctx.sync(leader, generation, assignments={old: b"A", b: b"B"},
             instance_id="worker-a" if leader == old else None)
    ctx.released.clear()
    # The instance restarts with a new member id: it takes the old one's place at once.
    again = ctx.join("", instance_id="worker-a")
    assert isinstance(again, JoinAnswer) and again.error == E.NONE
    assert again.member_id != old and again.generation == generation
    assert ctx.group().state is ClassicState.STABLE
    assert ctx.heartbeat(old, generation, instance_id="worker-a") == E.FENCED_INSTANCE_ID
    synced = ctx.sync(again.member_id, generation, instance_id="worker-a")
    assert isinstance(synced, SyncAnswer) and synced.assignment == b"A"
    assert ctx.heartbeat(b, generation) == E.NONE  # nobody else rebalanced
    del second


def test_leave_group_batch_by_member_and_instance_id() -> None:
    ctx = ClassicContext()
    static = ctx.join("", instance_id="s1")
    assert isinstance(static, JoinAnswer)
    dynamic = ctx.new_member()
    ctx.join(static.member_id, instance_id="s1")
    ctx.take(JOIN, static.member_id)
    ctx.take(JOIN, dynamic)
    answer = ctx.leave((dynamic, None), ("", "s1"), ("ghost", None),
                       ("wrong-id", "nobody"))
    assert [code for _, _, code in answer.members] == [
        E.NONE, E.NONE, E.UNKNOWN_MEMBER_ID, E.UNKNOWN_MEMBER_ID]
    assert ctx.group().active() == {}
    assert ctx.group().state is ClassicState.EMPTY
    # An instance id held by another member id is fenced, not removed.
    s2 = ctx.join("", instance_id="s2")
    assert isinstance(s2, JoinAnswer)
    fenced = ctx.leave(("other", "s2"))
    assert fenced.members[0][2] == E.FENCED_INSTANCE_ID and fenced.error == E.FENCED_INSTANCE_ID
    assert s2.member_id in ctx.group().members


def test_session_timeout_bounds_are_enforced() -> None:
    ctx = ClassicContext(classic_min_session_timeout_ms=6_000)
    answer = ctx.join("", session_ms=5_999)
    assert answer.error == E.INVALID_SESSION_TIMEOUT  # type: ignore[union-attr]
    assert "g" not in ctx.engine.store.groups  # nothing changed


def _state(ctx: ClassicContext) -> dict[str, object]:
    return {group_id: (asdict(group.meta), {m: asdict(v) for m, v in group.members.items()})
            for group_id, group in ctx.engine.store.groups.items()}


def test_restart_mid_rebalance_comes_back_with_generation_and_members() -> None:
    ctx = ClassicContext()
    leader, follower, generation = stable_pair(ctx)
    ctx.join(leader)  # PreparingRebalance, the leader parked
    before = _state(ctx)
    ctx.restart()
    assert _state(ctx) == before
    assert ctx.group().state is ClassicState.PREPARING_REBALANCE
    # The members carry on: the follower's heartbeat is told to rejoin; both rejoin.
    assert ctx.heartbeat(follower, generation) == E.REBALANCE_IN_PROGRESS
    answer = ctx.join(follower)
    assert isinstance(answer, JoinAnswer)  # the leader joined before the restart
    assert answer.generation == generation + 1
    # The leader's JoinGroup was lost with the restart: it sends it again and gets the
    # answer of the generation that completed.
    again = ctx.join(leader)
    assert isinstance(again, JoinAnswer) and again.generation == generation + 1
    assert again.leader == leader and len(again.members) == 2
    # Restart again in CompletingRebalance: the sync deadline comes back from the record.
    deadline = ctx.group().meta.phase_deadline_ms
    ctx.restart()
    assert ctx.timers[("classic_phase", "g", "")] == deadline
    assert ctx.sync(follower, generation + 1) == Parked((SYNC, "g", follower))
    done = ctx.sync(leader, generation + 1, assignments={leader: b"x", follower: b"y"})
    assert isinstance(done, SyncAnswer) and done.assignment == b"x"
    assert ctx.take(SYNC, follower).assignment == b"y"


def test_rollback_restores_the_state_of_the_durable_records() -> None:
    ctx = ClassicContext()
    leader, follower, generation = stable_pair(ctx)
    before = _state(ctx)
    result = ctx.engine.join(
        JoinRequest("g", "", "connect", (("sessioned", b"z"),), 10_000, 30_000), ctx.now)
    assert result.records  # a pending member was written
    ctx.core.rollback(result)
    assert _state(ctx) == before
    del leader, follower, generation


@pytest.mark.parametrize("version", [0, 3, 4, 9])
def test_every_join_version_reaches_a_stable_group(version: int) -> None:
    ctx = ClassicContext()
    first = ctx.join("", version=version)
    if isinstance(first, JoinAnswer) and first.error == E.MEMBER_ID_REQUIRED:
        first = ctx.join(first.member_id, version=version)
    assert isinstance(first, JoinAnswer) and first.error == E.NONE
    answer = ctx.sync(first.member_id, first.generation, assignments={first.member_id: b"a"})
    assert isinstance(answer, SyncAnswer) and answer.assignment == b"a"


def test_a_rolled_back_leave_leaves_a_member_that_still_times_out() -> None:
    """After a failed write the shell undoes the change and re-derives the touched groups'
    timers (`reschedule`): a classic group's come back with its state."""
    ctx = ClassicContext()
    leader, follower, generation = stable_pair(ctx)
    result = ctx.engine.leave(LeaveRequest("g", ((follower, None),)), ctx.now)
    assert follower not in ctx.group().members
    ctx.core.rollback(result)
    assert follower in ctx.group().members and ctx.group().generation == generation
    operations = ctx.core.reschedule(sorted(result.touched_groups()), ctx.now)
    assert operations[0] == TimerClearGroup("g")
    sessions = {op.key for op in operations
                if isinstance(op, TimerSet) and op.key[0] == CLASSIC_SESSION_TIMER}
    assert sessions == {(CLASSIC_SESSION_TIMER, "g", leader),
                        (CLASSIC_SESSION_TIMER, "g", follower)}
