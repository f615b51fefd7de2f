"""A simulated Kafka Connect worker on trio: the thin shell around :class:`WorkerState`.

It talks to the coordinator through :class:`coordinator.client.KafkaClient`, runs each
assigned unit as a trio task that records itself in a shared :class:`UnitRegistry`, and
does what the state machine says in the order it says: stop first, then start, then
heartbeat / compute an assignment. A watchdog task stops every unit when no heartbeat has
succeeded for the session timeout, even while a request hangs.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

import trio

from coordinator.client import KafkaClient
from coordinator.units import Unit
from coordinator.workers.assignors import ClientSideAssignor
from coordinator.workers.registry import UnitRegistry
from coordinator.workers.state import Actions, Phase, WorkerConfig, WorkerState
from protocol.framing import (
    CONNECT_GROUP_HEARTBEAT,
    CONNECT_GROUP_INSTALL_ASSIGNMENT,
    CONNECT_GROUP_PREPARE_ASSIGNMENT,
    ProtocolError,
)

Connector = Callable[[], Awaitable[KafkaClient]]
# What a lost or broken connection looks like from KafkaClient.
TRANSPORT_ERRORS = (OSError, ConnectionError, trio.BrokenResourceError,
                    trio.ClosedResourceError, trio.TooSlowError, ProtocolError)


class WorkerFailed(Exception):
    """The coordinator answered with an error the worker cannot recover from."""


def now_ms() -> int:
    return int(trio.current_time() * 1000)


class UnitRunner:
    """Runs simulated units as trio tasks in one nursery; stopping waits until they ended."""

    def __init__(self, registry: UnitRegistry, worker: str, nursery: trio.Nursery) -> None:
        self.registry = registry
        self.worker = worker
        self._nursery = nursery
        self._running: dict[Unit, tuple[trio.CancelScope, trio.Event]] = {}

    @property
    def running(self) -> frozenset[Unit]:
        return frozenset(self._running)

    async def start(self, units: Iterable[Unit]) -> None:
        for unit in sorted(units):
            if unit not in self._running:
                await self._nursery.start(self._run, unit)

    async def _run(self, unit: Unit, *, task_status: trio.TaskStatus[None]) -> None:
        done = trio.Event()
        with trio.CancelScope() as scope:
            self._running[unit] = (scope, done)
            self.registry.started(unit, self.worker, now_ms())
            try:
                task_status.started()
                await trio.sleep_forever()
            finally:
                self.registry.stopped(unit, self.worker, now_ms())
                self._running.pop(unit, None)
                done.set()

    async def stop(self, units: Iterable[Unit]) -> None:
        waiting = []
        for unit in units:
            entry = self._running.get(unit)
            if entry is not None:
                entry[0].cancel()
                waiting.append(entry[1])
        for done in waiting:
            await done.wait()

    async def stop_all(self) -> None:
        await self.stop(list(self._running))


class Worker:
    """One simulated Connect worker. `run()` until `shutdown()`; it leaves the group then."""

    def __init__(
        self,
        config: WorkerConfig,
        registry: UnitRegistry,
        *,
        address: tuple[str, int] | None = None,
        connect: Connector | None = None,
        assignors: Sequence[ClientSideAssignor] = (),
        request_timeout_ms: int = 5_000,
        name: str | None = None,
    ) -> None:
        if connect is None:
            if address is None:
                raise ValueError("give the coordinator's address or a connect function")
            host, port = address

            async def connect_tcp() -> KafkaClient:
                return await KafkaClient.connect(host, port, client_id=config.member_id)

            connect = connect_tcp
        self.config = config
        self.registry = registry
        self.state = WorkerState(config, assignors)
        self.name = name or config.member_id
        self.request_timeout_ms = request_timeout_ms
        self._connect = connect
        self._client: KafkaClient | None = None
        self._units: UnitRunner | None = None
        self._shutdown = trio.Event()
        self._state_changed = trio.Event()
        # The main loop and the session watchdog both act on units; one at a time.
        self._units_lock = trio.Lock()
        self.failure: str | None = None

    # ------------------------------------------------------------------ lifetime
    def shutdown(self) -> None:
        self._shutdown.set()

    @property
    def running_units(self) -> frozenset[Unit]:
        return self._units.running if self._units is not None else frozenset()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._units = UnitRunner(self.registry, self.name, nursery)
            nursery.start_soon(self._watch_session)
            task_status.started()
            try:
                await self._loop()
                await self._leave()
            finally:
                with trio.CancelScope(shield=True):
                    await self._units.stop_all()
                    await self._close()
                nursery.cancel_scope.cancel()

    async def _loop(self) -> None:
        while not self._shutdown.is_set():
            if self.state.phase is Phase.FAILED:
                raise WorkerFailed(self.failure or "the worker failed")
            wake_s = self.state.next_wakeup_ms / 1000
            with trio.move_on_at(wake_s):
                await self._shutdown.wait()
            if self._shutdown.is_set():
                return
            client = await self._connected()
            if client is not None:
                await self._heartbeat(client)

    async def _connected(self) -> KafkaClient | None:
        """The open connection, or a new one; None (after a backoff) if it cannot be made."""
        if self._client is not None:
            return self._client
        try:
            with trio.fail_after(self.request_timeout_ms / 1000):
                self._client = await self._connect()
        except TRANSPORT_ERRORS:
            self.state.on_heartbeat_failed(now_ms())
            self._notify()
            return None
        return self._client

    async def _close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            try:
                await client.aclose()
            except TRANSPORT_ERRORS:
                pass

    async def _request(self, client: KafkaClient, api_key: int, body: Any) -> Any:
        """One request; on any transport problem the connection is dropped and re-raised."""
        try:
            with trio.fail_after(self.request_timeout_ms / 1000):
                return await client.request(api_key, body)
        except TRANSPORT_ERRORS:
            await self._close()
            raise

    # ------------------------------------------------------------------ heartbeats
    async def _heartbeat(self, client: KafkaClient) -> None:
        state = self.state
        request = state.heartbeat_request(now_ms())
        try:
            response = await self._request(client, CONNECT_GROUP_HEARTBEAT, request)
        except TRANSPORT_ERRORS:
            state.on_heartbeat_failed(now_ms())
            self._notify()
            return
        await self._apply(state.on_heartbeat_response(response, now_ms()))
        if state.compute_due and self._client is not None:
            await self._compute_assignment(self._client)

    async def _apply(self, actions: Actions) -> None:
        assert self._units is not None
        async with self._units_lock:
            if actions.stop:
                await self._units.stop(actions.stop)  # revoked units stop before anything else
            # Only what the state still owns: the session may have been lost meanwhile.
            start = actions.start & self.state.owned
            if start:
                await self._units.start(start)
        if actions.fatal is not None:
            self.failure = actions.fatal
        self._notify()

    def _notify(self) -> None:
        """Wake whoever waits on the state (the watchdog: its deadline may have moved)."""
        self._state_changed.set()
        self._state_changed = trio.Event()

    async def _compute_assignment(self, client: KafkaClient) -> None:
        state = self.state
        try:
            prepared = await self._request(client, CONNECT_GROUP_PREPARE_ASSIGNMENT,
                                           state.prepare_request())
            install = state.on_prepare_response(prepared, now_ms())
            if install is None:
                return
            answer = await self._request(client, CONNECT_GROUP_INSTALL_ASSIGNMENT, install)
        except TRANSPORT_ERRORS:
            state.on_assignment_call_failed()
            return
        state.on_install_response(answer)

    async def _watch_session(self) -> None:
        """Stop every unit once the session is lost, whatever the main loop is waiting on."""
        while True:
            deadline = self.state.session_deadline_ms
            if deadline is None:
                await self._state_changed.wait()
                continue
            with trio.move_on_at(deadline / 1000):
                await self._state_changed.wait()
            if now_ms() >= deadline:
                await self._apply(self.state.check_session(now_ms()))

    async def _leave(self) -> None:
        assert self._units is not None
        async with self._units_lock:
            self.state.stop_all()
            await self._units.stop_all()  # stop first: then the coordinator may hand them out
        request = self.state.leave_request()
        if request is None or self._client is None:
            return
        try:
            await self._request(self._client, CONNECT_GROUP_HEARTBEAT, request)
        except TRANSPORT_ERRORS:
            pass  # the session timeout removes us instead

    async def wait_until(self, predicate: Callable[[WorkerState], bool],
                         timeout_s: float = math.inf) -> None:
        """Wait until `predicate(state)` holds after some response (for tests and tools)."""
        with trio.fail_after(timeout_s):
            while not predicate(self.state):
                await self._state_changed.wait()
