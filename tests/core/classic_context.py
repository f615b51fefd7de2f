"""Drives the classic engine through the core: requests, a fake clock, timers, parked
requests, the record log and restarts (replaying that log into a fresh core)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from coordinator.assignors import load_assignors
from coordinator.config import ServerConfig
from coordinator.core.classic.engine import (
    JOIN,
    SYNC,
    HeartbeatRequest,
    JoinAnswer,
    JoinRequest,
    LeaveAnswer,
    LeaveRequest,
    Parked,
    SyncAnswer,
    SyncRequest,
)
from coordinator.core.classic.state import ClassicGroup
from coordinator.core.coordinator import GroupCoordinator
from coordinator.core.result import Record, Result, TimerClearGroup, TimerKey, TimerOp, TimerSet
from protocol.records import decode_record, encode_key, encode_value

PROTOCOLS = (("sessioned", b"meta-2"), ("compatible", b"meta-1"), ("default", b"meta-0"))


class ClassicContext:
    def __init__(self, **config: Any) -> None:
        config.setdefault("initial_rebalance_delay_ms", 0)
        config.setdefault("classic_min_session_timeout_ms", 1_000)
        self.config = ServerConfig(**config)
        self.now = 0
        self.log: list[Record] = []
        self.events: list[Any] = []  # every change's events, in order
        self.timers: dict[TimerKey, int] = {}
        self.parked: set[tuple[str, str, str]] = set()
        self.released: dict[tuple[str, str, str], Any] = {}
        self._ids = itertools.count(1)
        self.core = self._new_core()

    def _new_core(self) -> GroupCoordinator:
        core = GroupCoordinator(self.config, load_assignors(self.config.server_assignors))
        core.classic.new_member_id = lambda client_id: f"{client_id or 'm'}-{next(self._ids)}"
        return core

    @property
    def engine(self) -> Any:
        return self.core.classic

    def group(self, group_id: str = "g") -> ClassicGroup:
        group: ClassicGroup = self.engine.store.groups[group_id]
        return group

    # ------------------------------------------------------------------ plumbing
    def apply(self, result: Result[Any]) -> Any:
        self.events.extend(result.events)
        # Records go through the codec, as they would to the log.
        for record in result.records:
            key, value = decode_record(encode_key(record.key), encode_value(record.value))
            self.log.append(Record(key, value))
        self.apply_timers(result.timers)
        response = result.response
        if isinstance(response, Parked):  # parked before the change's releases, as the shell
            # An answer released to an earlier request of the same member that its worker
            # never took (it had given up on it) is not this request's answer.
            self.released.pop(response.key, None)
            self.parked.add(response.key)
        for key, answer in result.releases:
            if key in self.parked:
                self.parked.discard(key)
                self.released[key] = answer
        if isinstance(response, Parked) and response.key in self.released:
            return self.released.pop(response.key)  # released by its own change
        return response

    def apply_timers(self, operations: Sequence[TimerOp]) -> None:
        for operation in operations:
            if isinstance(operation, TimerSet):
                self.timers[operation.key] = operation.deadline_ms
            elif isinstance(operation, TimerClearGroup):
                for key in [key for key in self.timers if key[1] == operation.group_id]:
                    del self.timers[key]
            else:
                self.timers.pop(operation.key, None)

    def take(self, kind: str, member_id: str, group_id: str = "g") -> Any:
        """The answer a parked request got (None if it is still parked)."""
        return self.released.pop((kind, group_id, member_id), None)

    def advance(self, ms: int) -> None:
        """Move the clock, firing due timers in deadline order."""
        target = self.now + ms
        while True:
            due = [(deadline, key) for key, deadline in self.timers.items() if deadline <= target]
            if not due:
                break
            deadline, key = min(due)
            del self.timers[key]
            self.now = max(self.now, deadline)
            self.apply(self.core.on_timer(key, self.now))
        self.now = target

    def restart(self) -> None:
        """A fresh core that replays the log; parked requests are gone with the old one."""
        self.core = self._new_core()
        for record in self.log:
            self.core.replay(record)
        self.timers = {}
        self.parked.clear()
        self.released.clear()
        for operation in self.core.timers_after_load(self.now):
            if isinstance(operation, TimerClearGroup):  # (nothing armed yet)
                continue
            assert isinstance(operation, TimerSet)
            self.timers[operation.key] = operation.deadline_ms

    # ------------------------------------------------------------------ requests
    def join(self, member_id: str = "", group_id: str = "g", *, version: int = 9,
             protocols: tuple[tuple[str, bytes], ...] = PROTOCOLS,
             instance_id: str | None = None, session_ms: int = 10_000,
             rebalance_ms: int = 30_000, protocol_type: str = "connect",
             client_id: str = "w") -> JoinAnswer | Parked:
        request = JoinRequest(group_id, member_id, protocol_type, protocols, session_ms,
                              rebalance_ms, instance_id, client_id, "127.0.0.1",
                              require_known_member_id=version >= 4,
                              skip_assignment_supported=version >= 9)
        answer: JoinAnswer | Parked = self.apply(self.engine.join(request, self.now))
        if isinstance(answer, JoinAnswer) and answer.error == 0:  # also kept for `take`
            self.released[(JOIN, group_id, answer.member_id)] = answer
        return answer

    def new_member(self, group_id: str = "g", **kwargs: Any) -> str:
        """MEMBER_ID_REQUIRED, then the join with the given id (parked or answered)."""
        first = self.join("", group_id, **kwargs)
        assert isinstance(first, JoinAnswer) and first.error == 79, first
        self.join(first.member_id, group_id, **kwargs)
        return first.member_id

    def sync(self, member_id: str, generation: int, group_id: str = "g",
             assignments: dict[str, bytes] | None = None,
             instance_id: str | None = None) -> SyncAnswer | Parked:
        request = SyncRequest(group_id, member_id, generation,
                              tuple((assignments or {}).items()), instance_id)
        answer: SyncAnswer | Parked = self.apply(self.engine.sync(request, self.now))
        return answer

    def heartbeat(self, member_id: str, generation: int, group_id: str = "g",
                  instance_id: str | None = None) -> int:
        answer = self.apply(self.engine.heartbeat(
            HeartbeatRequest(group_id, member_id, generation, instance_id), self.now))
        return int(answer.error)

    def leave(self, *members: tuple[str, str | None], group_id: str = "g") -> LeaveAnswer:
        answer: LeaveAnswer = self.apply(self.engine.leave(LeaveRequest(group_id, members),
                                                           self.now))
        return answer


__all__ = ["JOIN", "SYNC", "PROTOCOLS", "ClassicContext"]
