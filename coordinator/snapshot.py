"""`log snapshot`: the state a log replays to, as rows in Parquet or JSON lines.

The rows are `storage.snapshot_rows` (one per group, member and unit), the input the
capacity report reads with `--snapshot`. The log is read without changing it, so a
snapshot may be taken of the data dir of a running coordinator: a batch being appended
is simply not seen yet.
"""

from __future__ import annotations

import json
import time
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from coordinator.assignors import load_assignors
from coordinator.config import ServerConfig
from coordinator.core.coordinator import GroupCoordinator
from coordinator.core.result import Record
from coordinator.log.files import AppendableFile, FileLayer, OsFileLayer
from coordinator.log.load import read_all
from coordinator.storage import snapshot_rows
from protocol.records import decode_record

# Column order and types; they match the report's SNAPSHOT_SCHEMA (strings and int64).
SNAPSHOT_COLUMNS: tuple[tuple[str, str], ...] = (
    ("kind", "string"),
    ("group_id", "string"),
    ("group_state", "string"),
    ("group_epoch", "int64"),
    ("assignment_epoch", "int64"),
    ("member_id", "string"),
    ("instance_id", "string"),
    ("worker_url", "string"),
    ("member_epoch", "int64"),
    ("member_state", "string"),
    ("connector", "string"),
    ("task", "int64"),
    ("snapshot_ms", "int64"),
)
FORMATS = (".parquet", ".jsonl")


class SnapshotError(ValueError):
    """The snapshot cannot be written as asked (e.g. an unknown file extension)."""


class _ReadOnlyFile:
    """What the loader opens to cut a torn tail: here that cut is skipped, not made."""

    def __init__(self, path: Path) -> None:
        self._path = path

    @property
    def path(self) -> Path:
        return self._path

    @property
    def size(self) -> int:
        return self._path.stat().st_size

    def write(self, data: bytes) -> None:
        raise OSError(f"{self._path} is opened read-only")

    def fsync(self) -> None:
        pass

    def truncate(self, size: int) -> None:
        pass  # the loader already stopped at the tear; the file is left alone

    def close(self) -> None:
        pass


class ReadOnlyFileLayer:
    """A FileLayer for `read_all` that never changes the directory (repairs are skipped)."""

    def __init__(self, inner: FileLayer | None = None) -> None:
        self._inner: FileLayer = inner if inner is not None else OsFileLayer()

    def open(self, path: Path, *, create: bool = False) -> AppendableFile:
        if create:
            raise OSError(f"cannot create {path}: the log is opened read-only")
        return _ReadOnlyFile(path)

    def read(self, path: Path) -> bytes:
        return self._inner.read(path)

    def read_mapped(self, path: Path) -> AbstractContextManager[bytes]:
        return self._inner.read_mapped(path)

    def list_dir(self, directory: Path) -> list[str]:
        return self._inner.list_dir(directory)

    def make_dir(self, directory: Path) -> None:
        raise OSError(f"cannot create {directory}: the log is opened read-only")

    def rename(self, source: Path, target: Path) -> None:
        raise OSError(f"cannot rename {source}: the log is opened read-only")

    def remove(self, path: Path) -> None:
        pass  # a stale compaction temp file: start-up removes it, a snapshot ignores it

    def fsync_directory(self, directory: Path) -> None:
        pass


def load_core(data_dir: Path, config: ServerConfig | None = None) -> GroupCoordinator:
    """A fresh coordinator with the log of `data_dir` replayed into it, read-only."""
    if not data_dir.is_dir():
        raise SnapshotError(f"{data_dir} is not a directory")
    config = config if config is not None else ServerConfig()
    core = GroupCoordinator(config, load_assignors(config.server_assignors))
    for entry in read_all(data_dir, ReadOnlyFileLayer()):
        key, value = decode_record(entry.key, entry.value)
        core.replay(Record(key, value))
    return core


def check_output_path(out: Path) -> None:
    if out.suffix.lower() not in FORMATS:
        raise SnapshotError(
            f"cannot write {out}: the snapshot file must end in .parquet or .jsonl"
        )


def write_rows(rows: list[dict[str, Any]], out: Path) -> None:
    """Write `rows` with every column of SNAPSHOT_COLUMNS (absent values are null)."""
    check_output_path(out)
    names = [name for name, _ in SNAPSHOT_COLUMNS]
    complete = [{name: row.get(name) for name in names} for row in rows]
    # Write next to the target and rename, so a reader never sees half a file.
    temp = out.with_name(f".{out.name}.tmp")
    try:
        if out.suffix.lower() == ".jsonl":
            with open(temp, "w", encoding="utf-8") as file:
                for row in complete:
                    file.write(json.dumps(row) + "\n")
        else:
            import pyarrow as pa
            import pyarrow.parquet as pq

            schema = pa.schema([(name, pa.string() if kind == "string" else pa.int64())
                                for name, kind in SNAPSHOT_COLUMNS])
            pq.write_table(pa.Table.from_pylist(complete, schema=schema), temp)
        temp.replace(out)
    finally:
        temp.unlink(missing_ok=True)


def write_snapshot(data_dir: Path, out: Path, now_ms: int | None = None,
                   config: ServerConfig | None = None) -> list[dict[str, Any]]:
    """Replay `data_dir` and write its rows to `out`; return the rows."""
    check_output_path(out)  # before the (possibly long) replay
    core = load_core(data_dir, config)
    rows = snapshot_rows(core, int(time.time() * 1000) if now_ms is None else now_ms)
    write_rows(rows, out)
    return rows
