"""`connect-coordinator log check|dump|compact|snapshot DATA_DIR`: offline record log tools.

The data dir is given positionally or as `--data-dir DIR` (as `serve` takes it).
`compact` refuses a data directory a live coordinator holds (its lock file, `.lock`);
`check`, `dump` and `snapshot` only read, so they may run against one (they may then
report the batch being appended as a partial one, or not see it).
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from pathlib import Path

from coordinator.log.compaction import compact
from coordinator.log.dump import RecordFormatter, dump
from coordinator.log.errors import LogError
from coordinator.log.load import check
from coordinator.log.lock import DataDirLock
from coordinator.log.segments import DEFAULT_SEGMENT_BYTES
from protocol.records import RecordDecodeError, format_record

PROG = "connect-coordinator log"


def _formatter(spec: str) -> RecordFormatter:
    module_name, _, function_name = spec.partition(":")
    if not function_name:
        raise argparse.ArgumentTypeError(f"expected MODULE:FUNCTION, not {spec!r}")
    try:
        function: RecordFormatter = getattr(importlib.import_module(module_name), function_name)
    except (ImportError, AttributeError) as error:
        raise argparse.ArgumentTypeError(f"cannot load {spec}: {error}") from None
    return function


def readable_record(key: bytes, value: bytes | None) -> str:
    """The coordinator's records by name and fields; bytes that do not decode as hex."""
    try:
        return format_record(key, value)
    except RecordDecodeError as error:
        shown = "<tombstone>" if value is None else value.hex()
        return f"undecodable ({error}) key: {key.hex()} payload: {shown}"


def _add_data_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("data_dir", type=Path, nargs="?", metavar="DATA_DIR")
    parser.add_argument("--data-dir", dest="data_dir_option", type=Path, metavar="DIR",
                        help="the log directory (an alias of the positional DATA_DIR)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG)
    commands = parser.add_subparsers(dest="command", required=True)
    check_parser = commands.add_parser("check", help="report damage; change nothing")
    _add_data_dir(check_parser)
    dump_parser = commands.add_parser("dump", help="list batches and records")
    _add_data_dir(dump_parser)
    shown = dump_parser.add_mutually_exclusive_group()
    shown.add_argument(
        "--format-record",
        type=_formatter,
        default=None,
        metavar="MODULE:FUNCTION",
        help="a function (key: bytes, value: bytes | None) -> str; default: the "
             "coordinator's records decoded (hex when they do not decode)",
    )
    shown.add_argument("--hex", action="store_true", help="show keys and values as hex")
    compact_parser = commands.add_parser("compact", help="compact the closed segments")
    _add_data_dir(compact_parser)
    compact_parser.add_argument(
        "--tombstone-retention-ms", type=int, default=24 * 3_600_000, metavar="MS"
    )
    compact_parser.add_argument(
        "--segment-bytes", type=int, default=DEFAULT_SEGMENT_BYTES, metavar="BYTES",
        help="merge adjacent closed segments while they fit in this many bytes "
             "(serve's log.segment.bytes)")
    snapshot_parser = commands.add_parser(
        "snapshot", help="replay the log; write its groups, members and units as rows",
        description="Replay the log into a fresh coordinator (default config) and write one "
                    "row per group, member and unit to FILE.parquet or FILE.jsonl.")
    _add_data_dir(snapshot_parser)
    snapshot_parser.add_argument("--out", type=Path, required=True,
                                 metavar="FILE.parquet|FILE.jsonl")
    return parser


def _data_dir(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Path:
    positional, option = args.data_dir, args.data_dir_option
    if positional is not None and option is not None and positional != option:
        parser.error(f"two different data dirs given: {positional} and --data-dir {option}")
    data_dir: Path | None = option if option is not None else positional
    if data_dir is None:
        parser.error("the data dir is required (DATA_DIR or --data-dir DIR)")
    return data_dir


def main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    data_dir = _data_dir(parser, args)
    if args.command != "snapshot" and not data_dir.is_dir():
        print(f"{PROG} {args.command}: {data_dir} is not a directory", file=sys.stderr)
        return 2
    try:
        return _run(args, data_dir)
    except LogError as error:
        # Damage the command refuses to work around: the message names file and byte.
        print(f"{PROG} {args.command}: {error}", file=sys.stderr)
        return 1


def _run(args: argparse.Namespace, data_dir: Path) -> int:
    if args.command == "check":
        report = check(data_dir)
        for line in report.lines():
            print(line)
        return 0 if report.ok else 1
    if args.command == "dump":
        formatter = None if args.hex else (args.format_record or readable_record)
        for line in dump(data_dir, formatter):
            print(line)
        return 0
    if args.command == "snapshot":
        return _snapshot(data_dir, args.out)
    with DataDirLock.acquire(data_dir):  # not under a running coordinator's feet
        result = compact(data_dir, int(time.time() * 1000), args.tombstone_retention_ms,
                         segment_bytes=args.segment_bytes)
    print(
        f"{result.segments_rewritten} of {result.segments_examined} closed segments rewritten "
        f"({result.segments_removed} merged away): records {result.records_before} -> "
        f"{result.records_after}, bytes {result.bytes_before} -> {result.bytes_after}, "
        f"{result.tombstones_dropped} expired tombstones dropped"
    )
    return 0


def _snapshot(data_dir: Path, out: Path) -> int:
    # Imported here: the snapshot needs the core and pyarrow, the other tools do not.
    from coordinator.snapshot import SnapshotError, write_snapshot

    try:
        rows = write_snapshot(data_dir, out)
    except (SnapshotError, RecordDecodeError) as error:
        print(f"{PROG} snapshot: {error}", file=sys.stderr)
        return 2 if isinstance(error, SnapshotError) else 1
    kinds = {kind: sum(row["kind"] == kind for row in rows) for kind in ("group", "member", "unit")}
    print(f"{out}: {kinds['group']} groups, {kinds['member']} members, {kinds['unit']} units")
    return 0
