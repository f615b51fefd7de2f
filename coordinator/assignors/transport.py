"""Moving assignor runs to a worker process and back with little work on either side.

Packing a spec of 1,000 members and 50,000 units whole costs the coordinator's event loop
about 9 ms, and unpickling a full result about 12 ms, while between two runs of a group
little of either changes (after a one-task resize a run is told in 1.3 kB, packed in
0.15 ms: `bench core --pool-run`). So:

* a worker process keeps the spec of the last run it did for each :class:`SpecPacker` (one
  per group: `_RESIDENT`), and a run carries only what differs from the packer's previous
  run: the members whose :class:`MemberSpec` is another object, the previous-target entries
  that are other sets, the connectors whose task count changed, and the keys that went.
  The core tells which keys may have changed since the spec before (`SpecChanges`: each
  mapping's version, and the version and keys of the one it is a copy of), so a resize of
  a big group's connector is packed without a look at its other members and connectors;
  without that (or when the packer's last run was not of that version) it compares every
  entry by identity (a member's `MemberSpec` and target set are immutable objects the core
  keeps while they do not change);
* a worker that does not hold that previous run (it is new, the run went to another
  worker, or it forgot the packer) raises :class:`ResidentMiss`, and the runtime packs the
  run again whole: in steps of about PACK_STEP_UNITS units, each pickled on its own, so the
  event loop answers heartbeats in between;
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
from collections.abc import Generator, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from coordinator.assignors.api import (
    AssignmentResult,
    AssignmentSpec,
    MemberSpec,
    ServerAssignor,
)
from coordinator.core.result import (
    NO_SPEC_CHANGES,
    CompactResult,
    MappingChange,
    SpecChanges,
)
from coordinator.units import CONNECTOR, Unit

# A run packed whole is pickled in pieces of about this many units (and at most
# PACK_STEP_MEMBERS members), each between two yields of `pack_in_steps`: 0.1-0.25 ms of
# the event loop's time each (1,000 members x 50 tasks, scratch timing of every step).
PACK_STEP_UNITS = 1_000
PACK_STEP_MEMBERS = 250
PROTOCOL = pickle.HIGHEST_PROTOCOL
# What a worker process keeps between runs, all packers together, counted in units (a
# unit costs about 220 bytes there with its place in a TargetCheck: 11 MB for 51,000,
# measured with tracemalloc): the packers used least recently are forgotten first, and
# the last one is always kept.
RESIDENT_UNITS_MAX = 500_000


@dataclass(frozen=True, slots=True)
class PackedRun:
    # The pickled assignor, the spec's scalar fields, the connectors (those that changed
    # since run `base`, or all) and the keys gone since `base`.
    header: bytes
    # Pickled (members, previous target entries) pieces: those that are new since `base`,
    # or every one.
    pieces: tuple[bytes, ...]
    packer: str = ""  # the SpecPacker's token
    run: int = 0  # the packer's number for this run
    base: int | None = None  # the run this one is told against; None: packed whole


class ResidentMiss(Exception):
    """Raised in a worker process that does not hold the run a packed run is told against."""


# The spec of a packer's last run: its members, previous target and connectors, and the
# versions the core gave them (None: not told).
_Base = tuple[Mapping[str, MemberSpec], Mapping[str, frozenset[Unit]], Mapping[str, int]]
_Versions = tuple[int | None, int | None, int | None]
# A piece of a packed run: members as field tuples, then previous-target entries.
_Piece = tuple[list[tuple[Any, ...]], list[tuple[str, frozenset[Unit]]]]


class SpecPacker:
    """Packs one group's assignor runs, each as the difference from the one before, for
    the worker process that did that one (`ResidentMiss` when it did not)."""

    def __init__(self) -> None:
        self.token = os.urandom(8).hex()  # run numbers are this packer's: never mixed up
        self._runs = 0
        # The last run packed, by number, with its spec's mappings and their versions.
        self._base: tuple[int, _Base, _Versions] | None = None
        self._returned: tuple[int, bytes] | None = None  # a run's number and state returned
        self.whole = 0  # runs packed whole (for tests and benchmarks)

    def returned(self, packed: PackedRun, result: CompactResult) -> None:
        """A run came back from its worker, which keeps the state it returned."""
        self._returned = (packed.run, result.state)

    def pack(self, assignor: ServerAssignor, spec: AssignmentSpec, whole: bool = False,
             changes: SpecChanges = NO_SPEC_CHANGES) -> PackedRun:
        """`pack_in_steps` all at once."""
        *_steps, packed = self.pack_in_steps(assignor, spec, whole, changes)
        assert packed is not None
        return packed

    def pack_in_steps(self, assignor: ServerAssignor, spec: AssignmentSpec,
                      whole: bool = False, changes: SpecChanges = NO_SPEC_CHANGES
                      ) -> Iterator[PackedRun | None]:
        """Pack a run against the previous one, or `whole`: for a worker that raised
        ResidentMiss. Yields None after each step (packing whole takes one per piece, so
        the event loop answers heartbeats in between), then the packed run. The spec is
        the run's own and does not change meanwhile; one packer packs one run at a time.
        `changes`: what the core says changed since its spec before (used where that
        spec is the one this packer packed last)."""
        packed = yield from self._packing(assignor, spec, whole, changes)
        yield packed

    def _packing(self, assignor: ServerAssignor, spec: AssignmentSpec, whole: bool,
                 changes: SpecChanges) -> Generator[None, None, PackedRun]:
        base, self._base = (None if whole else self._base), None  # none if this fails
        self._runs += 1
        members, previous, connectors = spec.members, spec.previous_target, spec.connectors
        if base is None:
            self.whole += 1
            pieces = yield from _whole_pieces(members, previous)
            gone_members: list[str] = []
            gone_previous: list[str] = []
            connectors_sent: Mapping[str, int] = connectors
            gone_connectors: list[str] = []
        else:
            last_members, last_previous, last_connectors = base[1]
            members_version, previous_version, connectors_version = base[2]
            changed_members, gone_members = _differences(
                members, last_members, members_version, changes.members)
            changed_previous, gone_previous = _differences(
                previous, last_previous, previous_version, changes.previous_target)
            piece: _Piece = ([_member_fields(key, m) for key, m in changed_members.items()],
                             list(changed_previous.items()))
            pieces = [pickle.dumps(piece, PROTOCOL)]
            # (Task counts are compared by value: the same count may be another int.)
            connectors_sent, gone_connectors = _differences(
                connectors, last_connectors, connectors_version, changes.connectors,
                by_value=True)
        # The assignor's state (50 kB for `balanced` at 1,000 members) mostly is what the
        # worker's last run returned: then it stays there.
        state: bytes | None = spec.previous_state
        if base is not None and self._returned is not None and self._returned[0] == base[0] \
                and state is self._returned[1]:
            state = None
        header = pickle.dumps(
            (assignor, spec.group_id, connectors_sent, gone_members, gone_previous,
             gone_connectors, state, spec.now_ms, spec.scheduled_rebalance_max_delay_ms),
            PROTOCOL)
        self._base = (self._runs, (members, previous, connectors),
                      (_version(changes.members), _version(changes.previous_target),
                       _version(changes.connectors)))
        return PackedRun(header, tuple(pieces), self.token, self._runs,
                         None if base is None else base[0])


def _member_fields(key: str, member: MemberSpec) -> tuple[Any, ...]:
    return (key, member.member_id, member.instance_id, member.worker_url,
            member.current_target, member.metadata)


_ABSENT = object()


def _version(change: MappingChange | None) -> int | None:
    return None if change is None else change.version


def _differences(now: Mapping[str, Any], last: Mapping[str, Any], last_version: int | None,
                 change: MappingChange | None, by_value: bool = False
                 ) -> tuple[dict[str, Any], list[str]]:
    """The entries of `now` that `last` lacks or holds another object for (another
    value, `by_value`), and the keys of `last` that `now` lacks: from the keys `change`
    names when it is told against `last` (by version), else by going over both."""
    if change is not None and last_version is not None and change.base == last_version:
        if change.version == last_version:  # the very mapping the last run got
            return {}, []
        keys = sorted(change.keys)  # (a worker adds new keys in this order)
        changed = {key: now[key] for key in keys if key in now
                   and (last.get(key, _ABSENT) != now[key] if by_value
                        else last.get(key, _ABSENT) is not now[key])}
        return changed, [key for key in keys if key not in now and key in last]
    if by_value:
        changed = {key: value for key, value in now.items() if last.get(key, _ABSENT) != value}
    else:
        changed = {key: value for key, value in now.items()
                   if last.get(key, _ABSENT) is not value}
    return changed, _gone(now, last, changed)


def _gone(now: Mapping[str, Any], last: Mapping[str, Any], changed: Mapping[str, Any]
          ) -> list[str]:
    """The keys of `last` that `now` lacks, given the entries of `now` that differ from
    `last`'s: without a scan when those account for every key."""
    added = sum(1 for key in changed if key not in last)
    if len(last) == len(now) - added:
        return []
    return [key for key in last if key not in now]


def _whole_pieces(members: Mapping[str, MemberSpec],
                  previous: Mapping[str, frozenset[Unit]]) -> Generator[None, None, list[bytes]]:
    """Every member and previous-target entry, pickled in pieces. A member's previous
    target goes in the member's piece: it is mostly the same set as its current target,
    which pickle then writes once."""
    pieces: list[bytes] = []
    piece: _Piece = ([], [])
    units = 0

    def flush() -> None:
        nonlocal piece, units
        pieces.append(pickle.dumps(piece, PROTOCOL))
        piece, units = ([], []), 0

    for key, member in members.items():
        piece[0].append(_member_fields(key, member))
        units += len(member.current_target)
        before = previous.get(key)
        if before is not None:
            piece[1].append((key, before))
            if before is not member.current_target:
                units += len(before)
        if units >= PACK_STEP_UNITS or len(piece[0]) >= PACK_STEP_MEMBERS:
            flush()
            yield
    for key, before in previous.items():
        if key not in members:  # a departed member's part
            piece[1].append((key, before))
            units += len(before)
            if units >= PACK_STEP_UNITS or len(piece[1]) >= PACK_STEP_MEMBERS:
                flush()
                yield
    if piece[0] or piece[1] or not pieces:
        flush()
    return pieces


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

    run: int
    members: dict[str, MemberSpec]
    previous: dict[str, frozenset[Unit]]
    connectors: dict[str, int]
    check: TargetCheck
    units: int
    returned: bytes | None = None  # the state the assignor returned in that run


# In each worker process: by packer token, least recently used first.
_RESIDENT: dict[str, _Resident] = {}


def _unpack(packed: PackedRun) -> tuple[ServerAssignor, AssignmentSpec, _Resident]:
    resident = _RESIDENT.pop(packed.packer, None)
    if packed.base is not None and (resident is None or resident.run != packed.base):
        raise ResidentMiss(f"run {packed.base} of packer {packed.packer} is not here")
    (assignor, group_id, connectors_sent, gone_members, gone_previous, gone_connectors,
     previous_state, now_ms, delay_ms) = pickle.loads(packed.header)
    if previous_state is None:  # the state this worker's run `base` returned
        if resident is None or resident.returned is None:
            raise ResidentMiss(f"the state of run {packed.base} of packer {packed.packer} "
                               "is not here")
        previous_state = resident.returned
    if packed.base is None or resident is None:
        members: dict[str, MemberSpec] = {}
        previous: dict[str, frozenset[Unit]] = {}
        connectors: dict[str, int] = {}
    else:  # copies: the spec handed to the assignor is this run's alone
        members, previous = dict(resident.members), dict(resident.previous)
        connectors = dict(resident.connectors)
        for key in gone_members:
            del members[key]
        for key in gone_previous:
            del previous[key]
        for name in gone_connectors:
            del connectors[name]
    connectors.update(connectors_sent)
    for piece in packed.pieces:
        member_fields, previous_entries = pickle.loads(piece)
        for key, member_id, instance_id, worker_url, target, metadata in member_fields:
            members[key] = MemberSpec(member_id, instance_id, worker_url, target, metadata)
        previous.update(previous_entries)
    spec = AssignmentSpec(
        group_id=group_id,
        members=members,
        connectors=connectors,
        previous_target=previous,
        previous_state=previous_state,
        now_ms=now_ms,
        scheduled_rebalance_max_delay_ms=delay_ms,
    )
    kept = _Resident(packed.run, members, previous, connectors,
                     resident.check if resident is not None else TargetCheck(),
                     sum(map(len, previous.values())))
    _RESIDENT[packed.packer] = kept
    total = sum(other.units for other in _RESIDENT.values())
    while total > RESIDENT_UNITS_MAX and len(_RESIDENT) > 1:
        total -= _RESIDENT.pop(next(iter(_RESIDENT))).units
    return assignor, spec, kept


def unpack(packed: PackedRun) -> tuple[ServerAssignor, AssignmentSpec]:
    """The assignor and spec of a packed run (raises ResidentMiss, see the module)."""
    assignor, spec, _resident = _unpack(packed)
    return assignor, spec


def compact(spec: AssignmentSpec, result: AssignmentResult,
            check: TargetCheck | None = None) -> CompactResult:
    """The result as the members whose target changed, checked (by `check` when given:
    the one that passed the group's previous result)."""
    previous, members = spec.previous_target, spec.members
    target = {member_id: frozenset(units) for member_id, units in result.target.items()}
    changed: dict[str, frozenset[Unit]] = {}
    unchanged: list[str] = []
    listed = members_listed = 0
    for member_id, units in target.items():
        listed += len(units)
        members_listed += member_id in members
        before = previous.get(member_id)
        if before is units or before == units:
            unchanged.append(member_id)
        else:
            changed[member_id] = units
    verified = (check if check is not None else TargetCheck()).passes(spec.connectors, target)
    every_member = members_listed == len(target) == len(members)
    outsiders = tuple(member_id for member_id in previous if member_id not in members)
    return CompactResult(changed, None if every_member else tuple(unchanged), result.state,
                         result.rerun_at_ms, dict(result.extra), verified, listed, outsiders)


def run_packed(packed: PackedRun) -> CompactResult:
    """Executed in a worker process: unpack, assign, check and compact."""
    assignor, spec, resident = _unpack(packed)
    result = compact(spec, assignor.assign(spec), resident.check)
    resident.returned = result.state
    return result
