"""The type an empty group takes for a classic joiner: `connect.classic.group.type` as set
for the group through the admin API, else the server's `group.connect.classic.group.type`.
Nothing else decides: a group's other settings do not pin it to `connect`, and they are
kept while the group runs classic. An empty classic group follows the same rule as a new
one. Every step is records: after each, a fresh core that replays the log is in the same
state, and a restart there carries on the same way."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
import pytest

from coordinator.config import GroupConfig
from coordinator.connect_protocol import WorkerMetadata, encode_worker_metadata
from coordinator.core.classic.engine import JoinAnswer, Parked
from coordinator.core.group import configuration_record, group_metadata_record
from protocol.errors import ApiError
from protocol.errors import ErrorCode as E
from tests.core.classic_context import ClassicContext
from tests.core.test_classic_conversion import ClassicWorker, NewWorker, run

KEY = "connect.classic.group.type"
SESSION = "connect.session.timeout.ms"
METADATA = encode_worker_metadata(WorkerMetadata(2, "http://w", 0))
PROTOCOLS = (("sessioned", METADATA),)


def state(core: Any) -> dict[str, Any]:
    """What a coordinator holds of its groups, as its records say."""
    configs: dict[str, Any] = {}
    for group_id in sorted({*core.store.groups, *core.classic.store.groups}):
        try:
            configs[group_id] = core.group_config(group_id)
        except ApiError as error:
            configs[group_id] = error.code
    return {
        "connect": {group_id: (group.epoch, group.assignment_epoch, group.config,
                               sorted(group.members), dict(group.connectors),
                               group.expire_at_ms)
                    for group_id, group in core.store.groups.items()},
        "classic": {group_id: (group.meta, dict(group.members))
                    for group_id, group in core.classic.store.groups.items()},
        "bridged": dict(core.classic.store.bridged),
        "configs": configs,
    }


def replays_the_same(ctx: ClassicContext) -> None:
    """A fresh core that replays the log holds what the live one does."""
    fresh = ctx._new_core()
    for record in ctx.log:
        fresh.replay(record)
    assert state(fresh) == state(ctx.core)


def group_type(ctx: ClassicContext, group_id: str = "g") -> str | None:
    in_connect = group_id in ctx.core.store.groups
    in_classic = group_id in ctx.engine.store.groups
    assert not (in_connect and in_classic), "a group has one type"
    return "connect" if in_connect else "classic" if in_classic else None


def classic_joins(ctx: ClassicContext) -> str:
    """A classic worker's first two JoinGroups: its member id."""
    first = ctx.join("", protocols=PROTOCOLS, client_id="c")
    assert isinstance(first, JoinAnswer) and first.error == E.MEMBER_ID_REQUIRED, first
    answer = ctx.join(first.member_id, protocols=PROTOCOLS, client_id="c")
    assert isinstance(answer, Parked) or answer.error == E.NONE, answer
    return first.member_id


def steps_with_restart(ctx: ClassicContext, steps: list[Callable[[], None]],
                       restart_after: int | None) -> None:
    for index, step in enumerate(steps):
        step()
        replays_the_same(ctx)
        if index == restart_after:
            ctx.restart()
            replays_the_same(ctx)


def set_config(ctx: ClassicContext, body: dict[str, Any]) -> dict[str, Any]:
    answer: dict[str, Any] = ctx.apply(ctx.core.set_group_config("g", body, ctx.now))
    return answer


def emptied_connect_group(ctx: ClassicContext) -> None:
    worker = NewWorker(ctx, "n1")
    run(ctx, [worker], rounds=3)
    worker.leave()
    assert group_type(ctx) == "connect" and not ctx.core.store.groups["g"].members


def emptied_classic_group(ctx: ClassicContext) -> None:
    workers = [ClassicWorker(ctx, f"w{i}") for i in (1, 2)]
    run(ctx, workers)
    assert group_type(ctx) == "classic" and ctx.group().state.label == "Stable"
    ctx.leave(*((w.member_id, None) for w in workers))
    assert group_type(ctx) == "classic" and not ctx.group().active()


# ---------------------------------------------------------------- settings do not pin

@pytest.mark.parametrize("restart_after", [None, 0, 1, 2, 3])
def test_a_setting_other_than_the_type_does_not_keep_an_emptied_group_connect(
        restart_after: int | None) -> None:
    ctx = ClassicContext(assignment_interval_ms=0)  # the server's type: classic
    member: list[str] = []

    def set_session() -> None:
        set_config(ctx, {SESSION: 20_000})
        assert group_type(ctx) == "connect"
        assert ctx.core.group_config("g")[KEY] is None  # no type was set

    def classic_worker_joins() -> None:
        member.append(classic_joins(ctx))
        assert group_type(ctx) == "classic"  # the server's type decides
        assert ("g", member[0]) not in ctx.engine.store.bridged

    def settings_are_kept() -> None:
        config = ctx.core.group_config("g")
        assert (config[SESSION], config[KEY]) == (20_000, None)

    def new_protocol_worker_joins() -> None:
        ctx.leave((member[0], None))
        run(ctx, [NewWorker(ctx, "n2")], rounds=3)
        assert group_type(ctx) == "connect"
        assert ctx.core.effective_group_config("g")[SESSION] == 20_000  # back in force

    steps_with_restart(ctx, [set_session, lambda: emptied_connect_group(ctx),
                             classic_worker_joins, settings_are_kept,
                             new_protocol_worker_joins], restart_after)


def test_a_classic_group_with_settings_is_not_kept_from_downgrading() -> None:
    ctx = ClassicContext(assignment_interval_ms=0)
    set_config(ctx, {SESSION: 20_000})
    workers: list[Any] = [ClassicWorker(ctx, f"w{i}") for i in (1, 2)]
    newcomer = NewWorker(ctx, "n1")
    run(ctx, [newcomer], rounds=3)
    run(ctx, [*workers, newcomer])
    assert group_type(ctx) == "connect"
    newcomer.leave()
    assert group_type(ctx) == "classic"  # downgraded: its settings wait for its return
    replays_the_same(ctx)
    assert ctx.core.group_config("g")[SESSION] == 20_000


def test_a_server_that_puts_classic_workers_on_the_engine_does_not_downgrade() -> None:
    # group.connect.classic.group.type=connect: classic workers belong on the connect
    # engine, whether the group is empty or its last new-protocol member just left.
    ctx = ClassicContext(classic_group_type="connect", assignment_interval_ms=0)
    workers: list[Any] = [ClassicWorker(ctx, f"w{i}") for i in (1, 2)]
    newcomer = NewWorker(ctx, "n1")
    run(ctx, [*workers, newcomer])
    assert group_type(ctx) == "connect"
    newcomer.leave()
    assert group_type(ctx) == "connect"
    run(ctx, workers)  # the bridged workers carry on, and take the newcomer's units
    assert group_type(ctx) == "connect"
    assert all(("g", w.member_id) in ctx.engine.store.bridged for w in workers)
    replays_the_same(ctx)


# ---------------------------------------------------------------- empty classic groups

def _restart_on_a_connect_server(ctx: ClassicContext) -> None:
    ctx.config = msgspec.structs.replace(ctx.config, classic_group_type="connect")
    ctx.restart()


@pytest.mark.parametrize("how", ["server_default_changed", "override_cleared"])
@pytest.mark.parametrize("restart_after_join", [False, True])
def test_an_emptied_classic_group_takes_the_connect_type_for_a_classic_joiner(
        how: str, restart_after_join: bool) -> None:
    ctx = ClassicContext(assignment_interval_ms=0)
    if how == "override_cleared":
        ctx = ClassicContext(assignment_interval_ms=0, classic_group_type="connect")
        set_config(ctx, {KEY: "classic"})
        replays_the_same(ctx)
    emptied_classic_group(ctx)
    replays_the_same(ctx)
    if how == "server_default_changed":
        _restart_on_a_connect_server(ctx)
    else:
        set_config(ctx, {KEY: None})
        assert ctx.core.group_config("g")[KEY] is None
        assert group_type(ctx) == "classic"  # a type change waits for the next joiner
    replays_the_same(ctx)
    first = ctx.join("", protocols=PROTOCOLS, client_id="c")
    assert isinstance(first, JoinAnswer) and first.error == E.MEMBER_ID_REQUIRED, first
    replays_the_same(ctx)
    if restart_after_join:
        ctx.restart()
    answer = ctx.join(first.member_id, protocols=PROTOCOLS, client_id="c")
    # Bridged from its first member: answered at once, as the connect engine does.
    assert isinstance(answer, JoinAnswer) and answer.error == E.NONE, answer
    assert group_type(ctx) == "connect"
    assert ("g", first.member_id) in ctx.engine.store.bridged
    replays_the_same(ctx)
    ctx.restart()
    assert group_type(ctx) == "connect"


@pytest.mark.parametrize("restart", [False, True])
def test_the_classic_override_keeps_an_emptied_classic_group_classic_on_a_connect_server(
        restart: bool) -> None:
    ctx = ClassicContext(assignment_interval_ms=0, classic_group_type="connect")
    set_config(ctx, {KEY: "classic", SESSION: 20_000})
    emptied_classic_group(ctx)
    if restart:
        ctx.restart()
    member = classic_joins(ctx)
    assert group_type(ctx) == "classic" and member in ctx.group().members
    replays_the_same(ctx)
    assert ctx.core.group_config("g")[KEY] == "classic"


def test_the_type_set_while_a_group_has_members_decides_once_it_is_empty() -> None:
    ctx = ClassicContext(assignment_interval_ms=0)  # the server's type: classic
    workers = [ClassicWorker(ctx, f"w{i}") for i in (1, 2)]
    run(ctx, workers)
    answer = set_config(ctx, {KEY: "connect"})
    assert answer["config"][KEY] == "connect"
    assert group_type(ctx) == "classic" and len(ctx.group().active()) == 2  # untouched
    replays_the_same(ctx)
    ctx.leave(*((w.member_id, None) for w in workers))
    ctx.restart()
    member = classic_joins(ctx)
    assert group_type(ctx) == "connect" and ("g", member) in ctx.engine.store.bridged
    replays_the_same(ctx)


# ---------------------------------------------------------------- what cannot be classic

def test_connectors_cannot_be_set_for_a_group_set_to_classic() -> None:
    ctx = ClassicContext(assignment_interval_ms=0)
    set_config(ctx, {KEY: "classic"})
    before = list(ctx.log)
    with pytest.raises(ApiError, match="classic"):
        ctx.core.put_connector("g", "A", 1, ctx.now)
    assert ctx.log == before and group_type(ctx) == "classic"


def test_a_group_with_connectors_stays_connect_for_a_classic_joiner() -> None:
    ctx = ClassicContext(assignment_interval_ms=0)
    ctx.apply(ctx.core.put_connector("g", "A", 1, ctx.now))
    emptied_connect_group(ctx)
    member = classic_joins(ctx)
    assert group_type(ctx) == "connect" and ("g", member) in ctx.engine.store.bridged
    assert ctx.core.group_config("g")[KEY] is None  # nothing set: the connectors decide
    assert ctx.core.effective_group_config("g")[KEY] == "connect"


# ---------------------------------------------------------------- logs of before

def test_settings_recorded_before_the_type_had_a_record_still_mean_connect() -> None:
    ctx = ClassicContext(assignment_interval_ms=0)
    # A log as the coordinator wrote it when any setting kept a group connect.
    ctx.log = [group_metadata_record("g", 1),
               configuration_record("g", GroupConfig(session_timeout_ms=20_000))]
    ctx.restart()
    assert ctx.core.group_config("g")[KEY] == "connect"
    emptied_connect_group(ctx)
    member = classic_joins(ctx)
    assert group_type(ctx) == "connect" and ("g", member) in ctx.engine.store.bridged
    # A later setting keeps that meaning; clearing the type ends it.
    set_config(ctx, {"connect.heartbeat.interval.ms": 2_000})
    ctx.restart()
    assert ctx.core.group_config("g")[KEY] == "connect"
    set_config(ctx, {KEY: None})
    ctx.restart()
    assert ctx.core.group_config("g")[KEY] is None
    assert ctx.core.group_config("g")[SESSION] == 20_000


# ---------------------------------------------------------------- deleting a group

def test_an_expired_group_takes_its_settings_and_type_with_it() -> None:
    ctx = ClassicContext(assignment_interval_ms=0, empty_group_retention_ms=60_000)
    set_config(ctx, {KEY: "connect", SESSION: 20_000})
    ctx.advance(61_000)
    assert group_type(ctx) is None
    replays_the_same(ctx)
    with pytest.raises(ApiError):
        ctx.core.group_config("g")
    member = classic_joins(ctx)  # a new group: the server's type again
    assert group_type(ctx) == "classic" and member in ctx.group().members


def test_a_deleted_group_takes_its_settings_and_type_with_it() -> None:
    ctx = ClassicContext(assignment_interval_ms=0)
    set_config(ctx, {KEY: "connect", SESSION: 20_000})
    ctx.apply(ctx.core.delete_group("g", ctx.now))
    assert group_type(ctx) is None
    assert "g" not in ctx.core.store.settings and "g" not in ctx.core.store.types
    replays_the_same(ctx)
    set_config(ctx, {})  # the group again, with nothing set
    assert ctx.core.group_config("g")[KEY] is None
    assert ctx.core.group_config("g")[SESSION] == -1


# ---------------------------------------------------------------- settings on classic groups

def test_settings_set_for_a_classic_group_with_members_change_nothing_else() -> None:
    ctx = ClassicContext(assignment_interval_ms=0)
    workers = [ClassicWorker(ctx, f"w{i}") for i in (1, 2)]
    run(ctx, workers)
    meta, members = ctx.group().meta, dict(ctx.group().members)
    set_config(ctx, {SESSION: 20_000})
    assert group_type(ctx) == "classic"
    assert (ctx.group().meta, ctx.group().members) == (meta, members)
    replays_the_same(ctx)
    assert ctx.core.effective_group_config("g")[SESSION] == 20_000


# ---------------------------------------------------------------- a write that fails

@pytest.mark.parametrize("body", [{KEY: "classic", SESSION: 20_000}, {KEY: None},
                                  {SESSION: 30_000}])
def test_a_config_change_that_cannot_be_written_is_rolled_back(body: dict[str, Any]) -> None:
    ctx = ClassicContext(assignment_interval_ms=0)
    set_config(ctx, {KEY: "connect", SESSION: 20_000})
    before = state(ctx.core)
    result = ctx.core.set_group_config("g", body, ctx.now)
    assert result.records and state(ctx.core) != before
    ctx.core.rollback(result)
    assert state(ctx.core) == before
    assert ctx.core.store.types == {"g": "connect"}
    assert ctx.core.store.settings["g"] == GroupConfig(session_timeout_ms=20_000)
