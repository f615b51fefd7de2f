"""Kafka RecordBatch v2: encoding through kio; decoding through aiokafka's C reader, with a
small struct-based reader that says exactly what is wrong when that one refuses a batch.

Why not kio's reader: it truncates record timestamps to whole seconds, reports a short
buffer as "Checksum mismatch" (so a torn tail cannot be told from bit rot), and costs
about 6.6 us per record (about 150,000 records/s), too slow for start-up replay. The
struct-based reader alone reads about 620,000 records/s; aiokafka's compiled reader about
three times that, which start-up replay needs. Batch headers and the CRC-32C (via
`crc32c`) are always checked here first, so a torn tail is still told from bit rot; both
readers are cross-checked against kio's in the tests.

Why aiokafka, and through `aiokafka.record.MemoryRecords`: no library documents a public
RecordBatch v2 reader (aiokafka documents its clients; `aiokafka.record` exports only
`MemoryRecords`, which hands back its compiled batch reader; kafka-python's is pure
Python). `MemoryRecords` spares us aiokafka's private module paths; it needs a bytes copy
of each batch, which the A/B below puts within the noise. A Python loop of our own that
does only what start-up needs (offsets, key, value) was measured against it: start-up
load of 1,000,064 records (`bench replay`'s log, each load in a fresh process, median of
5 alternating runs, CPU seconds): 2.19 s through the private `DefaultRecordBatch`, 2.28 s
through `MemoryRecords`, 2.81 s with the Python loop (+23%); of the 317,328 left after
compaction: 1.59, 1.55 and 1.87 s (+21%).

Why the half-millisecond in `_timestamp`: kio's writer turns a datetime into
milliseconds with `int(dt.timestamp() * 1000)`; floating point makes that one
millisecond short for about 0.6% of exact-millisecond datetimes. Sitting in the middle
of the millisecond makes the truncation land on the intended value.
"""

from __future__ import annotations

import datetime
import io
import struct
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple, cast

from aiokafka.errors import CorruptRecordException
from aiokafka.record import MemoryRecords
from crc32c import crc32c
from kio.records.schema import NewRecordBatch, Record
from kio.records.writers import write_new_batch
from kio.static.primitive import TZAwareMicros, i8, i16, i32, i64

# base offset, batch length, partition leader epoch, magic, crc, attributes,
# last offset delta, base timestamp, max timestamp, producer id, producer epoch,
# base sequence, record count.
_HEADER = struct.Struct(">qiibIhiqqqhii")
HEADER_SIZE = _HEADER.size  # 61
# The base offset and batch length fields are not counted in the batch length.
LENGTH_PREFIX_SIZE = 12
MIN_BATCH_LENGTH = HEADER_SIZE - LENGTH_PREFIX_SIZE
_CRC_COVERAGE_START = 21  # the CRC covers everything from the attributes field on
MAGIC = 2
# Compression codec (bits 0-2), transactional (bit 4) and control (bit 5): none are used.
_UNSUPPORTED_ATTRIBUTES = 0b0011_0111
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


class LogEntry(NamedTuple):
    offset: int
    key: bytes
    value: bytes | None
    timestamp_ms: int


class BatchHeader(NamedTuple):
    position: int
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int
    end: int  # position + size: where the next batch starts

    @property
    def size(self) -> int:
        return LENGTH_PREFIX_SIZE + self.batch_length

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta


class FrameProblem(NamedTuple):
    """Why no valid batch starts at `position`; `short` means the data simply ran out."""

    position: int
    reason: str
    short: bool


class BatchFormatError(ValueError):
    """A batch whose CRC matches but whose contents break the format rules."""


# -- encoding -----------------------------------------------------------------------------


def _timestamp(timestamp_ms: int) -> TZAwareMicros:
    return TZAwareMicros.parse(_EPOCH + datetime.timedelta(microseconds=timestamp_ms * 1000 + 500))


def encode_batch(
    base_offset: int,
    records: Sequence[tuple[bytes, bytes | None]],
    timestamp_ms: int,
) -> bytes:
    """One batch holding `records` at consecutive offsets from `base_offset`."""
    timestamp = _timestamp(timestamp_ms)
    return _encode(
        tuple(
            Record(
                attributes=i8(0),
                timestamp=timestamp,
                offset=i64(base_offset + index),
                key=key,
                value=value,
                headers=(),
            )
            for index, (key, value) in enumerate(records)
        )
    )


def encode_entries(entries: Sequence[LogEntry]) -> bytes:
    """One batch holding `entries` at their own offsets and timestamps (for compaction)."""
    return _encode(
        tuple(
            Record(
                attributes=i8(0),
                timestamp=_timestamp(entry.timestamp_ms),
                offset=i64(entry.offset),
                key=entry.key,
                value=entry.value,
                headers=(),
            )
            for entry in entries
        )
    )


def _encode(records: tuple[Record, ...]) -> bytes:
    if not records:
        raise ValueError("a batch needs at least one record")
    buffer = io.BytesIO()
    write_new_batch(
        buffer,
        NewRecordBatch(
            producer_id=i64(-1),
            producer_epoch=i16(-1),
            base_sequence=i32(-1),
            records=records,
            attributes=i16(0),
        ),
    )
    return buffer.getvalue()


# -- decoding -----------------------------------------------------------------------------


def read_batch_header(data: bytes, position: int, view: memoryview | None = None
                      ) -> BatchHeader | FrameProblem:
    """The header of the batch at `position`, after checking its length, magic and CRC.

    `view`, a memoryview of `data`, saves making one per batch when walking a segment."""
    # Start-up walks every batch through here: a whole batch with the right magic and CRC
    # takes the short way; anything else goes through `_frame_problem`, which says what.
    if len(data) - position >= HEADER_SIZE:
        fields = _HEADER.unpack_from(data, position)
        end = position + LENGTH_PREFIX_SIZE + fields[1]
        if fields[1] >= MIN_BATCH_LENGTH and end <= len(data) and fields[3] == MAGIC:
            if view is None:
                view = memoryview(data)
            if crc32c(view[position + _CRC_COVERAGE_START : end]) == fields[4]:
                header: BatchHeader = _new_tuple(BatchHeader, (position, *fields, end))
                return header
    return _frame_problem(data, position)


_new_tuple = tuple.__new__  # skips the NamedTuple constructor's Python frame


def _frame_problem(data: bytes, position: int) -> BatchHeader | FrameProblem:
    remaining = len(data) - position
    if remaining < LENGTH_PREFIX_SIZE:
        return FrameProblem(position, f"partial batch header ({remaining} bytes)", True)
    batch_length = int.from_bytes(data[position + 8 : position + 12], "big", signed=True)
    if batch_length < MIN_BATCH_LENGTH:
        return FrameProblem(position, f"invalid batch length {batch_length}", False)
    end = position + LENGTH_PREFIX_SIZE + batch_length
    if remaining < LENGTH_PREFIX_SIZE + batch_length:
        return FrameProblem(
            position,
            f"partial batch ({remaining} of {LENGTH_PREFIX_SIZE + batch_length} bytes)",
            True,
        )
    header = BatchHeader._make((position, *_HEADER.unpack_from(data, position), end))
    if header.magic != MAGIC:
        return FrameProblem(position, f"magic byte {header.magic}, expected {MAGIC}", False)
    actual_crc = crc32c(memoryview(data)[position + _CRC_COVERAGE_START : end])
    if actual_crc != header.crc:
        return FrameProblem(
            position,
            f"CRC mismatch (stored {header.crc:#010x}, computed {actual_crc:#010x})",
            False,
        )
    return header


def _read_raw_varint(data: bytes, position: int) -> tuple[int, int]:
    """A varint before zigzag decoding (the multi-byte path; callers inline short ones)."""
    result = 0
    shift = 0
    while True:
        byte = data[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, position
        shift += 7
        if shift > 63:
            raise BatchFormatError("varint longer than 10 bytes")


def collect_newest(newest: dict[bytes, bytes | None], data: bytes, header: BatchHeader,
                   view: memoryview) -> int:
    """Put the records of a batch whose header (and so CRC) `read_batch_header` accepted
    into `newest`, key -> value; a key written again moves to the end, so the dict keeps
    the order of last writes. Returns the batch's record count.

    Anything `collect_newest_records` refuses is decoded again by `decode_records`, which
    names the problem. `view` is a memoryview of `data` (made once per segment, not per
    batch).
    """
    if header.attributes & _UNSUPPORTED_ATTRIBUTES or header.record_count < 0:
        _check_attributes(header)
    if not collect_newest_records(newest, view, header.position, header.end,
                                  header.base_offset, header.last_offset):
        raise _precise_error(data, header, view)
    count: int = header.record_count
    return count


def collect_newest_records(newest: dict[bytes, bytes | None], view: memoryview, start: int,
                           end: int, base_offset: int, last_offset: int) -> bool:
    """`collect_newest`'s loop, for a batch from `start` to `end` whose header checks
    passed: the compiled reader, plus the rules it does not check itself (every record
    has a key, offsets rise and stay within the batch). False when the batch breaks any
    of them (`newest` may then hold some of its records): the caller raises.

    Start-up's fast path: one loop per record, taking plain ints so that a segment walk
    need not build a header per batch."""
    pop = newest.pop
    previous = base_offset - 1
    try:
        batch = MemoryRecords(bytes(view[start:end])).next_batch()
        if batch is None:  # cannot happen: the header check saw a whole batch
            return False
        for record in batch:
            offset = record.offset
            key = record.key
            if offset <= previous or key is None:
                return False
            previous = offset
            pop(key, None)
            newest[key] = record.value
    except CorruptRecordException:
        return False
    return previous <= last_offset


def _compiled_batch(batch: memoryview) -> Iterable[Any]:
    """aiokafka's compiled reader over one whole batch (its header already checked here)."""
    reader = MemoryRecords(bytes(batch)).next_batch()
    if reader is None:  # cannot happen: the batch is whole, as the header check saw
        raise CorruptRecordException("not a whole record batch")
    return cast(Iterable[Any], reader)


def _precise_error(data: bytes, header: BatchHeader, view: memoryview) -> BatchFormatError:
    try:
        decode_records(data, header)
    except BatchFormatError as precise:
        return precise
    # Only the compiled reader objects: still damage, in its words.
    try:
        for _ in _compiled_batch(view[header.position : header.end]):
            pass
    except CorruptRecordException as error:
        return BatchFormatError(str(error))
    return BatchFormatError("records out of order or without a key")


def decode_records(data: bytes, header: BatchHeader) -> list[LogEntry]:
    """The records of a batch whose header (and so CRC) `read_batch_header` accepted, as
    entries, decoded the careful way (every rule checked and named)."""
    _check_attributes(header)
    try:
        return _decode_records(data, header)
    except IndexError:
        raise BatchFormatError("record runs past the end of its batch") from None


def _check_attributes(header: BatchHeader) -> None:
    if header.attributes & _UNSUPPORTED_ATTRIBUTES:
        raise BatchFormatError(f"unsupported batch attributes {header.attributes:#06x}")
    if header.record_count < 0:
        raise BatchFormatError(f"negative record count {header.record_count}")


def _decode_records(data: bytes, header: BatchHeader) -> list[LogEntry]:
    # Hot path of start-up replay: varints of one or two bytes are decoded inline (record
    # and value lengths of 64..8191 bytes take two), and entries are built without the
    # NamedTuple constructor's extra Python frame.
    position = header.position + HEADER_SIZE
    batch_end = header.end
    base_offset = header.base_offset
    base_timestamp = header.base_timestamp
    last_offset_delta = header.last_offset_delta
    previous_delta = -1
    entries: list[LogEntry] = []
    append = entries.append
    new_entry = tuple.__new__
    for _ in range(header.record_count):
        # record length
        byte = data[position]
        if byte < 0x80:
            position += 1
        elif data[position + 1] < 0x80:
            byte = (byte & 0x7F) | (data[position + 1] << 7)
            position += 2
        else:
            byte, position = _read_raw_varint(data, position)
        length = (byte >> 1) ^ -(byte & 1)
        record_end = position + length
        if length < 0 or record_end > batch_end:
            raise BatchFormatError(f"record length {length} out of bounds")
        # attributes (unused by record format v2), then the timestamp delta
        byte = data[position + 1]
        if byte < 0x80:
            position += 2
        else:
            byte, position = _read_raw_varint(data, position + 1)
        timestamp_delta = (byte >> 1) ^ -(byte & 1)
        # offset delta
        byte = data[position]
        if byte < 0x80:
            position += 1
        else:
            byte, position = _read_raw_varint(data, position)
        offset_delta = (byte >> 1) ^ -(byte & 1)
        if offset_delta <= previous_delta or offset_delta > last_offset_delta:
            raise BatchFormatError(
                f"record offset delta {offset_delta} after {previous_delta} "
                f"(last offset delta {last_offset_delta})"
            )
        previous_delta = offset_delta
        # key
        byte = data[position]
        if byte < 0x80:
            position += 1
        elif data[position + 1] < 0x80:
            byte = (byte & 0x7F) | (data[position + 1] << 7)
            position += 2
        else:
            byte, position = _read_raw_varint(data, position)
        key_length = (byte >> 1) ^ -(byte & 1)
        if key_length < 0:
            raise BatchFormatError("record without a key")
        key = data[position : position + key_length]
        position += key_length
        # value (length -1: a tombstone)
        byte = data[position]
        if byte < 0x80:
            position += 1
        elif data[position + 1] < 0x80:
            byte = (byte & 0x7F) | (data[position + 1] << 7)
            position += 2
        else:
            byte, position = _read_raw_varint(data, position)
        value: bytes | None
        if byte == 1:
            value = None
        else:
            value_length = (byte >> 1) ^ -(byte & 1)
            if value_length < 0:
                raise BatchFormatError(f"invalid value length {value_length}")
            value = data[position : position + value_length]
            position += value_length
        # headers: none are written, but skip any a foreign writer added
        if data[position] == 0:
            position += 1
        else:
            position = _skip_headers(data, position)
        if position != record_end:
            raise BatchFormatError("record length does not match its fields")
        append(
            new_entry(
                LogEntry,
                (base_offset + offset_delta, key, value, base_timestamp + timestamp_delta),
            )
        )
    if position != batch_end:
        raise BatchFormatError(f"{batch_end - position} bytes after the last record")
    return entries


def _read_varint(data: bytes, position: int) -> tuple[int, int]:
    raw, position = _read_raw_varint(data, position)
    return (raw >> 1) ^ -(raw & 1), position


def _skip_headers(data: bytes, position: int) -> int:
    count, position = _read_varint(data, position)
    if count < 0:
        raise BatchFormatError(f"negative header count {count}")
    for _ in range(count * 2):  # each header is a key and a value
        length, position = _read_varint(data, position)
        position += max(length, 0)
    return position
