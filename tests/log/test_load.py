"""Start-up load: torn tails are repaired with a warning, other damage stops start-up."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from coordinator.log import LogCorruptError, LogWriter, check, read_all
from coordinator.log.batch import encode_batch
from coordinator.log.chain import HEADER_SIZE, TRAILER_SIZE
from coordinator.log.load import LogLoad
from coordinator.log.segments import segment_file_name

from .helpers import batch_records, load_entries, segment_paths, snapshot, write_log

T0 = 1_700_000_000_000
BATCH = 223  # bytes of one batch of batch_records(i) for small i
HEADER = HEADER_SIZE  # a segment's batches start after its header


def build(tmp_path: Path, batches: int = 6, segment_bytes: int = 1024) -> list[Path]:
    write_log(tmp_path, [batch_records(i) for i in range(batches)], segment_bytes=segment_bytes)
    return segment_paths(tmp_path)


Reader = Callable[[LogLoad], list[tuple[bytes, bytes | None]]]


@pytest.fixture(params=["entries", "collect_newest"])
def read(request: pytest.FixtureRequest) -> Reader:
    """Both ways of reading a log must see the same records and the same damage: entry by
    entry (the careful reader: dump, compaction) and straight into the newest value per
    key (the compiled reader: start-up). Both give the newest (key, value) per key."""
    if request.param == "entries":
        def careful(load: LogLoad) -> list[tuple[bytes, bytes | None]]:
            newest: dict[bytes, bytes | None] = {}
            for entry in load:
                newest.pop(entry.key, None)
                newest[entry.key] = entry.value
            return list(newest.items())
        return careful

    def fast(load: LogLoad) -> list[tuple[bytes, bytes | None]]:
        newest: dict[bytes, bytes | None] = {}
        assert sum(load.collect_newest(newest)) == load.result.records
        return list(newest.items())
    return fast


def keys(count: int) -> list[bytes]:
    """The keys of the first `count` records build() writes: batch_records(i), three a
    batch."""
    return [key for index in range((count + 2) // 3) for key, _ in batch_records(index)][:count]


def flip_byte(path: Path, position: int) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= 0x55
    path.write_bytes(bytes(data))


def test_empty_directory_loads_nothing(tmp_path: Path, read: Reader) -> None:
    load = read_all(tmp_path / "missing")
    assert read(load) == []
    assert load.result.next_offset == 0 and load.result.active_segment is None


def test_torn_tail_of_newest_segment_is_truncated_with_a_warning(
    tmp_path: Path, read: Reader
) -> None:
    (newest,) = build(tmp_path, batches=3, segment_bytes=10_000)
    good_size = newest.stat().st_size
    torn = encode_batch(9, batch_records(3), T0)[:100]
    with open(newest, "ab") as file:
        file.write(torn)

    load = read_all(tmp_path)
    assert [key for key, _ in read(load)] == keys(9)
    (truncation,) = load.result.truncations
    assert truncation.file == str(newest)
    assert truncation.position == good_size
    assert truncation.removed_bytes == 100
    assert str(newest) in load.result.warnings[0] and str(good_size) in load.result.warnings[0]
    assert newest.stat().st_size == good_size

    writer = LogWriter.open(tmp_path, recovered=load.result, segment_bytes=10_000)
    assert writer.append(batch_records(4), T0) == 9
    writer.close()
    reload = read_all(tmp_path)
    assert [key for key, _ in read(reload)] == keys(9) + [k for k, _ in batch_records(4)]
    assert reload.result.truncations == []


def test_crc_mismatch_in_the_last_batch_is_truncated(tmp_path: Path, read: Reader) -> None:
    (newest,) = build(tmp_path, batches=3, segment_bytes=10_000)
    flip_byte(newest, HEADER + 2 * BATCH + 100)
    load = read_all(tmp_path)
    assert [key for key, _ in read(load)] == keys(6)
    assert "CRC mismatch" in load.result.truncations[0].reason
    assert newest.stat().st_size == HEADER + 2 * BATCH


def test_zeros_at_the_tail_are_truncated(tmp_path: Path, read: Reader) -> None:
    (newest,) = build(tmp_path, batches=2, segment_bytes=10_000)
    with open(newest, "ab") as file:
        file.write(bytes(4096))
    load = read_all(tmp_path)
    assert len(read(load)) == 6
    assert load.result.truncations[0].removed_bytes == 4096


def test_damage_followed_by_valid_batches_is_refused(tmp_path: Path, read: Reader) -> None:
    (newest,) = build(tmp_path, batches=4, segment_bytes=10_000)
    flip_byte(newest, HEADER + BATCH + 80)  # inside the second of four batches
    before = snapshot(tmp_path)
    with pytest.raises(LogCorruptError) as caught:
        read(read_all(tmp_path))
    message = str(caught.value)
    assert str(newest) in message and f"byte {HEADER + BATCH}" in message
    assert "followed by a valid batch" in message
    assert caught.value.position == HEADER + BATCH
    assert snapshot(tmp_path) == before  # nothing was dropped


def test_corrupted_length_field_mid_file_is_refused(tmp_path: Path, read: Reader) -> None:
    # A length that runs past the end looks like a partial batch; the valid batches after
    # it show it is not a torn tail.
    (newest,) = build(tmp_path, batches=4, segment_bytes=10_000)
    data = bytearray(newest.read_bytes())
    data[HEADER + BATCH + 9] = 0x7F
    newest.write_bytes(bytes(data))
    with pytest.raises(LogCorruptError, match=f"byte {HEADER + BATCH}"):
        read(read_all(tmp_path))


def test_crc_mismatch_in_an_older_segment_is_refused(tmp_path: Path, read: Reader) -> None:
    paths = build(tmp_path, batches=10)
    assert len(paths) >= 3
    flip_byte(paths[0], paths[0].stat().st_size - TRAILER_SIZE - 5)  # in its last batch
    before = snapshot(tmp_path)
    with pytest.raises(LogCorruptError) as caught:
        read(read_all(tmp_path))
    assert caught.value.file == str(paths[0])
    assert str(paths[0]) in str(caught.value) and "not the newest" in str(caught.value)
    assert snapshot(tmp_path) == before


def test_partial_batch_in_an_older_segment_is_refused(tmp_path: Path, read: Reader) -> None:
    paths = build(tmp_path, batches=10)
    size = paths[1].stat().st_size
    with open(paths[1], "r+b") as file:
        file.truncate(size - 7)  # its end mark and the end of its last batch
    with pytest.raises(LogCorruptError) as caught:
        read(read_all(tmp_path))
    assert caught.value.file == str(paths[1])
    assert "no end mark" in str(caught.value) and paths[2].name in str(caught.value)


def test_offset_gap_in_the_newest_segment_is_refused(tmp_path: Path, read: Reader) -> None:
    segment = tmp_path / segment_file_name(0)
    tmp_path.mkdir(exist_ok=True)
    segment.write_bytes(
        encode_batch(0, batch_records(0), T0) + encode_batch(5, batch_records(1), T0)
    )
    with pytest.raises(
        LogCorruptError, match=r"byte 223: batch base offset 5, expected 3 \(offset gap\)"
    ):
        read(read_all(tmp_path))


def test_offsets_going_backwards_are_refused(tmp_path: Path, read: Reader) -> None:
    first = tmp_path / segment_file_name(0)
    second = tmp_path / segment_file_name(10)
    second.write_bytes(encode_batch(10, batch_records(2), T0))
    # An older segment with a batch that goes backwards.
    first.write_bytes(encode_batch(3, batch_records(0), T0) + encode_batch(0, batch_records(1), T0))
    with pytest.raises(LogCorruptError, match="going backwards") as caught:
        read(read_all(tmp_path))
    assert caught.value.file == str(first) and caught.value.position == BATCH


def test_segment_overlapping_the_next_is_refused(tmp_path: Path, read: Reader) -> None:
    (tmp_path / segment_file_name(0)).write_bytes(encode_batch(0, batch_records(0), T0))
    (tmp_path / segment_file_name(2)).write_bytes(encode_batch(3, batch_records(1), T0))
    with pytest.raises(LogCorruptError, match="next segment's base offset 2"):
        read(read_all(tmp_path))


def test_gaps_left_by_compaction_in_older_segments_are_accepted(
    tmp_path: Path, read: Reader
) -> None:
    (tmp_path / segment_file_name(0)).write_bytes(
        encode_batch(2, [(b"a", b"1")], T0) + encode_batch(7, [(b"b", b"2")], T0)
    )
    (tmp_path / segment_file_name(10)).write_bytes(encode_batch(10, [(b"c", b"3")], T0))
    load = read_all(tmp_path)
    assert read(load) == [(b"a", b"1"), (b"b", b"2"), (b"c", b"3")]
    assert load.result.next_offset == 11


def test_misnamed_segment_is_refused(tmp_path: Path, read: Reader) -> None:
    build(tmp_path, batches=1)
    (tmp_path / "123.log").write_bytes(b"")
    with pytest.raises(LogCorruptError, match="123.log"):
        read(read_all(tmp_path))


def test_foreign_files_are_left_alone(tmp_path: Path) -> None:
    build(tmp_path, batches=1)
    (tmp_path / "LOCK").write_bytes(b"")
    assert len(load_entries(tmp_path)) == 3
    assert (tmp_path / "LOCK").exists()


def test_empty_newest_segment_fixes_the_next_offset(tmp_path: Path, read: Reader) -> None:
    (tmp_path / segment_file_name(0)).write_bytes(encode_batch(0, batch_records(0), T0))
    (tmp_path / segment_file_name(40)).write_bytes(b"")
    load = read_all(tmp_path)
    assert len(read(load)) == 3
    assert load.result.next_offset == 40


def test_check_reports_repairable_tail_without_changing_anything(tmp_path: Path) -> None:
    paths = build(tmp_path, batches=10)
    with open(paths[-1], "ab") as file:
        file.write(encode_batch(99, batch_records(9), T0)[:70])
    before = snapshot(tmp_path)
    report = check(tmp_path)
    assert snapshot(tmp_path) == before
    assert not report.ok and report.start_up_would_succeed
    (damage,) = report.damage
    assert damage.file == str(paths[-1]) and damage.repairable
    assert damage.position == paths[-1].stat().st_size - 70
    assert report.records == 30


def test_check_reports_unrepairable_damage_and_keeps_going(tmp_path: Path) -> None:
    paths = build(tmp_path, batches=10)
    flip_byte(paths[0], HEADER + 30)
    flip_byte(paths[-1], HEADER + 30)
    (tmp_path / "x.log").write_bytes(b"")
    (tmp_path / (paths[1].name + ".tmp")).write_bytes(b"junk")
    before = snapshot(tmp_path)
    report = check(tmp_path)
    assert snapshot(tmp_path) == before
    assert not report.start_up_would_succeed
    damaged = {(d.file, d.position, d.repairable) for d in report.damage}
    assert (str(paths[0]), HEADER, False) in damaged
    assert (str(tmp_path / "x.log"), None, False) in damaged
    # The newest segment's first batch is damaged and followed by valid ones.
    assert (str(paths[-1]), HEADER, False) in damaged
    assert report.temp_files == [str(tmp_path / (paths[1].name + ".tmp"))]
    text = "\n".join(report.lines())
    assert str(paths[0]) in text and "NOT repairable" in text


def test_check_of_a_healthy_log(tmp_path: Path) -> None:
    build(tmp_path, batches=10)
    report = check(tmp_path)
    assert report.ok and report.records == 30 and report.batches == 10
    assert report.lines()[-1] == "OK"
