"""What describe, DescribeGroups and the admin view say of classic groups and of classic
members in a connect group: the group's type and each member's protocol."""

from __future__ import annotations

from types import SimpleNamespace

from coordinator.cli import _group_json, render_table
from coordinator.server import classic as classic_server
from coordinator.server.admin import view_of
from protocol.messages import (
    ConnectGroupDescribeRequest,
    ConnectGroupDescribeResponse,
    ConnectGroupDescribeResponseV0,
)
from tests.core.classic_context import ClassicContext
from tests.core.test_classic_conversion import (
    UNITS,
    ClassicWorker,
    NewWorker,
    classic_group,
    run,
)


def describe(ctx: ClassicContext, version: int, *group_ids: str) -> object:
    return ctx.core.describe(ConnectGroupDescribeRequest(group_ids=group_ids), ctx.now,
                             version)


def test_a_mixed_group_shows_its_type_and_each_members_protocol() -> None:
    ctx = ClassicContext(assignment_interval_ms=0)
    workers = classic_group(ctx)
    newcomer = NewWorker(ctx, "n1")
    workers.append(newcomer)
    run(ctx, workers)  # upgraded: a connect group with three bridged members
    assert "g" in ctx.core.store.groups
    classic_ids = {w.member_id for w in workers if w is not newcomer}
    answer = describe(ctx, 1, "g")
    assert isinstance(answer, ConnectGroupDescribeResponse)
    (group,) = answer.groups
    assert (group.error_code, group.group_type, group.units_source) == (0, "connect",
                                                                        "installs")
    protocols = {m.member_id: (m.protocol, m.classic_protocol) for m in group.members}
    assert protocols == {"n1": ("connect", None),
                         **{member_id: ("classic", "sessioned") for member_id in classic_ids}}
    # Version 0 answers the same group without the new fields.
    old = describe(ctx, 0, "g")
    assert isinstance(old, ConnectGroupDescribeResponseV0)
    assert [m.member_id for m in old.groups[0].members] == [m.member_id for m in group.members]
    assert not hasattr(old.groups[0], "group_type")
    # The admin view and the describe CLI say the same.
    taken = ctx.core.describe_snapshot("g")
    view = view_of(taken, {}, frozenset())  # type: ignore[arg-type]
    assert {m["member_id"]: (m["protocol"], m["classic_protocol"])
            for m in view["members"]} == protocols
    shown = _group_json(group)
    assert shown["type"] == "connect"
    table = render_table([shown])
    assert "type=connect" in table and "classic/sessioned" in table
    assert table.count("classic/sessioned") == 3 and "  connect  " in table
    # DescribeGroups names the protocol the classic workers were told, and each member's
    # Connect metadata.
    body = SimpleNamespace(groups=("g",))
    described = classic_server.describe_groups_response(5, body, ctx.core)
    (wire_group,) = described.groups
    assert (wire_group.protocol_type, wire_group.protocol_data) == ("connect", "sessioned")
    assert all(m.member_metadata for m in wire_group.members)


def test_a_classic_group_is_described_by_version_1_only() -> None:
    ctx = ClassicContext(assignment_interval_ms=0)
    workers = classic_group(ctx)
    answer = describe(ctx, 1, "g", "nope")
    assert isinstance(answer, ConnectGroupDescribeResponse)
    group, missing = answer.groups
    assert (group.error_code, group.group_type, group.group_state) == (0, "classic", "STABLE")
    assert group.group_epoch == ctx.group().meta.generation
    assert {m.member_id: (m.protocol, m.classic_protocol) for m in group.members} == {
        w.member_id: ("classic", "sessioned") for w in workers}
    held = {m.member_id: len(m.assigned.connectors) + len(m.assigned.tasks)
            for m in group.members}
    assert held == {w.member_id: len(w.held) for w in workers}
    assert sum(held.values()) == len(UNITS)
    assert missing.error_code != 0 and missing.group_type == ""
    # Version 0 does not know group types: it does not find the classic group.
    old = describe(ctx, 0, "g")
    assert isinstance(old, ConnectGroupDescribeResponseV0)
    assert old.groups[0].error_code != 0


def _fields(ctx: ClassicContext, name: str, member_id: str) -> dict[str, object]:
    found = [e.fields for e in ctx.events if e.name == name and e.member_id == member_id]
    assert found, f"no {name} event for {member_id}"
    return dict(found[-1])


def test_join_and_leave_log_lines_say_the_group_type_and_the_members_protocol() -> None:
    ctx = ClassicContext(assignment_interval_ms=0)
    workers = classic_group(ctx)
    first = workers[0].member_id
    joined = _fields(ctx, "classic_member_joined", first)
    assert (joined["group_type"], joined["protocol"]) == ("classic", "classic")
    newcomer = NewWorker(ctx, "n1")
    workers.append(newcomer)
    run(ctx, workers)  # upgraded by n1's join
    new_joined = _fields(ctx, "member_joined", "n1")
    assert (new_joined["group_type"], new_joined["protocol"]) == ("connect", "connect")
    assert "classic_protocol" not in new_joined
    # A classic worker that joins the connect group now is bridged from its first join.
    late = ClassicWorker(ctx, "w9")
    workers.append(late)
    run(ctx, workers)
    bridged_join = _fields(ctx, "member_joined", late.member_id)
    assert (bridged_join["group_type"], bridged_join["protocol"],
            bridged_join["classic_protocol"]) == ("connect", "classic", "sessioned")
    # Its leave says so too.
    workers.remove(late)
    ctx.leave((late.member_id, None))
    left = [e.fields for e in ctx.events
            if e.name.startswith("member_removed") and e.member_id == late.member_id]
    assert left and (left[-1]["protocol"], left[-1]["classic_protocol"]) == (
        "classic", "sessioned")
