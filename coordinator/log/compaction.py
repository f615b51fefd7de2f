"""Compaction of the closed segments: newest record per key, expired tombstones dropped.

Safety rules:

- Only *closed* segments are rewritten. With a writer running, a segment is closed once
  a later segment starts below the writer's durable end offset: the writer can then never
  roll back into it. Without a writer (`durable_end_offset=None`) every segment but the
  newest is closed.
- "Newest per key" is decided over the whole log, but the segments still being written
  are read only up to `durable_end_offset`: a batch that a failed fsync will roll back
  must not make an older record look superseded.
- Segments are rewritten oldest first. A tombstone is dropped only when it is the newest
  record of its key and older than the retention; every older record of that key is in
  an older segment and so was removed first. A crash between two segments can therefore
  never bring a deleted key back.
- Each rewrite is atomic: temp file, fsync, rename over the segment, fsync the directory.
  Offsets and timestamps are kept; the segment keeps its name (its base offset).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from coordinator.log.batch import LogEntry, encode_entries
from coordinator.log.files import FileLayer, OsFileLayer
from coordinator.log.scan import SegmentScan
from coordinator.log.segments import TEMP_SUFFIX, Segment, list_segments

# Kept records are packed into new batches of at most this many records or bytes.
MAX_BATCH_RECORDS = 1000
_MAX_BATCH_BYTES = 1024 * 1024


@dataclass
class CompactionReport:
    segments_examined: int = 0  # closed segments considered
    segments_rewritten: int = 0
    segments_removed: int = 0  # rewritten to nothing, so deleted
    records_before: int = 0  # in the closed segments
    records_after: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    tombstones_dropped: int = 0
    rewritten: list[str] = field(default_factory=list)


def compact(
    data_dir: Path | str,
    now_ms: int,
    tombstone_retention_ms: int,
    file_layer: FileLayer | None = None,
    *,
    durable_end_offset: int | None = None,
) -> CompactionReport:
    data_dir = Path(data_dir)
    layer = file_layer if file_layer is not None else OsFileLayer()
    listing = list_segments(layer, data_dir)
    listing.require_well_formed()
    segments = listing.segments
    durable_end = durable_end_offset if durable_end_offset is not None else float("inf")
    closed_count = _closed_segment_count(segments, durable_end)
    closed, open_segments = segments[:closed_count], segments[closed_count:]
    report = CompactionReport(segments_examined=len(closed))
    if not closed:
        return report

    # Pass 1: the offset of every key's newest record.
    newest_offset: dict[bytes, int] = {}
    previous_offset = -1
    for index, segment in enumerate(closed):
        scan = SegmentScan(
            layer.read(segment.path),
            segment,
            previous_offset=previous_offset,
            next_segment_base=segments[index + 1].base_offset,
            consecutive=False,
        )
        for _, entries in scan.batches():
            for entry in entries:
                newest_offset[entry.key] = entry.offset
        if scan.frame_problem is not None:
            raise scan.problem_error(" (compaction refuses to rewrite a damaged log)")
        previous_offset = scan.last_offset
    for entry in _durable_entries(layer, open_segments, previous_offset, durable_end):
        newest_offset[entry.key] = entry.offset

    # Pass 2: rewrite, oldest first. Segments are read again rather than kept in memory.
    tombstone_horizon = now_ms - tombstone_retention_ms
    for index, segment in enumerate(closed):
        data = layer.read(segment.path)
        scan = SegmentScan(
            data,
            segment,
            previous_offset=-1,
            next_segment_base=segments[index + 1].base_offset,
            consecutive=False,
        )
        kept: list[LogEntry] = []
        total = 0
        for _, entries in scan.batches():
            total += len(entries)
            for entry in entries:
                if newest_offset[entry.key] != entry.offset:
                    continue
                if entry.value is None and entry.timestamp_ms < tombstone_horizon:
                    report.tombstones_dropped += 1
                    continue
                kept.append(entry)
        report.records_before += total
        report.bytes_before += len(data)
        report.records_after += len(kept)
        if len(kept) == total:
            report.bytes_after += len(data)
            continue
        new_size = _replace_segment(layer, data_dir, segment, kept)
        report.bytes_after += new_size
        report.segments_rewritten += 1
        report.rewritten.append(segment.name)
        if not kept:
            report.segments_removed += 1
    return report


def _closed_segment_count(segments: list[Segment], durable_end: float) -> int:
    """How many of the oldest segments are closed (see the module docstring)."""
    for index in range(len(segments) - 1, 0, -1):
        if segments[index].base_offset < durable_end:
            return index
    return 0


def _durable_entries(
    layer: FileLayer, segments: list[Segment], previous_offset: int, durable_end: float
) -> Iterator[LogEntry]:
    """Records of the segments still being written, up to the durable end.

    A frame problem here is not an error: it may be a batch being appended right now.
    """
    for index, segment in enumerate(segments):
        scan = SegmentScan(
            layer.read(segment.path),
            segment,
            previous_offset=previous_offset,
            next_segment_base=segments[index + 1].base_offset
            if index + 1 < len(segments)
            else None,
            consecutive=False,
        )
        for header in scan.headers():
            if header.base_offset >= durable_end:
                return
            for entry in scan.decode(header):
                if entry.offset >= durable_end:
                    return
                yield entry
        previous_offset = scan.last_offset


def _replace_segment(
    layer: FileLayer, data_dir: Path, segment: Segment, kept: list[LogEntry]
) -> int:
    """Atomically replace `segment` with `kept`; remove it when nothing is kept."""
    if not kept:
        layer.remove(segment.path)
        layer.fsync_directory(data_dir)
        return 0
    temp_path = data_dir / (segment.name[: -len(".log")] + TEMP_SUFFIX)
    temp = layer.open(temp_path, create=True)
    size = 0
    try:
        try:
            temp.truncate(0)  # a stale temp file from an earlier crash
            for batch in _batches(kept):
                temp.write(batch)
                size += len(batch)
            temp.fsync()
        finally:
            temp.close()
        layer.rename(temp_path, segment.path)
    except OSError:
        # The old segment is untouched; tidy up if we can (start-up removes it otherwise).
        try:
            layer.remove(temp_path)
        except OSError:
            pass
        raise
    layer.fsync_directory(data_dir)
    return size


def _batches(entries: list[LogEntry]) -> Iterator[bytes]:
    start = 0
    while start < len(entries):
        end = start
        size = 0
        while end < len(entries) and end - start < MAX_BATCH_RECORDS and size < _MAX_BATCH_BYTES:
            entry = entries[end]
            size += len(entry.key) + (len(entry.value) if entry.value is not None else 0)
            end += 1
        yield encode_entries(entries[start:end])
        start = end
