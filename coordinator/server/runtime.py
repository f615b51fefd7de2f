"""The shell around the sans-IO core: clock, timers, records, events and assignor runs.

Every core call happens on the trio thread and returns before anything is awaited, so the
core never sees two operations interleave. After each call the runtime

1. applies ``Result.timers`` to the :class:`TimerScheduler`,
2. logs ``Result.events`` (one line each, group, member and epochs bound) and counts the
   ones metrics follow: group epoch bumps by trigger, target installs by mode,
3. starts ``Result.jobs`` (offloaded server assignor runs) in the worker pool,
4. awaits ``sink.write(result.records)`` -- before the caller sends its response
   (docs/protocol.md, Durability: a response that reports a change follows its durable records).

Time to stable: the first group epoch bump of a group that is not rebalancing yet notes the
time (one dict entry per group); when the records of that change or a later one touch the
group and it is STABLE, the time since is observed. Only changes with records are checked
(a stable heartbeat writes none), and only the groups their records name, so the request
path stays O(1). A group that empties or is deleted drops its entry without an observation.

Sink writes are issued in the order the core produced the records; a sink must persist them
in call order (concurrent calls may overlap; a group-committing log batches them).

The durable log plugs in as a ``RecordSink`` and a ``LogLoader``. The
loader replays the log into the core while the server answers COORDINATOR_LOAD_IN_PROGRESS;
the runtime then arms ``core.timers_after_load(now)`` and flips ``ready``.
"""

from __future__ import annotations

import gc
import heapq
import math
import signal
import time
from collections import deque
from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol, TypeVar

import structlog
import trio
import trio_parallel

from coordinator.assignors.api import ServerAssignor
from coordinator.assignors.transport import (
    PackedRun,
    ResidentMiss,
    SpecPacker,
    run_packed,
)
from coordinator.config import ServerConfig
from coordinator.core.classic.engine import Parked
from coordinator.core.coordinator import GroupCoordinator
from coordinator.core.result import (
    AssignorRun,
    CompactResult,
    Event,
    Record,
    Result,
    TimerCancel,
    TimerKey,
    TimerOp,
    TimerSet,
)
from coordinator.core.validation import (
    CheckedHeartbeat,
    CheckedInstall,
    check_install,
    install_unit_count,
)
from coordinator.logs import RateLimitedLog
from coordinator.metrics import Metrics
from coordinator.server.classic import Waiters
from coordinator.server.priority import lower_this_thread
from coordinator.urls import redacted_url
from protocol.errors import ApiError, ErrorCode
from protocol.messages import (
    ConnectGroupDescribeResponse,
    ConnectGroupHeartbeatResponse,
    ConnectGroupInstallAssignmentResponse,
    ConnectGroupPrepareAssignmentResponse,
)

R = TypeVar("R")
log = structlog.get_logger("coordinator.runtime")


# ---------------------------------------------------------------------------- clock


class Clock(Protocol):
    """Milliseconds for the core, and the trio time at which a deadline in them falls."""

    def now_ms(self) -> int: ...

    def trio_deadline(self, deadline_ms: int) -> float: ...


class TrioEpochClock:
    """Epoch milliseconds that advance with trio's clock.

    Why not plain ``time.time()``: timers sleep on trio's clock, and under pytest-trio's
    ``autojump_clock`` trio time jumps while wall time does not, so a wall-clock ``now`` would
    never reach a deadline. This clock reads ``time.time()`` once (on first use) to anchor
    trio time to the epoch and then follows trio time. In production trio time is monotonic
    time, so ``now`` is the wall clock at start-up plus the monotonic time since; it does not
    follow later wall-clock steps, which is what timers want. Tests may pass
    ``epoch_offset_ms=0`` for small, deterministic numbers.
    """

    def __init__(self, epoch_offset_ms: float | None = None) -> None:
        self._offset_ms = epoch_offset_ms

    def _offset(self) -> float:
        if self._offset_ms is None:
            self._offset_ms = time.time() * 1000.0 - trio.current_time() * 1000.0
        return self._offset_ms

    def now_ms(self) -> int:
        return int(trio.current_time() * 1000.0 + self._offset())

    def trio_deadline(self, deadline_ms: int) -> float:
        return (deadline_ms - self._offset()) / 1000.0


# ---------------------------------------------------------------------------- timers


class TimerScheduler:
    """Named timers: a dict key -> deadline, plus a heap of (deadline, seq, key) entries.

    Re-arming a key to a later deadline (every heartbeat moves its member's session timer)
    only updates the dict: O(1). Heap entries are checked lazily when they come due: an entry
    fires only if the dict still holds exactly its deadline; if the dict holds a later one the
    entry is pushed again at that deadline; if the key is gone the entry is dropped. Moving a
    key earlier pushes a new entry, so the heap top is never later than the earliest deadline.
    """

    def __init__(self) -> None:
        self._deadlines: dict[TimerKey, int] = {}
        self._heap: list[tuple[int, int, TimerKey]] = []
        self._sequence = 0
        self._changed = trio.Event()

    def __len__(self) -> int:
        return len(self._deadlines)

    def deadline(self, key: TimerKey) -> int | None:
        return self._deadlines.get(key)

    def set(self, key: TimerKey, deadline_ms: int) -> None:
        previous = self._deadlines.get(key)
        self._deadlines[key] = deadline_ms
        if previous is None or deadline_ms < previous:
            self._push(key, deadline_ms)

    def cancel(self, key: TimerKey) -> None:
        self._deadlines.pop(key, None)

    def apply(self, operations: Sequence[TimerOp]) -> None:
        for operation in operations:
            if isinstance(operation, TimerSet):
                self.set(operation.key, operation.deadline_ms)
            elif isinstance(operation, TimerCancel):
                self.cancel(operation.key)
            else:
                self.cancel_group(operation.group_id)

    def cancel_group(self, group_id: str) -> None:
        """Cancel every timer of the group (rare: a rollback; goes over all timers)."""
        for key in [key for key in self._deadlines if key[1] == group_id]:
            del self._deadlines[key]

    def _push(self, key: TimerKey, deadline_ms: int) -> None:
        earliest = self._heap[0][0] if self._heap else None
        self._sequence += 1
        heapq.heappush(self._heap, (deadline_ms, self._sequence, key))
        if earliest is None or deadline_ms < earliest:
            self._changed.set()  # the sleeper must wake up earlier than it planned

    def pop_due(self, now_ms: int) -> list[TimerKey]:
        """Remove and return every key whose deadline is at or before `now_ms`."""
        due: list[TimerKey] = []
        heap = self._heap
        while heap and heap[0][0] <= now_ms:
            deadline, _, key = heapq.heappop(heap)
            current = self._deadlines.get(key)
            if current is None:
                continue
            if current == deadline:
                del self._deadlines[key]
                due.append(key)
            elif current > deadline:
                self._sequence += 1
                heapq.heappush(heap, (current, self._sequence, key))
        return due

    def next_deadline(self) -> int | None:
        return self._heap[0][0] if self._heap else None

    async def run(
        self, clock: Clock, fire: Callable[[TimerKey, int], Any]
    ) -> None:
        """Sleep until the earliest deadline, call `fire(key, now_ms)` (awaited), repeat."""
        while True:
            for key in self.pop_due(clock.now_ms()):
                await fire(key, clock.now_ms())
            self._changed = trio.Event()
            upcoming = self.next_deadline()
            wake_at = math.inf if upcoming is None else clock.trio_deadline(upcoming)
            with trio.move_on_at(wake_at):
                await self._changed.wait()


# ---------------------------------------------------------------------------- records


class RecordSink(Protocol):
    """Where records go before a response is sent: the durable log, or memory in tests."""

    async def write(self, records: Sequence[Record]) -> None:
        """Return once `records` are durable; raise if they cannot be made so."""
        ...

    async def close(self) -> None:
        """Flush and release; called once at shutdown."""
        ...


class MemorySink:
    """Keeps records in memory (or drops them with `keep=False`); for tests and until the log."""

    def __init__(self, keep: bool = True) -> None:
        self.keep = keep
        self.records: list[Record] = []
        self.closed = False

    async def write(self, records: Sequence[Record]) -> None:
        if self.closed:
            raise RuntimeError("the record sink is closed")
        if self.keep:
            self.records.extend(records)
        await trio.lowlevel.checkpoint()

    async def close(self) -> None:
        self.closed = True
        await trio.lowlevel.checkpoint()


class LogLoader(Protocol):
    """Replays the durable log into the core at start-up (`core.replay(record)` per record)."""

    async def load(self, core: GroupCoordinator) -> None: ...


# ---------------------------------------------------------------------------- assignor runs


# Events logged at debug: a member's steps towards its target, and a run's start (its
# `assignor_run_landed` line tells it again, with when it was submitted).
DEBUG_EVENTS = frozenset({"member_reached_epoch", "member_revoking", "assignor_run_started"})

# A pool process's cyclic collector is off (`init_pool_process`): a run allocates tens of
# thousands of objects that reference counting frees (young collections took 20% of a
# `balanced` run of 1,000 members), and what runs keep, each group's last spec, is not
# cyclic. What is (a failed run's traceback, say) is collected every so many runs (15-28 ms
# with one 1,000 x 50 group held).
POOL_COLLECTION_EVERY = 256
_pool_runs = 0


# A pool process sleeps COURTESY_PAUSE_S every COURTESY_EVERY_S of a run (BENCHMARKS.md,
# "Courtesy pauses"). On two CPUs a run that computes without a break keeps its CPU busy,
# and heartbeats woken meanwhile (the clients' and the event loop's) queue behind each other
# on the other CPU: a CPU that never goes idle does not pull them over. A pause lets it go
# idle, and an idle CPU pulls a waiting task at once. Neither a lower priority nor another
# scheduling class for the pool does that. The price: a run's flight about a third longer.
COURTESY_EVERY_S = 0.0005
COURTESY_PAUSE_S = 0.00005
_courtesy_pauses = False  # set by `init_pool_process`: only a pool process pauses
courtesy_pauses_taken = 0  # in this process (for tests)


def _take_a_pause(_signum: int, _frame: object) -> None:
    global courtesy_pauses_taken
    courtesy_pauses_taken += 1
    time.sleep(COURTESY_PAUSE_S)


def run_in_pool(packed: PackedRun) -> CompactResult:
    """What a pool process runs: the packed run, with courtesy pauses."""
    global _pool_runs
    _pool_runs += 1
    if _pool_runs % POOL_COLLECTION_EVERY == 0:
        gc.collect()
    if not _courtesy_pauses:
        return run_packed(packed)
    signal.setitimer(signal.ITIMER_REAL, COURTESY_EVERY_S, COURTESY_EVERY_S)
    try:
        return run_packed(packed)
    finally:
        # An alarm already on its way still finds the handler: one more short pause.
        signal.setitimer(signal.ITIMER_REAL, 0)


async def _pack(packer: SpecPacker, assignor: ServerAssignor, run: AssignorRun,
                whole: bool) -> PackedRun:
    """`SpecPacker.pack_in_steps`, answering heartbeats between the steps."""
    for packed in packer.pack_in_steps(assignor, run.spec, whole, run.changes):
        if packed is not None:
            return packed
        await trio.lowlevel.checkpoint()
    raise AssertionError("pack_in_steps ends with the packed run")


def init_pool_process(background_priority: bool = False) -> bool:
    """Run in each assignor worker process as it starts (trio-parallel's `init`): no cyclic
    collector, courtesy pauses (`run_in_pool`) from a SIGALRM handler of its own, and with
    `background_priority` (`serve`'s pool) a lower priority than the event loop's."""
    global _courtesy_pauses
    gc.disable()
    if background_priority:
        lower_this_thread()
    signal.signal(signal.SIGALRM, _take_a_pause)
    _courtesy_pauses = True
    return True


class AssignorPool:
    """The assignor worker processes, each in a trio-parallel context of its own, so that a
    group's run goes to the process that did the group's last run whenever that one is
    idle: it holds the group's last spec, and a run told against it carries only what
    changed (`coordinator/assignors/transport.py`). One context with several processes
    would hand out whichever one finished last, so groups running at the same time would
    keep finding a process that holds another group's spec."""

    def __init__(self, contexts: Sequence[trio_parallel.WorkerContext]) -> None:
        self._contexts = contexts
        self._idle = list(range(len(contexts)))  # the longest idle first
        self._process_of: dict[str, int] = {}  # group id -> the process of its last run

    async def run(self, group_id: str, packed: PackedRun) -> CompactResult:
        """Run in the group's process if it is idle, else in the one idle longest. The
        caller holds one of `len(contexts)` tokens of a limiter, so one is idle."""
        process = self._process_of.get(group_id)
        if process is None or process not in self._idle:
            process = self._idle[0]
        self._idle.remove(process)
        self._process_of[group_id] = process
        try:
            result: CompactResult = await self._contexts[process].run_sync(
                run_in_pool, packed, kill_on_cancel=True, limiter=trio.CapacityLimiter(1))
            return result
        finally:
            self._idle.append(process)

    def forget(self, group_id: str) -> None:
        self._process_of.pop(group_id, None)


# Checking an Install costs about 0.3 us per listed unit (BENCHMARKS.md): from here on
# it would hold the event loop for a millisecond or more.
INSTALL_OFFLOAD_UNITS = 4_000


class NotDurable(ApiError):
    """The records of a change could not be written; the change was rolled back."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.COORDINATOR_NOT_AVAILABLE, message)


class AssignorTimeout(Exception):
    """An offloaded assignor run exceeded group.connect.assignor.run.timeout.ms."""


# How many finished runs `Runtime.recent_runs` keeps.
RECENT_RUNS = 1_000


@dataclass(frozen=True, slots=True)
class RunTimes:
    """When an offloaded run was in flight, in wall-clock seconds (`time.time()`).

    `submitted`: the core handed the run to the runtime (before its spec is packed).
    `returned`: the worker process's answer (or the failure, or the timeout) is back on the
    event loop. `landed`: the outcome is applied and its records are durable: the run's work
    on the event loop is over. Benchmarks time heartbeats against these
    (`bench heartbeats --assignor-load`); the same times are logged as
    `assignor_run_landed`.
    """

    group_id: str
    run_id: int
    outcome: str
    submitted: float
    returned: float
    landed: float


# ---------------------------------------------------------------------------- runtime


class Runtime:
    """One GroupCoordinator with its timers, record sink and assignor worker pool."""

    def __init__(
        self,
        core: GroupCoordinator,
        config: ServerConfig,
        sink: RecordSink | None = None,
        clock: Clock | None = None,
        *,
        loader: LogLoader | None = None,
        metrics: Metrics | None = None,
        background_priority: bool = False,
    ) -> None:
        """`background_priority`: the assignor pool's processes run at a lower priority
        than the event loop (`coordinator.server.priority`); `serve` sets it."""
        self.core = core
        self.background_priority = background_priority
        self.config = config
        self.sink: RecordSink = sink if sink is not None else MemorySink(keep=False)
        self.clock: Clock = clock if clock is not None else TrioEpochClock()
        self.loader = loader
        self.metrics = (
            metrics
            if metrics is not None
            else Metrics(lambda: self.core, per_group_max=config.metrics_per_group_max)
        )
        self.timers = TimerScheduler()
        self._write_failures = RateLimitedLog(log)
        self.ready = False
        self._ready_event = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._pool: AssignorPool | None = None
        self._limiter = trio.CapacityLimiter(config.background_threads)
        self._sink_closed = False
        # Changes whose records are being written, oldest first (see roll_back_from).
        self._unconfirmed: list[Result[Any]] = []
        # Group id -> now_ms of the group epoch bump that started its rebalance.
        self._rebalance_started: dict[str, int] = {}
        # Group id -> the packer that keeps its large target sets pickled between runs.
        self._packers: dict[str, SpecPacker] = {}
        # Installs listing at least this many units are checked in a thread first.
        self.install_offload_units = INSTALL_OFFLOAD_UNITS
        # The latest offloaded runs, oldest first: when each was in flight; and how many
        # have landed since start-up.
        self.recent_runs: deque[RunTimes] = deque(maxlen=RECENT_RUNS)
        self.runs_landed = 0
        # Classic JoinGroup and SyncGroup requests waiting for other members.
        self.waiters = Waiters()

    # ---------------------------------------------------------------- lifetime
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run timers and assignor jobs until cancelled; `started` comes before the log loads.

        The caller opens its listeners after `started`, so clients can connect (and get
        COORDINATOR_LOAD_IN_PROGRESS) while the log loads; `wait_ready()` tells when it is done.
        """
        async with AsyncExitStack() as contexts:
            self._pool = AssignorPool([
                await contexts.enter_async_context(
                    trio_parallel.open_worker_context(
                        init=partial(init_pool_process, self.background_priority)))
                for _ in range(self.config.background_threads)])
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                if self.loader is not None:
                    log.info("log_loading")
                    await self.loader.load(self.core)
                    self.timers.apply(self.core.timers_after_load(self.clock.now_ms()))
                self.mark_ready()
                nursery.start_soon(self.timers.run, self.clock, self._fire_timer)

    def mark_ready(self) -> None:
        """Serve requests from now on (idempotent). `run()` calls it after loading."""
        if not self.ready:
            self.ready = True
            self.metrics.ready.set(1)
            self._ready_event.set()

    async def wait_ready(self) -> None:
        await self._ready_event.wait()

    async def close(self) -> None:
        """Flush and close the sink (idempotent). Call after the listeners have drained."""
        if self._sink_closed:
            return
        self._sink_closed = True
        self.ready = False
        self.metrics.ready.set(0)
        await self.sink.close()

    # ---------------------------------------------------------------- the one path
    async def complete(self, result: Result[R]) -> R:
        """Timers, events, jobs, then durable records; returns the response to send."""
        if result.timers:
            self.timers.apply(result.timers)
        if result.events:
            for event in result.events:
                self._log_event(event)
                self._count_event(event)
        if result.jobs:
            for run in result.jobs:
                self._start_job(run)
        if result.records:
            await self._persist(result)
            if self._rebalance_started:
                self._observe_stable(result.records)
        if result.releases:
            self.waiters.release(result.releases)  # parked classic requests, now durable
        return result.response

    def _count_event(self, event: Event) -> None:
        name = event.name
        if name == "group_epoch_bumped":
            self.metrics.rebalance(str(event.fields.get("trigger")))
            self._rebalance_started.setdefault(event.group_id, self.clock.now_ms())
        elif name == "target_installed":
            self.metrics.target_installed(str(event.fields.get("mode")))
        elif name == "classic_rebalance_started":
            self.metrics.classic_rebalance(str(event.fields.get("reason")))
        elif name == "group_converted":
            self.metrics.group_converted(str(event.fields.get("direction")))

    def _observe_stable(self, records: Sequence[Record]) -> None:
        """Observe time to stable for the rebalancing groups these records touched."""
        started = self._rebalance_started
        checked: set[str] = set()
        for record in records:
            group_id = record.key.group_id
            if group_id in checked or group_id not in started:
                continue
            checked.add(group_id)
            group = self.core.store.groups.get(group_id)
            if group is None or not group.members:
                del started[group_id]  # deleted or emptied: no rebalance left to finish
            elif group.state == "STABLE":
                elapsed_ms = self.clock.now_ms() - started.pop(group_id)
                self.metrics.time_to_stable.observe(max(0, elapsed_ms) / 1000.0)

    async def _persist(self, result: Result[Any]) -> None:
        started = time.perf_counter()
        self._unconfirmed.append(result)
        try:
            # Shielded: a caller that gives up (its client went away) must not stop the
            # change from being tracked until the sink says whether it is durable; a
            # write that then fails rolls it back like any other.
            with trio.CancelScope(shield=True):
                await self.sink.write(result.records)
        except Exception as error:
            # A log that refuses writes refuses every one: a few lines (a traceback the
            # first) per interval, with a count of the rest.
            self._write_failures.error("record_write_failed", traceback=True,
                                       records=len(result.records),
                                       error=f"{type(error).__name__}: {error}")
            self.roll_back_from(result)
            raise NotDurable(
                f"the change could not be written to the log ({type(error).__name__}: {error})"
            ) from error
        finally:
            index = self._unconfirmed_index(result)
            if index is not None:
                del self._unconfirmed[index]
        self.metrics.record_write_duration.observe(time.perf_counter() - started)
        self.metrics.records_written.inc(len(result.records))

    def roll_back_from(self, first: Result[Any] | None = None) -> None:
        """Undo `first` and every change made after it whose records are not durable yet,
        newest first (they were computed on top of it). Without `first`: all of them.
        A sink calls this synchronously when a flush fails, before any waiter resumes."""
        start = 0 if first is None else self._unconfirmed_index(first)
        if start is None:
            return  # already rolled back with an earlier failure
        undone = self._unconfirmed[start:]
        del self._unconfirmed[start:]
        for result in reversed(undone):
            self.core.rollback(result)
        # Timers and runs these changes started or cancelled are derived anew from the
        # state as it is now: as if the coordinator had never seen the changes.
        touched = {group_id for result in undone for group_id in result.touched_groups()}
        self.timers.apply(self.core.reschedule(sorted(touched), self.clock.now_ms()))

    def roll_back_writes(self, failed: Sequence[Sequence[Record]]) -> None:
        """A sink's failure hook: `failed` are the record lists of the failed writes (a
        suffix of the writes in issue order); undo from the oldest of them onwards."""
        failed_ids = {id(records) for records in failed}
        for pending in self._unconfirmed:
            if id(pending.records) in failed_ids:
                self.roll_back_from(pending)
                return

    def _unconfirmed_index(self, result: Result[Any]) -> int | None:
        # By identity: two changes may well carry equal records.
        for index, pending in enumerate(self._unconfirmed):
            if pending is result:
                return index
        return None

    @staticmethod
    def _log_event(event: Event) -> None:
        fields = dict(event.fields)
        fields.pop("event", None)
        if fields.get("worker_url"):
            fields["worker_url"] = redacted_url(fields["worker_url"])
        # One line per member per epoch is too many at info for a group of 1,000 members
        # (8,000 lines a second while it rebalances); the group's own events stay at info.
        emit = log.debug if event.name in DEBUG_EVENTS else log.info
        emit(event.name, group=event.group_id, member=event.member_id, **fields)

    def now_ms(self) -> int:
        return self.clock.now_ms()

    def require_ready(self) -> None:
        if not self.ready:
            raise ApiError(
                ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                "the coordinator is loading its log; retry shortly",
            )

    async def call(self, operation: Callable[..., Any], *args: Any) -> Any:
        """Run `operation(*args, now_ms)` on the core, then `complete` its result."""
        return await self.complete(operation(*args, self.clock.now_ms()))

    # ---------------------------------------------------------------- KRPC operations
    async def heartbeat(self, request: Any, checked: CheckedHeartbeat | None = None
                        ) -> ConnectGroupHeartbeatResponse:
        """`checked`: `check_heartbeat(request)` if the caller did it already, off the loop."""
        return await self.complete(self.core.heartbeat(request, self.clock.now_ms(), checked))

    async def prepare_assignment(self, request: Any) -> ConnectGroupPrepareAssignmentResponse:
        return await self.complete(self.core.prepare_assignment(request, self.clock.now_ms()))

    async def install_assignment(self, request: Any, checked: CheckedInstall | None = None
                                 ) -> ConnectGroupInstallAssignmentResponse:
        """`checked`: `check_install(request)` if the caller did it already, off the loop."""
        if checked is None and install_unit_count(request) >= self.install_offload_units:
            # Checking a large assignment takes milliseconds (13-21 ms for 50,000 units):
            # a thread lets the event loop answer heartbeats meanwhile.
            checked = await trio.to_thread.run_sync(check_install, request)
        return await self.complete(
            self.core.install_assignment(request, self.clock.now_ms(), checked))

    async def classic(self, operation: Callable[[Any, int], Result[Any]], request: Any) -> Any:
        """A classic group request: its answer, once durable; a parked one's when a later
        change releases it."""
        result = operation(request, self.clock.now_ms())
        parked = result.response if isinstance(result.response, Parked) else None
        if parked is None:
            return await self.complete(result)
        waiter = self.waiters.park(parked.key)
        try:
            await self.complete(result)
            return await waiter.wait()
        finally:
            self.waiters.discard(parked.key, waiter)

    def describe(self, request: Any) -> ConnectGroupDescribeResponse:
        described: ConnectGroupDescribeResponse = self.core.describe(request,
                                                                     self.clock.now_ms())
        return described

    # ---------------------------------------------------------------- admin operations
    async def put_connector(self, group_id: str, connector: str, tasks: int) -> dict[str, Any]:
        return await self.complete(
            self.core.put_connector(group_id, connector, tasks, self.clock.now_ms())
        )

    async def delete_connector(self, group_id: str, connector: str) -> dict[str, Any]:
        return await self.complete(
            self.core.delete_connector(group_id, connector, self.clock.now_ms())
        )

    async def remove_static_members(
        self, group_id: str, members: Sequence[tuple[str, str | None]]
    ) -> dict[str, Any]:
        return await self.complete(
            self.core.remove_static_members(group_id, members, self.clock.now_ms())
        )

    async def set_group_config(self, group_id: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self.complete(
            self.core.set_group_config(group_id, body, self.clock.now_ms())
        )

    async def delete_group(self, group_id: str) -> dict[str, Any]:
        return await self.complete(self.core.delete_group(group_id, self.clock.now_ms()))

    # ---------------------------------------------------------------- timers and jobs
    async def _fire_timer(self, key: TimerKey, now_ms: int) -> None:
        self.metrics.timers_fired.labels(key[0]).inc()
        try:
            await self.complete(self.core.on_timer(key, now_ms))
        except Exception:
            # A timer must never stop the scheduler; the state is rolled back if unwritten.
            log.exception("timer_failed", kind=key[0], group=key[1], member=key[2] or None)

    def _start_job(self, run: AssignorRun) -> None:
        if self._nursery is None:
            raise RuntimeError("Runtime.run() is not running; cannot start an assignor run")
        self._nursery.start_soon(self._run_job, run, time.time())

    def _packer_for(self, group_id: str) -> SpecPacker:
        packer = self._packers.get(group_id)
        if packer is None:
            if len(self._packers) > len(self.core.store.groups):  # forget deleted groups
                for gone in [g for g in self._packers if g not in self.core.store.groups]:
                    del self._packers[gone]
                    if self._pool is not None:
                        self._pool.forget(gone)
            packer = self._packers[group_id] = SpecPacker()
        return packer

    async def _run_job(self, run: AssignorRun, submitted: float) -> None:
        assignor = self.core.assignors[run.assignor]
        outcome: CompactResult | BaseException
        timeout_s = self.config.assignor_run_timeout_ms / 1000.0
        started = time.perf_counter()
        label = "ok"
        metrics = self.metrics
        metrics.assignor_runs_in_flight.inc()
        with trio.move_on_after(timeout_s) as scope:
            try:
                async with self._limiter:  # waiting here is queueing for a worker process
                    metrics.assignor_queue_seconds.observe(time.perf_counter() - started)
                    metrics.assignor_pool_busy_ratio.set(
                        self._limiter.borrowed_tokens / self._limiter.total_tokens)
                    running = time.perf_counter()
                    try:
                        pool = self._pool
                        assert pool is not None  # jobs start only while run() runs
                        packer = self._packer_for(run.group_id)
                        packed = await _pack(packer, assignor, run, whole=False)
                        # The core applies the result as the worker sends it: only
                        # the members whose target changed (`CompactResult`).
                        try:
                            outcome = await pool.run(run.group_id, packed)
                        except ResidentMiss:
                            # A worker that did not do the group's last run (new, or it
                            # went to another): once more, packed whole.
                            log.debug("assignor_run_resent", group=run.group_id,
                                      run=run.run_id)
                            packed = await _pack(packer, assignor, run, whole=True)
                            outcome = await pool.run(run.group_id, packed)
                        packer.returned(packed, outcome)
                    finally:
                        metrics.assignor_run_seconds.labels(run.assignor).observe(
                            time.perf_counter() - running)
                metrics.assignor_pool_busy_ratio.set(
                    self._limiter.borrowed_tokens / self._limiter.total_tokens)
            except Exception as error:  # a failing plug-in assignor is reported, not fatal
                outcome = error
                label = "failed"
        metrics.assignor_runs_in_flight.dec()
        if scope.cancelled_caught:
            outcome = AssignorTimeout(
                f"assignor {run.assignor} ran longer than {self.config.assignor_run_timeout_ms} ms"
            )
            label = "timeout"
        self.metrics.assignor_runs.labels(label).inc()
        returned = time.time()
        # (Told once it has landed, in one line: a line costs ~20 us in a quiet script,
        # more on a busy loop, and here heartbeats that came with the result are waiting.)
        duration_ms = round((time.perf_counter() - started) * 1000, 2)
        try:
            await trio.lowlevel.checkpoint()  # the result arrived: answer heartbeats first
            await self.complete(
                self.core.complete_assignor_run(run, outcome, self.clock.now_ms()))
        except Exception:
            log.exception("assignor_result_failed", group=run.group_id, run=run.run_id)
        times = RunTimes(run.group_id, run.run_id, label, submitted, returned, time.time())
        self.recent_runs.append(times)
        self.runs_landed += 1
        log.info("assignor_run_landed", group=run.group_id, assignor=run.assignor,
                 run=run.run_id, outcome=label, duration_ms=duration_ms,
                 submitted_at=round(times.submitted, 6), returned_at=round(times.returned, 6),
                 landed_at=round(times.landed, 6),
                 landing_ms=round((times.landed - times.returned) * 1000, 2))
