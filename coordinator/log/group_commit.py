"""Group commit on trio: many concurrent `write`s share one fsync.

No background task: the first writer to find no commit in progress leads. It takes
everything queued (a group), appends each batch and fsyncs once in a worker thread,
reports to every writer of the group, then hands the lead to the first writer that
queued meanwhile. So each writer waits for at most the group in flight plus its own,
and writes arriving during an fsync share the next one.

Cancellation: a write cancelled while still queued is withdrawn (it never happened). Once
its batch is in a group being written, the outcome is awaited with the cancellation
shielded and reported (the pending cancellation fires at the caller's next checkpoint),
because "cancelled" must mean "not written".
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

import trio

from coordinator.log.compaction import CompactionReport, compact
from coordinator.log.errors import LogClosedError, LogError, LogWriteError
from coordinator.log.writer import LogWriter, WriterStats

Records = Sequence[tuple[bytes, bytes | None]]


@dataclass
class GroupCommitStats:
    writes: int = 0  # batches acknowledged as durable
    records: int = 0
    groups: int = 0  # commits attempted; each costs one fsync when it has data
    failed_groups: int = 0
    failed_writes: int = 0  # writers that got a LogWriteError
    largest_group: int = 0


class _State(enum.Enum):
    QUEUED = "queued"
    LEADER = "leader"  # queued, and told to commit the queue
    IN_FLIGHT = "in flight"
    DONE = "done"


class _PendingWrite:
    __slots__ = ("records", "now_ms", "woken", "state", "offset", "error")

    def __init__(self, records: Records, now_ms: int) -> None:
        self.records = records
        self.now_ms = now_ms
        self.woken = trio.Event()
        self.state = _State.QUEUED
        self.offset = -1
        self.error: BaseException | None = None

    def outcome(self) -> int:
        if self.error is not None:
            # A fresh exception per writer: one instance raised in many tasks would
            # collect all their tracebacks.
            rolled_back_to = (
                self.error.rolled_back_to_offset if isinstance(self.error, LogWriteError) else None
            )
            raise LogWriteError(
                f"group commit failed: {self.error}", rolled_back_to_offset=rolled_back_to
            ) from self.error
        return self.offset


class GroupCommitLog:
    def __init__(self, writer: LogWriter, *, max_group_writes: int = 4096) -> None:
        self._writer = writer
        self._max_group_writes = max_group_writes
        self._queue: list[_PendingWrite] = []
        self._committing = False
        self._closing = False
        self._idle = trio.lowlevel.ParkingLot()
        self._compaction_lock = trio.Lock()
        self.stats = GroupCommitStats()

    @property
    def writer(self) -> LogWriter:
        return self._writer

    @property
    def writer_stats(self) -> WriterStats:
        """Appends, fsyncs and bytes as the writer counted them."""
        return self._writer.stats

    async def write(self, records: Records, now_ms: int) -> int:
        """Append one batch; return its base offset once it is fsynced."""
        if self._closing:
            raise LogClosedError("the log is closed")
        if not records:
            raise ValueError("write needs at least one record")
        pending = _PendingWrite(records, now_ms)
        self._queue.append(pending)
        if self._committing:
            try:
                await pending.woken.wait()
            except trio.Cancelled:
                if pending.state is _State.QUEUED:
                    self._queue.remove(pending)
                    raise
                with trio.CancelScope(shield=True):
                    await pending.woken.wait()
        else:
            self._committing = True
            pending.state = _State.LEADER
        if pending.state is _State.LEADER:
            await self._commit_queued()
        return pending.outcome()

    async def close(self) -> None:
        """Refuse new writes, let queued ones finish, fsync and close the writer."""
        self._closing = True
        while self._committing:
            await self._idle.park()
        await trio.to_thread.run_sync(self._writer.close)

    async def compact(self, now_ms: int, tombstone_retention_ms: int) -> CompactionReport:
        """Compact the closed segments in a worker thread while writes go on."""
        async with self._compaction_lock:
            run = partial(
                compact,
                self._writer.data_dir,
                now_ms,
                tombstone_retention_ms,
                self._writer.file_layer,
                durable_end_offset=self._writer.durable_end_offset,
            )
            return await trio.to_thread.run_sync(run)

    async def _commit_queued(self) -> None:
        # Shielded: the writers of this group must learn the outcome whatever happens to
        # the leader, and the lead must be handed on.
        with trio.CancelScope(shield=True):
            # One scheduling round first: writers woken by the previous group's outcome
            # queue their next batch now and join this group instead of the next one.
            await trio.lowlevel.checkpoint()
            group = self._queue[: self._max_group_writes]
            del self._queue[: len(group)]
            for pending in group:
                pending.state = _State.IN_FLIGHT
            batches = [(pending.records, pending.now_ms) for pending in group]
            self.stats.groups += 1
            self.stats.largest_group = max(self.stats.largest_group, len(group))
            try:
                offsets = await trio.to_thread.run_sync(self._commit_group, batches)
            except Exception as error:
                self.stats.failed_groups += 1
                self.stats.failed_writes += len(group)
                for pending in group:
                    pending.error = error
            else:
                self.stats.writes += len(group)
                for pending, offset in zip(group, offsets, strict=True):
                    pending.offset = offset
                    self.stats.records += len(pending.records)
            for pending in group:
                pending.state = _State.DONE
                pending.woken.set()
            if self._queue:
                successor = self._queue[0]
                successor.state = _State.LEADER
                successor.woken.set()
            else:
                self._committing = False
                self._idle.unpark_all()

    def _commit_group(self, batches: list[tuple[Records, int]]) -> list[int]:
        """In a worker thread: append every batch, then one fsync; all or nothing."""
        writer = self._writer
        try:
            offsets = [writer.append(records, now_ms) for records, now_ms in batches]
            writer.sync()
        except Exception:
            # The failing append or fsync rolled itself back; drop the rest of the group.
            try:
                writer.rollback_unsynced()
            except LogError:
                pass  # the writer is broken now and says so on every later call
            raise
        return offsets
