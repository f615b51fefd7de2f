"""Building specs and checking assignor results, shared by the assignor tests."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from hypothesis import strategies as st

from coordinator.assignors.api import AssignmentResult, AssignmentSpec, MemberSpec
from coordinator.units import CONNECTOR, Unit, units_of

Target = Mapping[str, frozenset[Unit]]


def member(member_id: str, instance_id: str | None = None, url: str | None = None,
           current: Iterable[Unit] = ()) -> MemberSpec:
    return MemberSpec(
        member_id=member_id,
        instance_id=instance_id,
        worker_url=url if url is not None else f"http://{member_id}:8083",
        current_target=frozenset(current),
    )


def make_spec(
    members: Iterable[MemberSpec] | Iterable[str],
    connectors: Mapping[str, int],
    previous: AssignmentResult | Target | None = None,
    *,
    now_ms: int = 0,
    delay_ms: int = 300_000,
    state: bytes | None = None,
) -> AssignmentSpec:
    """A spec; ``previous`` may be the last result (its target and state carry over)."""
    specs = [m if isinstance(m, MemberSpec) else member(m) for m in members]
    if isinstance(previous, AssignmentResult):
        target, carried = previous.target, previous.state
    else:
        target, carried = previous or {}, b""
    return AssignmentSpec(
        group_id="group",
        members={m.member_id: m for m in specs},
        connectors=dict(connectors),
        previous_target=dict(target),
        previous_state=carried if state is None else state,
        now_ms=now_ms,
        scheduled_rebalance_max_delay_ms=delay_ms,
    )


def as_coordinator_installs(
    spec: AssignmentSpec, result: AssignmentResult
) -> dict[str, frozenset[Unit]]:
    """The target the coordinator keeps: member parts limited to the units that exist."""
    units = units_of(spec.connectors)
    return {m: part & units for m, part in result.target.items() if m in spec.members}


def owners(target: Target) -> dict[Unit, str]:
    return {unit: member_id for member_id, part in target.items() for unit in part}


def assigned(target: Target) -> set[Unit]:
    return {unit for part in target.values() for unit in part}


def kind_counts(part: Iterable[Unit]) -> tuple[int, int]:
    """(connectors, tasks) in a part."""
    connectors = sum(1 for _, task in part if task == CONNECTOR)
    return connectors, sum(1 for _ in part) - connectors


def moved_by_kind(before: Target, after: Target) -> tuple[int, int]:
    """Units whose owner changed, connectors and tasks counted apart."""
    previous_owner = owners(before)
    moved = [unit for member_id, part in after.items() for unit in part
             if previous_owner.get(unit) != member_id]
    return kind_counts(moved)


def check_valid(spec: AssignmentSpec, result: AssignmentResult) -> None:
    """No unit twice, only existing units, only current members."""
    assert set(result.target) <= set(spec.members)
    seen: set[Unit] = set()
    for part in result.target.values():
        assert isinstance(part, frozenset)
        assert seen.isdisjoint(part), "a unit is assigned to two members"
        seen |= part
    assert seen <= units_of(spec.connectors), "a unit that does not exist was assigned"


def check_complete_and_balanced(spec: AssignmentSpec, result: AssignmentResult) -> None:
    """Every unit assigned; per kind every member within one unit of every other."""
    if not spec.members:
        assert not assigned(result.target)
        return
    assert assigned(result.target) == set(units_of(spec.connectors))
    counts = [kind_counts(result.target.get(m, frozenset())) for m in spec.members]
    for kind in (0, 1):
        per_member = [c[kind] for c in counts]
        total = sum(per_member)
        floor = total // len(per_member)
        assert min(per_member) >= floor
        assert max(per_member) <= math.ceil(total / len(per_member))


# --- Hypothesis strategies -----------------------------------------------------------------

connector_maps = st.dictionaries(
    st.sampled_from([f"conn-{c}" for c in "abcdefgh"]), st.integers(0, 9), max_size=6
)
member_ids = st.lists(
    st.sampled_from([f"member-{i:02d}" for i in range(12)]), min_size=1, max_size=8, unique=True
)


@st.composite
def previous_targets(draw: st.DrawFn, members: list[str], connectors: Mapping[str, int]) -> Target:
    """Any placement of some units (including gone ones and doubles) over ``members``."""
    units = sorted(units_of(connectors)) + [("conn-gone", CONNECTOR), ("conn-gone", 0)]
    parts: dict[str, set[Unit]] = {m: set() for m in members}
    for unit in units:
        holders = draw(st.lists(st.sampled_from(members), max_size=2, unique=True))
        for holder in holders:
            parts[holder].add(unit)
    return {m: frozenset(p) for m, p in parts.items()}
