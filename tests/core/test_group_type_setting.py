"""A group's type chosen through the admin config API before any member joins
(`connect.classic.group.type`): it decides where the first classic worker lands, whatever
the server's default, survives a restart, and refuses what would lose state."""

from __future__ import annotations

import pytest

from coordinator.connect_protocol import WorkerMetadata, encode_worker_metadata
from coordinator.core.classic.engine import JoinAnswer
from protocol.errors import ApiError
from protocol.errors import ErrorCode as E
from tests.core.classic_context import ClassicContext

METADATA = encode_worker_metadata(WorkerMetadata(2, "http://w", 0))
KEY = "connect.classic.group.type"


def _first_classic_member(ctx: ClassicContext) -> str:
    first = ctx.join("", protocols=(("sessioned", METADATA),))
    assert isinstance(first, JoinAnswer) and first.error == E.MEMBER_ID_REQUIRED
    answer = ctx.join(first.member_id, protocols=(("sessioned", METADATA),))
    assert not isinstance(answer, JoinAnswer) or answer.error == E.NONE, answer
    return first.member_id


@pytest.mark.parametrize("restart", [False, True])
def test_connect_set_before_any_member_puts_classic_workers_on_the_connect_engine(
        restart: bool) -> None:
    ctx = ClassicContext()  # the server's default: classic
    ctx.apply(ctx.core.set_group_config("g", {KEY: "connect"}, ctx.now))
    assert ctx.core.effective_group_config("g")[KEY] == "connect"
    if restart:
        ctx.restart()
    member = _first_classic_member(ctx)
    assert ("g", member) in ctx.engine.store.bridged
    assert "g" not in ctx.engine.store.groups


@pytest.mark.parametrize("restart", [False, True])
def test_classic_set_before_any_member_gives_a_classic_group_on_a_connect_server(
        restart: bool) -> None:
    ctx = ClassicContext(classic_group_type="connect")
    ctx.apply(ctx.core.set_group_config("g", {KEY: "classic"}, ctx.now))
    if restart:
        ctx.restart()
    member = _first_classic_member(ctx)
    assert member in ctx.group("g").members
    assert "g" not in ctx.core.store.groups and ("g", member) not in ctx.engine.store.bridged


def test_an_empty_connect_group_gives_way_to_classic_and_back() -> None:
    ctx = ClassicContext()
    ctx.apply(ctx.core.set_group_config("g", {"connect.session.timeout.ms": 20_000}, ctx.now))
    assert "g" in ctx.core.store.groups
    ctx.apply(ctx.core.set_group_config("g", {KEY: "classic"}, ctx.now))
    assert "g" not in ctx.core.store.groups and "g" in ctx.engine.store.groups
    ctx.apply(ctx.core.set_group_config("g", {KEY: "connect"}, ctx.now))
    assert "g" in ctx.core.store.groups and "g" not in ctx.engine.store.groups
    ctx.restart()
    assert "g" in ctx.core.store.groups and "g" not in ctx.engine.store.groups


def test_a_group_with_connectors_is_not_set_to_classic_and_one_with_members_keeps_its_type(
        ) -> None:
    ctx = ClassicContext(assignment_interval_ms=0)
    ctx.apply(ctx.core.put_connector("g", "A", 1, ctx.now))
    before = list(ctx.log)
    with pytest.raises(ApiError, match="1 connector"):
        ctx.core.set_group_config("g", {KEY: "classic"}, ctx.now)
    assert "g" in ctx.core.store.groups and ctx.log == before  # nothing changed
    classic = ClassicContext()
    member = _first_classic_member(classic)
    # The type is recorded for when the group is empty: its members are not disturbed.
    classic.apply(classic.core.set_group_config("g", {KEY: "connect"}, classic.now))
    assert "g" not in classic.core.store.groups and member in classic.group().members
    assert classic.core.group_config("g")[KEY] == "connect"


@pytest.mark.parametrize(("body", "message"), [
    ({KEY: "eager"}, "must be 'classic', 'connect' or null"),
    ({KEY: "classic", "connect.session.timeout.ms": 10}, "between 1000"),
])
def test_a_bad_group_type_setting_is_refused_and_changes_nothing(
        body: dict[str, object], message: str) -> None:
    ctx = ClassicContext()
    with pytest.raises(ApiError, match=message):
        ctx.core.set_group_config("g", body, ctx.now)
    assert "g" not in ctx.core.store.groups and "g" not in ctx.engine.store.groups
