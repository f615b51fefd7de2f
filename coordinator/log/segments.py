"""Segment file names and the sorted list of a data directory's segments."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from coordinator.log.errors import LogCorruptError
from coordinator.log.files import FileLayer

SEGMENT_SUFFIX = ".log"
# A segment is written whole as `<name>.log.tmp`, then renamed (see `write_whole_file`).
TEMP_SUFFIX = ".log.tmp"
DEFAULT_SEGMENT_BYTES = 64 * 1024 * 1024
_SEGMENT_NAME = re.compile(r"[0-9]{20}\.log")


def segment_file_name(base_offset: int) -> str:
    if not 0 <= base_offset < 10**20:
        raise ValueError(f"base offset {base_offset} does not fit in 20 digits")
    return f"{base_offset:020d}{SEGMENT_SUFFIX}"


@dataclass(frozen=True, order=True)
class Segment:
    base_offset: int
    path: Path

    @property
    def name(self) -> str:
        return self.path.name


@dataclass(frozen=True)
class DirectoryListing:
    segments: list[Segment]  # sorted by base offset
    temp_files: list[Path]  # left behind by an interrupted compaction
    misnamed: list[Path]  # `.log` files whose name is not a segment name

    def require_well_formed(self) -> None:
        """Raise `LogCorruptError` for the first misnamed `.log` file."""
        for path in self.misnamed:
            raise LogCorruptError(
                f"{path}: not a segment file name (20 digits + {SEGMENT_SUFFIX})",
                file=str(path),
                position=None,
            )


def list_segments(file_layer: FileLayer, data_dir: Path) -> DirectoryListing:
    segments: list[Segment] = []
    temp_files: list[Path] = []
    misnamed: list[Path] = []
    for name in file_layer.list_dir(data_dir):
        if name.endswith(TEMP_SUFFIX):
            temp_files.append(data_dir / name)
        elif name.endswith(SEGMENT_SUFFIX):
            if _SEGMENT_NAME.fullmatch(name):
                segments.append(Segment(int(name[:20]), data_dir / name))
            else:
                misnamed.append(data_dir / name)
        # Anything else (a lock file, an editor's backup) is not ours: leave it alone.
    segments.sort()
    return DirectoryListing(segments, temp_files, misnamed)


def write_whole_file(layer: FileLayer, path: Path, chunks: Iterable[bytes]) -> int:
    """Write `chunks` to `path` as a whole: under a temp name, fsynced, renamed into place,
    so that `path` never exists half-written. Returns the size. The caller fsyncs the
    directory. On failure the temp file is removed if possible (start-up removes it
    otherwise) and whatever `path` was stays as it was."""
    temp_path = path.with_name(path.name + ".tmp")
    temp = layer.open(temp_path, create=True)
    size = 0
    try:
        try:
            temp.truncate(0)  # a stale temp file from an earlier crash
            for chunk in chunks:
                temp.write(chunk)
                size += len(chunk)
            temp.fsync()
        finally:
            temp.close()
        layer.rename(temp_path, path)
    except OSError:
        try:
            layer.remove(temp_path)
        except OSError:
            pass
        raise
    return size
