"""Appending, rolling, and rolling back after failed writes and fsyncs."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from coordinator.log import LogWriteError, LogWriter, LogWriterBrokenError, read_all
from coordinator.log.batch import LogEntry
from coordinator.log.chain import HEADER_SIZE
from coordinator.log.faults import Fault, FaultyFileLayer, SimulatedCrash
from coordinator.log.segments import segment_file_name

from .helpers import batch_records, load_entries, segment_paths, snapshot, write_log

T0 = 1_700_000_000_000


def expected_entries(
    batches: list[list[tuple[bytes, bytes | None]]], start_ms: int = T0
) -> list[LogEntry]:
    entries = []
    for index, records in enumerate(batches):
        for key, value in records:
            entries.append(LogEntry(len(entries), key, value, start_ms + index))
    return entries


def test_round_trip_across_rolled_segments(tmp_path: Path) -> None:
    batches = [batch_records(index, count=1 + index % 4) for index in range(60)]
    offsets = write_log(tmp_path, batches, segment_bytes=1024)

    assert offsets == [sum(len(b) for b in batches[:i]) for i in range(len(batches))]
    paths = segment_paths(tmp_path)
    assert len(paths) > 5
    entries = load_entries(tmp_path)
    assert entries == expected_entries(batches)
    # Each segment is named by the offset of its first record and, except the active one,
    # stopped growing once the next batch would have taken it past segment_bytes.
    first_offsets = {entry.offset for entry in entries}
    for path in paths:
        assert int(path.name[:20]) in first_offsets
        assert path.stat().st_size <= 1024
    assert sum(path.stat().st_size for path in paths[:-1]) > 1024 * (len(paths) - 1) * 0.7


def test_reopened_writer_continues_offsets(tmp_path: Path) -> None:
    write_log(tmp_path, [batch_records(0), batch_records(1)])
    writer = LogWriter.open(tmp_path, segment_bytes=1024)
    assert writer.next_offset == 6
    assert writer.append(batch_records(2), T0 + 2) == 6
    writer.close()
    assert [entry.offset for entry in load_entries(tmp_path)] == list(range(9))


def test_a_batch_larger_than_a_segment_gets_a_segment_of_its_own(tmp_path: Path) -> None:
    writer = LogWriter.open(tmp_path, segment_bytes=100)
    writer.append([(b"small", b"x")], T0)
    writer.append([(b"big", b"y" * 500)], T0)
    writer.append([(b"after", b"z")], T0)
    writer.close()
    assert [p.name for p in segment_paths(tmp_path)] == [segment_file_name(n) for n in (0, 1, 2)]
    assert [e.key for e in load_entries(tmp_path)] == [b"small", b"big", b"after"]


def test_load_result_tells_where_appends_continue(tmp_path: Path) -> None:
    write_log(tmp_path, [batch_records(i) for i in range(20)], segment_bytes=500)
    load = read_all(tmp_path)
    with pytest.raises(RuntimeError):
        _ = load.result
    count = sum(1 for _ in load)
    result = load.result
    assert result.records == count == 60
    assert result.next_offset == 60
    assert result.active_segment is not None
    assert result.active_segment.path == segment_paths(tmp_path)[-1]
    assert result.active_segment_size == result.active_segment.path.stat().st_size
    assert result.truncations == [] and result.warnings == []


@pytest.mark.parametrize(
    "fault",
    [Fault(error=errno.ENOSPC), Fault(error=errno.EIO), Fault(error=errno.EIO, keep_bytes=30)],
    ids=["enospc", "eio", "torn"],
)
def test_failed_write_rolls_back_and_the_next_append_works(tmp_path: Path, fault: Fault) -> None:
    layer = FaultyFileLayer()
    writer = LogWriter.open(tmp_path, file_layer=layer)
    writer.append(batch_records(0), T0)
    writer.sync()
    before = snapshot(tmp_path)

    layer.fail_next("write", fault)
    with pytest.raises(LogWriteError) as caught:
        writer.append(batch_records(1), T0 + 1)
    assert isinstance(caught.value.__cause__, OSError)
    assert caught.value.__cause__.errno == fault.error
    assert caught.value.rolled_back_to_offset == 3
    assert snapshot(tmp_path) == before
    assert writer.next_offset == 3

    assert writer.append(batch_records(2), T0 + 2) == 3
    writer.close()
    load = read_all(tmp_path)
    assert [e.key for e in load] == [k for k, _ in batch_records(0) + batch_records(2)]
    assert load.result.truncations == []


def test_failed_fsync_rolls_back_everything_since_the_last_sync(tmp_path: Path) -> None:
    layer = FaultyFileLayer()
    writer = LogWriter.open(tmp_path, file_layer=layer)
    writer.append(batch_records(0), T0)
    writer.sync()
    before = snapshot(tmp_path)
    writer.append(batch_records(1), T0 + 1)
    writer.append(batch_records(2), T0 + 2)

    layer.fail_next_fsync(errno.EIO)
    with pytest.raises(LogWriteError) as caught:
        writer.sync()
    assert caught.value.rolled_back_to_offset == 3
    assert snapshot(tmp_path) == before

    assert writer.append(batch_records(3), T0 + 3) == 3
    writer.sync()
    writer.close()
    assert [e.offset for e in load_entries(tmp_path)] == list(range(6))
    assert load_entries(tmp_path)[3].key == batch_records(3)[0][0]


def test_failed_fsync_while_rolling_removes_nothing_durable(tmp_path: Path) -> None:
    layer = FaultyFileLayer()
    # A batch of batch_records() is 223 bytes: two fit in a segment, a third rolls.
    writer = LogWriter.open(tmp_path, file_layer=layer, segment_bytes=500)
    writer.append(batch_records(0), T0)
    writer.sync()
    writer.append(batch_records(1), T0 + 1)  # unsynced, same segment
    before = snapshot(tmp_path)
    layer.fail_next_fsync()
    with pytest.raises(LogWriteError):
        writer.append(batch_records(2), T0 + 2)  # needs a roll, whose fsync fails
    assert writer.next_offset == 3
    assert [p.name for p in segment_paths(tmp_path)] == [segment_file_name(0)]
    assert (tmp_path / segment_file_name(0)).read_bytes() == \
        before[segment_file_name(0)][: HEADER_SIZE + 223]

    writer.append(batch_records(3), T0 + 3)
    writer.append(batch_records(4), T0 + 4)
    writer.close()
    entries = load_entries(tmp_path)
    assert [e.offset for e in entries] == list(range(9))
    assert len(segment_paths(tmp_path)) == 2


def test_rollback_after_a_roll_empties_the_new_segment(tmp_path: Path) -> None:
    layer = FaultyFileLayer()
    writer = LogWriter.open(tmp_path, file_layer=layer, segment_bytes=400)
    writer.append(batch_records(0), T0)
    writer.append(batch_records(1), T0 + 1)  # rolls: segment 3 appears
    assert [p.name for p in segment_paths(tmp_path)] == [segment_file_name(n) for n in (0, 3)]
    layer.fail_next_fsync()
    with pytest.raises(LogWriteError):
        writer.sync()
    # The roll fsynced batch 0 and closed its segment, so that is durable; batch 1 is
    # gone and its segment is back to its header.
    assert [p.name for p in segment_paths(tmp_path)] == [segment_file_name(n) for n in (0, 3)]
    assert (tmp_path / segment_file_name(3)).stat().st_size == HEADER_SIZE
    assert writer.next_offset == 3
    writer.append(batch_records(2), T0 + 2)
    writer.close()
    assert [e.offset for e in load_entries(tmp_path)] == list(range(6))


def test_failed_rollback_stops_the_writer_and_a_restart_recovers(tmp_path: Path) -> None:
    layer = FaultyFileLayer()
    writer = LogWriter.open(tmp_path, file_layer=layer)
    writer.append(batch_records(0), T0)
    writer.sync()
    layer.tear_next_write(25)
    layer.fail_next("truncate")
    with pytest.raises(LogWriterBrokenError):
        writer.append(batch_records(1), T0 + 1)
    assert writer.broken
    with pytest.raises(LogWriterBrokenError):
        writer.append(batch_records(2), T0 + 2)
    writer.close()

    load = read_all(tmp_path)
    assert [e.offset for e in load] == [0, 1, 2]
    assert len(load.result.truncations) == 1
    assert load.result.truncations[0].removed_bytes == 25


def test_crash_mid_write_leaves_a_torn_tail_that_start_up_removes(tmp_path: Path) -> None:
    layer = FaultyFileLayer()
    writer = LogWriter.open(tmp_path, file_layer=layer)
    writer.append(batch_records(0), T0)
    writer.sync()
    good_size = (tmp_path / segment_file_name(0)).stat().st_size
    layer.tear_next_write(50, crash=True)
    with pytest.raises(SimulatedCrash):
        writer.append(batch_records(1), T0 + 1)
    with pytest.raises(SimulatedCrash):
        writer.close()  # the dead writer cannot tidy up: the torn bytes stay
    assert (tmp_path / segment_file_name(0)).stat().st_size == good_size + 50

    load = read_all(tmp_path)
    assert [e.offset for e in load] == [0, 1, 2]
    (truncation,) = load.result.truncations
    assert truncation.position == good_size and truncation.removed_bytes == 50
    assert "partial batch" in load.result.warnings[0]
    assert (tmp_path / segment_file_name(0)).stat().st_size == good_size

    writer = LogWriter.open(tmp_path, recovered=load.result)
    assert writer.append(batch_records(2), T0 + 2) == 3
    writer.close()
    assert [e.offset for e in load_entries(tmp_path)] == list(range(6))


def test_writer_refuses_a_segment_that_changed_after_loading(tmp_path: Path) -> None:
    write_log(tmp_path, [batch_records(0)])
    load = read_all(tmp_path)
    list(load)
    with open(tmp_path / segment_file_name(0), "ab") as file:
        file.write(b"extra")
    with pytest.raises(Exception, match="changed after loading"):
        LogWriter.open(tmp_path, recovered=load.result)


def test_stats_count_appends_fsyncs_and_bytes(tmp_path: Path) -> None:
    writer = LogWriter.open(tmp_path)
    writer.append(batch_records(0), T0)
    writer.append(batch_records(1), T0)
    writer.sync()
    writer.sync()  # nothing new: no fsync
    writer.close()
    assert writer.stats.appends == 2
    assert writer.stats.records == 6
    assert writer.stats.fsyncs == 1
    assert writer.stats.bytes_appended == \
        (tmp_path / segment_file_name(0)).stat().st_size - HEADER_SIZE
