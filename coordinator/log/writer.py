"""The synchronous appender: one batch per `append`, segments rolled by size.

A failed write rolls the log back to where it was before that append; a failed fsync
rolls it back to the last successful fsync, because after a failed fsync the kernel may
already have dropped the unwritten pages, so nothing since the last good fsync can be
trusted (and none of it was acknowledged). If the rollback itself fails, the writer
refuses further work: only a restart (load + tail truncation) restores a known state.

Segments are chained (`coordinator.log.chain`): each one is created whole with its header
under a temp name, and a roll writes the old segment's trailer only once the new segment
exists. Opening a directory written before segments had headers converts it first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from coordinator.log.batch import encode_batch
from coordinator.log.chain import HEADER_SIZE, ChainLink, encode_header, encode_trailer
from coordinator.log.errors import LogClosedError, LogError, LogWriteError, LogWriterBrokenError
from coordinator.log.files import AppendableFile, FileLayer, OsFileLayer
from coordinator.log.load import LoadResult, read_all
from coordinator.log.segments import DEFAULT_SEGMENT_BYTES, segment_file_name, write_whole_file


@dataclass
class WriterStats:
    appends: int = 0
    records: int = 0
    bytes_appended: int = 0
    fsyncs: int = 0
    segments_rolled: int = 0
    failed_writes: int = 0
    failed_fsyncs: int = 0
    rollbacks: int = 0


@dataclass(frozen=True)
class LogPosition:
    segment_base: int  # base offset of the segment the position is in
    size: int  # bytes of that segment up to the position
    next_offset: int


class LogWriter:
    """Not thread-safe: one caller at a time (the record sink's one flusher sees to that)."""

    def __init__(
        self,
        data_dir: Path,
        file_layer: FileLayer,
        active_file: AppendableFile,
        *,
        active_segment_base: int,
        next_offset: int,
        segment_bytes: int,
    ) -> None:
        self._data_dir = data_dir
        self._file_layer = file_layer
        self._active = active_file
        self._active_base = active_segment_base
        self._next_offset = next_offset
        self._segment_bytes = segment_bytes
        self._durable = self.position
        self._broken: BaseException | None = None
        self._closed = False
        self.stats = WriterStats()

    @classmethod
    def open(
        cls,
        data_dir: Path | str,
        *,
        file_layer: FileLayer | None = None,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        recovered: LoadResult | None = None,
    ) -> LogWriter:
        """Continue the log in `data_dir`.

        `recovered` is the result of the `read_all` the caller replayed; without it the
        log is loaded (and its torn tail repaired) here, records discarded.
        """
        if segment_bytes < 1:
            raise ValueError(f"segment_bytes must be positive, not {segment_bytes}")
        data_dir = Path(data_dir)
        layer = file_layer if file_layer is not None else OsFileLayer()
        if recovered is None:
            load = read_all(data_dir, layer)
            for _ in load:
                pass
            recovered = load.result
        if recovered.active_segment is None:
            layer.make_dir(data_dir)
            layer.fsync_directory(data_dir.parent)
            base = recovered.next_offset
            path = data_dir / segment_file_name(base)
            write_whole_file(layer, path, [encode_header(base, first=True)])
            layer.fsync_directory(data_dir)
            active = layer.open(path)
        else:
            base = recovered.active_segment.base_offset
            expected_size = recovered.active_segment_size
            if recovered.legacy_segments:
                expected_size = convert_legacy_segments(
                    layer, data_dir, recovered.legacy_segments, recovered)
            active = layer.open(recovered.active_segment.path)
            if active.size != expected_size:
                active.close()
                raise LogError(
                    f"{recovered.active_segment.path} is {active.size} bytes, the load saw "
                    f"{expected_size}: it changed after loading"
                )
        return cls(
            data_dir,
            layer,
            active,
            active_segment_base=base,
            next_offset=recovered.next_offset,
            segment_bytes=segment_bytes,
        )

    @property
    def next_offset(self) -> int:
        return self._next_offset

    @property
    def broken(self) -> bool:
        """A rollback failed: every call raises until the process restarts and reloads."""
        return self._broken is not None

    @property
    def durable_end_offset(self) -> int:
        """Every offset below this has been fsynced (compaction reads only those)."""
        return self._durable.next_offset

    @property
    def position(self) -> LogPosition:
        return LogPosition(self._active_base, self._active.size, self._next_offset)

    @property
    def data_dir(self) -> Path:
        return self._data_dir

    @property
    def file_layer(self) -> FileLayer:
        return self._file_layer

    def append(self, records: Sequence[tuple[bytes, bytes | None]], now_ms: int) -> int:
        """Write one batch (not yet fsynced); return its base offset."""
        self._check_usable()
        if not records:
            raise ValueError("append needs at least one record")
        batch = encode_batch(self._next_offset, records, now_ms)
        if (self._active.size > HEADER_SIZE
                and self._active.size + len(batch) > self._segment_bytes):
            try:
                self._roll()
            except OSError as error:
                self.stats.failed_writes += 1
                raise self._fail(error, self._durable, "rolling to a new segment") from error
        before = self.position  # after a roll: in the new segment
        try:
            self._active.write(batch)
        except OSError as error:
            self.stats.failed_writes += 1
            raise self._fail(error, before, f"append at offset {before.next_offset}") from error
        self._next_offset += len(records)
        self.stats.appends += 1
        self.stats.records += len(records)
        self.stats.bytes_appended += len(batch)
        return before.next_offset

    def sync(self) -> None:
        """fsync what was appended since the last sync."""
        self._check_usable()
        position = self.position
        if position == self._durable:
            return
        try:
            self._active.fsync()
        except OSError as error:
            self.stats.failed_fsyncs += 1
            raise self._fail(error, self._durable, "fsync") from error
        self.stats.fsyncs += 1
        self._durable = position

    def rollback_unsynced(self) -> None:
        """Drop everything appended since the last successful sync."""
        self._check_usable()
        if self.position != self._durable:
            self._rollback_to(self._durable)

    def close(self) -> None:
        if self._closed:
            return
        try:
            if self._broken is None:
                self.sync()
        finally:
            self._closed = True
            self._active.close()

    def _check_usable(self) -> None:
        if self._closed:
            raise LogClosedError("the log writer is closed")
        if self._broken is not None:
            raise LogWriterBrokenError(
                f"the log writer stopped after a failed rollback ({self._broken}); "
                "restart to recover",
                rolled_back_to_offset=None,
            ) from self._broken

    def _roll(self) -> None:
        # The closed segment is fsynced now, so later fsyncs only need the active one.
        self._active.fsync()
        self.stats.fsyncs += 1
        self._durable = self.position
        closed_size = self._active.size
        base = self._next_offset
        path = self._data_dir / segment_file_name(base)
        # The new segment exists (header and directory entry durable) before the old one
        # names it in its trailer: a crash in between leaves an unfinished roll, which
        # start-up undoes, never a trailer naming a missing segment.
        write_whole_file(self._file_layer, path, [encode_header(base, first=False)])
        new_file: AppendableFile | None = None
        try:
            self._file_layer.fsync_directory(self._data_dir)
            new_file = self._file_layer.open(path)
            self._active.write(encode_trailer(base))
            self._active.fsync()
            self.stats.fsyncs += 1
        except OSError:
            if new_file is not None:
                new_file.close()
            self._undo_roll(path, closed_size)
            raise
        self._active.close()
        self._active = new_file
        self._active_base = base
        self._durable = self.position
        self.stats.segments_rolled += 1

    def _undo_roll(self, new_path: Path, closed_size: int) -> None:
        """Back to before a roll that failed: the old segment loses its (maybe partial)
        trailer first, then the new one goes; each step leaves a chain start-up accepts."""
        try:
            if self._active.size != closed_size:
                self._active.truncate(closed_size)
                self._active.fsync()
            self._file_layer.remove(new_path)
            self._file_layer.fsync_directory(self._data_dir)
        except OSError as error:
            self._broken = error
            raise LogWriterBrokenError(
                f"undoing a failed roll failed: {error}; restart to recover",
                rolled_back_to_offset=None,
            ) from error

    def _fail(self, error: OSError, target: LogPosition, what: str) -> LogWriteError:
        self._rollback_to(target)
        return LogWriteError(
            f"{what} failed: {error}; log rolled back to offset {target.next_offset}",
            rolled_back_to_offset=target.next_offset,
        )

    def _rollback_to(self, target: LogPosition) -> None:
        try:
            if self._active_base != target.segment_base:
                # A roll moves the durable position into the new segment, and a failed
                # roll undoes itself: a rollback never has to cross segments.
                raise OSError(f"cannot roll back from segment {self._active_base} to "
                              f"segment {target.segment_base}")
            if self._active.size != target.size:
                self._active.truncate(target.size)
                self._active.fsync()
        except OSError as error:
            self._broken = error
            raise LogWriterBrokenError(
                f"rolling back to offset {target.next_offset} failed: {error}; restart to recover",
                rolled_back_to_offset=None,
            ) from error
        # `target` is never before the last durable position, which therefore stands.
        self._next_offset = target.next_offset
        self.stats.rollbacks += 1


def convert_legacy_segments(layer: FileLayer, data_dir: Path, legacy: list[ChainLink],
                            recovered: LoadResult) -> int:
    """Give the segments written before segments had headers their header and (but the
    newest) their trailer, newest first (see `coordinator.log.chain`); return the newest
    segment's new size. `legacy` are the oldest segments of the log, so its first is the
    log's first."""
    active = recovered.active_segment
    active_size = recovered.active_segment_size
    for index in range(len(legacy) - 1, -1, -1):
        link = legacy[index]
        segment = link.segment
        data = layer.read(segment.path)
        is_active = active is not None and segment.path == active.path
        if is_active:
            data = data[:recovered.active_segment_size]
        chunks = [encode_header(segment.base_offset, first=index == 0), data]
        if link.offset_limit is not None:
            chunks.append(encode_trailer(link.offset_limit))
        size = write_whole_file(layer, segment.path, chunks)
        layer.fsync_directory(data_dir)
        if is_active:
            active_size = size
    return active_size
