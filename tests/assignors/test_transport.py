"""Assignor runs packed for a worker process and back: nothing lost, little repeated."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from coordinator.assignors import transport
from coordinator.assignors.api import AssignmentResult, AssignmentSpec, MemberSpec
from coordinator.assignors.balanced import BalancedAssignor
from coordinator.assignors.transport import (
    SHARED_SET_MIN,
    PackedRun,
    ResidentMiss,
    SpecPacker,
    TargetCheck,
    compact,
    expand,
    run_packed,
    unpack,
)
from coordinator.units import Unit, units_of

CONNECTORS = {"a": 30, "b": 20}


def spec_with(targets: dict[str, frozenset[Unit]]) -> AssignmentSpec:
    return AssignmentSpec(
        group_id="g",
        members={m: MemberSpec(m, None, f"http://{m}:8083", units) for m, units in targets.items()},
        connectors=CONNECTORS, previous_target=targets, previous_state=b"", now_ms=1_000)


def split(count: int) -> dict[str, frozenset[Unit]]:
    ordered = sorted(units_of(CONNECTORS))
    return {f"w{i}": frozenset(ordered[i::count]) for i in range(count)}


def test_a_packed_run_unpacks_to_the_same_spec() -> None:
    spec = spec_with(split(2))
    packed = SpecPacker().pack(BalancedAssignor(), spec)
    assignor, copy = unpack(pickle.loads(pickle.dumps(packed)))
    assert copy == spec and isinstance(assignor, BalancedAssignor)
    assert len(packed.sets) == 2  # each large set once, though the spec names it twice


def travel(packed: PackedRun) -> PackedRun:
    return pickle.loads(pickle.dumps(packed))  # as trio-parallel sends it


def test_sets_still_in_use_are_neither_pickled_nor_sent_again() -> None:
    packer = SpecPacker()
    targets = split(3)
    first = packer.pack(BalancedAssignor(), spec_with(targets))
    assert packer.pickled_sets == 3 and len(first.sets) == 3 and first.complete
    unpack(travel(first))  # this process plays the worker that did the first run
    changed = dict(targets, w0=targets["w0"] - {("a", 0)})  # one member's target changes
    assert len(changed["w0"]) >= SHARED_SET_MIN
    second = packer.pack(BalancedAssignor(), spec_with(changed))
    assert packer.pickled_sets == 4
    assert len(second.sets) == 1 and not second.complete  # only w0's new set travels
    _assignor, copy = unpack(travel(second))
    assert copy.previous_target == changed


def test_a_worker_that_did_not_do_the_last_run_asks_for_every_set() -> None:
    packer = SpecPacker()
    targets = split(3)
    unpack(travel(packer.pack(BalancedAssignor(), spec_with(targets))))
    changed = dict(targets, w1=targets["w1"] - {("b", 0), ("b", 1)})
    second = packer.pack(BalancedAssignor(), spec_with(changed))
    transport._RESIDENT.clear()  # another worker process: it holds nothing of this packer
    with pytest.raises(ResidentMiss):
        unpack(travel(second))
    complete = packer.complete(second)
    assert complete.complete and len(complete.sets) == 3 and packer.completed == 1
    _assignor, copy = unpack(travel(complete))
    assert copy == spec_with(changed)


def test_serials_of_one_packer_never_resolve_with_another_packers_sets() -> None:
    one, other = SpecPacker(), SpecPacker()
    mine, theirs = split(2), split(3)
    unpack(travel(one.pack(BalancedAssignor(), spec_with(mine))))
    unpack(travel(other.pack(BalancedAssignor(), spec_with(theirs))))
    # Both numbered their sets from 0; each run resolves against its own packer's sets.
    again = one.pack(BalancedAssignor(), spec_with(mine))
    assert again.sets == ()
    _assignor, copy = unpack(travel(again))
    assert copy.previous_target == mine


def test_a_worker_forgets_the_least_recently_used_packers_first(
        monkeypatch: pytest.MonkeyPatch) -> None:
    transport._RESIDENT.clear()
    monkeypatch.setattr(transport, "RESIDENT_UNITS_MAX", 2 * len(units_of(CONNECTORS)))
    spec = spec_with(split(2))  # each packer keeps 52 units in the worker
    packers = [SpecPacker() for _ in range(3)]
    for packer in packers:
        unpack(travel(packer.pack(BalancedAssignor(), spec)))
    assert list(transport._RESIDENT) == [packers[1].token, packers[2].token]
    unpack(travel(packers[1].pack(BalancedAssignor(), spec)))  # used again
    packed = packers[0].pack(BalancedAssignor(), spec)
    with pytest.raises(ResidentMiss):  # packers[0] was forgotten
        unpack(travel(packed))
    unpack(travel(packers[0].complete(packed)))
    assert list(transport._RESIDENT) == [packers[1].token, packers[0].token]


def test_a_recycled_id_is_not_mistaken_for_a_known_set() -> None:
    packer = SpecPacker()
    targets = split(2)
    packer.pack(BalancedAssignor(), spec_with(targets))
    # Pretend w0's set died and another set was born at its address.
    impostor = frozenset(sorted(units_of(CONNECTORS))[:SHARED_SET_MIN])
    _units, old_bytes, serial = packer._known[id(targets["w0"])]
    packer._known = {id(impostor): (targets["w0"], old_bytes, serial)}
    packed = packer.pack(BalancedAssignor(), spec_with({"w0": impostor}))
    _assignor, copy = unpack(packer.complete(packed))
    assert copy.previous_target["w0"] == impostor


def test_only_changed_members_come_back_and_expand_reuses_the_spec_sets() -> None:
    targets = split(2)
    spec = spec_with(targets)
    moved = ("a", 0) if ("a", 0) in targets["w0"] else ("a", 1)
    new_target = {"w0": targets["w0"] - {moved}, "w1": targets["w1"] | {moved},
                  "w2": frozenset()}
    result = compact(spec, AssignmentResult(new_target, state=b"s", rerun_at_ms=5))
    assert set(result.changed) == {"w0", "w1", "w2"} and result.unchanged == ()
    stable = compact(spec, AssignmentResult(dict(targets)))
    assert stable.changed == {} and set(stable.unchanged) == {"w0", "w1"}
    assert stable.verified
    full = expand(spec, stable)
    assert full.target == targets
    assert all(full.target[m] is targets[m] for m in targets)  # the very same objects
    again = expand(spec, result)
    assert again.target == new_target and again.state == b"s" and again.rerun_at_ms == 5


def test_results_that_break_the_rules_are_not_verified() -> None:
    spec = spec_with(split(2))
    twice = compact(spec, AssignmentResult({"w0": frozenset({("a", 0)}),
                                            "w1": frozenset({("a", 0)})}))
    unknown = compact(spec, AssignmentResult({"w0": frozenset({("zzz", 0)})}))
    beyond = compact(spec, AssignmentResult({"w0": frozenset({("a", 30)})}))
    below = compact(spec, AssignmentResult({"w0": frozenset({("a", -2)})}))
    not_int = compact(spec, AssignmentResult({"w0": frozenset({("a", 1.0)})}))
    not_pair = compact(spec, AssignmentResult({"w0": frozenset({("a", 1, 2)}),
                                               "w1": frozenset({"a"})}))
    fine = compact(spec, AssignmentResult({"w0": frozenset({("a", -1), ("a", 29)})}))
    assert [r.verified for r in (twice, unknown, beyond, below, not_int, not_pair, fine)] == [
        False, False, False, False, False, False, True]


def fully_checked(connectors: dict[str, int], target: dict[str, frozenset[Unit]]) -> bool:
    """The rule, written the slow way."""
    everyone = [unit for units in target.values() for unit in units]
    return len(everyone) == len(set(everyone)) and set(everyone) <= units_of(connectors)


@st.composite
def result_sequences(draw: st.DrawFn) -> list[tuple[dict[str, int], dict[str, frozenset[Unit]]]]:
    """Results of one group, run after run, with the connectors of each run: members
    often keep their very set object from the run before (what the check relies on), the
    others are dealt known units that nobody holds, now and then with one arbitrary unit
    (unknown, or someone else's), so that most results pass and some do not."""
    steps = []
    connectors: dict[str, int] = {}
    target: dict[str, frozenset[Unit]] = {}
    for _ in range(draw(st.integers(1, 8))):
        change = draw(st.sampled_from(["same", "resize", "remove", "new"]))
        if change == "new":
            connectors = draw(st.dictionaries(st.sampled_from("abc"), st.integers(0, 5)))
        elif change != "same" and connectors:
            name = draw(st.sampled_from(sorted(connectors)))
            connectors = {k: v for k, v in connectors.items() if k != name}
            if change == "resize":
                connectors[name] = draw(st.integers(0, 5))
        members = draw(st.sets(st.sampled_from(["w0", "w1", "w2", "w3"])))
        following = {m: target[m] for m in sorted(members)
                     if m in target and draw(st.booleans())}  # the same objects
        held = {unit for units in following.values() for unit in units}
        free = draw(st.permutations(sorted(units_of(connectors) - held)))
        for member in sorted(members - following.keys()):
            count = draw(st.integers(0, 4))
            dealt, free = free[:count], free[count:]
            odd = [draw(st.tuples(st.sampled_from("abcd"), st.integers(-1, 5)))
                   for _ in range(draw(st.integers(0, 5)) == 0)]  # one in six
            following[member] = frozenset(dealt + odd)
        target = following
        steps.append((connectors, target))
    return steps


@settings(max_examples=400)  # cheap examples; the bugs it is after need a few steps
@given(result_sequences())
def test_the_check_remembers_only_what_makes_it_faster(
        steps: list[tuple[dict[str, int], dict[str, frozenset[Unit]]]]) -> None:
    check = TargetCheck()
    for connectors, target in steps:
        expected = fully_checked(connectors, target)
        assert TargetCheck().passes(connectors, dict(target)) == expected
        assert check.passes(connectors, dict(target)) == expected
    assume(any(fully_checked(*step) for step in steps[:-1]))  # one check built on another


def test_run_packed_runs_the_assignor() -> None:
    spec = spec_with(split(2))
    result = run_packed(SpecPacker().pack(BalancedAssignor(), spec))
    direct = BalancedAssignor().assign(spec)
    assert expand(spec, result).target == {m: frozenset(u) for m, u in direct.target.items()}


def test_every_spec_field_travels() -> None:
    """The packer lists the spec's fields by hand: a new field must be added there too."""
    from dataclasses import fields

    assert [f.name for f in fields(AssignmentSpec)] == [
        "group_id", "members", "connectors", "previous_target", "previous_state", "now_ms",
        "scheduled_rebalance_max_delay_ms"]
    assert [f.name for f in fields(MemberSpec)] == [
        "member_id", "instance_id", "worker_url", "current_target", "metadata"]
    targets = split(2)
    spec = AssignmentSpec(
        group_id="g",
        members={"w0": MemberSpec("w0", "i0", "http://w0:8083", targets["w0"], b"m0"),
                 "w1": MemberSpec("w1", None, "http://w1:8083", frozenset({("a", 0)}))},
        connectors=CONNECTORS, previous_target={**targets, "gone": frozenset()},
        previous_state=b"state", now_ms=7, scheduled_rebalance_max_delay_ms=9)
    _assignor, copy = unpack(pickle.loads(pickle.dumps(SpecPacker().pack(BalancedAssignor(),
                                                                           spec))))
    assert copy == spec
    assert copy.members["w0"].current_target is copy.previous_target["w0"]  # one object
