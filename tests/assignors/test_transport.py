"""Assignor runs packed for a worker process and back: nothing lost, little repeated."""

from __future__ import annotations

import pickle

from coordinator.assignors.api import AssignmentResult, AssignmentSpec, MemberSpec
from coordinator.assignors.balanced import BalancedAssignor
from coordinator.assignors.transport import (
    SHARED_SET_MIN,
    SpecPacker,
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


def test_sets_still_in_use_are_not_pickled_again() -> None:
    packer = SpecPacker()
    targets = split(3)
    packer.pack(BalancedAssignor(), spec_with(targets))
    assert packer.pickled_sets == 3
    changed = dict(targets, w0=targets["w0"] - {("a", 0)})  # one member's target changes
    assert len(changed["w0"]) >= SHARED_SET_MIN
    _assignor, copy = unpack(packer.pack(BalancedAssignor(), spec_with(changed)))
    assert packer.pickled_sets == 4
    assert copy.previous_target == changed


def test_a_recycled_id_is_not_mistaken_for_a_known_set() -> None:
    packer = SpecPacker()
    targets = split(2)
    packer.pack(BalancedAssignor(), spec_with(targets))
    # Pretend w0's set died and another set was born at its address.
    impostor = frozenset(sorted(units_of(CONNECTORS))[:SHARED_SET_MIN])
    old_bytes = packer._known[id(targets["w0"])][1]
    packer._known = {id(impostor): (targets["w0"], old_bytes)}
    _assignor, copy = unpack(packer.pack(BalancedAssignor(), spec_with({"w0": impostor})))
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
    assert not twice.verified and not unknown.verified


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
