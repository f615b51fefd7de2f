"""Benchmarks of the record log (not tests): group commit throughput and start-up load.

    connect-coordinator bench log --writers 1,10,100 --records 20000 --load-records 1000000

Group commit: W trio tasks each write batches of `records_per_write` member metadata
records (about 150 bytes each: a 30-byte key, a 120-byte value) through the server's record
sink (`LogSink`) until `records` are written in all; every write returns only after its
fsync, and changes queued during a flush share the next one. Load: a log of `load_records`
records (10 per batch, as a busy coordinator writes them) is read back with `read_all`, bare
and with a replay into a dict standing in for the state machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from coordinator.core.result import Record
from coordinator.log.load import read_all
from coordinator.log.writer import LogWriter
from coordinator.storage import LogSink
from protocol.messages import ConnectGroupMemberMetadataKey, ConnectGroupMemberMetadataValue

NOW_MS = 1_700_000_000_000
KEY_BYTES = 30
VALUE_BYTES = 120


def _record(number: int) -> tuple[bytes, bytes]:
    key = f"group-{number % 97:04d}-member-{number:012d}".encode().ljust(KEY_BYTES, b"_")
    value = (f"{number}:".encode() * 20)[:VALUE_BYTES].ljust(VALUE_BYTES, b".")
    return key, value


def _member_record(number: int) -> Record:
    """A member metadata record of about KEY_BYTES + VALUE_BYTES once encoded."""
    key = ConnectGroupMemberMetadataKey(group_id=f"group-{number % 97:04d}",
                                        member_id=f"m-{number:012d}")
    url = f"http://worker-{number}.connect.example:8083/".ljust(VALUE_BYTES - 19, "x")
    value = ConnectGroupMemberMetadataValue(worker_url=url, rebalance_timeout_ms=60_000,
                                            server_assignor="balanced", client_assignors=())
    return Record(key, value)


def bench_group_commit(
    data_dir: Path, writers: int, records: int, records_per_write: int = 4
) -> dict[str, Any]:
    if writers < 1 or records < 1 or records_per_write < 1:
        raise ValueError("need writers, records and records_per_write >= 1")
    writes_per_writer = max(1, records // (writers * records_per_write))
    latencies: list[float] = []
    written = 0

    async def run() -> tuple[float, LogSink]:
        nonlocal written
        sink = LogSink(LogWriter.open(data_dir), lambda: NOW_MS)

        async def writer(number: int) -> None:
            nonlocal written
            for index in range(writes_per_writer):
                first = (number * writes_per_writer + index) * records_per_write
                batch = [_member_record(first + n) for n in range(records_per_write)]
                started = time.perf_counter()
                await sink.write(batch)
                latencies.append(time.perf_counter() - started)
                written += len(batch)

        async with trio.open_nursery() as nursery:
            await nursery.start(sink.run)
            started = time.perf_counter()
            async with trio.open_nursery() as writing:
                for number in range(writers):
                    writing.start_soon(writer, number)
            elapsed = time.perf_counter() - started
            await sink.close()
        return elapsed, sink

    elapsed, sink = trio.run(run)
    assert sink.writer is not None
    stats = sink.writer.stats
    fsyncs = stats.fsyncs
    writes = len(latencies)
    latencies.sort()
    return {
        "writers": writers,
        "records": written,
        "writes": writes,
        "records_per_write": records_per_write,
        "seconds": round(elapsed, 3),
        "records_per_s": round(written / elapsed),
        "writes_per_s": round(writes / elapsed),
        "fsyncs": fsyncs,
        "fsyncs_per_s": round(fsyncs / elapsed, 1),
        "writes_per_fsync": round(writes / fsyncs, 2) if fsyncs else None,
        "bytes": stats.bytes_appended,
        "latency_p50_ms": round(statistics.median(latencies) * 1000, 3),
        "latency_p99_ms": round(latencies[int(len(latencies) * 0.99) - 1] * 1000, 3)
        if len(latencies) >= 100
        else None,
    }


def bench_load(data_dir: Path, records: int, records_per_batch: int = 10) -> dict[str, Any]:
    if records < 1 or records_per_batch < 1:
        raise ValueError("need records and records_per_batch >= 1")
    writer = LogWriter.open(data_dir)
    written = 0
    while written < records:
        count = min(records_per_batch, records - written)
        writer.append([_record(written + n) for n in range(count)], NOW_MS)
        written += count
    writer.close()
    size = sum(path.stat().st_size for path in data_dir.glob("*.log"))

    # CPU time is reported too: on a shared machine the wall clock also measures others.
    started = time.perf_counter()
    cpu_started = time.process_time()
    count = sum(1 for _ in read_all(data_dir))
    read_seconds = time.perf_counter() - started
    read_cpu_seconds = time.process_time() - cpu_started
    if count != records:
        raise AssertionError(f"read {count} records of {records}")

    # A replay: the newest value per key, tombstones delete (what the state machine
    # does, minus decoding the values).
    started = time.perf_counter()
    cpu_started = time.process_time()
    state: dict[bytes, bytes] = {}
    for _, key, value, _ in read_all(data_dir):
        if value is None:
            state.pop(key, None)
        else:
            state[key] = value
    replay_seconds = time.perf_counter() - started
    replay_cpu_seconds = time.process_time() - cpu_started

    return {
        "records": records,
        "records_per_batch": records_per_batch,
        "bytes": size,
        "read_all_seconds": round(read_seconds, 3),
        "read_all_records_per_s": round(records / read_seconds),
        "read_all_mb_per_s": round(size / read_seconds / 1e6, 1),
        "read_all_cpu_records_per_s": round(records / read_cpu_seconds),
        "replay_seconds": round(replay_seconds, 3),
        "replay_records_per_s": round(records / replay_seconds),
        "replay_cpu_records_per_s": round(records / replay_cpu_seconds),
    }


def run(
    base_dir: Path,
    writer_counts: list[int],
    records: int,
    load_records: int,
    records_per_write: int,
) -> dict[str, Any]:
    figures: dict[str, Any] = {"group_commit": [], "load": None}
    for writers in writer_counts:
        directory = base_dir / f"group-commit-{writers}"
        figures["group_commit"].append(
            bench_group_commit(directory, writers, records, records_per_write)
        )
        shutil.rmtree(directory)
    if load_records > 0:
        directory = base_dir / "load"
        figures["load"] = bench_load(directory, load_records)
        shutil.rmtree(directory)
    return figures


def _writer_counts(text: str) -> list[int]:
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a comma-separated list of integers: {text}"
        ) from None
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError("writer counts must be positive")
    return counts


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="connect-coordinator bench log",
        description="Measure group commit throughput and start-up load speed of the log.",
    )
    parser.add_argument(
        "--writers",
        type=_writer_counts,
        default=[1, 10, 100],
        metavar="W,W",
        help="concurrent trio writers, one run each (default: 1,10,100)",
    )
    parser.add_argument(
        "--records",
        type=int,
        default=20_000,
        metavar="N",
        help="records per group commit run (default: 20000)",
    )
    parser.add_argument(
        "--records-per-write",
        type=int,
        default=4,
        metavar="N",
        help="records in each write's batch (default: 4)",
    )
    parser.add_argument(
        "--load-records",
        type=int,
        default=1_000_000,
        metavar="N",
        help="records in the log read back by read_all; 0 skips (default: 1000000)",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="where to write (default: a temporary directory, removed after)",
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    if args.records < 1 or args.records_per_write < 1 or args.load_records < 0:
        parser.error("--records and --records-per-write must be positive, --load-records >= 0")

    temporary = args.data_dir is None
    base_dir = Path(tempfile.mkdtemp(prefix="log-bench-")) if temporary else args.data_dir
    try:
        os.makedirs(base_dir, exist_ok=True)
        figures = run(
            base_dir, args.writers, args.records, args.load_records, args.records_per_write
        )
        figures["data_dir"] = str(base_dir)
    finally:
        if temporary:
            shutil.rmtree(base_dir, ignore_errors=True)

    if args.json:
        print(json.dumps(figures, sort_keys=True))
        return 0
    print(f"data dir: {base_dir}")
    for row in figures["group_commit"]:
        print(
            f"group commit, {row['writers']:>3} writers: {row['records_per_s']:>9,} records/s "
            f"({row['writes_per_s']:,} writes/s of {row['records_per_write']}), "
            f"{row['fsyncs_per_s']:,} fsyncs/s, {row['writes_per_fsync']} writes per fsync, "
            f"latency p50 {row['latency_p50_ms']} ms, p99 {row['latency_p99_ms']} ms"
        )
    load = figures["load"]
    if load is not None:
        print(
            f"load {load['records']:,} records ({load['bytes'] / 1e6:.1f} MB): read_all "
            f"{load['read_all_seconds']} s = {load['read_all_records_per_s']:,} records/s "
            f"({load['read_all_mb_per_s']} MB/s; per CPU second "
            f"{load['read_all_cpu_records_per_s']:,}); with dict replay "
            f"{load['replay_seconds']} s = {load['replay_records_per_s']:,} records/s "
            f"(per CPU second {load['replay_cpu_records_per_s']:,})"
        )
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
