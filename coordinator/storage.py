"""The embedded durable store: core records <-> the on-disk record log.

`LogSink` is the runtime's record sink. It does its own group commit: every change queued
while a flush is in progress goes into the next flush (one batch per change, one fsync per
flush). When a flush fails, that flush and every change queued behind it fail together —
they were all computed on top of the failed one — and `on_failure` is called at once,
before any waiter wakes, so the runtime can roll them all back newest first while nothing
else runs.

`LogReplayer` loads the log into the core at start-up with the same `replay` used live.
`compact_periodically` compacts the closed segments in a worker thread, off the request
path, while the sink keeps appending.
"""

from __future__ import annotations

import gc
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from itertools import islice
from pathlib import Path
from typing import Any, TypeVar

import structlog
import trio

from coordinator.config import ServerConfig
from coordinator.core.coordinator import GroupCoordinator
from coordinator.core.result import Record
from coordinator.log import (
    CompactionReport,
    LogCorruptError,
    LogError,
    LogWriter,
    compact,
    find_newest,
    read_all,
)
from coordinator.log.files import FileLayer
from coordinator.metrics import Metrics
from protocol.records import RecordDecodeError, decode_record, encode_key, encode_value

log = structlog.get_logger("connect_coordinator.storage")
REPLAY_YIELD_EVERY = 20_000


class LogWriteFailed(Exception):
    """The change's records did not reach the disk; the change was (or must be) undone."""


def encode_records(records: Sequence[Record]) -> list[tuple[bytes, bytes | None]]:
    return [(encode_key(record.key),
             encode_value(record.value) if record.encoded is None else record.encoded)
            for record in records]


@dataclass
class _QueuedWrite:
    source: Sequence[Record]
    records: list[tuple[bytes, bytes | None]]
    done: trio.Event = field(default_factory=trio.Event)
    error: BaseException | None = None


T = TypeVar("T")


class FlushThread:
    """The one thread the log's flushes run in. trio hands its worker threads to whoever
    asks next, so whatever `thread_init` sets for the thread (`serve` lowers its priority)
    would otherwise end up on every later `trio.to_thread` user too."""

    def __init__(self, thread_init: Callable[[], object] | None = None) -> None:
        self._thread_init = thread_init
        self.native_id: int | None = None  # once started (for tests and diagnostics)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="log-flush",
                                            initializer=self._started)

    def _started(self) -> None:
        self.native_id = threading.get_native_id()
        if self._thread_init is not None:
            self._thread_init()

    async def run_sync(self, fn: Callable[..., T], *args: object) -> T:
        """`fn(*args)` in the thread. As with `trio.to_thread.run_sync`, a cancellation
        counts only before the call starts: once it runs, the caller gets its outcome."""
        await trio.lowlevel.checkpoint_if_cancelled()
        token = trio.lowlevel.current_trio_token()
        done = trio.Event()
        future = self._executor.submit(fn, *args)
        future.add_done_callback(lambda _: token.run_sync_soon(done.set))
        with trio.CancelScope(shield=True):
            await done.wait()
        return future.result()

    def close(self) -> None:
        """Let the thread end (nothing runs in it by then: every call is awaited)."""
        self._executor.shutdown(wait=False)


class LogSink:
    def __init__(self, writer: LogWriter | None, now_ms: Callable[[], int],
                 metrics: Metrics | None = None,
                 flush_thread_init: Callable[[], object] | None = None) -> None:
        """`flush_thread_init` runs in the flush thread as it starts (`serve` lowers the
        thread's priority with it)."""
        self.writer = writer  # set by LogReplayer once the log is loaded
        self.flush_thread = FlushThread(flush_thread_init)
        self._now_ms = now_ms
        self.metrics = metrics  # log append and fsync seconds, observed per flush
        self._queue: list[_QueuedWrite] = []
        self._wakeup = trio.Event()
        self._closing = False
        self._stopped = trio.Event()
        # Called synchronously when a flush fails, before any waiter resumes, with the
        # record lists of every failed write (the runtime rolls those changes back).
        self.on_failure: Callable[[list[Sequence[Record]]], None] | None = None
        self.flushes = 0
        self.failed_flushes = 0

    async def write(self, records: Sequence[Record]) -> None:
        if self._closing:
            raise LogWriteFailed("the log is closing")
        queued = _QueuedWrite(records, encode_records(records))
        self._queue.append(queued)
        self._wakeup.set()
        await queued.done.wait()
        if queued.error is not None:
            raise LogWriteFailed(str(queued.error)) from queued.error

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """The flusher: one task writes and fsyncs, so flushes never overlap."""
        task_status.started()
        batch: list[_QueuedWrite] = []
        try:
            while not (self._closing and not self._queue):
                if not self._queue:
                    self._wakeup = trio.Event()
                    await self._wakeup.wait()
                    continue
                batch, self._queue = self._queue, []
                await self._flush(batch)
                batch = []
        finally:
            # Stopped with changes queued, or cancelled before a flush's thread started
            # (once started, the thread's outcome is reported): none of them is durable.
            unwritten = [queued for queued in batch if not queued.done.is_set()] + self._queue
            self._queue = []
            if unwritten:
                self._fail(unwritten, LogError("the log stopped before this change was written"))
            self.flush_thread.close()
            self._stopped.set()

    async def _flush(self, batch: list[_QueuedWrite]) -> None:
        now_ms = self._now_ms()
        try:
            await self.flush_thread.run_sync(self._append_and_sync, batch, now_ms)
        except (LogError, OSError) as error:
            self.failed_flushes += 1
            failed = batch + self._queue
            self._queue = []
            log.error("log_flush_failed", error=str(error), changes=len(failed))
            self._fail(failed, error)
            return
        self.flushes += 1
        for queued in batch:
            queued.done.set()

    def _fail(self, failed: list[_QueuedWrite], error: BaseException) -> None:
        """Fail these writes: the runtime rolls them back before any waiter wakes."""
        for queued in failed:
            queued.error = error
        if self.on_failure is not None:
            self.on_failure([queued.source for queued in failed])
        for queued in failed:
            queued.done.set()

    def _append_and_sync(self, batch: list[_QueuedWrite], now_ms: int) -> None:
        if self.writer is None:
            raise LogError("the log is not loaded yet")
        try:
            started = time.perf_counter()
            for queued in batch:
                self.writer.append(queued.records, now_ms)
            appended = time.perf_counter()
            self.writer.sync()
            synced = time.perf_counter()
        except (LogError, OSError):
            if not self.writer.broken:
                self.writer.rollback_unsynced()
            raise
        if self.metrics is not None:  # histograms are thread-safe
            self.metrics.log_append_seconds.observe(appended - started)
            self.metrics.log_fsync_seconds.observe(synced - appended)

    async def close(self) -> None:
        self._closing = True
        self._wakeup.set()
        await self._stopped.wait()
        if self.writer is not None:
            await trio.to_thread.run_sync(self.writer.close)


class LogReplayer:
    """Replays `data_dir` into the core, then opens the writer where the log ends."""

    def __init__(self, data_dir: Path, config: ServerConfig, sink: LogSink | None = None,
                 file_layer: FileLayer | None = None, *, freeze_loaded: bool = False) -> None:
        """`freeze_loaded`: the process is the coordinator's own (`serve`): the cyclic
        collector is paused while the log loads, and what the load allocated leaves its
        sight when it is done (`gc.freeze`). Otherwise the process's collector is left
        as it is."""
        self.data_dir = data_dir
        self.sink = sink
        self.config = config
        self.file_layer = file_layer
        self.freeze_loaded = freeze_loaded
        self.writer: LogWriter | None = None
        self.records = 0

    async def load(self, core: GroupCoordinator) -> None:
        # Loading allocates nothing but long-lived state: the cyclic collector would scan
        # the growing heap again and again and find nothing (a third of the load time).
        # Those objects still sit in the youngest generation afterwards, so the first
        # collection would walk them all (a 0.3 s pause after loading 1,000,000 records);
        # frozen, collections leave them alone. Only in `serve`'s own process: a process
        # that merely uses this class keeps its collector as it set it.
        collecting = gc.isenabled()
        if self.freeze_loaded:
            gc.disable()
        try:
            await self._load(core)
        finally:
            if self.freeze_loaded:
                gc.freeze()
                # Without a count: `gc.get_freeze_count` walks every frozen object (about
                # 40 ms after loading 300,000 records, 4% of the load).
                log.info("gc_frozen")
            if collecting and self.freeze_loaded:
                gc.enable()

    async def _load(self, core: GroupCoordinator) -> None:
        load = read_all(self.data_dir, self.file_layer)
        # State is a function of the newest record per key (what compaction keeps), so
        # only those are decoded and replayed, in the order of their last write: the
        # same as replaying a fully compacted log, without decoding superseded values.
        # Only the value is kept (a newer one replaces it); the offset of a record that
        # fails to decode is looked up again (`find_newest`).
        newest: dict[bytes, bytes | None] = {}
        try:
            next_checkpoint = REPLAY_YIELD_EVERY
            for count in load.collect_newest(newest):
                self.records += count
                if self.records >= next_checkpoint:
                    next_checkpoint += REPLAY_YIELD_EVERY
                    await trio.lowlevel.checkpoint()  # keep answering LOAD_IN_PROGRESS
            replay = core.store.apply  # the core's `replay`, without building a Record
            survivors = iter(newest.items())
            while chunk := list(islice(survivors, REPLAY_YIELD_EVERY)):
                for key_bytes, value_bytes in chunk:
                    try:
                        key, value = decode_record(key_bytes, value_bytes)
                    except RecordDecodeError as error:
                        raise self._undecodable(key_bytes, error) from error
                    replay(key, value)
                await trio.lowlevel.checkpoint()
        except LogCorruptError as error:
            # Damage start-up must not repair: say where, once, before the process stops.
            log.error("log_load_failed", error=str(error), file=error.file,
                      position=error.position,
                      hint="inspect with `connect-coordinator log check --data-dir DIR`")
            raise
        for warning in load.result.warnings:
            log.warning("log_damage_repaired", detail=warning)
        if load.result.legacy_segments:
            # Written before segments had headers: the writer gives them theirs now.
            log.info("log_segments_converted", segments=len(load.result.legacy_segments))
        self.writer = LogWriter.open(self.data_dir, file_layer=self.file_layer,
                                     segment_bytes=self.config.log_segment_bytes,
                                     recovered=load.result)
        if self.sink is not None:
            self.sink.writer = self.writer
        log.info("log_loaded", records=self.records, groups=len(core.group_ids()),
                 members=core.member_count(), classic_groups=len(core.classic.store.groups),
                 classic_members=core.classic.store.member_count(),
                 next_offset=self.writer.next_offset)

    def _undecodable(self, key_bytes: bytes, error: RecordDecodeError) -> LogCorruptError:
        found = find_newest(self.data_dir, key_bytes, self.file_layer)
        if found is None:  # cannot happen: the key came from the log
            return LogCorruptError(f"{self.data_dir}: a record does not decode: {error}",
                                   file=str(self.data_dir), position=None)
        file, position, offset = found
        return LogCorruptError(
            f"{file} at byte {position}: the record at offset {offset} does not decode: "
            f"{error}", file=file, position=position)


def snapshot_rows(core: GroupCoordinator, now_ms: int) -> list[dict[str, Any]]:
    """The current state as rows (one per group, member and assigned unit)."""
    rows: list[dict[str, Any]] = []
    for group_id in core.group_ids():
        group = core.store.groups[group_id]
        base = {"group_id": group_id, "group_state": group.state, "group_epoch": group.epoch,
                "assignment_epoch": group.assignment_epoch, "snapshot_ms": now_ms}
        rows.append({"kind": "group", **base})
        holders: dict[tuple[str, int], str] = {}
        for member in group.members.values():
            metadata = member.metadata
            rows.append({"kind": "member", **base, "member_id": member.member_id,
                         "instance_id": metadata.instance_id if metadata else None,
                         "worker_url": metadata.worker_url if metadata else None,
                         "member_epoch": member.current.epoch,
                         "member_state": member.current.state.name})
            for unit in member.current.assigned:
                holders[unit] = member.member_id
        for connector, task in sorted(group.units):
            rows.append({"kind": "unit", **base, "member_id": holders.get((connector, task)),
                         "connector": connector, "task": task})
    return rows


async def compact_once(sink: LogSink, config: ServerConfig, now_ms: int
                       ) -> CompactionReport | None:
    """Compact the closed segments once; None when there is no usable writer.

    The writer's durable end bounds what compaction may read of the open segments: a
    batch a failed fsync is about to roll back must not make an older record look
    superseded (see `coordinator.log.compaction`).
    """
    writer = sink.writer
    if writer is None or writer.broken:
        return None
    started = time.perf_counter()
    report = await trio.to_thread.run_sync(
        partial(compact, writer.data_dir, now_ms, config.log_tombstone_retention_ms,
                writer.file_layer, durable_end_offset=writer.durable_end_offset,
                segment_bytes=config.log_segment_bytes))
    log.info("log_compacted", segments_examined=report.segments_examined,
             segments_rewritten=report.segments_rewritten,
             segments_removed=report.segments_removed,
             records_before=report.records_before, records_after=report.records_after,
             bytes_before=report.bytes_before, bytes_after=report.bytes_after,
             tombstones_dropped=report.tombstones_dropped,
             duration_ms=round((time.perf_counter() - started) * 1000, 2))
    return report


async def compact_periodically(sink: LogSink, config: ServerConfig,
                               now_ms: Callable[[], int], metrics: Metrics | None = None
                               ) -> None:
    """Every log.compaction.interval.ms, compact; a failure is logged and retried later.

    Each attempt is counted by outcome: ok, failed, or skipped (no usable writer)."""
    while True:
        await trio.sleep(config.log_compaction_interval_ms / 1000)
        try:
            report = await compact_once(sink, config, now_ms())
            outcome = "ok" if report is not None else "skipped"
        except Exception:
            # Compaction only saves space: the log stays correct without it.
            log.exception("log_compaction_failed")
            outcome = "failed"
        if metrics is not None:
            metrics.compactions.labels(outcome).inc()


def ensure_data_dir(data_dir: Path) -> None:
    data_dir.mkdir(parents=True, exist_ok=True)
    if not os.access(data_dir, os.W_OK):
        raise PermissionError(f"{data_dir} is not writable")
