"""An empty group takes the type of its next joiner: a connect group whose new-protocol
members all left becomes a classic group for a classic joiner (the server's
`group.connect.classic.group.type` being `classic`), with the classic join barrier, unless
the group was set to `connect` or given connectors through the admin API (its other
settings do not decide: tests/core/test_group_type_rule.py); an empty classic group becomes a
connect group for a new-protocol joiner. The change is records like any other: a restart
right after it comes back with the new type, a rolled-back write with the old one."""

from __future__ import annotations

import pytest

from coordinator.connect_protocol import WorkerMetadata, encode_worker_metadata
from coordinator.core.classic.engine import JOIN, JoinAnswer, JoinRequest, Parked
from coordinator.core.result import TimerSet
from protocol.errors import ErrorCode as E
from tests.core.classic_context import ClassicContext
from tests.core.test_classic_bridge import UNITS
from tests.core.test_classic_conversion import ClassicWorker, NewWorker, run

METADATA = encode_worker_metadata(WorkerMetadata(2, "http://w", 0))
KEY = "connect.classic.group.type"


def emptied_connect_group(ctx: ClassicContext) -> int:
    """A connect group that one new-protocol worker ran and left: its epoch."""
    worker = NewWorker(ctx, "n1")
    run(ctx, [worker], rounds=3)
    assert worker.held == UNITS
    worker.leave()
    group = ctx.core.store.groups["g"]
    assert not group.members and group.units_source == "installs"
    return group.epoch


def classic_joiner_asks(ctx: ClassicContext) -> JoinAnswer:
    first = ctx.join("", protocols=(("sessioned", METADATA),), client_id="c")
    assert isinstance(first, JoinAnswer) and first.error == E.MEMBER_ID_REQUIRED, first
    return first


@pytest.mark.parametrize("restart", [False, True])
def test_an_empty_connect_group_becomes_classic_for_a_classic_joiner(restart: bool) -> None:
    # The server's default type is classic, and a broker's delay before the first rebalance.
    ctx = ClassicContext(assignment_interval_ms=0, initial_rebalance_delay_ms=3_000)
    emptied_connect_group(ctx)
    first = classic_joiner_asks(ctx)
    assert "g" not in ctx.core.store.groups
    assert "g" in ctx.engine.store.groups
    assert not any(key[1] == "g" and key[0] not in ("classic_session", "classic_phase")
                   for key in ctx.timers)  # the connect group's timers went with it
    if restart:  # right after the change: the log holds the classic group
        ctx.restart()
        assert "g" not in ctx.core.store.groups and "g" in ctx.engine.store.groups
    # The classic join barrier: the JoinGroup waits for the join phase to end.
    answer = ctx.join(first.member_id, protocols=(("sessioned", METADATA),), client_id="c")
    assert isinstance(answer, Parked)
    assert ("g", first.member_id) not in ctx.engine.store.bridged
    ctx.advance(3_000)
    joined = ctx.take(JOIN, first.member_id)
    assert isinstance(joined, JoinAnswer) and joined.error == E.NONE, joined
    assert joined.leader == first.member_id and joined.generation == 1
    assert [m.member_id for m in joined.members] == [first.member_id]


def test_classic_workers_run_the_group_that_new_protocol_workers_left() -> None:
    ctx = ClassicContext(assignment_interval_ms=0)
    emptied_connect_group(ctx)
    workers = [ClassicWorker(ctx, f"w{i}") for i in (1, 2)]
    run(ctx, workers)
    assert "g" not in ctx.core.store.groups and not ctx.engine.store.bridged
    assert ctx.group().state.label == "Stable"
    assert set(ctx.group().members) == {w.member_id for w in workers}


@pytest.mark.parametrize("how", ["override", "connectors", "server_default"])
def test_an_empty_connect_group_keeps_its_type_when_the_setting_says_so(how: str) -> None:
    ctx = ClassicContext(assignment_interval_ms=0,
                         classic_group_type="connect" if how == "server_default" else "classic")
    epoch = emptied_connect_group(ctx)
    if how == "override":
        ctx.apply(ctx.core.set_group_config("g", {KEY: "connect"}, ctx.now))
    elif how == "connectors":
        ctx.apply(ctx.core.put_connector("g", "A", 1, ctx.now))
    first = classic_joiner_asks(ctx)
    answer = ctx.join(first.member_id, protocols=(("sessioned", METADATA),), client_id="c")
    assert isinstance(answer, JoinAnswer) and answer.error == E.NONE, answer  # bridged
    assert ("g", first.member_id) in ctx.engine.store.bridged
    assert "g" not in ctx.engine.store.groups
    assert ctx.core.store.groups["g"].epoch > epoch


@pytest.mark.parametrize("restart", [False, True])
def test_the_override_set_before_any_member_keeps_the_group_connect_once_empty(
        restart: bool) -> None:
    ctx = ClassicContext(assignment_interval_ms=0)
    ctx.apply(ctx.core.set_group_config("g", {KEY: "connect"}, ctx.now))
    assert ctx.core.group_config("g")[KEY] == "connect"
    if restart:
        ctx.restart()
    emptied_connect_group(ctx)
    first = classic_joiner_asks(ctx)
    assert "g" in ctx.core.store.groups and "g" not in ctx.engine.store.groups
    assert first.member_id


def test_a_conversion_that_cannot_be_written_is_rolled_back() -> None:
    ctx = ClassicContext(assignment_interval_ms=0)
    emptied_connect_group(ctx)
    durable = ClassicContext(assignment_interval_ms=0)
    durable.log, durable.now = list(ctx.log), ctx.now
    durable.restart()  # a coordinator that loaded only what is durable
    result = ctx.engine.join(ctx_request(ctx), ctx.now)
    assert "g" in ctx.engine.store.groups and "g" not in ctx.core.store.groups
    ctx.core.rollback(result)  # the write failed: undo, then the one scheduling rule
    timers = ctx.core.reschedule(sorted(result.touched_groups()), ctx.now)
    assert "g" not in ctx.engine.store.groups
    group, expected = ctx.core.store.groups["g"], durable.core.store.groups["g"]
    assert (group.epoch, group.assignment_epoch, group.expire_at_ms, group.config,
            group.units_source) == (expected.epoch, expected.assignment_epoch,
                                    expected.expire_at_ms, expected.config,
                                    expected.units_source)
    assert group.expire_at_ms is not None
    assert sorted(map(repr, timers)) == sorted(
        map(repr, durable.core.reschedule(["g"], ctx.now)))
    assert any(isinstance(op, TimerSet) and op.key[0] == "expiry" for op in timers)


def test_a_bad_classic_join_to_an_empty_connect_group_changes_nothing() -> None:
    ctx = ClassicContext(assignment_interval_ms=0)
    emptied_connect_group(ctx)
    before = len(ctx.log)
    answer = ctx.join("", protocols=(("sessioned", METADATA),), session_ms=10)
    assert isinstance(answer, JoinAnswer) and answer.error == E.INVALID_SESSION_TIMEOUT
    assert len(ctx.log) == before
    assert "g" in ctx.core.store.groups and "g" not in ctx.engine.store.groups


def test_an_empty_classic_group_becomes_connect_for_a_new_protocol_joiner() -> None:
    ctx = ClassicContext(assignment_interval_ms=0)
    workers = [ClassicWorker(ctx, f"w{i}") for i in (1, 2)]
    run(ctx, workers)
    ctx.leave(*((w.member_id, None) for w in workers))
    assert not ctx.group().active()
    newcomer = NewWorker(ctx, "n1")
    run(ctx, [newcomer], rounds=3)
    assert "g" not in ctx.engine.store.groups
    assert list(ctx.core.store.groups["g"].members) == ["n1"]
    ctx.restart()
    assert "g" not in ctx.engine.store.groups and "g" in ctx.core.store.groups


def ctx_request(ctx: ClassicContext) -> JoinRequest:
    return JoinRequest("g", "", "connect", (("sessioned", METADATA),), 10_000, 30_000,
                       None, "c", "127.0.0.1")


def test_a_group_set_to_connect_is_not_downgraded_when_classic_members_remain() -> None:
    ctx = ClassicContext(assignment_interval_ms=0)
    ctx.apply(ctx.core.set_group_config("g", {KEY: "connect"}, ctx.now))
    workers: list[ClassicWorker | NewWorker] = [ClassicWorker(ctx, f"w{i}") for i in (1, 2)]
    newcomer = NewWorker(ctx, "n1")
    workers.append(newcomer)
    run(ctx, workers)
    newcomer.leave()
    workers.remove(newcomer)
    assert "g" in ctx.core.store.groups and "g" not in ctx.engine.store.groups
    run(ctx, workers)  # the classic workers stay bridged and take the units back
    assert frozenset().union(*(w.held for w in workers)) == UNITS
