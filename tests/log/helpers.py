"""Shared helpers for the log tests: building logs, reading them without repairing."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from coordinator.log.batch import LogEntry
from coordinator.log.chain import read_ends
from coordinator.log.files import FileLayer, OsFileLayer
from coordinator.log.load import read_all
from coordinator.log.scan import SegmentScan
from coordinator.log.segments import list_segments
from coordinator.log.writer import LogWriter

Records = list[tuple[bytes, bytes | None]]


def batch_records(index: int, count: int = 3, value_size: int = 40) -> Records:
    """Distinct, recognisable records for the batch number `index`."""
    return [
        (f"key-{index}-{n}".encode(), f"value-{index}-{n}-".encode().ljust(value_size, b"."))
        for n in range(count)
    ]


def write_log(
    data_dir: Path,
    batches: Sequence[Records],
    *,
    segment_bytes: int = 1024,
    start_ms: int = 1_700_000_000_000,
    file_layer: FileLayer | None = None,
) -> list[int]:
    """Append and sync every batch; return their base offsets."""
    writer = LogWriter.open(data_dir, segment_bytes=segment_bytes, file_layer=file_layer)
    offsets = []
    for index, records in enumerate(batches):
        offsets.append(writer.append(records, start_ms + index))
        writer.sync()
    writer.close()
    return offsets


def load_entries(data_dir: Path) -> list[LogEntry]:
    return list(read_all(data_dir))


def peek_entries(data_dir: Path, *, synced_sizes: dict[Path, int] | None = None) -> list[LogEntry]:
    """The complete batches on disk, read-only (a live writer may be mid-append).

    With `synced_sizes`, only the bytes each file had at its last fsync are read.
    """
    layer = OsFileLayer()
    entries: list[LogEntry] = []
    for segment in list_segments(layer, data_dir).segments:
        data = layer.read(segment.path)
        if synced_sizes is not None:
            data = data[: synced_sizes.get(segment.path, 0)]
        ends = read_ends(segment, data)
        scan = SegmentScan(
            data, segment, previous_offset=-1, next_segment_base=None, consecutive=False,
            start=ends.batches_start, end=ends.batches_end,
        )
        for _, batch in scan.batches():
            entries.extend(batch)
    return entries


def snapshot(data_dir: Path) -> dict[str, bytes]:
    """Every file's name and bytes."""
    return {path.name: path.read_bytes() for path in sorted(data_dir.iterdir())}


def total_segment_bytes(data_dir: Path) -> int:
    return sum(path.stat().st_size for path in data_dir.glob("*.log"))


def total_batch_bytes(data_dir: Path) -> int:
    """The segments' bytes without their headers and trailers."""
    layer = OsFileLayer()
    total = 0
    for segment in list_segments(layer, data_dir).segments:
        ends = read_ends(segment, layer.read(segment.path))
        total += ends.batches_end - ends.batches_start
    return total


def segment_paths(data_dir: Path) -> list[Path]:
    return sorted(data_dir.glob("*.log"))


def latest_by_key(entries: Sequence[LogEntry]) -> dict[bytes, bytes]:
    """The state a replay builds: newest value per key, tombstones delete."""
    state: dict[bytes, bytes] = {}
    for entry in entries:
        if entry.value is None:
            state.pop(entry.key, None)
        else:
            state[entry.key] = entry.value
    return state
