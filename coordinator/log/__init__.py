"""The coordinator's durable, compacted, append-only record log.

Records are opaque (key bytes, value bytes or None for a tombstone), stored as Kafka
RecordBatch v2 in segment files named by their base offset. Start-up replays with
`read_all`; `LogWriter` appends (the server's record sink, `coordinator.storage.LogSink`,
shares its fsyncs among concurrent changes); `compact` rewrites closed segments; `check` and
`dump` inspect without changing.
"""

from coordinator.log.batch import LogEntry
from coordinator.log.compaction import CompactionReport, compact
from coordinator.log.dump import dump
from coordinator.log.errors import (
    LogClosedError,
    LogCorruptError,
    LogError,
    LogWriteError,
    LogWriterBrokenError,
)
from coordinator.log.files import AppendableFile, FileLayer, OsFileLayer
from coordinator.log.load import (
    CheckReport,
    Damage,
    LoadResult,
    LogLoad,
    TailTruncation,
    check,
    find_newest,
    read_all,
)
from coordinator.log.segments import DEFAULT_SEGMENT_BYTES, segment_file_name
from coordinator.log.writer import LogPosition, LogWriter, WriterStats

__all__ = [
    "DEFAULT_SEGMENT_BYTES",
    "AppendableFile",
    "CheckReport",
    "CompactionReport",
    "Damage",
    "FileLayer",
    "LoadResult",
    "LogClosedError",
    "LogCorruptError",
    "LogEntry",
    "LogError",
    "LogLoad",
    "LogPosition",
    "LogWriteError",
    "LogWriter",
    "LogWriterBrokenError",
    "OsFileLayer",
    "TailTruncation",
    "WriterStats",
    "check",
    "compact",
    "dump",
    "find_newest",
    "read_all",
    "segment_file_name",
]
