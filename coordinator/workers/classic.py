"""A simulated Kafka Connect worker of the classic protocol, on trio.

It behaves as Connect's `WorkerCoordinator` with the `sessioned` protocol: JoinGroup with
its Connect metadata (url, config offset, and as allocation the units it runs), SyncGroup,
heartbeats every interval; as leader it runs Connect's incremental cooperative rule (keep
a fair share of what each member holds, revoke the rest, grant only units nobody holds); it
stops revoked units before starting new ones and rejoins right after a revocation or once
a `delay` has passed. Like Connect, it keeps its units across UNKNOWN_MEMBER_ID and
ILLEGAL_GENERATION (it rejoins and tells what it holds); only when no heartbeat has
succeeded for its session timeout does it stop them all.

The leader knows the group's units from `units` (a Connect leader reads them from its
config topic).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import structlog
import trio

from coordinator.client import KafkaClient
from coordinator.connect_protocol import (
    SESSIONED_VERSION,
    ConnectAssignment,
    ConnectProtocolError,
    WorkerMetadata,
    decode_assignment,
    decode_worker_metadata,
    encode_assignment,
    encode_worker_metadata,
)
from coordinator.units import Unit
from coordinator.workers.registry import UnitRegistry
from coordinator.workers.worker import TRANSPORT_ERRORS, UnitRunner
from protocol import classic as wire
from protocol.errors import ErrorCode

log = structlog.get_logger("coordinator.workers.classic")
JOIN_VERSION, SYNC_VERSION, HEARTBEAT_VERSION, LEAVE_VERSION = 9, 5, 4, 5


def cooperative_plan(units: frozenset[Unit], owned: dict[str, frozenset[Unit]]
                     ) -> dict[str, tuple[frozenset[Unit], frozenset[Unit]]]:
    """member -> (granted, revoked): Connect's incremental cooperative rule, simply."""
    members = sorted(owned)
    base, extra = divmod(len(units), len(members))
    share = {member: base + (index < extra) for index, member in enumerate(members)}
    held = set().union(*owned.values())
    free = sorted(units - held)
    plan = {}
    for member in members:
        mine = sorted(owned[member] & units)
        keep = frozenset(mine[:share[member]])
        room = max(share[member] - len(keep), 0)
        granted, free = frozenset(free[:room]), free[room:]
        plan[member] = (granted, owned[member] - keep)
    return plan


def _request(api_key: int, version: int, struct: str = "", /, **values: Any) -> Any:
    kind = wire.REQUEST_CLASSES[api_key, version]
    if struct:
        return wire.build(getattr(wire.module(api_key, version, "request"), struct), **values)
    return wire.build(kind, **values)


class ClassicWorker:
    def __init__(self, name: str, group_id: str, address: tuple[str, int],
                 registry: UnitRegistry, units: Callable[[], frozenset[Unit]], *,
                 session_timeout_ms: int = 10_000, heartbeat_interval_ms: int = 3_000,
                 rebalance_timeout_ms: int = 60_000,
                 connect: Callable[[], Awaitable[Any]] | None = None) -> None:
        self.name = name
        # (the simulator passes its faulty links; anything with `request` and `aclose`)
        self._connect = connect if connect is not None else self._direct
        self.group_id = group_id
        self.address = address
        self.registry = registry
        self.units = units
        self.session_timeout_ms = session_timeout_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.member_id = ""
        self.generation = -1
        self.rejoin = True
        self.leader = False
        self.last_heartbeat_ok = 0.0
        # The watchdog and an assignment being applied change the running units in turn,
        # and an assignment applied after a session loss still leads to a rejoin.
        self._units_lock = trio.Lock()
        self._session_losses = 0
        self._runner: UnitRunner | None = None
        self._stop = trio.Event()

    @property
    def running_units(self) -> frozenset[Unit]:
        return self._runner.running if self._runner is not None else frozenset()

    def metadata(self) -> bytes:
        allocation = ConnectAssignment(SESSIONED_VERSION, assigned=self.running_units)
        return encode_worker_metadata(WorkerMetadata(
            SESSIONED_VERSION, f"http://{self.name}:8083", 0, allocation))

    async def _direct(self) -> KafkaClient:
        return await KafkaClient.connect(*self.address, client_id=self.name)

    def stop(self) -> None:
        """Leave the group and stop (as at a worker's shutdown)."""
        self._stop.set()

    shutdown = stop  # the name the simulator's hosts use

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        async with trio.open_nursery() as nursery:
            self._runner = UnitRunner(self.registry, self.name, nursery)
            task_status.started()
            self.last_heartbeat_ok = trio.current_time()
            nursery.start_soon(self._watchdog)
            with trio.CancelScope() as scope:
                nursery.start_soon(self._wait_stop, scope)
                while True:
                    try:
                        client = await self._connect()
                    except TRANSPORT_ERRORS:
                        await trio.sleep(0.2)
                        continue
                    try:
                        await self._loop(client)
                    except TRANSPORT_ERRORS as error:
                        log.info("classic_worker_connection_lost", worker=self.name,
                                 error=str(error))
                    finally:
                        with trio.CancelScope(shield=True):
                            await client.aclose()
                    await trio.sleep(0.1)
            # As Connect's worker does: stop the units first, then leave (after the leave
            # the coordinator may hand them to another worker at once).
            await self._runner.stop_all()
            await self._leave()
            nursery.cancel_scope.cancel()

    async def _wait_stop(self, scope: trio.CancelScope) -> None:
        await self._stop.wait()
        scope.cancel()

    async def _watchdog(self) -> None:
        while True:
            await trio.sleep(self.session_timeout_ms / 4000)
            async with self._units_lock:
                silent = trio.current_time() - self.last_heartbeat_ok
                if silent * 1000 > self.session_timeout_ms and self.running_units:
                    assert self._runner is not None
                    log.info("classic_worker_lost_session", worker=self.name)
                    await self._runner.stop_all()
                    # The coordinator may still count it as holding them (only the
                    # answers were lost): rejoin and say it holds nothing now.
                    self._session_losses += 1
                    self.rejoin = True

    async def _loop(self, client: Any) -> None:
        while True:
            if self.rejoin:
                await self._join_and_sync(client)
                continue
            await trio.sleep(self.heartbeat_interval_ms / 1000)
            body = _request(wire.HEARTBEAT, HEARTBEAT_VERSION, group_id=self.group_id,
                            generation_id=self.generation, member_id=self.member_id)
            answer = await client.request(wire.HEARTBEAT, body, HEARTBEAT_VERSION)
            code = int(answer.error_code.value)
            if code == ErrorCode.NONE:
                self.last_heartbeat_ok = trio.current_time()
                continue
            if code == ErrorCode.UNKNOWN_MEMBER_ID:
                self.member_id = ""
            self.rejoin = True  # REBALANCE_IN_PROGRESS, ILLEGAL_GENERATION, ...

    async def _join_and_sync(self, client: Any) -> None:
        losses = self._session_losses
        protocols = (_request(wire.JOIN_GROUP, JOIN_VERSION, "JoinGroupRequestProtocol",
                              name="sessioned", metadata=self.metadata()),)
        body = _request(wire.JOIN_GROUP, JOIN_VERSION, group_id=self.group_id,
                        session_timeout=self.session_timeout_ms,
                        rebalance_timeout=self.rebalance_timeout_ms, member_id=self.member_id,
                        protocol_type="connect", protocols=protocols)
        joined = await client.request(wire.JOIN_GROUP, body, JOIN_VERSION)
        code = int(joined.error_code.value)
        if code == ErrorCode.MEMBER_ID_REQUIRED:
            self.member_id = joined.member_id
            return  # again at once, with the id
        if code != ErrorCode.NONE:
            if code == ErrorCode.UNKNOWN_MEMBER_ID:
                self.member_id = ""
            await trio.sleep(0.1)
            return
        # As Connect's client: its heartbeat timers start again with the JoinGroup answer.
        self.last_heartbeat_ok = trio.current_time()
        self.generation = int(joined.generation_id)
        self.leader = joined.leader == self.member_id
        assignments: tuple[Any, ...] = ()
        if self.leader:
            assignments = self._assign(joined.members)
        sync = _request(wire.SYNC_GROUP, SYNC_VERSION, group_id=self.group_id,
                        generation_id=self.generation, member_id=self.member_id,
                        protocol_type="connect", protocol_name=joined.protocol_name,
                        assignments=assignments)
        synced = await client.request(wire.SYNC_GROUP, sync, SYNC_VERSION)
        if int(synced.error_code.value) != ErrorCode.NONE:
            return  # rejoin
        self.last_heartbeat_ok = trio.current_time()
        assignment = decode_assignment(synced.assignment)
        assert self._runner is not None
        async with self._units_lock:
            await self._runner.stop(assignment.revoked)  # stop first, then start
            await self._runner.start(assignment.assigned)
            # Connect rejoins right after revoking; so does a worker that stopped
            # everything meanwhile (what it runs is no longer what it was told).
            self.rejoin = bool(assignment.revoked) or losses != self._session_losses
        if assignment.delay_ms > 0 and not self.rejoin:
            await trio.sleep(assignment.delay_ms / 1000)
            self.rejoin = True

    def _assign(self, members: Any) -> tuple[Any, ...]:
        owned: dict[str, frozenset[Unit]] = {}
        for member in members:
            try:
                metadata = decode_worker_metadata(member.metadata)
            except ConnectProtocolError:
                owned[member.member_id] = frozenset()
                continue
            owned[member.member_id] = metadata.allocation.assigned \
                if metadata.allocation else frozenset()
        plan = cooperative_plan(self.units(), owned)
        return tuple(
            _request(wire.SYNC_GROUP, SYNC_VERSION, "SyncGroupRequestAssignment",
                     member_id=member_id, assignment=encode_assignment(ConnectAssignment(
                         SESSIONED_VERSION, leader=self.member_id,
                         leader_url=f"http://{self.name}:8083", assigned=granted,
                         revoked=revoked)))
            for member_id, (granted, revoked) in plan.items())

    async def _leave(self) -> None:
        if not self.member_id:
            return
        with trio.move_on_after(2):
            try:
                async with await KafkaClient.connect(*self.address,
                                                     client_id=self.name) as client:
                    member = _request(wire.LEAVE_GROUP, LEAVE_VERSION, "MemberIdentity",
                                      member_id=self.member_id)
                    await client.request(wire.LEAVE_GROUP, _request(
                        wire.LEAVE_GROUP, LEAVE_VERSION, group_id=self.group_id,
                        members=(member,)), LEAVE_VERSION)
            except TRANSPORT_ERRORS:
                pass
