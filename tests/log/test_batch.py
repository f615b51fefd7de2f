"""RecordBatch v2 encoding (kio), the struct-based decoder and the compiled reader."""

from __future__ import annotations

import struct

import pytest
from crc32c import crc32c
from hypothesis import given
from hypothesis import strategies as st
from kio.records.readers import read_batch as kio_read_batch

from coordinator.log.batch import (
    BatchFormatError,
    BatchHeader,
    FrameProblem,
    LogEntry,
    collect_newest,
    decode_records,
    encode_batch,
    encode_entries,
    read_batch_header,
)

records_strategy = st.lists(
    st.tuples(st.binary(max_size=300), st.none() | st.binary(max_size=10_000)),
    min_size=1,
    max_size=20,
)


def decode(data: bytes, position: int = 0) -> tuple[BatchHeader, list[LogEntry]]:
    """Decode with the careful reader, checking that the fast one agrees."""
    header = read_batch_header(data, position)
    assert isinstance(header, BatchHeader), header
    entries = decode_records(data, header)
    assert fast_newest(data, header) == newest_of(entries)
    return header, entries


def fast_newest(data: bytes, header: BatchHeader) -> list[tuple[bytes, bytes | None]]:
    newest: dict[bytes, bytes | None] = {b"before": b"x"}  # a key from an earlier batch
    assert collect_newest(newest, data, header, memoryview(data)) == header.record_count
    return list(newest.items())


def newest_of(entries: list[LogEntry]) -> list[tuple[bytes, bytes | None]]:
    """The newest value per key in the order of last writes, from the careful reader."""
    newest: dict[bytes, bytes | None] = {b"before": b"x"}
    for entry in entries:
        newest.pop(entry.key, None)
        newest[entry.key] = entry.value
    return list(newest.items())


@given(
    base_offset=st.integers(0, 2**62),
    records=records_strategy,
    timestamp_ms=st.integers(0, 4_102_444_800_000),
)
def test_round_trip_and_agreement_with_kio_reader(
    base_offset: int, records: list[tuple[bytes, bytes | None]], timestamp_ms: int
) -> None:
    data = encode_batch(base_offset, records, timestamp_ms)
    header, entries = decode(data)
    assert header.size == len(data)
    assert header.base_offset == base_offset
    assert header.last_offset == base_offset + len(records) - 1
    assert entries == [
        LogEntry(base_offset + index, key, value, timestamp_ms)
        for index, (key, value) in enumerate(records)
    ]
    kio_batch, kio_size = kio_read_batch(data, 0)
    assert kio_size == len(data)
    assert kio_batch.crc == header.crc
    assert [(r.offset, r.key, r.value) for r in kio_batch.records] == [
        (e.offset, e.key, e.value) for e in entries
    ]


@pytest.mark.parametrize("timestamp_ms", [1_079_485_535_620, 547_295_881_976, 273_579_595_770])
def test_timestamps_survive_to_the_millisecond(timestamp_ms: int) -> None:
    # Values where kio's float conversion of a whole-millisecond datetime loses 1 ms.
    _, entries = decode(encode_batch(0, [(b"k", b"v")], timestamp_ms))
    assert entries[0].timestamp_ms == timestamp_ms


def test_entries_keep_their_own_offsets_and_timestamps() -> None:
    entries = [
        LogEntry(5, b"a", b"1", 100),
        LogEntry(9, b"b", None, 90),
        LogEntry(12, b"c", b"3", 200),
    ]
    header, decoded = decode(encode_entries(entries))
    assert decoded == entries
    assert header.base_offset == 5 and header.last_offset == 12
    assert header.max_timestamp == 200


def test_batches_back_to_back() -> None:
    data = encode_batch(0, [(b"a", b"1")], 1) + encode_batch(1, [(b"b", b"2"), (b"c", None)], 2)
    first, _ = decode(data)
    second, entries = decode(data, first.end)
    assert second.end == len(data)
    assert [e.offset for e in entries] == [1, 2]


def test_short_data_is_reported_as_short() -> None:
    data = encode_batch(7, [(b"key", b"value" * 20)], 1)
    for cut in (0, 5, 11, 12, 40, len(data) - 1):
        problem = read_batch_header(data[:cut], 0)
        assert isinstance(problem, FrameProblem)
        assert problem.short, (cut, problem)


def test_flipped_byte_is_a_crc_mismatch() -> None:
    data = bytearray(encode_batch(7, [(b"key", b"value" * 20)], 1))
    data[-3] ^= 0x40
    problem = read_batch_header(bytes(data), 0)
    assert isinstance(problem, FrameProblem)
    assert not problem.short
    assert "CRC mismatch" in problem.reason


def test_bad_magic_and_bad_length_are_damage() -> None:
    data = bytearray(encode_batch(0, [(b"k", b"v")], 1))
    data[16] = 1
    problem = read_batch_header(bytes(data), 0)
    assert isinstance(problem, FrameProblem) and "magic" in problem.reason
    zeros = read_batch_header(bytes(100), 0)
    assert isinstance(zeros, FrameProblem) and not zeros.short
    assert "invalid batch length 0" in zeros.reason


def _with_fixed_crc(data: bytearray) -> bytes:
    struct.pack_into(">I", data, 17, crc32c(bytes(data[21:])))
    return bytes(data)


def _two_records() -> bytearray:
    return bytearray(encode_batch(0, [(b"k", b"v"), (b"l", b"w")], 1))


def _claims_three_records() -> bytes:
    data = _two_records()
    struct.pack_into(">i", data, 57, 3)
    return _with_fixed_crc(data)


def _claims_one_record() -> bytes:
    data = _two_records()
    struct.pack_into(">i", data, 57, 1)
    return _with_fixed_crc(data)


def _second_record_length_short() -> bytes:
    data = _two_records()
    second = 61 + 1 + (data[61] >> 1)  # past the first record's length varint and body
    data[second] -= 2  # zigzag: one byte shorter
    return _with_fixed_crc(data)


def _offsets_going_backwards() -> bytes:
    return encode_entries([LogEntry(5, b"a", b"1", 1), LogEntry(3, b"b", b"2", 1)])


def _record_without_a_key() -> bytes:
    data = bytearray(encode_batch(0, [(b"", b"v")], 1))
    # After the record's length, attributes, timestamp delta and offset delta: the key
    # length, 0 (an empty key) becomes -1 (none), same size.
    data[61 + 4] = 0x01
    return _with_fixed_crc(data)


def _compressed() -> bytes:
    data = bytearray(encode_batch(0, [(b"k", b"v")], 1))
    struct.pack_into(">h", data, 21, 1)  # gzip
    return _with_fixed_crc(data)


@pytest.mark.parametrize(
    ("damaged", "reason"),
    [
        (_claims_three_records, "past the end"),
        (_claims_one_record, "after the last record"),
        (_second_record_length_short, "record length"),
        (_offsets_going_backwards, "offset delta"),
        (_record_without_a_key, "without a key"),
        (_compressed, "attributes"),
    ],
)
def test_malformed_contents_with_a_valid_crc_are_a_format_error(damaged, reason) -> None:  # type: ignore[no-untyped-def]
    # The CRC matches, so this is no torn write: both readers refuse it, in the careful
    # reader's words.
    data = damaged()
    header = read_batch_header(data, 0)
    assert isinstance(header, BatchHeader)
    with pytest.raises(BatchFormatError, match=reason) as careful:
        decode_records(data, header)
    with pytest.raises(BatchFormatError) as fast:
        collect_newest({}, data, header, memoryview(data))
    assert str(fast.value) == str(careful.value)


@pytest.mark.parametrize("size", [0, 1, 63, 64, 8191, 8192, 1_048_576 + 5])
def test_varint_lengths_of_every_width(size: int) -> None:
    # One-, two- and multi-byte varints take different paths in the decoder.
    records = [(b"k" * size, b"v" * size), (b"t" * (size + 1), None), (b"", b"x" * size)]
    data = encode_batch(10, records, 1_700_000_000_000)
    _, entries = decode(data)
    assert [(e.key, e.value) for e in entries] == records


@pytest.mark.parametrize("delta_ms", [-100_000, -64, -1, 0, 63, 64, 8192, 10**9])
def test_timestamp_deltas_of_every_width(delta_ms: int) -> None:
    base = 1_700_000_000_000
    entries = [LogEntry(0, b"a", b"1", base), LogEntry(1, b"b", b"2", base + delta_ms)]
    _, decoded = decode(encode_entries(entries))
    assert decoded == entries


def test_large_offset_deltas() -> None:
    entries = [
        LogEntry(0, b"a", b"1", 5),
        LogEntry(70, b"b", b"2", 5),
        LogEntry(10**6, b"c", None, 5),
    ]
    _, decoded = decode(encode_entries(entries))
    assert decoded == entries
