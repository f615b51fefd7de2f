"""The per-group limits a connector put is checked against: at most
`group.connect.max.units` connectors and tasks, and a list of all of them that fits in one
frame. The check takes shortcuts (C-level sums, a bound from the longest name); these tests
hold it to the plain definition, at the boundaries and for names of many bytes."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.core.validation import check_group_units
from protocol.errors import ApiError, ErrorCode


def units_after(connectors: Mapping[str, int], connector: str, tasks: int) -> dict[str, int]:
    after = dict(connectors)
    after[connector] = tasks
    return after


def unit_count(after: Mapping[str, int]) -> int:
    return sum(1 + tasks for tasks in after.values())


def listed_bytes(after: Mapping[str, int]) -> int:
    # Each connector and each of its tasks is listed under the connector's name (its
    # UTF-8 bytes and their length), with an int32 and tagged fields: 6 bytes besides.
    return sum((len(name.encode("utf-8")) + 6) * (1 + tasks) for name, tasks in after.items())


def refusal(connectors: Mapping[str, int], connector: str, tasks: int, maximum: int,
            max_frame_bytes: int) -> str | None:
    try:
        check_group_units(connectors, connector, tasks, maximum, max_frame_bytes)
    except ApiError as error:
        assert error.code == ErrorCode.INVALID_REQUEST
        return str(error)
    return None


names = st.text(st.characters(codec="utf-8"), min_size=1, max_size=12)


@settings(max_examples=400, deadline=None)
@given(connectors=st.dictionaries(names, st.integers(0, 40), max_size=12), connector=names,
       tasks=st.integers(0, 40), slack_units=st.integers(-3, 3),
       slack_bytes=st.integers(-40, 40))
def test_a_put_is_refused_exactly_when_the_definition_says(
        connectors: dict[str, int], connector: str, tasks: int, slack_units: int,
        slack_bytes: int) -> None:
    after = units_after(connectors, connector, tasks)
    maximum = max(1, unit_count(after) + slack_units)
    max_frame_bytes = max(1, listed_bytes(after) + slack_bytes)
    message = refusal(connectors, connector, tasks, maximum, max_frame_bytes)
    if unit_count(after) > maximum:
        assert message is not None and "group.connect.max.units" in message
        assert str(unit_count(after)) in message
    elif listed_bytes(after) > max_frame_bytes:
        assert message is not None and "server.max.frame.bytes" in message
        assert str(listed_bytes(after)) in message
    else:
        assert message is None


@pytest.mark.parametrize("name", ["connector", "connécteur", "コネクタ", "\U0001f50c-plug"])
@pytest.mark.parametrize("resized", [True, False])
def test_the_frame_limit_holds_to_the_byte(name: str, resized: bool) -> None:
    # A group of 200 connectors under short ASCII names and one under `name`: the
    # limit at the list's exact size passes, one byte less refuses.
    connectors = {f"c-{index}": 9 for index in range(200)}
    if resized:
        connectors[name] = 3  # the put resizes a connector the group already runs
    after = units_after(connectors, name, 40)
    exact = listed_bytes(after)
    roomy = unit_count(after) * 100
    assert refusal(connectors, name, 40, roomy, exact) is None
    message = refusal(connectors, name, 40, roomy, exact - 1)
    assert message is not None and f"{exact} bytes" in message


@pytest.mark.parametrize("resized", [True, False])
def test_the_unit_limit_holds_to_the_unit(resized: bool) -> None:
    connectors = {f"c-{index}": 49 for index in range(1_000)}  # 50,000 units
    if resized:
        connectors["source"] = 10
    after = units_after(connectors, "source", 20)
    exact = unit_count(after)
    assert refusal(connectors, "source", 20, exact, 2**31 - 1) is None
    message = refusal(connectors, "source", 20, exact - 1, 2**31 - 1)
    assert message is not None and f"run {exact} connectors and tasks" in message
