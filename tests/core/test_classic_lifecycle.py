"""The life of classic groups and of the members only told MEMBER_ID_REQUIRED: pending
members are small, bounded and short-lived; classic groups count against the group limit,
expire when empty and can be deleted -- all by records, so a restart changes nothing."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import pytest

from coordinator.connect_protocol import WorkerMetadata, encode_worker_metadata
from coordinator.core.classic.engine import (
    CLASSIC_PHASE_TIMER,
    CLASSIC_SESSION_TIMER,
    JoinAnswer,
    JoinRequest,
)
from coordinator.core.classic.state import NO_DEADLINE, ClassicState, metadata_record
from coordinator.core.describe import ClassicSnapshot, build
from protocol.errors import ApiError, ErrorCode
from protocol.messages import ClassicGroupMemberValue, ClassicGroupMetadataValue
from tests.core.classic_context import ClassicContext
from tests.core.test_classic_conversion import NewWorker, classic_group

E = ErrorCode
RETENTION = 60_000
BIG = (("sessioned", b"x" * 250_000), ("compatible", b"y" * 250_000))


def _state(ctx: ClassicContext) -> dict[str, object]:
    return {group_id: (asdict(group.meta), {m: asdict(v) for m, v in group.members.items()})
            for group_id, group in ctx.engine.store.groups.items()}


def _pending(ctx: ClassicContext, group_id: str = "g") -> dict[str, ClassicGroupMemberValue]:
    return {member_id: member for member_id, member in ctx.group(group_id).members.items()
            if member.pending}


# ---------------------------------------------------------------------- pending members


def test_a_pending_member_is_written_without_its_protocols() -> None:
    ctx = ClassicContext()
    answer = ctx.join("", protocols=BIG)
    assert isinstance(answer, JoinAnswer) and answer.error == E.MEMBER_ID_REQUIRED
    written = [record.value for record in ctx.log
               if isinstance(record.value, ClassicGroupMemberValue)]
    assert len(written) == 1 and written[0].pending
    assert written[0].protocols == ()  # the 500 KB are not kept
    # It joins for real with its protocols, which are kept then.
    ctx.join(answer.member_id, protocols=BIG)
    member = ctx.group().members[answer.member_id]
    assert not member.pending and [p.name for p in member.protocols] == ["sessioned",
                                                                           "compatible"]


def test_pending_members_count_against_the_group_size() -> None:
    ctx = ClassicContext(max_size=3)
    ctx.new_member()
    told = [ctx.join("") for _ in range(2)]
    assert [answer.error for answer in told] == [E.MEMBER_ID_REQUIRED] * 2  # type: ignore
    logged = len(ctx.log)
    refused = ctx.join("")
    assert isinstance(refused, JoinAnswer) and refused.error == E.GROUP_MAX_SIZE_REACHED
    assert len(ctx.log) == logged  # refused: nothing written
    assert len(ctx.group().members) == 3
    # The pending ones may still join for real: they hold their place.
    second = ctx.join(told[0].member_id)  # type: ignore[union-attr]
    assert not isinstance(second, JoinAnswer) or second.error == E.NONE
    assert not ctx.group().members[told[0].member_id].pending  # type: ignore[union-attr]


def test_pending_members_are_bounded_in_total() -> None:
    ctx = ClassicContext(classic_max_pending_members=3)
    for group_id in ("a", "b", "c"):
        answer = ctx.join("", group_id)
        assert isinstance(answer, JoinAnswer) and answer.error == E.MEMBER_ID_REQUIRED
    logged = len(ctx.log)
    refused = ctx.join("", "a")
    assert isinstance(refused, JoinAnswer) and refused.error == E.COORDINATOR_NOT_AVAILABLE
    assert len(ctx.log) == logged
    assert any(event.name == "classic_join_refused"
               and "group.connect.classic.max.pending.members" in event.fields["reason"]
               for event in ctx.events)
    # One joins for real: its place is free again.
    ctx.join(next(iter(_pending(ctx, "a"))), "a")
    again = ctx.join("", "b")
    assert isinstance(again, JoinAnswer) and again.error == E.MEMBER_ID_REQUIRED


def test_a_pending_member_expires_after_its_rebalance_timeout_not_its_session() -> None:
    ctx = ClassicContext()
    ctx.new_member("g", session_ms=1_800_000)  # (keeps the group)
    answer = ctx.join("", session_ms=1_800_000, rebalance_ms=5_000)
    assert isinstance(answer, JoinAnswer) and answer.error == E.MEMBER_ID_REQUIRED
    assert answer.member_id in _pending(ctx)
    ctx.advance(4_999)
    assert answer.member_id in _pending(ctx)
    ctx.advance(2)
    assert answer.member_id not in ctx.group().members
    ctx.restart()  # by records: a replay does not bring it back
    assert answer.member_id not in ctx.group().members
    late = ctx.join(answer.member_id, session_ms=1_800_000, rebalance_ms=5_000)
    assert isinstance(late, JoinAnswer) and late.error == E.UNKNOWN_MEMBER_ID


def test_a_pending_member_lives_no_longer_than_the_longest_session() -> None:
    ctx = ClassicContext(classic_max_session_timeout_ms=20_000)
    ctx.new_member("g", session_ms=20_000, rebalance_ms=60_000)  # (keeps the group)
    answer = ctx.join("", session_ms=10_000, rebalance_ms=2**31 - 1)
    assert isinstance(answer, JoinAnswer) and answer.error == E.MEMBER_ID_REQUIRED
    ctx.advance(20_001)
    assert answer.member_id not in ctx.group().members


def test_a_restart_keeps_pending_members_and_derives_their_expiry() -> None:
    ctx = ClassicContext()
    first = ctx.join("", rebalance_ms=5_000)
    ctx.advance(1_000)
    before = _state(ctx)
    ctx.restart()
    assert _state(ctx) == before
    key = (CLASSIC_SESSION_TIMER, "g", first.member_id)  # type: ignore[union-attr]
    assert ctx.timers[key] == ctx.now + 5_000  # afresh, as sessions are after a load
    # It joins after the restart with the id it was given.
    ctx.join(first.member_id)  # type: ignore[union-attr]
    assert not ctx.group().members[first.member_id].pending  # type: ignore[union-attr]


def test_a_rolled_back_pending_join_leaves_nothing() -> None:
    ctx = ClassicContext()
    ctx.new_member()
    before = _state(ctx)
    result = ctx.engine.join(JoinRequest("g", "", "connect", BIG, 10_000, 30_000), ctx.now)
    assert result.records
    ctx.core.rollback(result)
    assert _state(ctx) == before


def test_pending_members_are_described() -> None:
    ctx = ClassicContext()
    member = ctx.new_member()
    told = ctx.join("", client_id="late")
    assert isinstance(told, JoinAnswer)
    taken = ctx.core.describe_snapshot("g")
    assert isinstance(taken, ClassicSnapshot)
    described = build(taken)
    states = {m.member_id: m.member_state for m in described.members}
    assert states[member] != "PENDING" and states[told.member_id] == "PENDING"


# ---------------------------------------------------------------------- the group limit


def test_classic_groups_count_against_the_group_limit() -> None:
    ctx = ClassicContext(max_groups=2)
    assert ctx.join("", "a").error == E.MEMBER_ID_REQUIRED  # type: ignore[union-attr]
    ctx.apply(ctx.core.put_connector("connect-one", "c", 1, ctx.now))
    logged = len(ctx.log)
    refused = ctx.join("", "b")
    assert isinstance(refused, JoinAnswer) and refused.error == E.INVALID_REQUEST
    assert len(ctx.log) == logged and "b" not in ctx.engine.store.groups
    assert any(event.name == "classic_join_refused"
               and "group.coordinator.max.groups" in event.fields["reason"]
               for event in ctx.events)
    # The same refusal for a connect group, and for a group set classic through the API.
    with pytest.raises(ApiError) as raised:
        ctx.core.put_connector("connect-two", "c", 1, ctx.now)
    assert raised.value.code == E.INVALID_REQUEST
    with pytest.raises(ApiError) as raised:
        ctx.core.set_group_config("c", {"connect.classic.group.type": "classic"}, ctx.now)
    assert raised.value.code == E.INVALID_REQUEST
    # A group already held takes no new place.
    assert ctx.join("", "a").error == E.MEMBER_ID_REQUIRED  # type: ignore[union-attr]


def test_an_upgrade_at_the_group_limit_is_not_refused() -> None:
    ctx = ClassicContext(max_groups=1, assignment_interval_ms=0)
    classic_group(ctx)
    newcomer = NewWorker(ctx, "n1")
    answer = ctx.apply(ctx.core.heartbeat(newcomer._request(0), ctx.now))
    assert answer.error_code in (E.NONE, E.COMPUTE_ASSIGNMENT), answer.error_message
    assert "g" in ctx.core.store.groups and "g" not in ctx.engine.store.groups


# ---------------------------------------------------------------------- expiry


def retention_context(**config: Any) -> ClassicContext:
    return ClassicContext(empty_group_retention_ms=RETENTION, **config)


def test_an_emptied_classic_group_expires_after_the_retention() -> None:
    ctx = retention_context()
    member = ctx.new_member()
    ctx.apply(ctx.core.set_group_config("g", {"connect.session.timeout.ms": 20_000},
                                        ctx.now))
    ctx.leave((member, None))
    assert ctx.group().state is ClassicState.EMPTY
    ctx.advance(RETENTION - 1)
    assert "g" in ctx.engine.store.groups
    ctx.advance(2)
    assert "g" not in ctx.engine.store.groups
    assert "g" not in ctx.core.store.settings  # its settings go with it, as a connect one's
    ctx.restart()
    assert "g" not in ctx.engine.store.groups  # by records
    assert any(event.name == "group_expired" for event in ctx.events)


def test_a_classic_group_made_by_a_pending_join_expires() -> None:
    ctx = retention_context()
    ctx.join("", rebalance_ms=5_000)
    ctx.advance(RETENTION + 1)
    assert "g" not in ctx.engine.store.groups
    ctx.restart()
    assert "g" not in ctx.engine.store.groups


def test_a_group_set_classic_through_the_api_expires_empty() -> None:
    ctx = retention_context()
    ctx.apply(ctx.core.set_group_config("g", {"connect.classic.group.type": "classic"},
                                        ctx.now))
    assert "g" in ctx.engine.store.groups
    ctx.advance(RETENTION + 1)
    assert "g" not in ctx.engine.store.groups
    assert "g" not in ctx.core.store.types


def test_a_member_keeps_it_and_the_clock_starts_again_when_it_empties() -> None:
    ctx = retention_context()

    def stay(member: str, ms: int) -> None:  # a member that heartbeats keeps the group
        ctx.sync(member, ctx.group().generation, assignments={member: b"a"})
        for _ in range(ms // 5_000):
            ctx.advance(5_000)
            assert ctx.heartbeat(member, ctx.group().generation) == E.NONE

    member = ctx.new_member(session_ms=10_000)
    stay(member, RETENTION * 2)
    ctx.leave((member, None))
    ctx.advance(RETENTION - 10_000)
    assert "g" in ctx.engine.store.groups
    again = ctx.new_member(session_ms=10_000)  # back in use before it expires
    stay(again, 20_000)  # past the first expiry
    ctx.leave((again, None))  # empty again: the clock starts again
    ctx.advance(RETENTION - 1)
    assert "g" in ctx.engine.store.groups
    ctx.advance(2)
    assert "g" not in ctx.engine.store.groups


def test_a_restart_keeps_the_original_expiry() -> None:
    ctx = retention_context()
    member = ctx.new_member()
    ctx.leave((member, None))
    left_at = ctx.now
    ctx.advance(5_000)
    ctx.restart()
    assert ctx.timers[(CLASSIC_PHASE_TIMER, "g", "")] == left_at + RETENTION
    ctx.advance(RETENTION - 5_000 + 1)
    assert "g" not in ctx.engine.store.groups


def test_an_empty_group_of_an_older_log_gets_its_expiry_at_start_up() -> None:
    """An empty classic group written before empty ones expired has no deadline: the first
    timer after the load writes one, so it goes one retention later."""
    ctx = retention_context()
    old = ClassicGroupMetadataValue(protocol_type="connect", protocol_name=None, generation=3,
                                    state=ClassicState.EMPTY, leader=None,
                                    phase_started_ms=NO_DEADLINE,
                                    phase_deadline_ms=NO_DEADLINE, initial_delay=False)
    ctx.log.append(metadata_record("old", old))
    ctx.now = 1_000
    ctx.restart()
    ctx.advance(0)
    assert ctx.engine.store.groups["old"].meta.phase_deadline_ms == 1_000 + RETENTION
    ctx.restart()  # the deadline is a record now
    ctx.advance(RETENTION + 1)
    assert "old" not in ctx.engine.store.groups


# ---------------------------------------------------------------------- delete


def test_an_empty_classic_group_can_be_deleted() -> None:
    ctx = ClassicContext()
    member = ctx.new_member()
    with pytest.raises(ApiError) as raised:
        ctx.core.delete_group("g", ctx.now)
    assert raised.value.code == E.NON_EMPTY_GROUP  # the connect rule: not with members
    ctx.leave((member, None))
    ctx.join("")  # a pending member does not keep it
    ctx.apply(ctx.core.set_group_config("g", {"connect.session.timeout.ms": 20_000},
                                        ctx.now))
    answer = ctx.apply(ctx.core.delete_group("g", ctx.now))
    assert answer == {"group": "g", "deleted": True}
    assert "g" not in ctx.engine.store.groups and "g" not in ctx.core.store.settings
    assert not [key for key in ctx.timers if key[1] == "g"]
    ctx.restart()
    assert "g" not in ctx.engine.store.groups
    with pytest.raises(ApiError) as raised:
        ctx.core.delete_group("g", ctx.now)
    assert raised.value.code == E.GROUP_ID_NOT_FOUND


def test_a_bridged_group_is_deleted_by_the_connect_rule() -> None:
    ctx = ClassicContext(classic_group_type="connect")
    worker = (("sessioned", encode_worker_metadata(WorkerMetadata(2, "http://w1", 0))),)
    first = ctx.join("", protocols=worker)
    joined = ctx.join(first.member_id, protocols=worker)  # type: ignore[union-attr]
    assert "g" in ctx.core.store.groups, joined
    with pytest.raises(ApiError) as raised:
        ctx.core.delete_group("g", ctx.now)
    assert raised.value.code == E.NON_EMPTY_GROUP
    ctx.leave((first.member_id, None))  # type: ignore[union-attr]
    ctx.apply(ctx.core.delete_group("g", ctx.now))
    assert "g" not in ctx.core.store.groups
    assert not [key for key in ctx.engine.store.bridged if key[0] == "g"]


@pytest.mark.parametrize("group_type", ["classic", "connect"])
def test_a_member_id_fits_the_id_limit_whatever_the_client_id(group_type: str) -> None:
    """A member id is the client id and a suffix: cut to `group.connect.max.id.bytes`, or
    a worker with a long client id could never come back with it (and its pending
    record would be as large as its client id, twice)."""
    ctx = ClassicContext(classic_group_type=group_type)
    worker = (("sessioned", encode_worker_metadata(WorkerMetadata(2, "http://w1", 0))),)
    answer = ctx.join("", protocols=worker, client_id="é" * 1_000)
    assert isinstance(answer, JoinAnswer) and answer.error == E.MEMBER_ID_REQUIRED
    assert len(answer.member_id.encode()) <= ctx.config.max_id_bytes
    assert answer.member_id.startswith("éé")
    joined = ctx.join(answer.member_id, protocols=worker, client_id="é" * 1_000)
    assert not isinstance(joined, JoinAnswer) or joined.error == E.NONE, joined


def test_a_group_only_pending_members_ever_joined_goes_with_the_last_of_them() -> None:
    """Joins answered MEMBER_ID_REQUIRED alone do not hold a place in the group limit for
    the whole retention: a group no member ever joined goes when its last pending member
    does (one the admin API set up stays, as does one that had members)."""
    ctx = retention_context(max_groups=2)
    ctx.join("", "p", rebalance_ms=5_000)
    ctx.advance(2_000)
    ctx.join("", "p", rebalance_ms=5_000)
    ctx.apply(ctx.core.set_group_config("set", {"connect.classic.group.type": "classic"},
                                        ctx.now))
    ctx.join("", "set", rebalance_ms=5_000)
    ctx.advance(3_001)
    assert "p" in ctx.engine.store.groups  # its second pending member is still there
    ctx.advance(2_000)
    assert "p" not in ctx.engine.store.groups and "set" in ctx.engine.store.groups
    ctx.restart()
    assert "p" not in ctx.engine.store.groups
    assert ctx.join("", "q").error == E.MEMBER_ID_REQUIRED  # type: ignore[union-attr]


def test_a_refused_join_leaves_an_empty_connect_group_it_would_have_taken() -> None:
    ctx = ClassicContext(classic_max_pending_members=1)
    # An empty connect group, which a classic joiner takes (it becomes classic).
    ctx.apply(ctx.core.set_group_config("g", {"connect.session.timeout.ms": 20_000},
                                        ctx.now))
    assert ctx.core.gives_way("g")
    assert ctx.join("", "other").error == E.MEMBER_ID_REQUIRED  # type: ignore[union-attr]
    logged = len(ctx.log)
    refused = ctx.join("", "g")
    assert isinstance(refused, JoinAnswer) and refused.error == E.COORDINATOR_NOT_AVAILABLE
    assert len(ctx.log) == logged and "g" in ctx.core.store.groups
