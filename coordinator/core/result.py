"""What a core operation hands back to the shell: a response, records, timers, events."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

R = TypeVar("R")

# A timer is named by (kind, group id, member id or ""); arming a key again moves it.
TimerKey = tuple[str, str, str]
SESSION_TIMER = "session"  # a member heard nothing from within its session timeout
REVOCATION_TIMER = "revocation"  # a member has not released units within its rebalance timeout
ASSIGNOR_TIMER = "assignor"  # the chosen worker has not installed an assignment in time
ASSIGNMENT_TIMER = "assignment"  # the assignment interval ends (or an assignor asked to re-run)


@dataclass(frozen=True, slots=True)
class Record:
    """One log record: a key entity and a value entity, or None for a tombstone."""

    key: Any
    value: Any | None


@dataclass(frozen=True, slots=True)
class TimerSet:
    key: TimerKey
    deadline_ms: int


@dataclass(frozen=True, slots=True)
class TimerCancel:
    key: TimerKey


TimerOp = TimerSet | TimerCancel


@dataclass(frozen=True, slots=True)
class Event:
    """A state change worth one log line (join, leave, fence, new target, ...)."""

    name: str
    group_id: str
    member_id: str | None = None
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class AssignorRun:
    """A server-side assignor run handed to the worker pool (seed 004's offload).

    The shell runs `assignors[assignor].assign(spec)` off the event loop, bounded by the
    run time limit, and hands the outcome to `GroupCoordinator.complete_assignor_run`.
    """

    run_id: int
    group_id: str
    assignor: str
    group_epoch: int
    started_ms: int
    spec: Any


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
