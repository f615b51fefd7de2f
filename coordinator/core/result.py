"""What a core operation hands back to the shell: a response, records, timers, events."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, Generic, NamedTuple, TypeVar

from coordinator.assignors.api import AssignmentResult
from coordinator.units import Unit

R = TypeVar("R")

# A timer is named by (kind, group id, member id or ""); arming a key again moves it.
TimerKey = tuple[str, str, str]
SESSION_TIMER = "session"  # a member heard nothing from within its session timeout
REVOCATION_TIMER = "revocation"  # a member has not released units within its rebalance timeout
ASSIGNOR_TIMER = "assignor"  # the chosen worker has not installed an assignment in time
ASSIGNMENT_TIMER = "assignment"  # the assignment interval ends (or an assignor asked to re-run)
EXPIRY_TIMER = "expiry"  # a group with no members and no connectors reaches its retention

# Why the group epoch moved: the `trigger` field of every "group_epoch_bumped" event. A
# closed set, so the shell can count rebalances by trigger without unbounded labels.
TRIGGER_MEMBER_JOINED = "member_joined"  # a new member id joined
TRIGGER_MEMBER_LEFT = "member_left"  # a member left (epoch -1)
TRIGGER_MEMBER_FENCED = "member_fenced"  # a member sent a stale epoch and was removed
TRIGGER_SESSION_TIMEOUT = "session_timeout"  # a member was silent past its session timeout
TRIGGER_REVOCATION_TIMEOUT = "revocation_timeout"  # it did not release units in time
TRIGGER_ADMIN_REMOVAL = "admin_removal"  # static members removed through the admin API
TRIGGER_METADATA_CHANGED = "metadata_changed"  # e.g. a new worker URL, a replaced instance
TRIGGER_ASSIGNORS_CHANGED = "assignors_changed"  # assignor choice, reason or metadata changed
TRIGGER_CONNECTORS_CHANGED = "connectors_changed"  # a connector was added, resized or removed
TRIGGER_DELAYED_REBALANCE = "delayed_rebalance"  # a server assignor's scheduled re-run came due
# A member released units its client-side assignment revoked and gave nobody (Connect's
# classic leader leaves them to a second round, which a classic member's rejoin brings).
TRIGGER_UNITS_RELEASED = "units_released"
REBALANCE_TRIGGERS = (
    TRIGGER_MEMBER_JOINED,
    TRIGGER_MEMBER_LEFT,
    TRIGGER_MEMBER_FENCED,
    TRIGGER_SESSION_TIMEOUT,
    TRIGGER_REVOCATION_TIMEOUT,
    TRIGGER_ADMIN_REMOVAL,
    TRIGGER_METADATA_CHANGED,
    TRIGGER_ASSIGNORS_CHANGED,
    TRIGGER_CONNECTORS_CHANGED,
    TRIGGER_DELAYED_REBALANCE,
    TRIGGER_UNITS_RELEASED,
)

# Where a target assignment was computed: the `mode` field of "target_installed" events.
SERVER_MODE = "server"  # by a server-side assignor (inline or in the worker pool)
CLIENT_MODE = "client"  # by the chosen worker, through Prepare/Install
ASSIGNMENT_MODES = (SERVER_MODE, CLIENT_MODE)


@dataclass(frozen=True, slots=True)
class Record:
    """One log record: a key entity and a value entity, or None for a tombstone.

    `encoded`: the value's bytes, when whoever built the record had them at hand for less
    than encoding it (the connectors record of a resize); exactly `encode_value(value)`.
    `model`: see below; replay at start-up (records decoded from the log) has none.
    """

    key: Any
    value: Any | None
    encoded: bytes | None = field(default=None, compare=False, repr=False)
    # The model object the value was built from (a target part), when the builder had it:
    # replaying the record takes it instead of converting the value back. Never written.
    model: Any = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class TimerSet:
    key: TimerKey
    deadline_ms: int


@dataclass(frozen=True, slots=True)
class TimerCancel:
    key: TimerKey


@dataclass(frozen=True, slots=True)
class TimerClearGroup:
    """Cancel every timer of a group: what precedes its timers derived anew (`reschedule`)."""

    group_id: str


TimerOp = TimerSet | TimerCancel | TimerClearGroup


@dataclass(frozen=True, slots=True)
class Event:
    """A state change worth one log line (join, leave, fence, new target, ...).

    Some events carry what the shell counts: "group_epoch_bumped" has a `trigger` field
    (one of REBALANCE_TRIGGERS) and "target_installed" a `mode` field (ASSIGNMENT_MODES).
    """

    name: str
    group_id: str
    member_id: str | None = None
    fields: dict[str, Any] = field(default_factory=dict)


class MappingChange(NamedTuple):
    """A spec's mapping told against the same group's spec before, by version numbers the
    core hands out (`SpecCache`): this one is version `version`, made from version `base`
    with at most `keys` added, replaced or removed (`version == base`: the same mapping).
    A packer uses `keys` only when `base` is the version it packed last."""

    base: int
    version: int
    keys: Collection[str]


@dataclass(frozen=True, slots=True)
class SpecChanges:
    """How a run's spec differs from the one the core built before it for the group, per
    mapping; None where the core does not know (then the packer compares every entry)."""

    members: MappingChange | None = None
    previous_target: MappingChange | None = None
    connectors: MappingChange | None = None


NO_SPEC_CHANGES = SpecChanges()


@dataclass(frozen=True, slots=True)
class AssignorRun:
    """A server-side assignor run handed to the worker pool (offloaded).

    The shell runs `assignors[assignor].assign(spec)` off the event loop, bounded by the
    run time limit, and hands the outcome to `GroupCoordinator.complete_assignor_run`.
    """

    run_id: int
    group_id: str
    assignor: str
    group_epoch: int
    started_ms: int
    spec: Any
    # The group's change counters when the spec was taken: a run that lands on a group
    # whose members, metadata and target are still those of its spec applies in time
    # proportional to what it changed (`GroupCoordinator.complete_assignor_run`).
    metadata_changes: int = -1
    target_changes: int = -1
    # What changed since the group's previous spec: a run packed for the pool process that
    # holds that one is packed in time proportional to the change (`SpecPacker`).
    changes: SpecChanges = NO_SPEC_CHANGES


@dataclass(slots=True)
class Result(Generic[R]):
    response: R
    records: list[Record] = field(default_factory=list)
    timers: list[TimerOp] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    # Records that restore the state from before this change, newest first (not logged).
    undo: list[Record] = field(default_factory=list)
    # Server-side assignor runs to start in the worker pool.
    jobs: list[AssignorRun] = field(default_factory=list)
    # Parked requests to answer once the records are durable: (waiter key, answer). A
    # classic group's JoinGroup and SyncGroup wait for other members; the shell holds
    # them (`coordinator/core/classic/engine.py`).
    releases: list[tuple[Any, Any]] = field(default_factory=list)

    def touched_groups(self) -> set[str]:
        """The groups this change wrote records for, set timers of or started runs for:
        those to `reschedule` if it is rolled back."""
        touched = {record.key.group_id for record in self.records}
        touched.update(run.group_id for run in self.jobs)
        for operation in self.timers:
            touched.add(operation.group_id if isinstance(operation, TimerClearGroup)
                        else operation.key[1])
        return touched


@dataclass(frozen=True, slots=True)
class CompactResult:
    """An AssignmentResult as the worker sends it back."""

    changed: dict[str, frozenset[Unit]]  # members whose target differs from the previous
    # Members whose target is exactly their previous one; None when they are all the
    # spec's members not in `changed` (the result names every member and no one else).
    unchanged: tuple[str, ...] | None
    state: bytes = b""
    rerun_at_ms: int | None = None
    extra: dict[str, object] = field(default_factory=dict)
    # Every unit is one the spec's connectors define, and none is given to two members.
    verified: bool = False
    assigned: int = 0  # units given, all members together
    # The keys of the spec's previous target that are not its members (a departed member's
    # part): a landing on the group as the spec saw it drops those among its target's
    # parts, without going over them all. None: not known.
    outsiders: tuple[str, ...] | None = None


def unchanged_members(spec: Any, result: CompactResult) -> list[str] | tuple[str, ...]:
    """The members a compact result leaves with the target they had."""
    if result.unchanged is not None:
        return result.unchanged
    changed = result.changed
    return [member_id for member_id in spec.members if member_id not in changed]


def expand(spec: Any, result: CompactResult) -> AssignmentResult:
    """The full result again, with the spec's own set objects for unchanged members."""
    previous = spec.previous_target
    if result.unchanged is None and result.outsiders is not None:
        # Every member named: the previous target (a copy, in C) less the outsiders.
        target: dict[str, frozenset[Unit]] = dict(previous)
        for member_id in result.outsiders:
            del target[member_id]
    else:
        target = {member_id: previous[member_id]
                  for member_id in unchanged_members(spec, result)}
    target.update(result.changed)
    return AssignmentResult(target, result.state, result.rerun_at_ms, result.extra)
