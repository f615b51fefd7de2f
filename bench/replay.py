"""`connect-coordinator bench replay`: start-up load speed through the real core.

Builds a log of real coordinator records (groups of 10 members joining and reaching
STABLE with `balanced`), then times `LogReplayer.load` into a fresh coordinator: read,
CRC check, decode and replay, as at start-up. Each of ROUNDS loads the same log into a new
coordinator in a new process, as at start-up; the median is reported. About a third of the
records are the newest of their key; `--compacted` loads a log holding only those instead,
in batches of up to 1,000 as compaction writes them (records/s then counts only those).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from coordinator.assignors import load_assignors
from coordinator.config import ServerConfig
from coordinator.core.coordinator import GroupCoordinator
from coordinator.core.group import units_to_wire
from coordinator.core.result import Result
from coordinator.log import LogWriter, read_all
from coordinator.log.compaction import MAX_BATCH_RECORDS
from coordinator.logs import configure_logging
from coordinator.storage import LogReplayer, encode_records
from protocol.messages import ConnectGroupHeartbeatRequest

NOW_MS = 1_000_000
LOAD_ONLY_FLAG = "--load-only"  # a round's child process: bench replay --load-only DATA_DIR


def build_log(data_dir: Path, records: int) -> int:
    config = ServerConfig(assignment_interval_ms=0, assignor_offload_enable=False)
    core = GroupCoordinator(config, load_assignors(config.server_assignors))
    writer = LogWriter.open(data_dir)
    written = 0

    def emit(result: Result[Any]) -> None:
        nonlocal written
        if result.records:
            writer.append(encode_records(result.records), NOW_MS)
            written += len(result.records)

    group_index = 0
    while written < records:
        group_id = f"group-{group_index}"
        group_index += 1
        emit(core.put_connector(group_id, "source", 20, NOW_MS))
        for member in range(10):
            emit(core.heartbeat(ConnectGroupHeartbeatRequest(
                group_id=group_id, member_id=f"worker-{member}", member_epoch=0,
                worker_url=f"http://worker-{member}:8083", rebalance_timeout_ms=60_000,
                server_assignor="balanced"), NOW_MS))
        for _ in range(3):
            for state in list(core.store.groups[group_id].members.values()):
                current = state.current
                emit(core.heartbeat(ConnectGroupHeartbeatRequest(
                    group_id=group_id, member_id=state.member_id, member_epoch=current.epoch,
                    owned_connectors_and_tasks=units_to_wire(current.assigned)), NOW_MS))
    writer.sync()
    writer.close()
    return written


def write_compacted(source: Path, target: Path) -> int:
    """`target` gets the newest record of every key of `source`, in the order of their last
    write, in batches as compaction packs them: what compaction leaves of a log."""
    newest: dict[bytes, bytes | None] = {}
    for _ in read_all(source).collect_newest(newest):
        pass
    writer = LogWriter.open(target)
    survivors = list(newest.items())
    for start in range(0, len(survivors), MAX_BATCH_RECORDS):
        writer.append(survivors[start : start + MAX_BATCH_RECORDS], NOW_MS)
    writer.sync()
    writer.close()
    return len(survivors)


def load_in_fresh_process(data_dir: Path) -> tuple[float, float]:
    """`load_once` in a new interpreter, as at start-up: the heap that built the log (or
    an earlier round) does not help or hinder the load."""
    done = subprocess.run(
        [sys.executable, "-m", "coordinator.cli", "bench", "replay", LOAD_ONLY_FLAG,
         str(data_dir)],
        capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the load failed: {done.stderr.strip()}")
    wall, cpu = json.loads(done.stdout.strip().splitlines()[-1])
    return float(wall), float(cpu)


def load_once(data_dir: Path) -> tuple[float, float]:
    """Wall and CPU seconds of one start-up load of `data_dir` into a new coordinator."""
    config = ServerConfig()
    core = GroupCoordinator(config, load_assignors(config.server_assignors))
    loader = LogReplayer(data_dir, config, freeze_loaded=True)  # as `serve` loads
    started, cpu_started = time.perf_counter(), time.process_time()
    trio.run(loader.load, core)
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    assert loader.writer is not None
    loader.writer.close()
    return wall, cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="connect-coordinator bench replay",
                                     description=__doc__)
    parser.add_argument("--records", type=int, default=300_000,
                        help="records to write before loading (default %(default)s)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="loads of the same log; the median is reported (default %(default)s)")
    parser.add_argument("--compacted", action="store_true",
                        help="load only the newest record of each key (a compacted log)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object (keys: records, wall_s, wall_s_each, "
                             "records_per_s, ...)")
    parser.add_argument(LOAD_ONLY_FLAG, type=Path, help=argparse.SUPPRESS)  # one round's child
    args = parser.parse_args(argv)
    if args.load_only is not None:
        configure_logging("warning")  # the load's info line would land in the output
        print(json.dumps(load_once(args.load_only)))
        return 0
    if args.records < 1 or args.rounds < 1:
        parser.error("--records and --rounds must be at least 1")
    with tempfile.TemporaryDirectory() as directory:
        data_dir = Path(directory) / "log"
        written = build_log(data_dir, args.records)
        if args.compacted:
            compacted_dir = Path(directory) / "compacted"
            written = write_compacted(data_dir, compacted_dir)
            data_dir = compacted_dir
        rounds = [load_in_fresh_process(data_dir) for _ in range(args.rounds)]
    wall = statistics.median(w for w, _ in rounds)
    cpu = statistics.median(c for _, c in rounds)
    row = {"records": written, "compacted": args.compacted, "rounds": args.rounds,
           "wall_s": round(wall, 3), "cpu_s": round(cpu, 3),
           "wall_s_each": [round(w, 3) for w, _ in rounds],
           "records_per_s": round(written / wall), "records_per_cpu_s": round(written / cpu)}
    print(json.dumps(row) if args.json else
          f"replayed {written:,} records{' (compacted log)' if args.compacted else ''} in "
          f"{wall:.2f} s, median of {args.rounds} "
          f"({', '.join(f'{w:.2f}' for w, _ in rounds)}): {row['records_per_s']:,}/s wall, "
          f"{row['records_per_cpu_s']:,}/s per CPU second")
    return 0
