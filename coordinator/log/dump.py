"""A human-readable listing of the log, in the manner of kafka-dump-log."""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterator
from pathlib import Path

from coordinator.log.batch import LogEntry
from coordinator.log.errors import LogCorruptError
from coordinator.log.files import FileLayer, OsFileLayer
from coordinator.log.load import survey
from coordinator.log.scan import SegmentScan

RecordFormatter = Callable[[bytes, bytes | None], str]


def dump(
    data_dir: Path | str,
    format_record: RecordFormatter | None = None,
    file_layer: FileLayer | None = None,
) -> Iterator[str]:
    """One line per segment, per batch and per record; damage is shown, not raised."""
    layer = file_layer if file_layer is not None else OsFileLayer()
    data_dir = Path(data_dir)
    listing, chain = survey(layer, data_dir)
    for path in listing.misnamed:
        yield f"Skipping {path}: not a segment file name"
    for path in listing.temp_files:
        yield f"Skipping {path}: temp file of an interrupted compaction or roll"
    for segment in chain.merge_leftovers:
        yield f"Skipping {segment.path}: merged into the segment before it"
    for problem in chain.problems:
        yield f"Damage: {problem}"
    links = chain.links
    previous_offset = -1
    for link in links:
        segment, ends = link.segment, link.ends
        scan = SegmentScan(
            layer.read(segment.path),
            segment,
            previous_offset=previous_offset,
            next_segment_base=link.offset_limit,
            consecutive=False,  # show what is there; `check` judges the offsets
            start=ends.batches_start,
            end=ends.batches_end,
        )
        yield f"Dumping {segment.path} ({len(scan.data)} bytes)"
        if ends.kind == "chained":
            yield (f"segment header: baseOffset: {ends.header_base} "
                   f"firstOfLog: {str(ends.first).lower()}")
        else:
            yield "segment header: none (written before segments had one)"
        try:
            for header in scan.headers():
                yield (
                    f"baseOffset: {header.base_offset} lastOffset: {header.last_offset} "
                    f"count: {header.record_count} baseTimestamp: {header.base_timestamp} "
                    f"maxTimestamp: {header.max_timestamp} size: {header.size} "
                    f"position: {header.position} crc: {header.crc} isValid: true"
                )
                for entry in scan.decode(header):
                    yield _record_line(entry, format_record)
        except LogCorruptError as error:
            yield f"Damage: {error}"
        if scan.frame_problem is not None:
            yield (
                f"Damage: {segment.path} at byte {scan.frame_problem.position}: "
                f"{scan.frame_problem.reason} ({scan.size - scan.valid_end} bytes)"
            )
        if ends.end_offset is not None:
            yield f"segment trailer: endOffset: {ends.end_offset}"
        previous_offset = max(previous_offset, scan.last_offset)


def _record_line(entry: LogEntry, format_record: RecordFormatter | None) -> str:
    when = datetime.datetime.fromtimestamp(entry.timestamp_ms / 1000, datetime.UTC)
    value_size = -1 if entry.value is None else len(entry.value)
    head = (
        f"| offset: {entry.offset} CreateTime: {entry.timestamp_ms} "
        f"({when.isoformat(timespec='milliseconds')}) keySize: {len(entry.key)} "
        f"valueSize: {value_size}"
    )
    if format_record is not None:
        return f"{head} {format_record(entry.key, entry.value)}"
    value = "<tombstone>" if entry.value is None else entry.value.hex()
    return f"{head} key: {entry.key.hex()} payload: {value}"
