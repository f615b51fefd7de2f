"""`round-robin`: Connect's eager dealing order, blind to the previous target."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from coordinator.assignors.round_robin import RoundRobinAssignor
from tests.assignors.helpers import connector_maps, make_spec, member_ids, previous_targets


def test_deals_connectors_then_tasks_over_members_sorted_by_id() -> None:
    spec = make_spec(["b", "a"], {"y": 2, "x": 3})
    target = RoundRobinAssignor().assign(spec).target
    # dealing order: x, y, x-0, x-1, x-2, y-0, y-1 over a, b, a, b, ...
    assert target == {
        "a": frozenset({("x", -1), ("x", 0), ("x", 2), ("y", 1)}),
        "b": frozenset({("y", -1), ("x", 1), ("y", 0)}),
    }


@given(data=st.data(), members=member_ids, connectors=connector_maps)
def test_ignores_the_previous_target(
    data: st.DataObject, members: list[str], connectors: dict[str, int]
) -> None:
    previous = data.draw(previous_targets(members, connectors))
    assignor = RoundRobinAssignor()
    fresh = assignor.assign(make_spec(members, connectors))
    assert assignor.assign(make_spec(members, connectors, previous)).target == fresh.target


@given(members=member_ids, connectors=connector_maps)
def test_every_member_is_in_the_target(members: list[str], connectors: dict[str, int]) -> None:
    target = RoundRobinAssignor().assign(make_spec(members, connectors)).target
    assert set(target) == set(members)
