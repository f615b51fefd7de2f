"""Properties every built-in assignor must have, whatever the previous target looked like."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coordinator.assignors import builtin_assignors
from coordinator.assignors.api import ServerAssignor
from tests.assignors.helpers import (
    check_complete_and_balanced,
    check_valid,
    connector_maps,
    make_spec,
    member_ids,
    previous_targets,
)

ASSIGNORS = sorted(builtin_assignors())


def _assignor(name: str) -> ServerAssignor:
    return builtin_assignors()[name]


@pytest.mark.parametrize("name", ASSIGNORS)
@given(data=st.data(), members=member_ids, connectors=connector_maps)
def test_valid_complete_and_balanced(
    name: str, data: st.DataObject, members: list[str], connectors: dict[str, int]
) -> None:
    # the previous target names only current members, so no delay can be pending
    previous = data.draw(previous_targets(members, connectors))
    spec = make_spec(members, connectors, previous)
    result = _assignor(name).assign(spec)
    check_valid(spec, result)
    check_complete_and_balanced(spec, result)
    assert result.rerun_at_ms is None


@pytest.mark.parametrize("name", ASSIGNORS)
@given(data=st.data(), members=member_ids, connectors=connector_maps)
def test_deterministic(
    name: str, data: st.DataObject, members: list[str], connectors: dict[str, int]
) -> None:
    previous = data.draw(previous_targets(members, connectors))
    spec = make_spec(members, connectors, previous)
    # the same group with its members and connectors listed in another order
    shuffled = make_spec(
        data.draw(st.permutations(members)),
        dict(data.draw(st.permutations(sorted(connectors.items())))),
        previous,
    )
    first, again, reordered = (_assignor(name).assign(s) for s in (spec, spec, shuffled))
    assert first.target == again.target == reordered.target
    assert first.state == again.state
    assert first.rerun_at_ms == again.rerun_at_ms


@pytest.mark.parametrize("name", ASSIGNORS)
@given(connectors=connector_maps)
def test_no_members_get_nothing(name: str, connectors: dict[str, int]) -> None:
    spec = make_spec([], connectors, {})
    result = _assignor(name).assign(spec)
    assert not any(result.target.values())


@pytest.mark.parametrize("name", ASSIGNORS)
def test_units_that_no_longer_exist_are_dropped(name: str) -> None:
    previous = {"a": frozenset({("old", -1), ("old", 0), ("c", 5)}), "b": frozenset({("c", -1)})}
    spec = make_spec(["a", "b"], {"c": 2}, previous)
    result = _assignor(name).assign(spec)
    check_valid(spec, result)
    check_complete_and_balanced(spec, result)


@pytest.mark.parametrize("name", ASSIGNORS)
def test_assignor_spec_and_result_cross_a_process_boundary(name: str) -> None:
    # offloaded runs (trio-parallel) pickle the assignor, the spec and the result
    spec = make_spec(["a", "b"], {"c": 3}, {"gone": frozenset({("c", 0)})})
    assignor = pickle.loads(pickle.dumps(_assignor(name)))
    result = assignor.assign(pickle.loads(pickle.dumps(spec)))
    copy = pickle.loads(pickle.dumps(result))
    assert (copy.target, copy.state, copy.rerun_at_ms) == (
        result.target, result.state, result.rerun_at_ms)
