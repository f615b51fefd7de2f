"""The chain of segments: a crash at every step of a roll, a merge or a conversion leaves a
log that loads with everything synced before it, and a broken chain is refused."""

from __future__ import annotations

import contextlib
import errno
from pathlib import Path

import pytest

from coordinator.log import LogCorruptError, LogWriteError, LogWriter, check, compact, read_all
from coordinator.log.batch import encode_batch
from coordinator.log.chain import HEADER_SIZE, read_ends
from coordinator.log.faults import Fault, FaultyFileLayer, Operation, SimulatedCrash
from coordinator.log.segments import Segment, segment_file_name

from .helpers import batch_records, latest_by_key, load_entries, segment_paths, write_log

T0 = 1_700_000_000_000
# Two batches of batch_records() fit in a segment of 500 bytes; the third rolls.
SEGMENT_BYTES = 500

# Every file operation of a roll, in order: (operation, how many of its kind pass first).
ROLL_STEPS: list[tuple[Operation, int, Fault]] = [
    ("fsync", 0, Fault(crash=True)),  # the closing segment's batches
    ("open", 0, Fault(crash=True)),  # the new segment's temp file
    ("write", 0, Fault(crash=True)),  # its header
    ("fsync", 1, Fault(crash=True)),
    ("rename", 0, Fault(crash=True)),  # into place
    ("fsync_directory", 0, Fault(crash=True)),
    ("open", 1, Fault(crash=True)),  # the new segment, to append to
    ("write", 1, Fault(keep_bytes=7, crash=True)),  # the old segment's trailer, torn
    ("fsync", 2, Fault(crash=True)),  # the trailer
    ("write", 2, Fault(keep_bytes=30, crash=True)),  # the first batch of the new segment
]
STEP_IDS = [f"{operation}-{after}" for operation, after, _ in ROLL_STEPS]


def two_synced_batches(data_dir: Path, layer: FaultyFileLayer) -> LogWriter:
    writer = LogWriter.open(data_dir, file_layer=layer, segment_bytes=SEGMENT_BYTES)
    writer.append(batch_records(0), T0)
    writer.append(batch_records(1), T0 + 1)
    writer.sync()
    return writer


def assert_loads_and_continues(data_dir: Path, synced: int) -> None:
    """The log loads with at least the `synced` first records, appends go on from where
    it ends, and afterwards it checks clean."""
    load = read_all(data_dir)
    offsets = [entry.offset for entry in load]
    assert offsets == list(range(len(offsets))) and len(offsets) >= synced
    writer = LogWriter.open(data_dir, recovered=load.result, segment_bytes=SEGMENT_BYTES)
    for index in range(3):
        writer.append(batch_records(10 + index), T0 + 10)
        writer.sync()
    writer.close()
    report = check(data_dir)
    assert report.ok, report.lines()
    offsets = [entry.offset for entry in load_entries(data_dir)]
    assert offsets == list(range(len(offsets))) and len(offsets) >= synced + 9


@pytest.mark.parametrize(("operation", "after", "fault"), ROLL_STEPS, ids=STEP_IDS)
def test_a_crash_at_any_step_of_a_roll_leaves_a_log_that_loads(
    tmp_path: Path, operation: Operation, after: int, fault: Fault
) -> None:
    layer = FaultyFileLayer()
    writer = two_synced_batches(tmp_path, layer)
    layer.fail_next(operation, fault, after=after)
    with pytest.raises(SimulatedCrash):
        writer.append(batch_records(2), T0 + 2)  # rolls
        writer.sync()
    with contextlib.suppress(SimulatedCrash):
        writer.close()  # the dead writer cannot tidy up
    assert layer.pending_faults() == 0
    assert_loads_and_continues(tmp_path, synced=6)


@pytest.mark.parametrize(("operation", "after", "fault"), ROLL_STEPS, ids=STEP_IDS)
def test_a_failed_step_of_a_roll_is_undone_and_the_writer_goes_on(
    tmp_path: Path, operation: Operation, after: int, fault: Fault
) -> None:
    layer = FaultyFileLayer()
    writer = two_synced_batches(tmp_path, layer)
    layer.fail_next(operation, Fault(error=errno.EIO, keep_bytes=fault.keep_bytes), after=after)
    with pytest.raises(LogWriteError):
        writer.append(batch_records(2), T0 + 2)
    assert check(tmp_path).ok, check(tmp_path).lines()
    assert writer.append(batch_records(3), T0 + 3) == 6
    writer.sync()
    writer.close()
    assert [entry.offset for entry in load_entries(tmp_path)] == list(range(9))
    assert check(tmp_path).ok


def test_an_unfinished_roll_is_undone_at_start_up_with_a_warning(tmp_path: Path) -> None:
    layer = FaultyFileLayer()
    writer = two_synced_batches(tmp_path, layer)
    layer.fail_next("write", Fault(crash=True), after=1)  # the trailer
    with pytest.raises(SimulatedCrash):
        writer.append(batch_records(2), T0 + 2)
    with contextlib.suppress(SimulatedCrash):
        writer.close()
    unfinished = tmp_path / segment_file_name(6)
    assert unfinished.stat().st_size == HEADER_SIZE
    report = check(tmp_path)
    assert report.ok and report.unfinished_roll == str(unfinished)
    load = read_all(tmp_path)
    assert len(list(load)) == 6
    assert any(str(unfinished) in warning for warning in load.result.warnings)
    assert not unfinished.exists()


def small_segments(data_dir: Path, count: int = 12) -> dict[bytes, bytes]:
    """`count` closed segments, each keeping a record of its own and one it shares."""
    batches = [[(b"own-%d" % index, b"v" * 40), (b"shared", b"%d" % index)]
               for index in range(count)]
    write_log(data_dir, batches, segment_bytes=1)  # a segment per batch
    return latest_by_key(load_entries(data_dir))


def test_compaction_merges_small_neighbours_within_the_segment_size(tmp_path: Path) -> None:
    state = small_segments(tmp_path)
    assert len(segment_paths(tmp_path)) == 12
    report = compact(tmp_path, T0, 0, segment_bytes=400)
    paths = segment_paths(tmp_path)
    assert 2 < len(paths) < 12 and report.segments_removed == 12 - len(paths)
    assert all(path.stat().st_size <= 400 for path in paths[:-1])
    assert latest_by_key(load_entries(tmp_path)) == state
    assert check(tmp_path).ok
    # Nothing left to merge or drop: a second run rewrites nothing.
    assert compact(tmp_path, T0, 0, segment_bytes=400).segments_rewritten == 0


@pytest.mark.parametrize(("operation", "after"), [
    ("rename", 0), ("fsync_directory", 0), ("remove", 0), ("remove", 2),
    ("fsync_directory", 1), ("rename", 1)])
def test_a_crash_in_a_merge_leaves_a_log_that_loads_the_same(
    tmp_path: Path, operation: Operation, after: int
) -> None:
    state = small_segments(tmp_path)
    layer = FaultyFileLayer()
    layer.fail_next(operation, Fault(crash=True), after=after)
    with pytest.raises(SimulatedCrash):
        compact(tmp_path, T0, 0, layer, segment_bytes=400)
    report = check(tmp_path)
    assert report.ok, report.lines()
    load = read_all(tmp_path)
    assert latest_by_key(list(load)) == state
    assert check(tmp_path).merge_leftovers == []  # the load removed them
    compact(tmp_path, T0, 0, segment_bytes=400)
    assert latest_by_key(load_entries(tmp_path)) == state
    assert check(tmp_path).ok


def test_merge_leftovers_are_reported_then_removed_unread(tmp_path: Path) -> None:
    state = small_segments(tmp_path, count=4)
    layer = FaultyFileLayer()
    layer.fail_next("remove", Fault(crash=True))
    with pytest.raises(SimulatedCrash):
        compact(tmp_path, T0, 0, layer, segment_bytes=10_000)
    leftovers = check(tmp_path).merge_leftovers
    assert leftovers == [str(tmp_path / segment_file_name(n)) for n in (2, 4)]
    load = read_all(tmp_path)
    assert latest_by_key(list(load)) == state
    assert len(load.result.removed_merge_leftovers) == 2
    assert [p.name for p in segment_paths(tmp_path)] == [segment_file_name(n) for n in (0, 6)]


def write_legacy_log(data_dir: Path) -> None:
    """Segments as a coordinator wrote them before they had headers: bare batches, the
    newest one empty (just rolled)."""
    data_dir.mkdir(exist_ok=True)
    (data_dir / segment_file_name(0)).write_bytes(
        encode_batch(0, batch_records(0), T0) + encode_batch(3, batch_records(1), T0))
    # Compaction left a gap at the start of this one.
    (data_dir / segment_file_name(6)).write_bytes(encode_batch(8, [(b"x", b"1")], T0))
    (data_dir / segment_file_name(9)).write_bytes(b"")


def test_a_legacy_log_is_converted_when_a_writer_opens_it(tmp_path: Path) -> None:
    write_legacy_log(tmp_path)
    before = load_entries(tmp_path)
    report = check(tmp_path)
    assert report.ok and report.legacy_segments == 3
    assert "3 segment(s) without a header" in "\n".join(report.lines())
    writer = LogWriter.open(tmp_path)
    assert writer.append([(b"y", b"2")], T0) == 9
    writer.close()
    kinds = [read_ends(Segment(int(p.name[:20]), p), p.read_bytes()).kind
             for p in segment_paths(tmp_path)]
    assert kinds == ["chained"] * 3
    assert load_entries(tmp_path)[:-1] == before
    assert check(tmp_path).ok
    (tmp_path / segment_file_name(6)).unlink()
    with pytest.raises(LogCorruptError, match=segment_file_name(6)):
        load_entries(tmp_path)


@pytest.mark.parametrize("renames", [0, 1, 2])
def test_a_crash_while_converting_a_legacy_log_leaves_one_that_loads(
    tmp_path: Path, renames: int
) -> None:
    write_legacy_log(tmp_path)
    before = load_entries(tmp_path)
    layer = FaultyFileLayer()
    layer.fail_next("rename", Fault(crash=True), after=renames)
    with pytest.raises(SimulatedCrash):
        LogWriter.open(tmp_path, file_layer=layer)
    assert check(tmp_path).ok, check(tmp_path).lines()
    assert load_entries(tmp_path) == before
    LogWriter.open(tmp_path).close()
    assert load_entries(tmp_path) == before and check(tmp_path).ok


def test_an_empty_older_legacy_segment_is_refused(tmp_path: Path) -> None:
    write_legacy_log(tmp_path)
    (tmp_path / segment_file_name(6)).write_bytes(b"")
    with pytest.raises(LogCorruptError, match=f"{segment_file_name(6)}: is empty"):
        load_entries(tmp_path)
    assert not check(tmp_path).ok


def test_a_segment_out_of_place_is_refused(tmp_path: Path) -> None:
    write_log(tmp_path, [batch_records(index) for index in range(6)], segment_bytes=500)
    paths = segment_paths(tmp_path)
    moved = paths[1].with_name(segment_file_name(int(paths[1].name[:20]) + 1))
    paths[1].rename(moved)
    with pytest.raises(LogCorruptError, match=f"{moved.name}: holds the segment that starts"):
        load_entries(tmp_path)


class ListedBeforeTheRoll(FaultyFileLayer):
    """Lists the directory as it was a moment before `hidden` was rolled into it."""

    def __init__(self, hidden: str) -> None:
        super().__init__()
        self.hidden = hidden

    def list_dir(self, directory: Path) -> list[str]:
        return [name for name in super().list_dir(directory) if name != self.hidden]


def test_compaction_beside_a_roll_under_way_sees_no_broken_chain(tmp_path: Path) -> None:
    writer = LogWriter.open(tmp_path, segment_bytes=SEGMENT_BYTES)
    for index in range(4):
        writer.append([(b"same", b"%d" % index), (b"k%d" % index, b"x" * 100)], T0)
        writer.sync()
    writer.append(batch_records(4), T0)  # rolls; not synced yet
    newest = segment_paths(tmp_path)[-1].name
    # The compaction thread listed the directory before the roll, and reads the segment
    # it rolled away from after: that one has a trailer naming a segment it did not list.
    report = compact(tmp_path, T0, 0, ListedBeforeTheRoll(newest),
                     durable_end_offset=writer.durable_end_offset, segment_bytes=10_000)
    assert report.segments_examined >= 1
    writer.sync()
    writer.close()
    assert check(tmp_path).ok
