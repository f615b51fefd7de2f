"""Group commit: concurrent trio writers share fsyncs; a failed group fails as a whole."""

from __future__ import annotations

import errno
import threading
from pathlib import Path

import pytest
import trio
import trio.testing

from coordinator.log import GroupCommitLog, LogClosedError, LogWriteError, LogWriter, read_all
from coordinator.log.faults import Fault, FaultyFileLayer

from .helpers import batch_records, peek_entries, total_segment_bytes

T0 = 1_700_000_000_000


def open_log(tmp_path: Path, layer: FaultyFileLayer, segment_bytes: int = 4096) -> GroupCommitLog:
    return GroupCommitLog(LogWriter.open(tmp_path, file_layer=layer, segment_bytes=segment_bytes))


async def test_concurrent_writers_share_fsyncs_and_return_only_when_durable(
    tmp_path: Path,
) -> None:
    layer = FaultyFileLayer()
    log = open_log(tmp_path, layer)
    writers = 40
    rounds = 5
    acknowledged: dict[bytes, int] = {}
    not_durable_at_return: list[bytes] = []

    async def writer(number: int) -> None:
        for round_number in range(rounds):
            records = batch_records(number * 100 + round_number, count=2)
            offset = await log.write(records, T0)
            # Read only what the last fsyncs covered: the batch must be there already.
            durable = {
                e.offset: e.key for e in peek_entries(tmp_path, synced_sizes=layer.synced_sizes)
            }
            for index, (key, _) in enumerate(records):
                acknowledged[key] = offset + index
                if durable.get(offset + index) != key:
                    not_durable_at_return.append(key)

    async with trio.open_nursery() as nursery:
        for number in range(writers):
            nursery.start_soon(writer, number)
    await log.close()

    assert not_durable_at_return == []
    total_writes = writers * rounds
    assert log.stats.writes == total_writes
    assert log.stats.records == 2 * total_writes
    fsyncs = log.writer_stats.fsyncs
    assert 0 < fsyncs < total_writes / 4, fsyncs
    assert log.stats.largest_group > 1
    assert log.writer_stats.bytes_appended == total_segment_bytes(tmp_path)

    entries = list(read_all(tmp_path))
    assert [e.offset for e in entries] == list(range(2 * total_writes))
    assert {e.key: e.offset for e in entries} == acknowledged


async def test_a_single_writer_gets_one_fsync_per_write(tmp_path: Path) -> None:
    log = open_log(tmp_path, FaultyFileLayer())
    for index in range(5):
        assert await log.write(batch_records(index), T0) == 3 * index
    await log.close()
    assert log.writer_stats.fsyncs == 5 and log.stats.groups == 5


async def hold_fsyncs(layer: FaultyFileLayer) -> tuple[threading.Event, threading.Event]:
    """Make the next fsync wait for `release`; `entered` is set once it is waiting."""
    entered = threading.Event()
    release = threading.Event()

    def gate(_: Path) -> None:
        entered.set()
        release.wait(10)

    layer.before_fsync = gate
    return entered, release


async def wait_for(event: threading.Event) -> None:
    assert await trio.to_thread.run_sync(event.wait, 10)


async def test_failed_fsync_fails_the_whole_group_and_the_log_goes_on(tmp_path: Path) -> None:
    layer = FaultyFileLayer()
    log = open_log(tmp_path, layer)
    await log.write(batch_records(0), T0)
    entered, release = await hold_fsyncs(layer)
    outcomes: dict[int, int | LogWriteError] = {}

    async def writer(number: int) -> None:
        try:
            outcomes[number] = await log.write(batch_records(number), T0)
        except LogWriteError as error:
            outcomes[number] = error

    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer, 1)  # leads a group of one, held in its fsync
        await wait_for(entered)
        for number in range(2, 12):  # queue behind it: the next group
            nursery.start_soon(writer, number)
        await trio.testing.wait_all_tasks_blocked()
        layer.fail_next("fsync", Fault(), after=1)  # group 1's fsync passes, group 2's fails
        release.set()

    layer.before_fsync = None
    assert isinstance(outcomes[1], int)
    failed = sorted(n for n, outcome in outcomes.items() if isinstance(outcome, LogWriteError))
    assert failed == list(range(2, 12))
    error = outcomes[2]
    assert isinstance(error, LogWriteError)
    assert error.rolled_back_to_offset == 6
    assert isinstance(error.__cause__, LogWriteError)
    assert log.stats.failed_groups == 1 and log.stats.failed_writes == 10

    assert await log.write(batch_records(20), T0) == 6
    await log.close()
    keys = [e.key for e in read_all(tmp_path)]
    expected = [k for n in (0, 1, 20) for k, _ in batch_records(n)]
    assert keys == expected


async def test_failed_write_in_a_group_rolls_back_the_batches_before_it(tmp_path: Path) -> None:
    layer = FaultyFileLayer()
    log = open_log(tmp_path, layer)
    entered, release = await hold_fsyncs(layer)
    errors: list[int] = []

    async def writer(number: int) -> None:
        try:
            await log.write(batch_records(number), T0)
        except LogWriteError:
            errors.append(number)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer, 0)
        await wait_for(entered)
        for number in range(1, 6):
            nursery.start_soon(writer, number)
        await trio.testing.wait_all_tasks_blocked()
        # The second group holds five batches: the third one's write fails.
        layer.fail_next("write", Fault(error=errno.ENOSPC), after=2)
        release.set()

    layer.before_fsync = None
    assert sorted(errors) == [1, 2, 3, 4, 5]
    assert log.writer.next_offset == 3
    await log.close()
    assert [e.key for e in read_all(tmp_path)] == [k for k, _ in batch_records(0)]


async def test_cancelled_while_queued_means_not_written(tmp_path: Path) -> None:
    layer = FaultyFileLayer()
    log = open_log(tmp_path, layer)
    entered, release = await hold_fsyncs(layer)
    cancelled = False

    async def queued_writer(scope_ready: trio.Event, holder: list[trio.CancelScope]) -> None:
        nonlocal cancelled
        with trio.CancelScope() as scope:
            holder.append(scope)
            scope_ready.set()
            await log.write(batch_records(1), T0)
        cancelled = scope.cancelled_caught

    async with trio.open_nursery() as nursery:
        nursery.start_soon(log.write, batch_records(0), T0)
        await wait_for(entered)
        ready = trio.Event()
        scopes: list[trio.CancelScope] = []
        nursery.start_soon(queued_writer, ready, scopes)
        await ready.wait()
        await trio.testing.wait_all_tasks_blocked()
        scopes[0].cancel()
        await trio.testing.wait_all_tasks_blocked()
        release.set()

    layer.before_fsync = None
    assert cancelled
    await log.close()
    assert [e.key for e in read_all(tmp_path)] == [k for k, _ in batch_records(0)]


async def test_cancelled_while_in_flight_still_reports_the_outcome(tmp_path: Path) -> None:
    layer = FaultyFileLayer()
    log = open_log(tmp_path, layer)
    entered, release = await hold_fsyncs(layer)
    results: list[int] = []

    async def in_flight_writer(holder: list[trio.CancelScope]) -> None:
        with trio.CancelScope() as scope:
            holder.append(scope)
            results.append(await log.write(batch_records(0), T0))
            await trio.lowlevel.checkpoint()  # the pending cancellation lands here

    async with trio.open_nursery() as nursery:
        scopes: list[trio.CancelScope] = []
        nursery.start_soon(in_flight_writer, scopes)
        await wait_for(entered)  # its batch is appended and its fsync is held
        scopes[0].cancel()
        await trio.testing.wait_all_tasks_blocked()
        release.set()

    layer.before_fsync = None
    assert results == [0]
    await log.close()
    assert len(list(read_all(tmp_path))) == 3


async def test_close_waits_for_writes_in_flight_then_refuses_more(tmp_path: Path) -> None:
    layer = FaultyFileLayer()
    log = open_log(tmp_path, layer)
    entered, release = await hold_fsyncs(layer)
    offsets: list[int] = []

    async def writer(number: int) -> None:
        offsets.append(await log.write(batch_records(number), T0))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer, 0)
        await wait_for(entered)
        nursery.start_soon(writer, 1)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(log.close)
        await trio.testing.wait_all_tasks_blocked()
        release.set()

    layer.before_fsync = None
    assert sorted(offsets) == [0, 3]
    with pytest.raises(LogClosedError):
        await log.write(batch_records(2), T0)
    assert len(list(read_all(tmp_path))) == 6
