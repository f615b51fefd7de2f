"""A segment's two walks agree: the careful one (batch by batch, every record decoded:
dump, compaction) and start-up's quick one (`collect_newest`), on healthy and damaged
segments alike."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pytest
from crc32c import crc32c
from hypothesis import given
from hypothesis import strategies as st

from coordinator.log.batch import LogEntry, encode_batch, encode_entries
from coordinator.log.errors import LogCorruptError
from coordinator.log.scan import SegmentScan
from coordinator.log.segments import Segment

SEGMENT_BASE = 100
# Few distinct keys, so later batches overwrite earlier ones.
record = st.tuples(st.sampled_from([b"a", b"b", b"c", b"d", b"e"]),
                   st.none() | st.binary(max_size=20))
batches_strategy = st.lists(st.lists(record, min_size=1, max_size=4), min_size=1, max_size=12)


def build_segment(batches: list[list[tuple[bytes, bytes | None]]], gaps: list[int],
                  consecutive: bool) -> tuple[bytes, list[int], int]:
    """The segment's bytes, where each batch starts, and the offset after the last;
    older segments (not `consecutive`) may have offset gaps left by compaction."""
    data = b""
    starts = []
    offset = SEGMENT_BASE
    for index, records in enumerate(batches):
        if not consecutive:
            offset += gaps[index % len(gaps)]
        starts.append(len(data))
        data += encode_batch(offset, records, 1_700_000_000_000)
        offset += len(records)
    return data, starts, offset


def with_valid_crc(batch: bytearray) -> bytes:
    struct.pack_into(">I", batch, 17, crc32c(bytes(batch[21:])))
    return bytes(batch)


def damage(data: bytes, starts: list[int], kind: str, where: int, how: int) -> bytes:
    """`kind` of damage at batch `where` (an index into `starts`, wrapped)."""
    start = starts[where % len(starts)]
    if kind == "none":
        return data
    if kind == "flip":  # bit rot somewhere in or after that batch
        position = start + how % (len(data) - start)
        return data[:position] + bytes([data[position] ^ 0x5A]) + data[position + 1:]
    if kind == "truncate":  # a torn tail
        return data[: start + how % (len(data) - start)]
    header = bytearray(data[start:])
    if kind == "record_count":  # the CRC matches, the contents do not
        struct.pack_into(">i", header, 57, struct.unpack_from(">i", header, 57)[0] + how % 3 - 1)
        batch_end = 12 + struct.unpack_from(">i", header, 8)[0]
        return data[:start] + with_valid_crc(header[:batch_end]) + bytes(header[batch_end:])
    if kind == "last_offset_delta":  # valid CRC, the records do not fill the offsets
        delta = struct.unpack_from(">i", header, 23)[0]
        struct.pack_into(">i", header, 23, delta + how % 5 - 2)
        batch_end = 12 + struct.unpack_from(">i", header, 8)[0]
        return data[:start] + with_valid_crc(header[:batch_end]) + bytes(header[batch_end:])
    if kind == "no_records":  # valid CRC, a header alone: -1 or 0 records, offset delta -1 or 0
        empty = bytearray(header[:61])
        struct.pack_into(">i", empty, 8, 61 - 12)
        struct.pack_into(">i", empty, 23, how % 2 - 1)
        struct.pack_into(">i", empty, 57, how // 2 % 2 - 1)
        return data[:start] + with_valid_crc(empty) + data[start:]
    if kind == "magic":  # the magic byte is not covered by the CRC
        header[16] = how % 256
        return data[:start] + bytes(header)
    if kind == "attributes":  # valid CRC: gzip, an unknown codec, transactional, control
        struct.pack_into(">h", header, 21, [1, 7, 0x10, 0x20][how % 4])
        batch_end = 12 + struct.unpack_from(">i", header, 8)[0]
        return data[:start] + with_valid_crc(header[:batch_end]) + bytes(header[batch_end:])
    if kind == "base_offset":  # offsets going backwards or leaving a gap
        struct.pack_into(">q", header, 0, struct.unpack_from(">q", header, 0)[0] + how % 5 - 2)
        return data[:start] + bytes(header)
    assert kind == "backwards_records"  # valid CRC, record offsets out of order
    base = struct.unpack_from(">q", header, 0)[0]
    swapped = encode_entries([LogEntry(base + 1, b"x", b"1", 1), LogEntry(base, b"y", b"2", 1)])
    batch_end = 12 + struct.unpack_from(">i", header, 8)[0]
    return data[:start] + swapped + bytes(header[batch_end:])


def walk(data: bytes, consecutive: bool, next_segment_base: int | None, quick: bool,
         chunk_batches: int) -> dict[str, Any]:
    scan = SegmentScan(data, Segment(SEGMENT_BASE, Path("/d/segment.log")),
                       previous_offset=SEGMENT_BASE - 1, next_segment_base=next_segment_base,
                       consecutive=consecutive)
    newest: dict[bytes, bytes | None] = {b"earlier": b"x"}  # from an earlier segment
    counted = 0
    try:
        if quick:
            for count in scan.collect_newest(newest, chunk_batches):
                assert count >= 0
                counted += count
        else:
            for _, entries in scan.batches():
                for entry in entries:
                    newest.pop(entry.key, None)
                    newest[entry.key] = entry.value
            counted = scan.record_count
    except LogCorruptError as error:
        return {"error": str(error)}
    return {"newest": list(newest.items()), "counted": counted,
            "frame_problem": scan.frame_problem, "last_offset": scan.last_offset,
            "batches": scan.batch_count, "records": scan.record_count,
            "valid_end": scan.valid_end}


@pytest.mark.parametrize("kind", ["none", "flip", "truncate", "record_count",
                                  "last_offset_delta", "no_records", "magic", "attributes",
                                  "base_offset", "backwards_records"])
@given(
    batches=batches_strategy,
    gaps=st.lists(st.integers(0, 3), min_size=1, max_size=4),
    consecutive=st.booleans(),
    where=st.integers(0, 20),
    how=st.integers(0, 10_000),
    chunk_batches=st.sampled_from([1, 2, 3, 2048]),
    next_segment_gap=st.integers(-2, 3),
)
def test_both_walks_see_the_same_records_and_the_same_damage(
    batches: list[list[tuple[bytes, bytes | None]]], gaps: list[int], consecutive: bool,
    kind: str, where: int, how: int, chunk_batches: int, next_segment_gap: int,
) -> None:
    data, starts, end_offset = build_segment(batches, gaps, consecutive)
    data = damage(data, starts, kind, where, how)
    # Only an older segment has a next one, whose base offset its batches must stay below.
    next_segment_base = None if consecutive else end_offset + next_segment_gap
    careful = walk(data, consecutive, next_segment_base, quick=False,
                   chunk_batches=chunk_batches)
    quick = walk(data, consecutive, next_segment_base, quick=True,
                 chunk_batches=chunk_batches)
    assert quick == careful
    if kind == "none" and next_segment_gap >= 0:
        assert careful["frame_problem"] is None and careful["valid_end"] == len(data)
        assert careful["records"] == sum(map(len, batches))


def test_collect_newest_yields_once_per_chunk_of_batches() -> None:
    batches = [[(b"k%d" % index, b"v")] for index in range(7)]
    data, _, _ = build_segment(batches, [0], consecutive=True)
    scan = SegmentScan(data, Segment(SEGMENT_BASE, Path("/d/segment.log")),
                       previous_offset=SEGMENT_BASE - 1, next_segment_base=None,
                       consecutive=True)
    newest: dict[bytes, bytes | None] = {}
    assert list(scan.collect_newest(newest, chunk_batches=3)) == [3, 3, 1]
    assert list(newest) == [b"k%d" % index for index in range(7)]
    assert scan.last_offset == SEGMENT_BASE + 6
