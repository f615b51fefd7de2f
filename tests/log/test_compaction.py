"""Compaction: newest record per key, tombstone retention, atomic rewrites."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.config import ServerConfig
from coordinator.core.result import Record
from coordinator.log import LogWriteError, LogWriter, compact, read_all
from coordinator.log.faults import FaultyFileLayer, SimulatedCrash
from coordinator.log.segments import segment_file_name
from coordinator.storage import LogSink, compact_once, encode_records
from protocol.messages import ConnectGroupMetadataKey, ConnectGroupMetadataValue

from .helpers import latest_by_key, load_entries, segment_paths, snapshot

T0 = 1_700_000_000_000
DAY = 86_400_000


def write_ops(
    data_dir: Path,
    ops: list[list[tuple[bytes, bytes | None]]],
    *,
    segment_bytes: int = 300,
    times: list[int] | None = None,
) -> None:
    writer = LogWriter.open(data_dir, segment_bytes=segment_bytes)
    for index, records in enumerate(ops):
        writer.append(records, times[index] if times else T0 + index)
    writer.close()


def test_keeps_the_newest_record_per_key_at_its_offset(tmp_path: Path) -> None:
    ops: list[list[tuple[bytes, bytes | None]]] = [
        [(b"k%d" % (i % 5), b"value-%03d" % i + b"." * 40)] for i in range(60)
    ]
    write_ops(tmp_path, ops)
    before = load_entries(tmp_path)
    active_before = segment_paths(tmp_path)[-1].read_bytes()

    report = compact(tmp_path, T0 + 1000, DAY)

    after = load_entries(tmp_path)
    assert latest_by_key(after) == latest_by_key(before)
    assert set(after) <= set(before)  # same offsets, keys, values, timestamps
    newest = {e.key: e.offset for e in before}
    active_base = int(segment_paths(tmp_path)[-1].name[:20])
    for entry in after:
        if entry.offset < active_base:
            assert newest[entry.key] == entry.offset
    assert segment_paths(tmp_path)[-1].read_bytes() == active_before
    assert report.segments_rewritten > 0
    assert report.records_after < report.records_before
    assert report.bytes_after < report.bytes_before


def test_keys_whose_newest_record_is_in_the_active_segment_leave_closed_segments(
    tmp_path: Path,
) -> None:
    write_ops(
        tmp_path,
        [[(b"a", b"old" * 30)], [(b"b", b"keep" * 30)], [(b"a", b"new" * 30)]],
        segment_bytes=100,
    )
    assert len(segment_paths(tmp_path)) == 3
    report = compact(tmp_path, T0, DAY)
    assert [(e.offset, e.key) for e in load_entries(tmp_path)] == [(1, b"b"), (2, b"a")]
    # The first segment kept nothing, the second one record: one file holds both now.
    assert report.segments_removed == 1
    assert [p.name for p in segment_paths(tmp_path)] == [segment_file_name(n) for n in (0, 2)]


def test_tombstones_are_dropped_after_retention_only(tmp_path: Path) -> None:
    ops: list[list[tuple[bytes, bytes | None]]] = [
        [(b"old", b"v"), (b"recent", b"v"), (b"live", b"v")],
        [(b"old", None)],
        [(b"recent", None)],
        [(b"filler", b"x" * 200)],
    ]
    times = [T0, T0 + 1, T0 + 5 * DAY, T0 + 5 * DAY]
    write_ops(tmp_path, ops, segment_bytes=1, times=times)  # a segment per batch
    assert len(segment_paths(tmp_path)) == 4

    report = compact(tmp_path, T0 + 6 * DAY, 2 * DAY)
    entries = load_entries(tmp_path)
    by_key = {e.key: e for e in entries}
    assert b"old" not in by_key  # the old tombstone and the value it deleted are gone
    assert by_key[b"recent"].value is None  # still within retention: kept for replays
    assert by_key[b"live"].value == b"v"
    assert report.tombstones_dropped == 1


def write_rewritable_log(data_dir: Path) -> None:
    """Two closed segments, the first of which compaction rewrites (keeping b)."""
    write_ops(
        data_dir,
        [[(b"a", b"1"), (b"b", b"2")], [(b"a", b"3")], [(b"c", b"4")]],
        segment_bytes=1,
    )


def test_crash_between_temp_write_and_rename_leaves_the_old_segment(tmp_path: Path) -> None:
    write_rewritable_log(tmp_path)
    entries_before = load_entries(tmp_path)
    before = snapshot(tmp_path)
    layer = FaultyFileLayer()
    layer.crash_next("rename")
    with pytest.raises(SimulatedCrash):
        compact(tmp_path, T0, DAY, layer)

    temp_files = sorted(tmp_path.glob("*.tmp"))
    assert [path.name for path in temp_files] == [segment_file_name(0) + ".tmp"]
    assert {
        name: data for name, data in snapshot(tmp_path).items() if name.endswith(".log")
    } == before

    load = read_all(tmp_path)
    assert list(load) == entries_before
    assert load.result.removed_temp_files == [str(temp_files[0])]
    assert not temp_files[0].exists()

    report = compact(tmp_path, T0, DAY)
    assert report.segments_rewritten == 1
    assert [(e.offset, e.key) for e in load_entries(tmp_path)] == [(1, b"b"), (2, b"a"), (3, b"c")]


def test_failed_temp_write_cleans_up_and_leaves_the_segment(tmp_path: Path) -> None:
    write_rewritable_log(tmp_path)
    before = snapshot(tmp_path)
    layer = FaultyFileLayer()
    layer.fail_next_fsync()
    with pytest.raises(OSError):
        compact(tmp_path, T0, DAY, layer)
    assert snapshot(tmp_path) == before


def test_only_durable_records_supersede_older_ones(tmp_path: Path) -> None:
    layer = FaultyFileLayer()
    writer = LogWriter.open(tmp_path, file_layer=layer, segment_bytes=100)
    writer.append([(b"a", b"first" * 30)], T0)
    writer.append([(b"b", b"other" * 30)], T0)
    writer.sync()
    writer.append([(b"a", b"second" * 30)], T0)  # appended, not yet fsynced
    report = compact(tmp_path, T0, DAY, layer, durable_end_offset=writer.durable_end_offset)
    assert report.segments_rewritten == 0

    layer.fail_next_fsync()
    with pytest.raises(LogWriteError):
        writer.sync()  # the newer "a" is rolled back: the older one must still be there
    writer.close()
    assert latest_by_key(load_entries(tmp_path))[b"a"] == b"first" * 30


async def test_compaction_runs_while_writers_append(tmp_path: Path) -> None:
    """As the server runs it: changes go through the record sink while `compact_once`
    rewrites closed segments in a worker thread."""
    sink = LogSink(LogWriter.open(tmp_path, segment_bytes=2048), lambda: T0)
    config = ServerConfig(log_tombstone_retention_ms=DAY)
    queued: list[tuple[bytes, bytes | None]] = []  # in the order the sink queued: the log's
    writers_done = trio.Event()
    reports = []

    async def writer(number: int) -> None:
        for round_number in range(40):
            key = ConnectGroupMetadataKey(group_id=f"group-{(number * 7 + round_number) % 13}")
            value = ConnectGroupMetadataValue(epoch=number * 1000 + round_number)
            record = Record(key, value)
            queued.extend(encode_records([record]))
            await sink.write([record])  # queues before its first checkpoint

    async def compactor() -> None:
        while not writers_done.is_set():
            report = await compact_once(sink, config, T0)
            assert report is not None
            reports.append(report)
            await trio.sleep(0.001)

    async with trio.open_nursery() as nursery:
        await nursery.start(sink.run)
        async with trio.open_nursery() as compacting:  # one compaction at a time, as served
            compacting.start_soon(compactor)
            async with trio.open_nursery() as writers:
                for number in range(8):
                    writers.start_soon(writer, number)
            writers_done.set()
        final = await compact_once(sink, config, T0)
        assert final is not None
        reports.append(final)
        await sink.close()

    expected = dict(queued)
    assert latest_by_key(load_entries(tmp_path)) == expected
    assert sum(report.segments_rewritten for report in reports) > 0
    assert len(load_entries(tmp_path)) < len(queued)


keys = st.sampled_from([b"a", b"b", b"c", b"d", b"e", b"f"])
values = st.none() | st.binary(min_size=0, max_size=120)
operations = st.lists(
    st.lists(st.tuples(keys, values), min_size=1, max_size=4), min_size=1, max_size=40
)


@settings(max_examples=40, deadline=None)
@given(
    ops=operations,
    segment_bytes=st.integers(80, 600),
    retention=st.sampled_from([0, 5, 10**9]),
    compactions=st.integers(1, 3),
)
def test_compacted_log_replays_to_the_same_state(
    ops: list[list[tuple[bytes, bytes | None]]],
    segment_bytes: int,
    retention: int,
    compactions: int,
) -> None:
    with tempfile.TemporaryDirectory() as directory:
        data_dir = Path(directory)
        write_ops(data_dir, ops, segment_bytes=segment_bytes)
        full = load_entries(data_dir)
        active_before = segment_paths(data_dir)[-1].read_bytes()
        now = T0 + len(ops)
        for _ in range(compactions):
            compact(data_dir, now, retention)
        compacted = load_entries(data_dir)

        assert latest_by_key(compacted) == latest_by_key(full)
        assert set(compacted) <= set(full)  # offsets and contents preserved
        assert segment_paths(data_dir)[-1].read_bytes() == active_before
        # In the closed segments, only the newest record of each key survives.
        newest = {e.key: e.offset for e in full}
        active_base = int(segment_paths(data_dir)[-1].name[:20])
        closed_keys = [e.key for e in compacted if e.offset < active_base]
        assert len(closed_keys) == len(set(closed_keys))
        for entry in compacted:
            if entry.offset < active_base:
                assert newest[entry.key] == entry.offset
                if entry.value is None:
                    assert entry.timestamp_ms >= now - retention
        # Compacting again changes nothing.
        assert compact(data_dir, now, retention).segments_rewritten == 0
