"""Moving assignor runs to a worker process and back with little work on the event loop.

A spec for 1,000 members and 50,000 units pickles in about 14 ms and a full result unpickles
in about 12 ms, both on the coordinator's event loop. Between two runs of a group most
members' targets are the same frozenset objects, so:

* :class:`SpecPacker` pickles each large target set once and reuses the bytes while the set
  lives on. The spec itself travels as plain tuples that name those sets by index (for
  1,000 members, 1.2 ms on the event loop; pickling the `MemberSpec` dataclasses through a
  `persistent_id` hook, which pickle asks about each of the spec's ~14,000 objects, took
  3.5 ms);
* :func:`run_packed` (in the worker process) unpacks the spec, runs the assignor, checks the
  result (every unit known to the spec and given at most once) and sends back only the
  members whose target changed;
* the core applies that compact result as it is when the group is as the spec saw it
  (`GroupCoordinator.complete_assignor_run`: only the changed members are touched);
  otherwise :func:`expand` rebuilds the full result from the spec's own sets, so an
  unchanged member's target is the very object it was, and comparing it costs nothing.
"""

from __future__ import annotations

import pickle
from collections.abc import Generator
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from coordinator.assignors.api import (
    AssignmentResult,
    AssignmentSpec,
    MemberSpec,
    ServerAssignor,
)
from coordinator.units import Unit, units_of

# Sets smaller than this are pickled inline: an index would cost more than it saves.
SHARED_SET_MIN = 16
# Members packed between two yields of `pack_in_steps`: about 0.3 ms on the event loop.
PACK_STEP_MEMBERS = 250
PROTOCOL = pickle.HIGHEST_PROTOCOL


@dataclass(frozen=True, slots=True)
class PackedRun:
    payload: bytes  # the pickled assignor and spec fields as tuples, large sets as indexes
    sets: tuple[bytes, ...]  # the pickled large sets, by index


@dataclass(frozen=True, slots=True)
class CompactResult:
    """An AssignmentResult as the worker sends it back."""

    changed: dict[str, frozenset[Unit]]  # members whose target differs from the previous
    unchanged: tuple[str, ...]  # members whose target is exactly their previous one
    state: bytes = b""
    rerun_at_ms: int | None = None
    extra: dict[str, object] = field(default_factory=dict)
    # Every unit is one the spec's connectors define, and none is given to two members.
    verified: bool = False
    assigned: int = 0  # units given, all members together


class SpecPacker:
    """Pickles assignor runs, keeping the bytes of large sets that are still in use."""

    def __init__(self) -> None:
        self._known: dict[int, tuple[frozenset[Unit], bytes]] = {}
        self._used: dict[int, tuple[frozenset[Unit], bytes]] = {}
        self._order: dict[int, int] = {}
        self._sets: list[bytes] = []
        self.pickled_sets = 0  # sets that had to be pickled (for tests and benchmarks)

    def index_of(self, units: frozenset[Unit]) -> int:
        key = id(units)
        index = self._order.get(key)
        if index is None:
            entry = self._known.get(key)
            # The object must be the same, not just the id: ids are reused after death.
            if entry is None or entry[0] is not units:
                entry = (units, pickle.dumps(units, PROTOCOL))
                self.pickled_sets += 1
            self._used[key] = entry
            index = self._order[key] = len(self._sets)
            self._sets.append(entry[1])
        return index

    def _ref(self, units: Any) -> Any:
        """A large frozenset by index (an int), anything else as it is."""
        if type(units) is frozenset and len(units) >= SHARED_SET_MIN:
            index = self._order.get(id(units))
            return index if index is not None else self.index_of(units)
        return units

    def pack(self, assignor: ServerAssignor, spec: AssignmentSpec) -> PackedRun:
        """`pack_in_steps` all at once."""
        steps = self.pack_in_steps(assignor, spec)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                packed: PackedRun = done.value
                return packed

    def pack_in_steps(self, assignor: ServerAssignor, spec: AssignmentSpec
                      ) -> Generator[None, None, PackedRun]:
        """Pack a run, yielding after every `PACK_STEP_MEMBERS` members (the packed run is
        the generator's return value): the event loop answers heartbeats in between
        instead of after a millisecond and more for a big group. The spec is the run's own
        and does not change meanwhile; one packer packs one run at a time."""
        self._used, self._order, self._sets = {}, {}, []
        ref = self._ref
        members: list[tuple[Any, ...]] = []
        entries = iter(spec.members.items())
        while chunk := list(islice(entries, PACK_STEP_MEMBERS)):
            members += [(key, m.member_id, m.instance_id, m.worker_url, ref(m.current_target),
                         m.metadata) for key, m in chunk]
            yield
        previous: list[tuple[str, Any]] = []
        targets = iter(spec.previous_target.items())
        while part := list(islice(targets, PACK_STEP_MEMBERS * 2)):
            previous += [(key, ref(units)) for key, units in part]
            yield
        payload = pickle.dumps(
            (assignor, spec.group_id, tuple(members), spec.connectors, tuple(previous),
             spec.previous_state, spec.now_ms, spec.scheduled_rebalance_max_delay_ms), PROTOCOL)
        # Keep only what this spec used: the sets of the next spec are mostly these.
        self._known = self._used
        return PackedRun(payload, tuple(self._sets))


def unpack(packed: PackedRun) -> tuple[ServerAssignor, AssignmentSpec]:
    sets = [pickle.loads(blob) for blob in packed.sets]

    def units(ref: Any) -> Any:
        return sets[ref] if type(ref) is int else ref

    (assignor, group_id, members, connectors, previous, previous_state, now_ms,
     delay_ms) = pickle.loads(packed.payload)
    spec = AssignmentSpec(
        group_id=group_id,
        members={key: MemberSpec(member_id, instance_id, worker_url, units(target), metadata)
                 for key, member_id, instance_id, worker_url, target, metadata in members},
        connectors=connectors,
        previous_target={key: units(ref) for key, ref in previous},
        previous_state=previous_state,
        now_ms=now_ms,
        scheduled_rebalance_max_delay_ms=delay_ms,
    )
    return assignor, spec


def compact(spec: AssignmentSpec, result: AssignmentResult) -> CompactResult:
    changed: dict[str, frozenset[Unit]] = {}
    unchanged: list[str] = []
    given: set[Unit] = set()
    listed = 0
    for member_id, units in result.target.items():
        units = frozenset(units)
        given |= units
        listed += len(units)
        if spec.previous_target.get(member_id) == units:
            unchanged.append(member_id)
        else:
            changed[member_id] = units
    verified = listed == len(given) and given <= units_of(spec.connectors)
    return CompactResult(changed, tuple(unchanged), result.state, result.rerun_at_ms,
                         dict(result.extra), verified, listed)


def run_packed(packed: PackedRun) -> CompactResult:
    """Executed in a worker process: unpack, assign, check and compact."""
    assignor, spec = unpack(packed)
    return compact(spec, assignor.assign(spec))


def expand(spec: AssignmentSpec, result: CompactResult) -> AssignmentResult:
    """The full result again, with the spec's own set objects for unchanged members."""
    target: dict[str, frozenset[Unit]] = {
        member_id: spec.previous_target[member_id] for member_id in result.unchanged}
    target.update(result.changed)
    return AssignmentResult(target, result.state, result.rerun_at_ms, result.extra)
