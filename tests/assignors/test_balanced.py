"""`balanced`: stickiness, minimal movement and the delayed rebalance of departed workers."""

from __future__ import annotations

import math

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from coordinator.assignors.api import AssignmentResult, AssignmentSpec, MemberSpec
from coordinator.assignors.balanced import BalancedAssignor
from coordinator.units import Unit, units_of
from tests.assignors.helpers import (
    Target,
    as_coordinator_installs,
    assigned,
    check_complete_and_balanced,
    check_valid,
    connector_maps,
    kind_counts,
    make_spec,
    member,
    member_ids,
    moved_by_kind,
    previous_targets,
)

DELAY_MS = 10_000
T0 = 1_000_000

# The API says the previous target still shows members that left; the coordinator may also
# drop a leaving member's part at once. The assignor must hold back the units either way.
DEPARTED_PART_MODES = ["kept", "dropped"]


def run(spec: AssignmentSpec) -> AssignmentResult:
    result = BalancedAssignor().assign(spec)
    check_valid(spec, result)
    return result


def settled_group(
    members: list[str], connectors: dict[str, int], with_identity: bool = True
) -> tuple[list[MemberSpec], AssignmentSpec, AssignmentResult]:
    """A group that ran once from scratch: its member specs, the spec and the result."""
    specs = [
        member(m, instance_id=f"instance-{m}" if with_identity else None, url=f"http://{m}")
        for m in members
    ]
    spec = make_spec(specs, connectors, now_ms=T0 - 1, delay_ms=DELAY_MS)
    return specs, spec, run(spec)


def leave(result: AssignmentResult, departed_id: str, mode: str) -> dict[str, frozenset[Unit]]:
    """The previous target the next run sees after ``departed_id`` left."""
    target = dict(result.target)
    if mode == "dropped":
        del target[departed_id]
    return target


@st.composite
def group_with_leaver(draw: st.DrawFn) -> tuple[list[str], dict[str, int], str]:
    """At least two members and enough units that the leaving member holds some."""
    members = draw(member_ids.filter(lambda ms: len(ms) >= 2))
    connectors = draw(connector_maps.filter(lambda cs: len(cs) + sum(cs.values()) >= 1))
    return members, connectors, draw(st.sampled_from(members))


# --- stickiness -----------------------------------------------------------------------------


@pytest.mark.parametrize("carry_state", [True, False])
@given(data=st.data(), members=member_ids, connectors=connector_maps)
def test_rerun_on_its_own_output_moves_nothing(
    carry_state: bool, data: st.DataObject, members: list[str], connectors: dict[str, int]
) -> None:
    first_spec = make_spec(members, connectors, data.draw(previous_targets(members, connectors)))
    first = run(first_spec)
    again = run(make_spec(members, connectors, as_coordinator_installs(first_spec, first),
                          state=first.state if carry_state else b""))
    for member_id in members:
        assert again.target.get(member_id, frozenset()) == first.target.get(member_id, frozenset())


@given(data=st.data(), members=member_ids, connectors=connector_maps)
def test_a_joining_worker_takes_only_its_share(
    data: st.DataObject, members: list[str], connectors: dict[str, int]
) -> None:
    _, spec, before = settled_group(members, connectors)
    newcomer = data.draw(st.sampled_from([f"new-{i}" for i in range(3)]))
    joined = make_spec([*spec.members.values(), member(newcomer)], connectors, before,
                       now_ms=T0, delay_ms=DELAY_MS)
    after = run(joined)
    check_complete_and_balanced(joined, after)
    total_connectors, total_tasks = kind_counts(units_of(connectors))
    moved_connectors, moved_tasks = moved_by_kind(before.target, after.target)
    workers = len(members)
    assert moved_connectors <= math.ceil(total_connectors / workers)
    assert moved_tasks <= math.ceil(total_tasks / workers)
    # exactly what the newcomer needs to reach the floor: nobody else gains anything
    assert (moved_connectors, moved_tasks) == (
        total_connectors // (workers + 1), total_tasks // (workers + 1))
    for member_id in members:
        assert after.target[member_id] <= before.target[member_id]


@pytest.mark.parametrize("mode", DEPARTED_PART_MODES)
@given(group=group_with_leaver())
def test_with_no_delay_only_the_leaving_workers_units_move(
    mode: str, group: tuple[list[str], dict[str, int], str]
) -> None:
    members, connectors, leaver = group
    specs, _, before = settled_group(members, connectors)
    stayers = [s for s in specs if s.member_id != leaver]
    spec = make_spec(stayers, connectors, leave(before, leaver, mode), now_ms=T0, delay_ms=0,
                     state=before.state)
    after = run(spec)
    check_complete_and_balanced(spec, after)
    assert after.rerun_at_ms is None
    gained: set[Unit] = set()
    for stayer in stayers:
        kept = before.target[stayer.member_id]
        assert kept <= after.target[stayer.member_id], "a staying worker lost a unit"
        gained |= after.target[stayer.member_id] - kept
    assert gained == before.target[leaver]


# --- delayed rebalance ----------------------------------------------------------------------


Departure = tuple[
    list[MemberSpec], list[MemberSpec], AssignmentResult, AssignmentSpec, AssignmentResult
]


def _depart(
    mode: str, group: tuple[list[str], dict[str, int], str], with_identity: bool = True
) -> Departure:
    """Settle the group, then run without the leaver: (specs, stayers, before, spec, after)."""
    members, connectors, leaver = group
    specs, _, before = settled_group(members, connectors, with_identity)
    assume(before.target[leaver])  # the leaver must hold something to hold back
    stayers = [s for s in specs if s.member_id != leaver]
    spec = make_spec(stayers, connectors, leave(before, leaver, mode), now_ms=T0,
                     delay_ms=DELAY_MS, state=before.state)
    return specs, stayers, before, spec, run(spec)


def _assert_survivors_unchanged(
    before: Target, after: Target, stayers: list[MemberSpec]
) -> None:
    for stayer in stayers:
        assert after[stayer.member_id] == before[stayer.member_id]


@pytest.mark.parametrize("mode", DEPARTED_PART_MODES)
@given(group=group_with_leaver())
def test_a_departed_workers_units_wait_until_the_deadline(
    mode: str, group: tuple[list[str], dict[str, int], str]
) -> None:
    _, stayers, before, spec, during = _depart(mode, group)
    leaver = group[2]
    assert during.rerun_at_ms == T0 + DELAY_MS
    assert assigned(during.target) == set(units_of(spec.connectors)) - before.target[leaver]
    _assert_survivors_unchanged(before.target, during.target, stayers)

    # a later run before the deadline neither hands them out nor pushes the deadline back
    later = run(make_spec(stayers, spec.connectors, during, now_ms=T0 + DELAY_MS - 1,
                          delay_ms=DELAY_MS))
    assert later.rerun_at_ms == T0 + DELAY_MS
    assert later.target == during.target

    # at the deadline they go to the least loaded, nobody losing what it had
    expired_spec = make_spec(stayers, spec.connectors, later, now_ms=T0 + DELAY_MS,
                             delay_ms=DELAY_MS)
    expired = run(expired_spec)
    assert expired.rerun_at_ms is None
    check_complete_and_balanced(expired_spec, expired)
    for stayer in stayers:
        assert before.target[stayer.member_id] <= expired.target[stayer.member_id]


@pytest.mark.parametrize("mode", DEPARTED_PART_MODES)
@pytest.mark.parametrize("matched_by", ["instance_id", "worker_url", "member_id"])
@given(group=group_with_leaver())
def test_a_returning_worker_gets_its_units_back(
    mode: str, matched_by: str, group: tuple[list[str], dict[str, int], str]
) -> None:
    specs, stayers, before, spec, during = _depart(mode, group,
                                                   with_identity=matched_by == "instance_id")
    leaver = next(s for s in specs if s.member_id == group[2])
    if matched_by == "instance_id":  # a new member id, and a new URL too
        returning = member("returned", instance_id=leaver.instance_id, url="http://elsewhere")
    elif matched_by == "worker_url":
        returning = member("returned", url=leaver.worker_url)
    else:
        returning = member(leaver.member_id, url="http://elsewhere")
    back_spec = make_spec([*stayers, returning], spec.connectors, during,
                          now_ms=T0 + DELAY_MS // 2, delay_ms=DELAY_MS)
    back = run(back_spec)
    assert back.rerun_at_ms is None
    assert back.target[returning.member_id] == before.target[leaver.member_id]
    _assert_survivors_unchanged(before.target, back.target, stayers)
    check_complete_and_balanced(back_spec, back)


@given(group=group_with_leaver())
def test_another_instance_on_the_same_url_is_not_the_departed_worker(
    group: tuple[list[str], dict[str, int], str]
) -> None:
    specs, stayers, before, spec, during = _depart("kept", group)
    leaver = next(s for s in specs if s.member_id == group[2])
    stranger = member("stranger", instance_id="someone-else", url=leaver.worker_url)
    result = run(make_spec([*stayers, stranger], spec.connectors, during,
                           now_ms=T0 + 1, delay_ms=DELAY_MS))
    assert result.rerun_at_ms == T0 + DELAY_MS
    assert result.target[stranger.member_id].isdisjoint(before.target[leaver.member_id])


def test_when_every_worker_left_the_bookkeeping_is_kept() -> None:
    connectors = {"a": 3, "b": 2}
    specs, _, before = settled_group(["w1", "w2"], connectors)
    empty = run(make_spec([], connectors, before, now_ms=T0, delay_ms=DELAY_MS))
    assert not any(empty.target.values())
    assert empty.rerun_at_ms == T0 + DELAY_MS

    w1 = specs[0]
    again = member("w1-again", instance_id=w1.instance_id)
    back_spec = make_spec([again], connectors, empty, now_ms=T0 + 1, delay_ms=DELAY_MS)
    back = run(back_spec)
    assert back.target["w1-again"] == before.target["w1"]
    assert back.rerun_at_ms == T0 + DELAY_MS  # w2's units still wait for w2

    expired_spec = make_spec([again], connectors, back, now_ms=T0 + DELAY_MS,
                             delay_ms=DELAY_MS)
    expired = run(expired_spec)
    check_complete_and_balanced(expired_spec, expired)
    assert expired.rerun_at_ms is None


@pytest.mark.parametrize("mode", DEPARTED_PART_MODES)
def test_two_workers_leaving_at_once_are_held_back(mode: str) -> None:
    connectors = {"a": 4, "b": 4, "c": 1}
    specs, _, before = settled_group(["w1", "w2", "w3", "w4"], connectors)
    stayers = specs[2:]
    previous = dict(before.target)
    if mode == "dropped":
        del previous["w1"], previous["w2"]
    during = run(make_spec(stayers, connectors, previous, now_ms=T0, delay_ms=DELAY_MS,
                           state=before.state))
    assert assigned(during.target) == before.target["w3"] | before.target["w4"]
    assert during.rerun_at_ms == T0 + DELAY_MS

    returning = member("w2-new", instance_id=specs[1].instance_id)
    back = run(make_spec([*stayers, returning], connectors, during, now_ms=T0 + 5,
                         delay_ms=DELAY_MS))
    if mode == "kept":  # each departed part is known, so w2 gets exactly its own back
        assert back.target["w2-new"] == before.target["w2"]
        assert back.rerun_at_ms == T0 + DELAY_MS
    # (dropped: the two parts cannot be told apart; they wait together for the deadline)
    expired_spec = make_spec([*stayers, returning], connectors, back, now_ms=T0 + DELAY_MS,
                             delay_ms=DELAY_MS)
    expired = run(expired_spec)
    check_complete_and_balanced(expired_spec, expired)
    assert expired.rerun_at_ms is None


# --- robustness -----------------------------------------------------------------------------


@given(data=st.data(), members=member_ids, connectors=connector_maps, state=st.binary())
def test_an_unreadable_state_counts_as_none(
    data: st.DataObject, members: list[str], connectors: dict[str, int], state: bytes
) -> None:
    spec = make_spec(members, connectors, data.draw(previous_targets(members, connectors)),
                     state=state)
    result = run(spec)
    check_complete_and_balanced(spec, result)


def test_a_truncated_or_foreign_state_counts_as_none() -> None:
    _, spec, first = settled_group(["a", "b"], {"c": 5})
    for state in (first.state[:-3], b"\x93\x01\x02", b"\xc1", first.state + b"junk"):
        result = run(make_spec(spec.members.values(), {"c": 5}, first.target, state=state))
        assert result.target == first.target


@pytest.mark.parametrize("mode", DEPARTED_PART_MODES)
@given(data=st.data())
def test_a_long_run_of_changes_keeps_every_invariant(mode: str, data: st.DataObject) -> None:
    """Joins, leaves, returns, connector changes and time passing, checked after each run."""
    identities = [(f"instance-{i}", f"http://worker-{i}") for i in range(6)]
    present: dict[str, tuple[str, str]] = {}  # member id -> identity
    connectors = data.draw(connector_maps)
    previous: dict[str, frozenset[Unit]] = {}
    state = b""
    now_ms = T0
    ever_departed: set[Unit] = set()
    for step in range(data.draw(st.integers(1, 12))):
        action = data.draw(st.sampled_from(["join", "leave", "resize", "wait"]))
        if action == "join":
            identity = data.draw(st.sampled_from(identities))
            if identity not in present.values():
                present[f"m{step}"] = identity
        elif action == "leave" and present:
            gone = data.draw(st.sampled_from(sorted(present)))
            del present[gone]
            ever_departed |= previous.get(gone, frozenset())
            if mode == "dropped":
                previous.pop(gone, None)
        elif action == "resize":
            name = data.draw(st.sampled_from(["conn-a", "conn-b", "conn-x"]))
            count = data.draw(st.integers(-1, 6))
            if count < 0:
                connectors.pop(name, None)
            else:
                connectors[name] = count
        now_ms += data.draw(st.sampled_from([0, 1, DELAY_MS // 2, DELAY_MS]))
        by_instance = data.draw(st.booleans())
        specs = [member(m, instance_id=i if by_instance else None, url=u)
                 for m, (i, u) in present.items()]
        spec = make_spec(specs, connectors, previous, now_ms=now_ms, delay_ms=DELAY_MS,
                         state=state)
        result = run(spec)
        unassigned = set(units_of(connectors)) - assigned(result.target)
        if not present:
            assert not assigned(result.target)
        elif result.rerun_at_ms is None:
            check_complete_and_balanced(spec, result)
        else:  # only units of departed workers may wait, and only until a later run
            assert result.rerun_at_ms > now_ms
            assert unassigned <= ever_departed
        assert result.rerun_at_ms is None or result.rerun_at_ms <= now_ms + DELAY_MS
        previous = as_coordinator_installs(spec, result)
        state = result.state


def test_an_instance_id_match_beats_a_url_match() -> None:
    connectors = {"a": 6}
    specs, _, before = settled_group(["w1", "w2", "w3"], connectors)
    leaver = specs[0]
    during = run(make_spec(specs[1:], connectors, before, now_ms=T0, delay_ms=DELAY_MS))
    # "a-newcomer" sorts first and shares the URL, but only "z-returning" has the instance id
    returning = member("z-returning", instance_id=leaver.instance_id, url="http://moved")

    def rejoin(newcomer_url: str) -> Target:
        newcomer = member("a-newcomer", url=newcomer_url)
        return run(make_spec([*specs[1:], newcomer, returning], connectors, during,
                             now_ms=T0 + 1, delay_ms=DELAY_MS)).target

    # the shared URL changes nothing: the units went back by instance id
    assert rejoin(leaver.worker_url) == rejoin("http://unrelated")
    assert rejoin(leaver.worker_url)["z-returning"] <= before.target["w1"]
