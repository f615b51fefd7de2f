"""`balanced` (the default server assignor): sticky, balanced per kind, with a delayed rebalance.

Connectors and tasks are balanced separately: every member ends with the floor or the ceiling
of the average of each kind. Units stay where they are whenever balance allows, so a re-run on
a stable group moves nothing and a joining worker only takes what it needs to reach its share.

Like Connect's incremental cooperative assignor, the units of a worker that left are held back
(unassigned) for ``scheduled_rebalance_max_delay_ms`` after the run that first noticed the
departure, so a bouncing worker (same instance id, else same worker URL) gets them back. Until
then ``rerun_at_ms`` asks the coordinator to run the assignor again at the earliest deadline.

The bookkeeping travels in the opaque state (msgpack): who the members were (to notice
departures and to recognise returns), the departed workers' held-back units and deadlines, and
the connector task counts of that run. The last one is what keeps a re-run cheap at 50,000
units: a target the coordinator installed only holds units that existed then, so only the
connectors that shrank or vanished since need checking, and only new tasks need placing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import repeat

import msgspec

from coordinator.assignors.api import AssignmentResult, AssignmentSpec, MemberSpec
from coordinator.units import CONNECTOR, Unit

STATE_VERSION = 1
# the record that holds units of departed workers we cannot tell apart (see _attribute_orphans)
UNKNOWN_DEPARTED = ""
NO_MATCH, URL_MATCH, STRONG_MATCH = 0, 1, 2


class _RosterEntry(msgspec.Struct, array_like=True):
    instance_id: str | None
    worker_url: str
    # how many units the member was given; a different count means the target came from
    # elsewhere and must be checked unit by unit
    size: int


class _DepartedEntry(msgspec.Struct, array_like=True):
    member_id: str
    instance_id: str | None
    worker_url: str
    units: list[tuple[str, int]]
    deadline_ms: int


class _State(msgspec.Struct, array_like=True):
    version: int
    roster: dict[str, _RosterEntry]
    connectors: dict[str, int]
    departed: list[_DepartedEntry]


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(_State)


def _decode_state(raw: bytes) -> _State | None:
    """The state of the last run, or None when there is none or it cannot be read."""
    if not raw:
        return None
    try:
        state = _DECODER.decode(raw)
    except (msgspec.DecodeError, ValueError, TypeError, RecursionError):
        return None
    return state if state.version == STATE_VERSION else None


@dataclass(slots=True)
class _Departed:
    """A worker that left with units we hold back for it until ``deadline_ms``."""

    member_id: str
    instance_id: str | None
    worker_url: str
    units: frozenset[Unit]
    deadline_ms: int

    def match_strength(self, member: MemberSpec) -> int:
        """Is ``member`` this worker coming back? Instance id first, else the worker URL.

        2: the same member id or instance id; 1: the same URL (and no instance ids that
        differ); 0: another worker.
        """
        if member.member_id == self.member_id:
            return STRONG_MATCH
        if member.instance_id is not None and self.instance_id is not None:
            return STRONG_MATCH if member.instance_id == self.instance_id else NO_MATCH
        if self.worker_url and member.worker_url == self.worker_url:
            return URL_MATCH
        return NO_MATCH


class _Universe:
    """The units that exist now, and what changed since the connectors the state remembers."""

    def __init__(self, connectors: Mapping[str, int], remembered: Mapping[str, int] | None):
        self.connectors = connectors
        self.total = len(connectors) + sum(connectors.values())
        self.connector_units = frozenset((name, CONNECTOR) for name in connectors)
        self._all_units: frozenset[Unit] | None = None
        # with no remembered connectors nothing is known: check every unit against all_units
        self.trusted = remembered is not None
        self.vanished: frozenset[Unit] = frozenset()
        self.added: frozenset[Unit] = frozenset()
        if remembered is not None:
            self.vanished, self.added = _connector_changes(remembered, connectors)

    @property
    def all_units(self) -> frozenset[Unit]:
        if self._all_units is None:
            # zip builds the task tuples in C: about twice as fast as a generator at 50k units
            units: list[Unit] = [(name, CONNECTOR) for name in self.connectors]
            for name, count in self.connectors.items():
                units.extend(zip(repeat(name, count), range(count), strict=True))
            self._all_units = frozenset(units)
        return self._all_units

    def existing(self, units: frozenset[Unit], checked: bool = True) -> frozenset[Unit]:
        """``units`` without those that no longer exist; the same object when none vanished.

        ``checked`` says the set was valid when the remembered connectors were (a target we
        computed), so only vanished units can be in it.
        """
        if not units:
            return units
        if self.trusted and checked:
            if self.vanished and not units.isdisjoint(self.vanished):
                return units - self.vanished
            return units
        if units <= self.all_units:
            return units
        return units & self.all_units


def _connector_changes(
    before: Mapping[str, int], after: Mapping[str, int]
) -> tuple[frozenset[Unit], frozenset[Unit]]:
    """Units that vanished and units that were added between two connector maps."""
    vanished: list[Unit] = []
    added: list[Unit] = []
    for name, count_before in before.items():
        count_after = after.get(name)
        if count_after is None:
            vanished.append((name, CONNECTOR))
            vanished.extend((name, task) for task in range(count_before))
        elif count_after < count_before:
            vanished.extend((name, task) for task in range(count_after, count_before))
    for name, count_after in after.items():
        if name not in before:
            added.append((name, CONNECTOR))
            added.extend((name, task) for task in range(count_after))
        elif count_after > before[name]:
            added.extend((name, task) for task in range(before[name], count_after))
    return frozenset(vanished), frozenset(added)


class BalancedAssignor:
    name = "balanced"

    def assign(self, spec: AssignmentSpec) -> AssignmentResult:
        now_ms = spec.now_ms
        delay_ms = max(0, spec.scheduled_rebalance_max_delay_ms)
        state = _decode_state(spec.previous_state)
        universe = _Universe(spec.connectors, state.connectors if state else None)
        roster = state.roster if state else {}
        members = sorted(spec.members)

        # 1. every current member keeps what it holds, as far as it still exists
        holdings: dict[str, frozenset[Unit]] = {}
        all_checked = universe.trusted
        for member_id in members:
            part = spec.previous_target.get(member_id)
            if part is None:
                part = spec.members[member_id].current_target
            known = roster.get(member_id)
            checked = known is not None and known.size == len(part)
            all_checked = all_checked and checked
            holdings[member_id] = universe.existing(part, checked=checked)

        # 2. departures: held-back units of earlier ones, and workers gone since the last run
        departed: dict[str, _Departed] = {}
        # units to hand out now, each with whether it is known valid as of the last run
        released: list[tuple[frozenset[Unit], bool]] = []
        for entry in state.departed if state else ():
            units = frozenset(entry.units)
            if entry.deadline_ms > now_ms:
                departed[entry.member_id] = _Departed(
                    entry.member_id, entry.instance_id, entry.worker_url, units, entry.deadline_ms
                )
            else:
                released.append((units, True))
        handled = {entry.member_id for entry in state.departed} if state else set()
        # with a state, the roster says who left; without one, a target part of a non-member
        gone_ids = set(roster) if state else set(spec.previous_target)
        gone_ids.difference_update(spec.members, handled)
        orphaned_ids: list[str] = []  # left, but the previous target no longer shows their part
        for member_id in sorted(gone_ids):
            known = roster.get(member_id)
            part = spec.previous_target.get(member_id)
            if part is None:
                orphaned_ids.append(member_id)
                part = frozenset()
            part = universe.existing(part, checked=known is not None and known.size == len(part))
            if delay_ms == 0:
                released.append((part, True))
                continue
            departed[member_id] = _Departed(
                member_id,
                known.instance_id if known else None,
                known.worker_url if known else "",
                part,
                now_ms + delay_ms,
            )
        # any other part of a non-member (none of ours) is free
        accounted = gone_ids | handled
        for member_id, part in spec.previous_target.items():
            if member_id not in spec.members and member_id not in accounted:
                released.append((part, False))

        # Parts of the last target this assignor computed, each still the size it gave, are
        # disjoint: unless workers departed, their union (2 ms at 50,000 units) is not built.
        quick = all_checked and not departed and not released
        claimed: set[Unit] = set() if quick else _claim(members, holdings)

        # 3. a returning worker takes back what was held for it; identity matches go first
        # so that a newcomer on the same URL cannot take a returning static member's units
        newcomers = [m for m in members if m not in roster] if departed else []
        for strength in (STRONG_MATCH, URL_MATCH):
            for member_id in newcomers:
                member = spec.members[member_id]
                for record in [departed[d] for d in sorted(departed)
                               if departed[d].match_strength(member) == strength]:
                    del departed[record.member_id]
                    back = universe.existing(record.units) - claimed
                    if back:
                        holdings[member_id] = holdings[member_id] | back
                        claimed.update(back)

        # 4. what is still held back, and what is free to place
        reserved: set[Unit] = set()
        for member_id in list(departed):
            record = departed[member_id]
            record.units = universe.existing(record.units) - claimed
            reserved.update(record.units)
        candidates: set[Unit] = set(universe.added)
        for part, checked in released:
            candidates.update(universe.existing(part, checked))
        candidates.difference_update(claimed, reserved)  # (quick: the new units are in no part)
        held = sum(map(len, holdings.values())) if quick else len(claimed)
        if universe.trusted and held + len(reserved) + len(candidates) == universe.total:
            free = candidates  # the counts prove nothing else is unplaced
        else:
            if quick:
                claimed = _claim(members, holdings)
            free = set(universe.all_units.difference(claimed, reserved))
            orphans = free - candidates
            if orphaned_ids and orphans and delay_ms > 0:
                free -= orphans
                _attribute_orphans(departed, orphaned_ids, frozenset(orphans))
        departed = {m: d for m, d in departed.items() if d.units}

        # 5. balance connectors, then tasks, moving as little as possible
        target = _balance(members, holdings, free, universe.connector_units) if members else {}

        pending = [departed[m] for m in sorted(departed)]
        new_state = _State(
            version=STATE_VERSION,
            roster={
                m: _RosterEntry(spec.members[m].instance_id, spec.members[m].worker_url,
                                len(target[m]))
                for m in members
            },
            connectors=dict(spec.connectors),
            departed=[
                _DepartedEntry(d.member_id, d.instance_id, d.worker_url, sorted(d.units),
                               d.deadline_ms)
                for d in pending
            ],
        )
        return AssignmentResult(
            target=target,
            state=_ENCODER.encode(new_state),
            rerun_at_ms=min((d.deadline_ms for d in pending), default=None),
            extra={"delayed_units": sum(len(d.units) for d in pending)},
        )


def _claim(members: list[str], holdings: dict[str, frozenset[Unit]]) -> set[Unit]:
    """All units the members hold; a unit held twice stays with the first member by id."""
    claimed: set[Unit] = set()
    for part in holdings.values():
        claimed.update(part)
    if len(claimed) == sum(map(len, holdings.values())):
        return claimed  # the common case, found without a per-member overlap test
    claimed.clear()
    for member_id in members:
        part = holdings[member_id]
        if not claimed.isdisjoint(part):
            part = holdings[member_id] = part - claimed
        claimed.update(part)
    return claimed


def _attribute_orphans(
    departed: dict[str, _Departed], orphaned_ids: list[str], orphans: frozenset[Unit]
) -> None:
    """Hold back units whose holder left without its part showing in the previous target.

    With one such worker they are its own; with several they cannot be told apart, so they
    are held back under no identity and handed out when the delay ends.
    """
    if len(orphaned_ids) == 1:
        record = departed[orphaned_ids[0]]
        record.units = record.units | orphans
        return
    deadline_ms = min(departed[m].deadline_ms for m in orphaned_ids)
    shared = departed.get(UNKNOWN_DEPARTED)
    if shared is not None:
        shared.units = shared.units | orphans
    else:
        departed[UNKNOWN_DEPARTED] = _Departed(UNKNOWN_DEPARTED, None, "", orphans, deadline_ms)


def _balance(
    members: list[str],
    holdings: dict[str, frozenset[Unit]],
    free: set[Unit],
    connector_units: frozenset[Unit],
) -> dict[str, frozenset[Unit]]:
    connectors_held = {m: len(holdings[m] & connector_units) for m in members}
    tasks_held = {m: len(holdings[m]) - connectors_held[m] for m in members}
    free_connectors = sorted(u for u in free if u[1] == CONNECTOR)
    free_tasks = sorted(u for u in free if u[1] != CONNECTOR)

    connector_quota = _quotas(members, connectors_held, len(free_connectors), tasks_held)
    # the members that got an extra connector are the last to get an extra task
    task_quota = _quotas(members, tasks_held, len(free_tasks), connector_quota)

    gains: dict[str, list[Unit]] = {}
    losses: dict[str, list[Unit]] = {}
    for held, quota, pool, of_kind in (
        (connectors_held, connector_quota, free_connectors, _connectors_in),
        (tasks_held, task_quota, free_tasks, _tasks_in),
    ):
        for member_id in members:
            surplus = held[member_id] - quota[member_id]
            if surplus > 0:
                # give up the last units in sorted order: deterministic and cheap
                dropped = sorted(of_kind(holdings[member_id], connector_units))[-surplus:]
                losses.setdefault(member_id, []).extend(dropped)
                pool.extend(dropped)
        pool.sort()
        for member_id, unit in zip(_deal_order(members, held, quota), pool, strict=True):
            gains.setdefault(member_id, []).append(unit)

    target: dict[str, frozenset[Unit]] = {}
    for member_id in members:
        part = holdings[member_id]  # unchanged parts keep their frozenset object
        if member_id in losses:
            part = part.difference(losses[member_id])
        if member_id in gains:
            part = part.union(gains[member_id])
        target[member_id] = part
    return target


def _connectors_in(units: frozenset[Unit], connector_units: frozenset[Unit]) -> Iterable[Unit]:
    return units & connector_units


def _tasks_in(units: frozenset[Unit], connector_units: frozenset[Unit]) -> Iterable[Unit]:
    return units - connector_units


def _quotas(
    members: list[str], held: Mapping[str, int], free_count: int, other_kind: Mapping[str, int]
) -> dict[str, int]:
    """How many units of one kind each member ends with: the floor, or one more for some.

    The extra units go first to members already holding more than the floor (they keep it,
    nothing moves), then to the least loaded: least of the other kind, then of this kind,
    then by member id.
    """
    base, extra = divmod(sum(held.values()) + free_count, len(members))
    quotas = dict.fromkeys(members, base)
    if extra:
        ranked = sorted(members, key=lambda m: (held[m] <= base, other_kind[m], held[m], m))
        for member_id in ranked[:extra]:
            quotas[member_id] = base + 1
    return quotas


def _deal_order(members: list[str], held: Mapping[str, int], quota: Mapping[str, int]) -> list[str]:
    """Who receives the sorted pool's units in turn: round-robin, the least loaded first.

    Dealing round-robin spreads one connector's tasks over several members.
    """
    needy = sorted(
        (held[m], m, quota[m] - held[m]) for m in members if quota[m] > held[m]
    )
    order: list[str] = []
    for round_number in range(max((need for _, _, need in needy), default=0)):
        order.extend(m for _, m, need in needy if need > round_number)
    return order
