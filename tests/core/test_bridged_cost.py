"""What a bridged request costs does not grow with its group where nothing changed: the
group's assignment mode and assignor, and whether a worker's client assignor range covers
everyone's, are worked out over the members once per change of their assignor choices,
not at every classic rejoin (a rejoin with a new allocation changes metadata bytes only);
a SyncGroup's answer names the group's Connect leader and highest config offset without
decoding every member's metadata. What the caches give is always what a fresh look at
every member gives."""

from __future__ import annotations

from typing import Any

import pytest

from coordinator.connect_protocol import ConnectAssignment, WorkerMetadata, encode_worker_metadata
from coordinator.core import coordinator as core_module
from coordinator.core.classic.engine import JoinAnswer
from coordinator.core.coordinator import CLIENT_MODE, _covering_members
from coordinator.units import Unit
from protocol.errors import ErrorCode as E
from tests.core.classic_context import ClassicContext

MEMBERS = 20


def metadata(index: int, held: frozenset[Unit] = frozenset()) -> bytes:
    return encode_worker_metadata(WorkerMetadata(
        2, f"http://w{index}", 0, ConnectAssignment(2, assigned=held)))


def fresh_choice(ctx: ClassicContext) -> tuple[str, str, bool]:
    group = ctx.core.store.groups["g"]
    everyone = {m.member_id: m.metadata for m in group.members.values()
                if m.metadata is not None}
    mode, name = ctx.core._select_mode(everyone)
    return mode, name, mode != CLIENT_MODE or _covering_members(everyone, name) != []


def bridged_group(ctx: ClassicContext) -> list[str]:
    ctx.apply(ctx.core.put_connector("g", "A", MEMBERS, ctx.now))
    members = []
    for index in range(MEMBERS):
        protocols = (("sessioned", metadata(index)), ("compatible", metadata(index)))
        first = ctx.join("", protocols=protocols, client_id=f"w{index}")
        assert isinstance(first, JoinAnswer) and first.error == E.MEMBER_ID_REQUIRED
        answer = ctx.join(first.member_id, protocols=protocols, client_id=f"w{index}")
        assert isinstance(answer, JoinAnswer) and answer.error == E.NONE, answer
        members.append(first.member_id)
    return members


def rejoin(ctx: ClassicContext, member_id: str, index: int, *protocol_names: str,
           held: frozenset[Unit] = frozenset()) -> None:
    protocols = tuple((name, metadata(index, held)) for name in protocol_names)
    answer = ctx.join(member_id, protocols=protocols, client_id=f"w{index}")
    assert isinstance(answer, JoinAnswer) and answer.error == E.NONE, answer


def test_rejoins_with_new_allocations_do_not_go_over_every_member(
        monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = ClassicContext(assignment_interval_ms=0)
    members = bridged_group(ctx)
    ctx.core._group_choice(ctx.core.store.groups["g"])  # (worked out once)
    looks: list[Any] = []
    select = ctx.core._select_mode
    monkeypatch.setattr(ctx.core, "_select_mode", lambda md: looks.append(md) or select(md))
    monkeypatch.setattr(core_module, "_covering_members",
                        lambda md, name: looks.append(md) or _covering_members(md, name))
    for index, member_id in enumerate(members):
        # A new allocation is new metadata (the epoch rises), not a new choice.
        rejoin(ctx, member_id, index, "sessioned", "compatible",
               held=frozenset({("A", index)}))
    assert ctx.core.store.groups["g"].epoch > MEMBERS  # every rejoin moved the epoch
    assert looks == []  # neither to choose the assignor nor the worker that runs it
    assert ctx.core._group_choice(ctx.core.store.groups["g"]) == fresh_choice(ctx)


def test_a_changed_range_or_a_departure_is_looked_at_again() -> None:
    ctx = ClassicContext(assignment_interval_ms=0)
    members = bridged_group(ctx)
    group = ctx.core.store.groups["g"]
    assert ctx.core._group_choice(group) == fresh_choice(ctx) == (
        CLIENT_MODE, "incremental-cooperative", True)
    before = group.assignor_changes
    rejoin(ctx, members[0], 0, "compatible")  # incremental-cooperative 1-1 now
    assert group.assignor_changes == before + 1
    assert ctx.core._group_choice(group) == fresh_choice(ctx)
    ctx.leave((members[1], None))
    assert group.assignor_changes == before + 2
    assert ctx.core._group_choice(group) == fresh_choice(ctx)
    ctx.restart()  # derived again from the replayed records
    group = ctx.core.store.groups["g"]
    assert ctx.core._group_choice(group) == fresh_choice(ctx)


def test_sync_group_answers_do_not_decode_every_members_metadata(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from coordinator.core.classic import bridge as bridge_module
    from coordinator.core.classic.engine import SyncAnswer, SyncRequest

    # (answered at once, not waiting for an assignment: what is counted is an answer's cost)
    ctx = ClassicContext(assignment_interval_ms=0, classic_sync_wait_ms=0)
    members = bridged_group(ctx)
    group = ctx.core.store.groups["g"]
    expected = ctx.engine.bridge._connect_leader("g")
    decoded: list[bytes] = []
    decode = bridge_module.decode_worker_metadata
    monkeypatch.setattr(bridge_module, "decode_worker_metadata",
                        lambda data: decoded.append(data) or decode(data))
    for member_id in members:
        answer = ctx.apply(ctx.engine.sync(SyncRequest(
            "g", member_id, group.members[member_id].current.epoch), ctx.now))
        assert isinstance(answer, SyncAnswer) and answer.error == E.NONE, answer
    assert decoded == []
    assert ctx.engine.bridge._connect_leader("g") == expected
    # A member's new config offset is seen at once.
    rejoin_with_offset = encode_worker_metadata(WorkerMetadata(2, "http://w3", 7))
    answer = ctx.join(members[3], protocols=(("sessioned", rejoin_with_offset),),
                      client_id="w3")
    assert isinstance(answer, JoinAnswer) and answer.error == E.NONE, answer
    assert ctx.engine.bridge._connect_leader("g")[2] == 7
