"""Connect's client-side assignors: balance, stickiness and the delayed rebalance."""

from __future__ import annotations

from collections.abc import Mapping

from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.connect_protocol import decode_assignment, decode_worker_metadata
from coordinator.units import Unit, units_of
from coordinator.workers.assignors import (
    DelayMemory,
    EagerAssignor,
    GroupView,
    IncrementalCooperativeAssignor,
    Leader,
    eager_assign,
    incremental_cooperative_assign,
)

from .helpers import kinds, units, view

LEADER = Leader("W1", "http://W1:8083")
ALL = units("A", "A-0", "A-1", "B", "B-0")
DELAY = 300_000


def assert_at_most_once(target: Mapping[str, frozenset[Unit]]) -> None:
    seen: set[Unit] = set()
    for part in target.values():
        assert seen.isdisjoint(part)
        seen |= part


def assert_balanced(target: Mapping[str, frozenset[Unit]]) -> None:
    for index in (0, 1):
        counts = [kinds(part)[index] for part in target.values()]
        assert max(counts) - min(counts) <= 1, target


# --------------------------------------------------------------------------- generated groups


@st.composite
def groups(draw: st.DrawFn) -> GroupView:
    connectors = draw(st.dictionaries(st.sampled_from("ABCDEFGH"), st.integers(0, 6),
                                      max_size=6))
    all_units = sorted(units_of(connectors))
    member_ids = draw(st.lists(st.sampled_from([f"W{i}" for i in range(1, 8)]),
                               min_size=1, max_size=6, unique=True))
    # A current target: some units spread over the members, plus some the group deleted.
    stale = [("Z", task) for task in range(-1, 3)]
    owners = draw(st.lists(st.none() | st.sampled_from(member_ids),
                           min_size=len(all_units) + len(stale),
                           max_size=len(all_units) + len(stale)))
    targets: dict[str, set[Unit]] = {mid: set() for mid in member_ids}
    for unit, owner in zip(all_units + stale, owners, strict=True):
        if owner is not None:
            targets[owner].add(unit)
    return view(all_units, targets)


@settings(max_examples=200, deadline=None)
@given(groups())
def test_incremental_assigns_everything_once_and_balanced(group: GroupView) -> None:
    result = incremental_cooperative_assign(group, 0, DELAY, DelayMemory())
    assert set(result.target) == {m.member_id for m in group.members}
    assert_at_most_once(result.target)
    assert frozenset().union(*result.target.values()) == group.units
    assert_balanced(result.target)
    assert result.delay_ms == 0 and not result.memory.departed


@settings(max_examples=200, deadline=None)
@given(groups())
def test_incremental_is_sticky(group: GroupView) -> None:
    result = incremental_cooperative_assign(group, 0, DELAY, DelayMemory())
    members = len(group.members)
    for index, is_connector in ((0, True), (1, False)):
        total = kinds(group.units)[index]
        floor = total // members
        for member in group.members:
            mine = {u for u in member.target & group.units if (u[1] == -1) == is_connector}
            kept = mine & result.target[member.member_id]
            # Nobody loses units while at or below its fair share.
            assert len(kept) >= min(len(mine), floor)


@settings(max_examples=100, deadline=None)
@given(groups())
def test_incremental_is_stable_once_balanced(group: GroupView) -> None:
    first = incremental_cooperative_assign(group, 0, DELAY, DelayMemory())
    again = incremental_cooperative_assign(view(group.units, first.target), 0, DELAY,
                                           first.memory)
    assert again.target == first.target


@settings(max_examples=100, deadline=None)
@given(groups())
def test_eager_deals_round_robin(group: GroupView) -> None:
    target = eager_assign(group)
    assert_at_most_once(target)
    assert frozenset().union(*target.values()) == group.units
    sizes = [len(part) for part in target.values()]
    assert max(sizes) - min(sizes) <= 1


def test_eager_order_is_connectors_then_tasks_over_sorted_members() -> None:
    group = view(ALL, {"W2": units("A"), "W1": frozenset(), "W3": units("B-0")})
    # Sorted: A, B, then, B-0; dealt W1, W2, W3, W1, W2.
    assert eager_assign(group) == {"W1": units("A", "A-1"), "W2": units("B", "B-0"),
                                   "W3": units("A-0")}


def test_eager_assignor_metadata_is_version_0() -> None:
    assignor = EagerAssignor(config_offset=4)
    advertised = assignor.advertised("http://w:1", 0)
    assert (advertised.minimum_version, advertised.maximum_version, advertised.version) == (0, 0, 0)
    assert decode_worker_metadata(advertised.metadata).url == "http://w:1"
    plan = assignor.assign(view(ALL, {"W1": ALL, "W2": ()}, version=0), 0, LEADER)
    decoded = decode_assignment(plan.members["W2"].metadata)
    assert decoded.version == 0 and decoded.leader == "W1" and decoded.config_offset == 4
    assert decoded.assigned == plan.members["W2"].units


# --------------------------------------------------------------------------- the delay


def three_workers(assignor: IncrementalCooperativeAssignor) -> None:
    """The design's epoch-35 set-up, installed by `assignor`: W1 [A, A-0], W2 [B, B-0], W3 [A-1]."""
    start = {"W1": units("A", "A-0"), "W2": units("B", "B-0"), "W3": units("A-1")}
    plan = assignor.assign(view(ALL, start), 0, LEADER)
    assert {mid: part.units for mid, part in plan.members.items()} == start
    assignor.installed(plan)


def test_departed_units_are_held_back_until_the_deadline() -> None:
    assignor = IncrementalCooperativeAssignor(DELAY)
    three_workers(assignor)
    reason = assignor.advertised("http://W1:8083", 0).reason

    # W2 is gone: its units stay unassigned, the others keep theirs.
    survivors = {"W1": units("A", "A-0"), "W3": units("A-1")}
    plan = assignor.assign(view(ALL, survivors), 1_000, LEADER)
    assert {mid: part.units for mid, part in plan.members.items()} == survivors
    assignor.installed(plan)
    assert decode_assignment(plan.members["W1"].metadata).delay_ms == DELAY
    assert assignor.wake_at_ms() == 1_000 + DELAY

    # A rebalance for another reason during the delay still holds them back.
    plan = assignor.assign(view(ALL, survivors), 2_000, LEADER)
    assert {mid: part.units for mid, part in plan.members.items()} == survivors
    assert decode_assignment(plan.members["W3"].metadata).delay_ms == DELAY - 1_000
    assignor.installed(plan)

    # Before the deadline nothing is asked; at it, the Reason changes once.
    assert assignor.advertised("http://W1:8083", DELAY).reason == reason
    asked = assignor.advertised("http://W1:8083", 1_000 + DELAY).reason
    assert asked != reason
    assert assignor.wake_at_ms() is None
    assert assignor.advertised("http://W1:8083", 2_000 + DELAY).reason == asked

    # The coordinator runs the assignor again: the held-back units are handed out, balanced.
    plan = assignor.assign(view(ALL, survivors), 1_000 + DELAY, LEADER)
    target = {mid: part.units for mid, part in plan.members.items()}
    assert frozenset().union(*target.values()) == ALL
    assert_balanced(target)
    assert target["W1"] >= units("A", "A-0") and target["W3"] >= units("A-1")
    assignor.installed(plan)
    assert assignor.memory.deadline_ms is None and assignor.wake_at_ms() is None


def test_a_returning_worker_gets_its_units_back() -> None:
    assignor = IncrementalCooperativeAssignor(DELAY)
    three_workers(assignor)
    survivors = {"W1": units("A", "A-0"), "W3": units("A-1")}
    plan = assignor.assign(view(ALL, survivors), 1_000, LEADER)
    assignor.installed(plan)

    # W2 restarts under a new member id but the same url, within the delay.
    back = {**survivors, "W2-new": frozenset()}
    plan = assignor.assign(view(ALL, back, urls={"W2-new": "http://W2:8083"}), 5_000, LEADER)
    target = {mid: part.units for mid, part in plan.members.items()}
    assert target == {**survivors, "W2-new": units("B", "B-0")}
    assert decode_assignment(plan.members["W2-new"].metadata).delay_ms == 0
    assignor.installed(plan)
    assert assignor.memory.deadline_ms is None and not assignor.memory.departed


def test_a_member_that_rejoined_under_its_id_gets_its_units_back() -> None:
    assignor = IncrementalCooperativeAssignor(DELAY)
    three_workers(assignor)
    # W2 was fenced and rejoined: it is there, but its target is empty now.
    rejoined = {"W1": units("A", "A-0"), "W2": frozenset(), "W3": units("A-1")}
    plan = assignor.assign(view(ALL, rejoined), 1_000, LEADER)
    assert plan.members["W2"].units == units("B", "B-0")


def test_no_delay_hands_departed_units_out_at_once() -> None:
    assignor = IncrementalCooperativeAssignor(0)
    three_workers(assignor)
    plan = assignor.assign(view(ALL, {"W1": units("A", "A-0"), "W3": units("A-1")}), 1, LEADER)
    assert frozenset().union(*(p.units for p in plan.members.values())) == ALL
    assert assignor.wake_at_ms() is None


def test_a_failed_install_keeps_the_old_memory() -> None:
    assignor = IncrementalCooperativeAssignor(DELAY)
    three_workers(assignor)
    before = assignor.memory
    assignor.assign(view(ALL, {"W1": units("A", "A-0"), "W3": units("A-1")}), 1_000, LEADER)
    assert assignor.memory is before  # only `installed` commits


def test_assignment_metadata_names_leader_revocations_and_version() -> None:
    assignor = IncrementalCooperativeAssignor(DELAY)
    group = view(ALL, {"W1": ALL, "W2": frozenset()}, version=1)
    plan = assignor.assign(group, 0, LEADER)
    w1 = decode_assignment(plan.members["W1"].metadata)
    assert w1.version == 1 and plan.members["W1"].version == 1  # the lowest members speak
    assert w1.leader == "W1" and w1.leader_url == "http://W1:8083"
    assert w1.revoked == ALL - plan.members["W1"].units
    assert w1.assigned == plan.members["W1"].units


def test_advertised_metadata_is_the_worker_url_without_allocation() -> None:
    advertised = IncrementalCooperativeAssignor().advertised("http://w:8083", 0)
    assert (advertised.minimum_version, advertised.maximum_version) == (1, 2)
    metadata = decode_worker_metadata(advertised.metadata)
    assert metadata.version == 2 and metadata.url == "http://w:8083"
    assert metadata.allocation is None
