"""Connect's client-side assignors, run by the worker the coordinator chooses.

The chosen worker gets COMPUTE_ASSIGNMENT, calls Prepare, and hands the response to the
assignor named in it; the assignor returns an :class:`AssignmentPlan` (member id -> units,
metadata version and bytes) which the worker installs. The computations are pure functions
(:func:`eager_assign`, :func:`incremental_cooperative_assign`); the classes around them add
what a worker advertises in its heartbeat and, for the incremental cooperative assignor, the
memory Connect keeps in the leader between rebalances: which departed workers' units are
held back, and until when.

Delayed rebalance (Connect's incremental cooperative assignor): when a worker that held units is
gone, its units are left unassigned for ``scheduled_rebalance_max_delay_ms`` so that it can
come back (same worker url) and take them again. Nothing else would make the coordinator
run the assignor again when the delay ends, so the assignor changes the ``Reason`` of the
ClientAssignor its worker advertises; the coordinator treats that as a metadata change and
asks for a new assignment, in which the held-back units are handed out.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from coordinator.connect_protocol import (
    COMPATIBLE_VERSION,
    EAGER_VERSION,
    SESSIONED_VERSION,
    ConnectAssignment,
    ConnectProtocolError,
    WorkerMetadata,
    decode_worker_metadata,
    encode_assignment,
    encode_worker_metadata,
)
from coordinator.units import CONNECTOR, Unit, split_units
from protocol.messages import (
    ConnectGroupInstallAssignmentRequest,
    ConnectGroupPrepareAssignmentResponse,
)
from protocol.messages.common import ConnectorsAndTasks, ConnectorTaskId
from protocol.messages.connect_group_heartbeat_request import ClientAssignor
from protocol.messages.connect_group_install_assignment_request import MemberAssignment

INCREMENTAL_COOPERATIVE = "incremental-cooperative"
EAGER = "eager"
DEFAULT_SCHEDULED_REBALANCE_MAX_DELAY_MS = 300_000
ASSIGNMENT_FAILED = 1  # Install's Error when the assignor could not compute an assignment
# Reason 0: nothing asked. Each delayed-rebalance request moves to the next value in 1..127,
# so that consecutive requests always differ from what the coordinator last saw.
REASON_NONE = 0
MAX_REASON = 127

EMPTY: frozenset[Unit] = frozenset()


# ------------------------------------------------------------------------------ wire helpers


def units_from_wire(value: ConnectorsAndTasks) -> frozenset[Unit]:
    units: set[Unit] = {(name, CONNECTOR) for name in value.connectors}
    units.update((task.connector, task.task) for task in value.tasks)
    return frozenset(units)


def units_to_wire(units: Iterable[Unit]) -> ConnectorsAndTasks:
    connectors, tasks = split_units(units)
    return ConnectorsAndTasks(
        connectors=tuple(connectors),
        tasks=tuple(ConnectorTaskId(connector=name, task=task) for name, task in tasks),
    )


# ------------------------------------------------------------------------------ inputs/outputs


@dataclass(frozen=True, slots=True)
class GroupMember:
    """One member as the Prepare response shows it."""

    member_id: str
    worker_url: str
    instance_id: str | None
    version: int
    reason: int
    metadata: bytes
    target: frozenset[Unit]

    @property
    def config_offset(self) -> int:
        """The config offset in the member's Connect metadata (0 if it sent none we can read)."""
        try:
            return decode_worker_metadata(self.metadata).config_offset
        except ConnectProtocolError:
            return 0


@dataclass(frozen=True, slots=True)
class GroupView:
    """The assignor's input: a Prepare response in plain Python values."""

    group_epoch: int
    assignor_name: str
    units: frozenset[Unit]
    members: tuple[GroupMember, ...]  # sorted by member id

    @classmethod
    def from_prepare(cls, response: ConnectGroupPrepareAssignmentResponse) -> GroupView:
        members = tuple(sorted(
            (GroupMember(
                member_id=m.member_id,
                worker_url=m.worker_url,
                instance_id=m.instance_id,
                version=m.assignor.version,
                reason=m.assignor.reason,
                metadata=m.assignor.metadata,
                target=units_from_wire(m.target),
            ) for m in response.members),
            key=lambda m: m.member_id,
        ))
        return cls(response.group_epoch, response.assignor_name,
                   units_from_wire(response.connectors_and_tasks), members)


@dataclass(frozen=True, slots=True)
class PlannedMember:
    units: frozenset[Unit]
    version: int
    metadata: bytes


@dataclass(frozen=True, slots=True)
class AssignmentPlan:
    """What the chosen worker installs. `memory` is what the assignor keeps if it lands."""

    group_epoch: int
    members: Mapping[str, PlannedMember]
    error: int = 0
    memory: object = None

    def install_request(self, group_id: str, member_id: str,
                        member_epoch: int) -> ConnectGroupInstallAssignmentRequest:
        return ConnectGroupInstallAssignmentRequest(
            group_id=group_id,
            member_id=member_id,
            member_epoch=member_epoch,
            group_epoch=self.group_epoch,
            error=self.error,
            members=tuple(
                MemberAssignment(member_id=mid, assigned=units_to_wire(part.units),
                                 version=part.version, metadata=part.metadata)
                for mid, part in sorted(self.members.items())
            ),
        )


@dataclass(frozen=True, slots=True)
class Leader:
    """The worker running the assignor, as Connect names it in every assignment."""

    member_id: str
    url: str


class ClientSideAssignor(Protocol):
    """What a worker needs from a client-side assignor."""

    name: str
    minimum_version: int
    maximum_version: int

    def advertised(self, worker_url: str, now_ms: int) -> ClientAssignor:
        """The ClientAssignors entry for the next heartbeat (may change over time)."""
        ...

    def wake_at_ms(self) -> int | None:
        """When `advertised` will next change on its own, or None."""
        ...

    def assign(self, view: GroupView, now_ms: int, leader: Leader) -> AssignmentPlan: ...

    def installed(self, plan: AssignmentPlan) -> None:
        """The coordinator accepted `plan`: keep its memory."""
        ...


def _common_version(view: GroupView, low: int, high: int) -> int:
    """The newest metadata version every member speaks (the coordinator chose us because our
    range covers everyone's, so clamping into it is safe)."""
    versions = [m.version for m in view.members if low <= m.version <= high]
    return min(versions) if versions else high


# ------------------------------------------------------------------------------ eager


def eager_assign(view: GroupView) -> dict[str, frozenset[Unit]]:
    """Connect's eager assignor: every unit re-dealt round-robin over the members sorted by
    id, connectors first, then tasks, one rotation carrying on from connectors to tasks."""
    member_ids = [m.member_id for m in view.members]
    if not member_ids:
        return {}
    dealt: dict[str, set[Unit]] = {mid: set() for mid in member_ids}
    connectors, tasks = split_units(view.units)
    ordered = [(name, CONNECTOR) for name in connectors] + list(tasks)
    for index, unit in enumerate(ordered):
        dealt[member_ids[index % len(member_ids)]].add(unit)
    return {mid: frozenset(units) for mid, units in dealt.items()}


@dataclass
class EagerAssignor:
    """Connect's eager protocol (metadata version 0)."""

    config_offset: int = 0
    name: str = EAGER
    minimum_version: int = EAGER_VERSION
    maximum_version: int = EAGER_VERSION

    def advertised(self, worker_url: str, now_ms: int) -> ClientAssignor:
        metadata = encode_worker_metadata(WorkerMetadata(EAGER_VERSION, worker_url,
                                                         self.config_offset))
        return ClientAssignor(name=self.name, minimum_version=self.minimum_version,
                              maximum_version=self.maximum_version, reason=REASON_NONE,
                              version=EAGER_VERSION, metadata=metadata)

    def wake_at_ms(self) -> int | None:
        return None

    def assign(self, view: GroupView, now_ms: int, leader: Leader) -> AssignmentPlan:
        offset = max([m.config_offset for m in view.members] + [self.config_offset])
        members = {
            mid: PlannedMember(units, EAGER_VERSION, encode_assignment(ConnectAssignment(
                EAGER_VERSION, leader=leader.member_id, leader_url=leader.url,
                config_offset=offset, assigned=units)))
            for mid, units in eager_assign(view).items()
        }
        return AssignmentPlan(view.group_epoch, members)

    def installed(self, plan: AssignmentPlan) -> None:
        pass


# ------------------------------------------------------------------------------ incremental


@dataclass(frozen=True, slots=True)
class DelayMemory:
    """What the incremental cooperative assignor remembers between its runs.

    `known`: each member's part of the last assignment it installed, with its url (how a
    departure is recognised). `departed`: units of workers that left, by worker url, held
    back until `deadline_ms` or until a worker with that url is back.
    """

    known: Mapping[str, tuple[str, frozenset[Unit]]] = field(default_factory=dict)
    departed: Mapping[str, frozenset[Unit]] = field(default_factory=dict)
    deadline_ms: int | None = None

    @property
    def held_back(self) -> frozenset[Unit]:
        return frozenset().union(*self.departed.values()) if self.departed else EMPTY


@dataclass(frozen=True, slots=True)
class IncrementalResult:
    target: dict[str, frozenset[Unit]]
    memory: DelayMemory
    delay_ms: int  # what is left of the scheduled delay (0: none pending)


def incremental_cooperative_assign(view: GroupView, now_ms: int, max_delay_ms: int,
                                   memory: DelayMemory) -> IncrementalResult:
    """Connect's incremental cooperative assignment, declaratively.

    Members keep what their current target holds (stickiness); units of departed workers
    are held back until the deadline unless their worker returns; everything else is
    balanced to floor/ceil per member, connectors and tasks separately, moving as few units
    as possible.
    """
    units = view.units
    present = {m.member_id: m for m in view.members}
    member_by_url: dict[str, str] = {}
    for m in view.members:
        member_by_url.setdefault(m.worker_url, m.member_id)

    current: dict[str, set[Unit]] = {mid: set() for mid in present}
    held: set[Unit] = set()
    for m in view.members:  # sorted by id, so a unit in two targets stays with the first
        mine = (m.target & units) - held
        current[m.member_id] |= mine
        held |= mine
    free = set(units) - held

    # Units we last gave to a member that is no longer here are its departed units; a
    # member that is still (or again) here under the same id simply gets back what it lost.
    departed: dict[str, set[Unit]] = {url: set(lost) for url, lost in memory.departed.items()}
    for member_id, (url, part) in sorted(memory.known.items()):
        lost = part & free
        if not lost:
            continue
        if member_id in present:
            current[member_id] |= lost
            free -= lost
        else:
            departed.setdefault(url, set()).update(lost)

    # Only units still unassigned can be held back (deleted or reassigned ones drop out).
    for url in list(departed):
        departed[url] &= free
        if not departed[url]:
            del departed[url]

    # A worker that came back (same url) takes its former units again.
    for url in sorted(departed):
        returning = member_by_url.get(url)
        if returning is not None:
            back = departed.pop(url)
            current[returning] |= back
            free -= back

    deadline = None
    if departed:
        deadline = memory.deadline_ms if memory.deadline_ms is not None else now_ms + max_delay_ms
        if now_ms >= deadline:
            departed, deadline = {}, None  # the delay is over: hand them out now
    held_back = set().union(*departed.values()) if departed else set()
    free -= held_back

    target: dict[str, frozenset[Unit]] = {}
    if present:
        member_ids = sorted(present)
        balanced: dict[str, set[Unit]] = {mid: set() for mid in member_ids}
        for is_connector in (True, False):
            kind_current = {mid: {u for u in current[mid] if (u[1] == CONNECTOR) == is_connector}
                            for mid in member_ids}
            kind_free = {u for u in free if (u[1] == CONNECTOR) == is_connector}
            for mid, kind_part in balance(member_ids, kind_current, kind_free).items():
                balanced[mid] |= kind_part
        target = {mid: frozenset(units_of_member) for mid, units_of_member in balanced.items()}

    new_memory = DelayMemory(
        known={mid: (present[mid].worker_url, part) for mid, part in target.items()},
        departed={url: frozenset(lost) for url, lost in departed.items()},
        deadline_ms=deadline,
    )
    delay_left = max(0, deadline - now_ms) if deadline is not None else 0
    return IncrementalResult(target, new_memory, delay_left)


def balance(member_ids: Sequence[str], current: Mapping[str, set[Unit]],
            free: set[Unit]) -> dict[str, set[Unit]]:
    """Spread `free` plus the members' `current` units so every member has floor or ceil of
    the average. Members keep as much of their current units as their quota allows; the ceil
    quotas go to those already holding the most, so the fewest units move."""
    if not member_ids:
        return {}
    total = len(free) + sum(len(current[mid]) for mid in member_ids)
    floor, extra = divmod(total, len(member_ids))
    by_load = sorted(member_ids, key=lambda mid: (-len(current[mid]), mid))
    quota = {mid: floor + (1 if rank < extra else 0) for rank, mid in enumerate(by_load)}

    result: dict[str, set[Unit]] = {}
    pool = sorted(free)
    for mid in member_ids:
        mine = sorted(current[mid])
        result[mid] = set(mine[: quota[mid]])
        pool.extend(mine[quota[mid]:])
    pool.sort()
    # Hand the pool out least-loaded first (ties by id), never above quota.
    heap = [(len(result[mid]), mid) for mid in member_ids if len(result[mid]) < quota[mid]]
    heapq.heapify(heap)
    for unit in pool:
        load, mid = heapq.heappop(heap)
        result[mid].add(unit)
        if load + 1 < quota[mid]:
            heapq.heappush(heap, (load + 1, mid))
    return result


class IncrementalCooperativeAssignor:
    """Connect's incremental cooperative assignor (metadata versions 1-2) with the delay.

    The memory lives here, in the worker that runs it, as it lives in Connect's leader.
    """

    name = INCREMENTAL_COOPERATIVE

    def __init__(self,
                 scheduled_rebalance_max_delay_ms: int = DEFAULT_SCHEDULED_REBALANCE_MAX_DELAY_MS,
                 *, minimum_version: int = COMPATIBLE_VERSION,
                 maximum_version: int = SESSIONED_VERSION, config_offset: int = 0) -> None:
        if scheduled_rebalance_max_delay_ms < 0:
            raise ValueError("scheduled_rebalance_max_delay_ms must not be negative")
        if not COMPATIBLE_VERSION <= minimum_version <= maximum_version <= SESSIONED_VERSION:
            raise ValueError("incremental cooperative versions are 1 (compatible) to 2 (sessioned)")
        self.max_delay_ms = scheduled_rebalance_max_delay_ms
        self.minimum_version = minimum_version
        self.maximum_version = maximum_version
        self.config_offset = config_offset
        self.memory = DelayMemory()
        self.reason = REASON_NONE
        self._asked_for_deadline: int | None = None

    def _due(self, now_ms: int) -> bool:
        deadline = self.memory.deadline_ms
        return deadline is not None and now_ms >= deadline and self._asked_for_deadline != deadline

    def advertised(self, worker_url: str, now_ms: int) -> ClientAssignor:
        if self._due(now_ms):
            # Ask the coordinator for a new assignment: the held-back units are due.
            self.reason = self.reason % MAX_REASON + 1
            self._asked_for_deadline = self.memory.deadline_ms
        # The current allocation is left out on purpose: the coordinator already knows each
        # member's target, and a metadata change would bump the group epoch every time a
        # worker's units change.
        metadata = encode_worker_metadata(WorkerMetadata(self.maximum_version, worker_url,
                                                         self.config_offset))
        return ClientAssignor(name=self.name, minimum_version=self.minimum_version,
                              maximum_version=self.maximum_version, reason=self.reason,
                              version=self.maximum_version, metadata=metadata)

    def wake_at_ms(self) -> int | None:
        deadline = self.memory.deadline_ms
        if deadline is None or self._asked_for_deadline == deadline:
            return None
        return deadline

    def assign(self, view: GroupView, now_ms: int, leader: Leader) -> AssignmentPlan:
        result = incremental_cooperative_assign(view, now_ms, self.max_delay_ms, self.memory)
        version = _common_version(view, self.minimum_version, self.maximum_version)
        offset = max([m.config_offset for m in view.members] + [self.config_offset])
        previous = {m.member_id: m.target for m in view.members}
        members = {}
        for mid, units in result.target.items():
            metadata = encode_assignment(ConnectAssignment(
                version, leader=leader.member_id, leader_url=leader.url, config_offset=offset,
                assigned=units, revoked=previous.get(mid, EMPTY) - units,
                delay_ms=result.delay_ms))
            members[mid] = PlannedMember(units, version, metadata)
        return AssignmentPlan(view.group_epoch, members, memory=result.memory)

    def installed(self, plan: AssignmentPlan) -> None:
        if isinstance(plan.memory, DelayMemory):
            self.memory = plan.memory
