"""`connect-coordinator log check|dump|compact DATA_DIR`: offline tools for the record log.

None of them may run against a data directory a live coordinator is writing, except
`check` and `dump`, which only read (they may then report the batch being appended as a
partial one).
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from pathlib import Path

from coordinator.log.compaction import compact
from coordinator.log.dump import RecordFormatter, dump
from coordinator.log.errors import LogCorruptError
from coordinator.log.load import check


def _formatter(spec: str) -> RecordFormatter:
    module_name, _, function_name = spec.partition(":")
    if not function_name:
        raise argparse.ArgumentTypeError(f"expected MODULE:FUNCTION, not {spec!r}")
    try:
        function: RecordFormatter = getattr(importlib.import_module(module_name), function_name)
    except (ImportError, AttributeError) as error:
        raise argparse.ArgumentTypeError(f"cannot load {spec}: {error}") from None
    return function


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="connect-coordinator log")
    commands = parser.add_subparsers(dest="command", required=True)
    check_parser = commands.add_parser("check", help="report damage; change nothing")
    check_parser.add_argument("data_dir", type=Path)
    dump_parser = commands.add_parser("dump", help="list batches and records")
    dump_parser.add_argument("data_dir", type=Path)
    dump_parser.add_argument(
        "--format-record",
        type=_formatter,
        default=None,
        metavar="MODULE:FUNCTION",
        help="a function (key: bytes, value: bytes | None) -> str; default: hex",
    )
    compact_parser = commands.add_parser("compact", help="compact the closed segments")
    compact_parser.add_argument("data_dir", type=Path)
    compact_parser.add_argument(
        "--tombstone-retention-ms", type=int, default=24 * 3_600_000, metavar="MS"
    )
    args = parser.parse_args(argv)

    if args.command == "check":
        report = check(args.data_dir)
        for line in report.lines():
            print(line)
        return 0 if report.ok else 1
    if args.command == "dump":
        for line in dump(args.data_dir, args.format_record):
            print(line)
        return 0
    try:
        result = compact(args.data_dir, int(time.time() * 1000), args.tombstone_retention_ms)
    except LogCorruptError as error:
        print(f"connect-coordinator log compact: {error}", file=sys.stderr)
        return 1
    print(
        f"{result.segments_rewritten} of {result.segments_examined} closed segments rewritten "
        f"({result.segments_removed} removed): records {result.records_before} -> "
        f"{result.records_after}, bytes {result.bytes_before} -> {result.bytes_after}, "
        f"{result.tombstones_dropped} expired tombstones dropped"
    )
    return 0
