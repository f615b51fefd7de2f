"""The server-side assignor interface: a pure function from a spec to a target.

Assignors run inline or in worker processes (trio-parallel), so a spec and a result must
pickle and an assignor must not touch coordinator state: a spec's mappings are the
coordinator's own, shared between runs while they do not change, and are read only.
Third-party assignors register under the ``connect_coordinator.assignors`` entry-point
group (value: a class or factory returning an object with ``name`` and ``assign``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from coordinator.units import Unit


@dataclass(frozen=True, slots=True)
class MemberSpec:
    member_id: str
    instance_id: str | None
    worker_url: str
    current_target: frozenset[Unit]
    metadata: bytes = b""


@dataclass(frozen=True, slots=True)
class AssignmentSpec:
    group_id: str
    members: Mapping[str, MemberSpec]
    # connector name -> task count (tasks are 0..n-1; the connector is a unit of its own)
    connectors: Mapping[str, int]
    # the group's previous target, member id -> units (members may have left since)
    previous_target: Mapping[str, frozenset[Unit]]
    # opaque state the same assignor returned last time (b"" on the first run)
    previous_state: bytes
    now_ms: int
    scheduled_rebalance_max_delay_ms: int = 300_000


@dataclass(frozen=True, slots=True)
class AssignmentResult:
    # member id -> units; members absent from the mapping get nothing
    target: Mapping[str, frozenset[Unit]]
    # opaque state persisted with the target and handed back as previous_state
    state: bytes = b""
    # ask the coordinator to run the assignor again at this time (e.g. a delay ends)
    rerun_at_ms: int | None = None
    extra: Mapping[str, object] = field(default_factory=dict)


class ServerAssignor(Protocol):
    name: str

    def assign(self, spec: AssignmentSpec) -> AssignmentResult: ...
