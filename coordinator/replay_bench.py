"""`connect-coordinator bench replay`: start-up load speed through the real core.

Builds a log of real coordinator records (groups of 10 members joining and reaching
STABLE with `balanced`), then times `LogReplayer.load` into a fresh coordinator: read,
CRC check, decode and replay, as at start-up.
"""

from __future__ import annotations

import argparse
import json
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
from coordinator.log import LogWriter
from coordinator.storage import LogReplayer, encode_records
from protocol.messages import ConnectGroupHeartbeatRequest

NOW_MS = 1_000_000


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="connect-coordinator bench replay",
                                     description=__doc__)
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as directory:
        data_dir = Path(directory)
        written = build_log(data_dir, args.records)
        config = ServerConfig()
        core = GroupCoordinator(config, load_assignors(config.server_assignors))
        loader = LogReplayer(data_dir, config)
        started, cpu_started = time.perf_counter(), time.process_time()
        trio.run(loader.load, core)
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    row = {"records": written, "wall_s": round(wall, 3), "cpu_s": round(cpu, 3),
           "records_per_s": round(written / wall), "records_per_cpu_s": round(written / cpu)}
    print(json.dumps(row) if args.json else
          f"replayed {written:,} records in {wall:.2f} s ({row['records_per_s']:,}/s wall, "
          f"{row['records_per_cpu_s']:,}/s per CPU second)")
    return 0
