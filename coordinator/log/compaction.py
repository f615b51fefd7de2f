"""Compaction of the closed segments: newest record per key, expired tombstones dropped,
small neighbours merged.

Safety rules:

- Only *closed* segments are rewritten. With a writer running, a segment is closed once
  a later segment starts below the writer's durable end offset: the writer can then never
  roll back into it. Without a writer (`durable_end_offset=None`) every segment but the
  newest is closed.
- "Newest per key" is decided over the whole log, but the segments still being written
  are read only up to `durable_end_offset`: a batch that a failed fsync will roll back
  must not make an older record look superseded.
- Adjacent closed segments are merged while what they keep fits in `segment_bytes`, so
  the number of files stays bounded as the log rolls on. A merge is written under the
  first segment's name and keeps its header (the log's first segment stays the first,
  even when nothing is left in it) and the last one's trailer, so the chain of segments
  runs on unbroken (`coordinator.log.chain`).
- Segments are rewritten oldest first. A tombstone is dropped only when it is the newest
  record of its key and older than the retention; every older record of that key is in
  an older segment and so was removed first. A crash between two rewrites can therefore
  never bring a deleted key back.
- Each rewrite is atomic: temp file, fsync, rename over the first segment, fsync the
  directory; only then are the other merged segments removed. A crash before they are
  gone leaves merge leftovers, which start-up (or the next compaction) removes unread.
  Offsets and timestamps are kept.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from coordinator.log.batch import LogEntry, encode_entries
from coordinator.log.chain import (
    HEADER_SIZE,
    TRAILER_SIZE,
    ChainLink,
    encode_header,
    encode_trailer,
)
from coordinator.log.errors import LogError
from coordinator.log.files import FileLayer, OsFileLayer
from coordinator.log.load import survey
from coordinator.log.scan import SegmentScan
from coordinator.log.segments import DEFAULT_SEGMENT_BYTES, write_whole_file
from coordinator.log.writer import LogWriter

# Kept records are packed into new batches of at most this many records or bytes.
MAX_BATCH_RECORDS = 1000
_MAX_BATCH_BYTES = 1024 * 1024


@dataclass
class CompactionReport:
    segments_examined: int = 0  # closed segments considered
    segments_rewritten: int = 0
    segments_removed: int = 0  # merged into the segment before them, so deleted
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
    segment_bytes: int = DEFAULT_SEGMENT_BYTES,
) -> CompactionReport:
    data_dir = Path(data_dir)
    layer = file_layer if file_layer is not None else OsFileLayer()
    # With a writer running, only the segments below its durable end are looked at: the
    # later ones hold nothing durable, and one may be in the middle of a roll.
    listing, chain = survey(layer, data_dir, below=durable_end_offset)
    listing.require_well_formed()
    chain.raise_first_problem()  # compaction refuses to rewrite a broken log
    if chain.legacy:
        if durable_end_offset is not None:  # a running writer converted them when it opened
            raise LogError(f"{data_dir}: segments without a header while a writer runs")
        # Opening a writer converts them (and repairs what a crash left); nothing is appended.
        LogWriter.open(data_dir, file_layer=layer).close()
        listing, chain = survey(layer, data_dir, below=durable_end_offset)
        chain.raise_first_problem()
    if chain.merge_leftovers:
        for leftover in chain.merge_leftovers:
            layer.remove(leftover.path)
        layer.fsync_directory(data_dir)
    links = chain.links
    durable_end = durable_end_offset if durable_end_offset is not None else float("inf")
    closed_count = _closed_segment_count(links, durable_end)
    closed, open_links = links[:closed_count], links[closed_count:]
    report = CompactionReport(segments_examined=len(closed))
    if not closed:
        return report

    # Pass 1: the offset of every key's newest record.
    newest_offset: dict[bytes, int] = {}
    previous_offset = -1
    for link in closed:
        scan = _scan(layer.read(link.segment.path), link, previous_offset)
        for _, entries in scan.batches():
            for entry in entries:
                newest_offset[entry.key] = entry.offset
        if scan.frame_problem is not None:
            raise scan.problem_error(" (compaction refuses to rewrite a damaged log)")
        previous_offset = scan.last_offset
    for entry in _durable_entries(layer, open_links, previous_offset, durable_end):
        newest_offset[entry.key] = entry.offset

    # Pass 2: rewrite and merge, oldest first. Segments are read again rather than kept;
    # only what one merge keeps (at most `segment_bytes`) is held at a time.
    tombstone_horizon = now_ms - tombstone_retention_ms
    group = _MergeGroup()
    for link in closed:
        data = layer.read(link.segment.path)
        scan = _scan(data, link, -1)
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
        batches = list(_batches(kept)) if len(kept) < total else None
        kept_bytes = (sum(map(len, batches)) if batches is not None
                      else link.ends.batches_end - link.ends.batches_start)
        if group.links and group.size + kept_bytes + TRAILER_SIZE > segment_bytes:
            _write_group(layer, data_dir, group, report)
            group = _MergeGroup()
        group.add(link, data, batches, kept_bytes)
    _write_group(layer, data_dir, group, report)
    return report


class _MergeGroup:
    """Adjacent closed segments that become one, with the batches each keeps."""

    def __init__(self) -> None:
        self.links: list[ChainLink] = []
        self.kept: list[list[bytes]] = []
        self.size = HEADER_SIZE  # of the merged segment, but its trailer
        self.changed = False
        self.file_size = 0  # of the one segment, when it stays as it is

    def add(self, link: ChainLink, data: bytes, batches: list[bytes] | None,
            kept_bytes: int) -> None:
        """`batches` None: the segment keeps every record, as the bytes it has."""
        if batches is None:
            batches = [bytes(data[link.ends.batches_start : link.ends.batches_end])]
        else:
            self.changed = True
        self.links.append(link)
        self.kept.append(batches)
        self.size += kept_bytes
        self.file_size = len(data)

    @property
    def unchanged(self) -> bool:
        return len(self.links) == 1 and not self.changed


def _write_group(layer: FileLayer, data_dir: Path, group: _MergeGroup,
                 report: CompactionReport) -> None:
    if not group.links:
        return
    if group.unchanged:
        report.bytes_after += group.file_size
        return
    first, last = group.links[0], group.links[-1]
    assert last.offset_limit is not None  # a closed segment is followed by another
    chunks = [encode_header(first.segment.base_offset, first=first.ends.first)]
    for batches in group.kept:
        chunks.extend(batches)
    chunks.append(encode_trailer(last.offset_limit))
    report.bytes_after += write_whole_file(layer, first.segment.path, chunks)
    layer.fsync_directory(data_dir)
    report.segments_rewritten += 1
    report.rewritten.append(first.segment.name)
    if len(group.links) > 1:
        # Their records are in the merged segment now; until they are gone they are merge
        # leftovers, which a start-up would remove unread.
        for link in group.links[1:]:
            layer.remove(link.segment.path)
            report.segments_removed += 1
        layer.fsync_directory(data_dir)


def _scan(data: bytes, link: ChainLink, previous_offset: int) -> SegmentScan:
    return SegmentScan(data, link.segment, previous_offset=previous_offset,
                       next_segment_base=link.offset_limit, consecutive=False,
                       start=link.ends.batches_start, end=link.ends.batches_end)


def _closed_segment_count(links: list[ChainLink], durable_end: float) -> int:
    """How many of the oldest segments are closed (see the module docstring)."""
    for index in range(len(links) - 1, 0, -1):
        if links[index].segment.base_offset < durable_end:
            return index
    return 0


def _durable_entries(
    layer: FileLayer, links: list[ChainLink], previous_offset: int, durable_end: float
) -> Iterator[LogEntry]:
    """Records of the segments still being written, up to the durable end.

    A frame problem here is not an error: it may be a batch being appended right now.
    """
    for link in links:
        # Read the whole file: its trailer, if a roll wrote one since the survey, is no batch.
        data = layer.read(link.segment.path)
        scan = SegmentScan(data, link.segment, previous_offset=previous_offset,
                           next_segment_base=None, consecutive=False,
                           start=link.ends.batches_start)
        for header in scan.headers():
            if header.base_offset >= durable_end:
                return
            for entry in scan.decode(header):
                if entry.offset >= durable_end:
                    return
                yield entry
        previous_offset = scan.last_offset


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
