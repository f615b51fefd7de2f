"""Group commit in the server's record sink (`LogSink`): changes queued while a flush is in
progress share the next fsync; a failed flush fails with every change queued behind it, and
the runtime hears of them all before any waiter wakes."""

from __future__ import annotations

import errno
import threading
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
import trio.testing

from coordinator.core.result import Record
from coordinator.log import LogWriter, read_all
from coordinator.log.faults import Fault, FaultyFileLayer
from coordinator.storage import LogSink, LogWriteFailed, encode_records
from protocol.messages import ConnectGroupMemberMetadataKey, ConnectGroupMemberMetadataValue

from .helpers import peek_entries, total_batch_bytes

T0 = 1_700_000_000_000


def change(index: int, count: int = 3) -> list[Record]:
    """Distinct, recognisable records for the change number `index`."""
    return [Record(ConnectGroupMemberMetadataKey(group_id=f"g-{index}", member_id=f"m-{n}"),
                   ConnectGroupMemberMetadataValue(worker_url=f"http://w-{index}-{n}:8083",
                                                   rebalance_timeout_ms=60_000,
                                                   client_assignors=()))
            for n in range(count)]


def keys_of(*indexes: int) -> list[bytes]:
    return [key for index in indexes for key, _ in encode_records(change(index))]


@asynccontextmanager
async def running_sink(tmp_path: Path, layer: FaultyFileLayer) -> AsyncIterator[LogSink]:
    sink = LogSink(LogWriter.open(tmp_path, file_layer=layer, segment_bytes=4096), lambda: T0)
    async with trio.open_nursery() as nursery:
        await nursery.start(sink.run)
        yield sink
        await sink.close()


def hold_fsyncs(layer: FaultyFileLayer) -> tuple[threading.Event, threading.Event]:
    """Make the next fsyncs wait for `release`; `entered` is set once one is waiting."""
    entered = threading.Event()
    release = threading.Event()

    def gate(_: Path) -> None:
        entered.set()
        release.wait(10)

    layer.before_fsync = gate
    return entered, release


async def wait_for(event: threading.Event) -> None:
    assert await trio.to_thread.run_sync(event.wait, 10)


async def test_concurrent_changes_share_fsyncs_and_return_only_when_durable(
    tmp_path: Path,
) -> None:
    layer = FaultyFileLayer()
    writers, rounds = 40, 5
    not_durable_at_return: list[bytes] = []
    async with running_sink(tmp_path, layer) as sink:

        async def writer(number: int) -> None:
            for round_number in range(rounds):
                index = number * 100 + round_number
                await sink.write(change(index, count=2))
                # Read only what the last fsyncs covered: the change must be there already.
                durable = {e.key for e in peek_entries(tmp_path,
                                                       synced_sizes=layer.synced_sizes)}
                not_durable_at_return.extend(
                    key for key, _ in encode_records(change(index, count=2))
                    if key not in durable)

        async with trio.open_nursery() as nursery:
            for number in range(writers):
                nursery.start_soon(writer, number)
    assert sink.writer is not None
    stats = sink.writer.stats

    assert not_durable_at_return == []
    changes = writers * rounds
    assert stats.appends == changes and stats.records == 2 * changes  # one batch per change
    # One fsync per flush, and one per rolled segment.
    assert 0 < sink.flushes <= stats.fsyncs < changes / 4, (sink.flushes, stats.fsyncs)
    assert stats.bytes_appended == total_batch_bytes(tmp_path)
    entries = list(read_all(tmp_path))
    assert [e.offset for e in entries] == list(range(2 * changes))
    assert len({e.key for e in entries}) == 2 * changes


async def test_a_single_writer_gets_one_fsync_per_change(tmp_path: Path) -> None:
    async with running_sink(tmp_path, FaultyFileLayer()) as sink:
        for index in range(5):
            await sink.write(change(index))
    assert sink.writer is not None
    assert sink.writer.stats.fsyncs == sink.flushes == 5
    assert [e.key for e in read_all(tmp_path)] == keys_of(0, 1, 2, 3, 4)


@pytest.mark.parametrize("held_flush_fails", [False, True], ids=["next-flush", "held-flush"])
async def test_a_failed_fsync_fails_its_flush_and_every_change_queued_behind_it(
    tmp_path: Path, held_flush_fails: bool
) -> None:
    layer = FaultyFileLayer()
    outcomes: dict[int, str] = {}
    reported: list[tuple[list[Sequence[Record]], dict[int, str]]] = []
    async with running_sink(tmp_path, layer) as sink:
        sink.on_failure = lambda failed: reported.append((failed, dict(outcomes)))
        await sink.write(change(0))
        entered, release = hold_fsyncs(layer)

        async def writer(index: int) -> None:
            try:
                await sink.write(change(index))
                outcomes[index] = "durable"
            except LogWriteFailed:
                outcomes[index] = "failed"

        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer, 1)  # a flush of one, held in its fsync
            await wait_for(entered)
            for index in range(2, 12):  # queued behind it: the next flush
                nursery.start_soon(writer, index)
            await trio.testing.wait_all_tasks_blocked()
            layer.fail_next("fsync", Fault(error=errno.ENOSPC), after=0 if held_flush_fails else 1)
            release.set()
        layer.before_fsync = None

        first_failed = 1 if held_flush_fails else 2
        assert outcomes == {index: "durable" if index < first_failed else "failed"
                            for index in range(1, 12)}
        # Told once, with every failed change, while none of their waiters had woken.
        assert len(reported) == 1
        failed, seen_by_then = reported[0]
        assert sorted(failed, key=lambda records: records[0].key.group_id) == sorted(
            (change(index) for index in range(first_failed, 12)),
            key=lambda records: records[0].key.group_id)
        assert all(index < first_failed for index in seen_by_then)
        assert sink.failed_flushes == 1

        await sink.write(change(20))  # the log goes on
    assert [e.key for e in read_all(tmp_path)] == keys_of(*range(first_failed), 20)


async def test_a_failed_append_rolls_back_the_changes_before_it_in_the_flush(
    tmp_path: Path,
) -> None:
    layer = FaultyFileLayer()
    failed: list[int] = []
    async with running_sink(tmp_path, layer) as sink:
        entered, release = hold_fsyncs(layer)

        async def writer(index: int) -> None:
            try:
                await sink.write(change(index))
            except LogWriteFailed:
                failed.append(index)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer, 0)
            await wait_for(entered)
            for index in range(1, 6):
                nursery.start_soon(writer, index)
            await trio.testing.wait_all_tasks_blocked()
            # The second flush holds five changes: the third one's append fails.
            layer.fail_next("write", Fault(error=errno.ENOSPC), after=2)
            release.set()
        layer.before_fsync = None
        assert sorted(failed) == [1, 2, 3, 4, 5]
        assert sink.writer is not None and sink.writer.next_offset == 3
    assert [e.key for e in read_all(tmp_path)] == keys_of(0)


async def test_close_writes_what_is_queued_then_refuses_more(tmp_path: Path) -> None:
    layer = FaultyFileLayer()
    durable: list[int] = []
    async with running_sink(tmp_path, layer) as sink:
        entered, release = hold_fsyncs(layer)

        async def writer(index: int) -> None:
            await sink.write(change(index))
            durable.append(index)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer, 0)
            await wait_for(entered)
            nursery.start_soon(writer, 1)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(sink.close)
            await trio.testing.wait_all_tasks_blocked()
            release.set()
        layer.before_fsync = None
        assert sorted(durable) == [0, 1]
        with pytest.raises(LogWriteFailed, match="closing"):
            await sink.write(change(2))
    assert [e.key for e in read_all(tmp_path)] == keys_of(0, 1)


async def test_a_sink_stopped_during_a_flush_fails_the_changes_still_waiting(
    tmp_path: Path,
) -> None:
    """Its run task cancelled (the server's nursery going down) while a flush is in its
    fsync, with changes queued behind: the flush in progress still reports, and the
    changes queued behind it fail at once and are reported for rollback, rather than
    leaving their waiters (shielded, in the runtime) waiting for ever."""
    layer = FaultyFileLayer()
    sink = LogSink(LogWriter.open(tmp_path, file_layer=layer), lambda: T0)
    reported: list[list[Sequence[Record]]] = []
    sink.on_failure = reported.append
    outcomes: dict[int, str] = {}
    entered, release = hold_fsyncs(layer)

    async def writer(index: int) -> None:
        try:
            await sink.write(change(index))
            outcomes[index] = "durable"
        except LogWriteFailed:
            outcomes[index] = "failed"

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            flusher = trio.CancelScope()

            async def run_until_cancelled() -> None:
                with flusher:
                    await sink.run()

            nursery.start_soon(run_until_cancelled)
            nursery.start_soon(writer, 0)
            await wait_for(entered)
            for index in (1, 2):  # queued in this order
                nursery.start_soon(writer, index)
                await trio.testing.wait_all_tasks_blocked()
            flusher.cancel()
            release.set()
    layer.before_fsync = None
    assert outcomes == {0: "durable", 1: "failed", 2: "failed"}
    assert reported == [[change(1), change(2)]]
    assert sink.writer is not None
    sink.writer.close()
    assert [e.key for e in read_all(tmp_path)] == keys_of(0)
