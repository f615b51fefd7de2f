"""Moving assignor runs to a worker process and back with little work on either side.

A spec for 1,000 members and 50,000 units pickles in about 14 ms and a full result unpickles
in about 12 ms, both on the coordinator's event loop; in the worker, a run that unpickles
every set and checks every unit costs 24-27 ms, one that does neither 8.5-9.5 ms
(`bench core --pool-run`). Between two runs of a group most members' targets are the same
frozenset objects, so:

* :class:`SpecPacker` pickles each large target set once and reuses the bytes while the set
  lives on. The spec itself travels as plain tuples that name those sets by serial number
  (for 1,000 members, 1.2 ms on the event loop; pickling the `MemberSpec` dataclasses
  through a `persistent_id` hook, which pickle asks about each of the spec's ~14,000
  objects, took 3.5 ms);
* a worker process keeps the sets of the last run it did for each packer (`_RESIDENT`), so
  a run carries only the sets that are new since the packer's previous run. A worker that
  does not hold one of them (it is new, or that run went to another worker) raises
  :class:`ResidentMiss`, and the runtime sends the run again with every set
  (:meth:`SpecPacker.complete`);
* :func:`run_packed` (in the worker process) unpacks the spec, runs the assignor, checks the
  result (every unit known to the spec and given at most once; :class:`TargetCheck` does it
  in time proportional to what changed since the last result it checked for that packer)
  and sends back only the members whose target changed;
* the core applies that compact result as it is when the group is as the spec saw it
  (`GroupCoordinator.complete_assignor_run`: only the changed members are touched);
  otherwise :func:`expand` rebuilds the full result from the spec's own sets, so an
  unchanged member's target is the very object it was, and comparing it costs nothing.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Generator, Mapping
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from coordinator.assignors.api import (
    AssignmentResult,
    AssignmentSpec,
    MemberSpec,
    ServerAssignor,
)
from coordinator.units import CONNECTOR, Unit

# Sets smaller than this are pickled inline: a serial number would cost more than it saves.
SHARED_SET_MIN = 16
# Members packed between two yields of `pack_in_steps`: about 0.3 ms on the event loop.
PACK_STEP_MEMBERS = 250
PROTOCOL = pickle.HIGHEST_PROTOCOL
# What a worker process keeps between runs, all packers together, counted in units (a
# unit costs about 220 bytes there with its place in a TargetCheck: 11 MB for 51,000,
# measured with tracemalloc): the packers used least recently are forgotten first, and
# the last one is always kept.
RESIDENT_UNITS_MAX = 500_000


@dataclass(frozen=True, slots=True)
class PackedRun:
    payload: bytes  # the pickled assignor and spec fields as tuples, large sets by serial
    sets: tuple[tuple[int, bytes], ...]  # (serial, pickled set) the worker may not hold
    packer: str = ""  # the SpecPacker that numbered the sets
    complete: bool = True  # `sets` holds every set the payload names


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


class ResidentMiss(Exception):
    """Raised in a worker process that does not hold a set a packed run names by serial."""


# One set the packer has pickled: the set, its bytes and its serial number.
_Known = tuple[frozenset[Unit], bytes, int]


class SpecPacker:
    """Pickles one group's assignor runs, keeping the bytes of large sets still in use and
    numbering them, so that a worker that did the previous run is sent only the new ones."""

    def __init__(self) -> None:
        self.token = os.urandom(8).hex()  # serials are this packer's: never mixed up
        self._known: dict[int, _Known] = {}  # by id(), the sets of the last packed run
        self._used: dict[int, _Known] = {}
        self._held: frozenset[int] = frozenset()  # serials a worker holds after that run
        self._next_serial = 0
        self.pickled_sets = 0  # sets that had to be pickled (for tests and benchmarks)
        self.completed = 0  # runs sent again with every set, after a ResidentMiss

    def _entry(self, units: frozenset[Unit]) -> _Known:
        key = id(units)
        entry = self._known.get(key)
        # The object must be the same, not just the id: ids are reused after death.
        if entry is None or entry[0] is not units:
            entry = (units, pickle.dumps(units, PROTOCOL), self._next_serial)
            self._next_serial += 1
            self.pickled_sets += 1
        self._used[key] = entry
        return entry

    def _ref(self, units: Any) -> Any:
        """A large frozenset by serial (an int), anything else as it is."""
        if type(units) is frozenset and len(units) >= SHARED_SET_MIN:
            entry = self._used.get(id(units))
            return (entry if entry is not None else self._entry(units))[2]
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
        self._used = {}
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
        held = self._held
        # Keep only what this spec used: the sets of the next spec are mostly these.
        self._known = self._used
        self._held = frozenset(serial for _units, _blob, serial in self._known.values())
        fresh = tuple((serial, blob) for _units, blob, serial in self._known.values()
                      if serial not in held)
        return PackedRun(payload, fresh, self.token, complete=not held)

    def complete(self, packed: PackedRun) -> PackedRun:
        """The run just packed, with every set it names: for a worker that raised
        ResidentMiss."""
        self.completed += 1
        return PackedRun(packed.payload,
                         tuple((serial, blob) for _units, blob, serial in self._known.values()),
                         packed.packer, complete=True)


class TargetCheck:
    """Checks that a result gives only units the connectors define, each at most once.

    It remembers who held each unit in the last result it passed, so the next result of
    the same group is checked in time proportional to the members whose set is a
    different object, and to the units of connectors that shrank or went away."""

    def __init__(self) -> None:
        self._forget()

    def _forget(self) -> None:
        self._owners: dict[Unit, str] = {}  # every unit of _targets, by unit
        self._targets: dict[str, frozenset[Unit]] = {}  # the last result that passed
        self._connectors: dict[str, int] = {}  # and the connectors it was checked against

    def passes(self, connectors: Mapping[str, int], target: dict[str, frozenset[Unit]]) -> bool:
        try:
            if self._passes(connectors, target):
                self._targets, self._connectors = target, dict(connectors)
                return True
        except (TypeError, ValueError):  # a unit that is not a (name, task) pair
            pass
        self._forget()  # half updated: start from nothing next time
        return False

    def _passes(self, connectors: Mapping[str, int], target: dict[str, frozenset[Unit]]
                ) -> bool:
        owners, previous = self._owners, self._targets
        changed = [(member, units) for member, units in target.items()
                   if previous.get(member) is not units]
        for member in [m for m in previous if m not in target] + [m for m, _ in changed]:
            for unit in previous.get(member, ()):
                del owners[unit]
        if connectors != self._connectors:
            # Units of unchanged members were known before; now some may not be.
            for name, before in self._connectors.items():
                now = connectors.get(name)
                gone = range(CONNECTOR, before) if now is None else range(now, before)
                if any((name, task) in owners for task in gone):
                    return False
        task_count = connectors.get
        for member, units in changed:
            for unit in units:
                name, task = unit
                count = task_count(name)
                if count is None or type(task) is not int or not CONNECTOR <= task < count \
                        or unit in owners:
                    return False
                owners[unit] = member
        return True


@dataclass(slots=True)
class _Resident:
    """What a worker process keeps of one packer's last run."""

    sets: dict[int, frozenset[Unit]]
    check: TargetCheck
    units: int


# In each worker process: by packer token, least recently used first.
_RESIDENT: dict[str, _Resident] = {}


def _unpack(packed: PackedRun) -> tuple[ServerAssignor, AssignmentSpec, _Resident]:
    resident = _RESIDENT.pop(packed.packer, None)
    held = resident.sets if resident is not None else {}
    fresh = {serial: pickle.loads(blob) for serial, blob in packed.sets}
    used: dict[int, frozenset[Unit]] = {}

    def units(ref: Any) -> Any:
        if type(ref) is not int:
            return ref
        found = used.get(ref)
        if found is None:
            found = fresh[ref] if ref in fresh else held.get(ref)
            if found is None:
                raise ResidentMiss(f"set {ref} of packer {packed.packer} is not here")
            used[ref] = found
        return found

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
    resident = _Resident(used, resident.check if resident is not None else TargetCheck(),
                         sum(map(len, used.values())))
    _RESIDENT[packed.packer] = resident
    total = sum(kept.units for kept in _RESIDENT.values())
    while total > RESIDENT_UNITS_MAX and len(_RESIDENT) > 1:
        total -= _RESIDENT.pop(next(iter(_RESIDENT))).units
    return assignor, spec, resident


def unpack(packed: PackedRun) -> tuple[ServerAssignor, AssignmentSpec]:
    """The assignor and spec of a packed run (raises ResidentMiss, see the module)."""
    assignor, spec, _resident = _unpack(packed)
    return assignor, spec


def compact(spec: AssignmentSpec, result: AssignmentResult,
            check: TargetCheck | None = None) -> CompactResult:
    """The result as the members whose target changed, checked (by `check` when given:
    the one that passed the group's previous result)."""
    previous = spec.previous_target
    target = {member_id: frozenset(units) for member_id, units in result.target.items()}
    changed: dict[str, frozenset[Unit]] = {}
    unchanged: list[str] = []
    listed = 0
    for member_id, units in target.items():
        listed += len(units)
        before = previous.get(member_id)
        if before is units or before == units:
            unchanged.append(member_id)
        else:
            changed[member_id] = units
    verified = (check if check is not None else TargetCheck()).passes(spec.connectors, target)
    return CompactResult(changed, tuple(unchanged), result.state, result.rerun_at_ms,
                         dict(result.extra), verified, listed)


def run_packed(packed: PackedRun) -> CompactResult:
    """Executed in a worker process: unpack, assign, check and compact."""
    assignor, spec, resident = _unpack(packed)
    return compact(spec, assignor.assign(spec), resident.check)


def expand(spec: AssignmentSpec, result: CompactResult) -> AssignmentResult:
    """The full result again, with the spec's own set objects for unchanged members."""
    target: dict[str, frozenset[Unit]] = {
        member_id: spec.previous_target[member_id] for member_id in result.unchanged}
    target.update(result.changed)
    return AssignmentResult(target, result.state, result.rerun_at_ms, result.extra)
