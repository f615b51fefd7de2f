"""Assignor runs packed for a worker process and back: nothing lost, little repeated."""

from __future__ import annotations

import pickle
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from coordinator.assignors import transport
from coordinator.assignors.api import AssignmentResult, AssignmentSpec, MemberSpec
from coordinator.assignors.balanced import BalancedAssignor
from coordinator.assignors.transport import (
    PackedRun,
    ResidentMiss,
    SpecPacker,
    TargetCheck,
    compact,
    run_packed,
    unpack,
)
from coordinator.core.result import (
    CompactResult,
    MappingChange,
    SpecChanges,
    expand,
    unchanged_members,
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


@pytest.fixture(autouse=True)
def a_fresh_worker() -> None:
    transport._RESIDENT.clear()  # this process plays the pool process


def travel(packed: PackedRun) -> PackedRun:
    return pickle.loads(pickle.dumps(packed))  # as trio-parallel sends it


def run_in_worker(packer: SpecPacker, packed: PackedRun, answered: bool = True
                  ) -> CompactResult:
    result: CompactResult = pickle.loads(pickle.dumps(run_packed(travel(packed))))
    if answered:
        packer.returned(packed, result)  # as the runtime does when a run comes back
    return result


def test_a_packed_run_unpacks_to_the_same_spec() -> None:
    spec = spec_with(split(2))
    packed = SpecPacker().pack(BalancedAssignor(), spec)
    assert packed.base is None
    assignor, copy = unpack(travel(packed))
    assert copy == spec and isinstance(assignor, BalancedAssignor)
    # A member's target and its previous target were one set, and still are.
    assert all(copy.members[m].current_target is copy.previous_target[m] for m in spec.members)


def test_a_run_carries_only_what_changed_since_the_last() -> None:
    packer = SpecPacker()
    targets = split(3)
    first_spec = spec_with(targets)
    first = packer.pack(BalancedAssignor(), first_spec)
    result = run_in_worker(packer, first)
    # w0's target changes; w1 and w2 keep their MemberSpec and sets; the state is the one
    # the worker returned.
    changed = dict(targets, w0=targets["w0"] - {("a", 0)})
    members = dict(first_spec.members, w0=MemberSpec("w0", None, "http://w0:8083",
                                                     changed["w0"]))
    second_spec = replace(first_spec, members=members, previous_target=changed,
                          previous_state=result.state)
    second = packer.pack(BalancedAssignor(), second_spec)
    assert (second.base, second.run) == (first.run, first.run + 1)
    (piece,) = second.pieces
    member_fields, previous_entries = pickle.loads(piece)
    assert [fields[0] for fields in member_fields] == ["w0"]
    assert [key for key, _units in previous_entries] == ["w0"]
    header = pickle.loads(second.header)
    assert header[2] == {} and header[6] is None  # no connector changed; the state stays
    _assignor, copy = unpack(travel(second))
    assert copy == second_spec and packer.whole == 1


class NoScan(dict[str, Any]):
    """A mapping that may be read by key but not gone over."""

    def __iter__(self) -> Any:
        raise AssertionError("gone over")

    def items(self) -> Any:
        raise AssertionError("gone over")

    def keys(self) -> Any:
        raise AssertionError("gone over")

    def values(self) -> Any:
        raise AssertionError("gone over")


def test_a_run_told_what_changed_is_packed_without_going_over_the_rest() -> None:
    packer = SpecPacker()
    targets = split(3)
    first_spec = spec_with(targets)
    run_in_worker(packer, packer.pack(BalancedAssignor(), first_spec))
    moved = targets["w0"] - {("a", 0)}
    members = NoScan({**first_spec.members,
                      "w0": MemberSpec("w0", None, "http://w0:8083", moved)})
    previous = NoScan({**targets, "w0": moved})
    connectors = NoScan({**CONNECTORS, "a": 31})
    second_spec = replace(first_spec, members=members, previous_target=previous,
                          connectors=connectors)
    packer = SpecPacker()
    first_told = SpecChanges(MappingChange(0, 1, ()), MappingChange(0, 2, ()),
                             MappingChange(0, 3, ()))
    run_in_worker(packer, packer.pack(BalancedAssignor(), first_spec, changes=first_told))
    told = SpecChanges(MappingChange(1, 4, ("w0",)),
                       MappingChange(2, 5, ("w0", "w1")),
                       MappingChange(3, 6, ("a",)))
    second = packer.pack(BalancedAssignor(), second_spec, changes=told)
    member_fields, previous_entries = pickle.loads(second.pieces[0])
    assert [fields[0] for fields in member_fields] == ["w0"]
    assert previous_entries == [("w0", moved)]  # (w1 was named, but is the same set)
    assert pickle.loads(second.header)[2] == {"a": 31}
    _assignor, copy = unpack(travel(second))
    assert copy == second_spec
    # Told against another spec than the packer's last, it goes over every entry.
    again = NoScan({**first_spec.members, "w0": MemberSpec("w0", None, "http://w0", moved)})
    with pytest.raises(AssertionError, match="gone over"):
        packer.pack(BalancedAssignor(), replace(second_spec, members=again), changes=told)


def test_a_worker_that_did_not_do_the_last_run_asks_for_it_whole() -> None:
    packer = SpecPacker()
    targets = split(3)
    run_in_worker(packer, packer.pack(BalancedAssignor(), spec_with(targets)))
    changed = spec_with(dict(targets, w1=targets["w1"] - {("b", 0), ("b", 1)}))
    second = packer.pack(BalancedAssignor(), changed)
    transport._RESIDENT.clear()  # another worker process: it holds nothing of this packer
    with pytest.raises(ResidentMiss):
        unpack(travel(second))
    whole = packer.pack(BalancedAssignor(), changed, whole=True)
    assert whole.base is None and packer.whole == 2
    _assignor, copy = unpack(travel(whole))
    assert copy == changed
    # The next run is told against the whole one, which this worker now holds.
    third = packer.pack(BalancedAssignor(), spec_with(split(2)))
    assert third.base == whole.run
    _assignor, copy = unpack(travel(third))
    assert copy == spec_with(split(2))


def test_a_worker_behind_by_a_run_asks_for_it_whole() -> None:
    packer = SpecPacker()
    run_in_worker(packer, packer.pack(BalancedAssignor(), spec_with(split(3))))
    packer.pack(BalancedAssignor(), spec_with(split(2)))  # went to another worker
    third = packer.pack(BalancedAssignor(), spec_with(split(4)))
    with pytest.raises(ResidentMiss):
        unpack(travel(third))


def test_the_state_stays_only_with_the_worker_that_returned_it() -> None:
    packer = SpecPacker()
    spec = spec_with(split(2))
    result = run_in_worker(packer, packer.pack(BalancedAssignor(), spec))
    told = packer.pack(BalancedAssignor(), replace(spec, previous_state=result.state))
    assert pickle.loads(told.header)[6] is None  # not sent: the worker has it
    _assignor, copy = unpack(travel(told))
    assert copy.previous_state == result.state
    # Another state object (the group's target came from elsewhere): it travels.
    other = packer.pack(BalancedAssignor(), replace(spec, previous_state=bytes(result.state)))
    assert pickle.loads(other.header)[6] == result.state
    _assignor, copy = unpack(travel(other))
    assert copy.previous_state == result.state


def test_run_numbers_of_one_packer_never_resolve_with_another_packers_runs() -> None:
    one, other = SpecPacker(), SpecPacker()
    mine, theirs = spec_with(split(2)), spec_with(split(3))
    unpack(travel(one.pack(BalancedAssignor(), mine)))
    unpack(travel(other.pack(BalancedAssignor(), theirs)))
    # Both numbered their first run 1; each run resolves against its own packer's.
    _assignor, copy = unpack(travel(one.pack(BalancedAssignor(), mine)))
    assert copy == mine


def test_a_worker_forgets_the_least_recently_used_packers_first(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transport, "RESIDENT_UNITS_MAX", 2 * len(units_of(CONNECTORS)))
    spec = spec_with(split(2))  # each packer keeps 52 units in the worker
    packers = [SpecPacker() for _ in range(3)]
    for packer in packers:
        unpack(travel(packer.pack(BalancedAssignor(), spec)))
    assert list(transport._RESIDENT) == [packers[1].token, packers[2].token]
    unpack(travel(packers[1].pack(BalancedAssignor(), spec)))  # used again
    with pytest.raises(ResidentMiss):  # packers[0] was forgotten
        unpack(travel(packers[0].pack(BalancedAssignor(), spec)))
    unpack(travel(packers[0].pack(BalancedAssignor(), spec, whole=True)))
    assert list(transport._RESIDENT) == [packers[1].token, packers[0].token]


def test_a_spec_packed_whole_goes_in_pieces_of_a_few_units(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transport, "PACK_STEP_UNITS", 20)
    spec = spec_with(split(5))  # 10-11 units each: two members a piece
    *steps, packed = SpecPacker().pack_in_steps(BalancedAssignor(), spec)
    assert packed is not None and steps == [None, None] and len(packed.pieces) == 3
    _assignor, copy = unpack(travel(packed))
    assert copy == spec


class EchoAssignor:
    """Gives each member its previous target, and a state that says which run it was;
    notes the spec it was given (the "worker" is this process)."""

    name = "echo"
    seen: AssignmentSpec | None = None

    def assign(self, spec: AssignmentSpec) -> AssignmentResult:
        EchoAssignor.seen = spec
        return AssignmentResult({m: spec.previous_target.get(m, frozenset())
                                 for m in spec.members}, state=spec.previous_state + b".")


MEMBER_IDS = ["w0", "w1", "w2", "w3", "w4"]


@st.composite
def spec_sequences(draw: st.DrawFn) -> list[tuple[AssignmentSpec, str, SpecChanges]]:
    """Specs of one group, run after run, each made from the one before as the core
    makes them: members, sets and connectors kept as the very objects or replaced,
    members joining and leaving, departed members' parts; and what happens to each run
    ("runs": in the worker of the last run; "lost": never reaches a worker; "elsewhere":
    in a worker that holds nothing of the group; "unanswered": runs, but its result never
    comes back, so the next spec has the state of the run before); and what the core
    would tell of the changes, true but not always of use: against the spec before,
    against the one before that, or nothing."""
    sets = [frozenset(units) for units in (
        set(), {("a", -1)}, {("a", 0), ("a", 1)}, {("b", 0)}, {("b", -1), ("c", 2)})]
    members: dict[str, MemberSpec] = {}
    previous: dict[str, frozenset[Unit]] = {}
    connectors: dict[str, int] = {}
    state = b""
    sequence = []
    history: list[AssignmentSpec] = []
    for _ in range(draw(st.integers(1, 6))):
        members = dict(members)
        for member_id in draw(st.sets(st.sampled_from(MEMBER_IDS))):
            action = draw(st.sampled_from(["new", "leave", "url"]))
            if action == "leave":
                members.pop(member_id, None)
            else:
                units = draw(st.sampled_from(sets))
                members[member_id] = MemberSpec(member_id, draw(st.none() | st.just("i")),
                                                f"http://{member_id}:{action}", units)
        previous = {key: units for key, units in previous.items()
                    if draw(st.integers(0, 3))}  # now and then a part goes
        previous.update({m: spec.current_target for m, spec in members.items()
                         if draw(st.booleans())})
        previous.update({m: draw(st.sampled_from(sets)) for m in
                         draw(st.sets(st.sampled_from(["gone0", "gone1"])))})
        connectors = {name: tasks for name, tasks in connectors.items() if draw(st.booleans())}
        connectors.update(draw(st.dictionaries(st.sampled_from("abcd"), st.integers(0, 4))))
        if draw(st.booleans()):
            state = draw(st.binary(max_size=3))  # else: whatever the last run returned
        spec = AssignmentSpec("g", members, connectors, previous, state, 1)
        history.append(spec)
        told = draw(st.sampled_from(["before", "before", "two back", "nothing"]))
        back = 2 if told == "two back" else 1
        # Each spec's mappings are new dicts (above): version i is spec i's.
        version = len(history)
        changes = SpecChanges()
        if told != "nothing" and len(history) > back:
            # The keys that differ from that spec's (by identity, as the core keeps them),
            # plus one that may not: a change may name more than changed. (Two back, a
            # part that changed and changed back is not named, though it differs from the
            # spec before: told against another spec than its last, a packer must not use
            # the keys.)
            base = history[-1 - back]
            spare = draw(st.sampled_from(["w0", "a", "gone0"]))
            changes = SpecChanges(*(
                MappingChange(len(history) - back, version, tuple({
                    key for key in now.keys() | before.keys()
                    if key not in now or key not in before or now[key] is not before[key]}
                    | {spare}))
                for now, before in ((members, base.members),
                                    (previous, base.previous_target),
                                    (connectors, base.connectors))))
        sequence.append((spec, draw(st.sampled_from(["runs", "runs", "lost", "elsewhere",
                                                     "unanswered"])), changes))
    return sequence


@settings(max_examples=300)
@given(spec_sequences())
def test_every_run_reaches_its_worker_as_its_spec(
        sequence: list[tuple[AssignmentSpec, str, SpecChanges]]) -> None:
    transport._RESIDENT.clear()
    packer = SpecPacker()
    returned = b""
    for spec, fate, changes in sequence:
        if spec.previous_state == b"" and returned:
            spec = replace(spec, previous_state=returned)  # the state as it came back
        packed = packer.pack(EchoAssignor(), spec, changes=changes)
        if fate == "lost":
            continue
        if fate == "elsewhere":
            transport._RESIDENT.clear()
        EchoAssignor.seen = None
        try:
            result = run_in_worker(packer, packed, fate != "unanswered")
        except ResidentMiss:
            assert packed.base is not None
            packed = packer.pack(EchoAssignor(), spec, whole=True)
            result = run_in_worker(packer, packed, fate != "unanswered")
        assert EchoAssignor.seen == spec
        if fate == "unanswered":
            continue
        assert expand(spec, result).target == EchoAssignor().assign(spec).target
        returned = result.state


def test_only_changed_members_come_back_and_expand_reuses_the_spec_sets() -> None:
    targets = split(2)
    spec = spec_with(targets)
    moved = ("a", 0) if ("a", 0) in targets["w0"] else ("a", 1)
    new_target = {"w0": targets["w0"] - {moved}, "w1": targets["w1"] | {moved},
                  "w2": frozenset()}
    result = compact(spec, AssignmentResult(new_target, state=b"s", rerun_at_ms=5))
    assert set(result.changed) == {"w0", "w1", "w2"} and result.unchanged == ()
    stable = compact(spec, AssignmentResult(dict(targets)))
    # Every member named, no one else: the unchanged ones are the others, not listed.
    assert stable.changed == {} and stable.unchanged is None
    assert unchanged_members(spec, stable) == ["w0", "w1"]
    left_out = compact(spec, AssignmentResult({"w1": targets["w1"]}))
    assert left_out.unchanged == ("w1",) and unchanged_members(spec, left_out) == ("w1",)
    assert expand(spec, left_out).target == {"w1": targets["w1"]}
    assert stable.verified
    full = expand(spec, stable)
    assert full.target == targets
    assert all(full.target[m] is targets[m] for m in targets)  # the very same objects
    again = expand(spec, result)
    assert again.target == new_target and again.state == b"s" and again.rerun_at_ms == 5
    assert stable.outsiders == ()  # every previous part is a member's
    # A departed member's part is still in the previous target: the landing must drop it.
    departed = replace(spec, previous_target={**targets, "gone": frozenset({("b", 0)})})
    assert compact(departed, AssignmentResult(dict(targets))).outsiders == ("gone",)


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
