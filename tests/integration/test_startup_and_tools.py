"""Damage found at start-up, and the offline tools: `log check|dump|snapshot --data-dir`."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from crc32c import crc32c

from coordinator.log import LogWriter
from coordinator.log.chain import HEADER_SIZE
from coordinator.log.files import OsFileLayer
from coordinator.log.segments import list_segments
from coordinator.storage import snapshot_rows
from coordinator.units import Unit
from tests.core.context import wire_units

from .helpers import ROOT, ServerProcess, connector_tasks
from .test_replay_stateful import LoggedContext

SETTINGS = ["group.connect.session.timeout.ms=600000"]


def build_log(data_dir: Path) -> LoggedContext:
    """Two groups with connectors and members, over several segments."""
    ctx = LoggedContext(data_dir)
    for index in range(30):
        ctx.put_connector("g", "source", index % 4 + 1)
    epochs = {w: ctx.join("g", w, server_assignor="balanced").member_epoch
              for w in ("w1", "w2")}
    owned: dict[str, frozenset[Unit]] = {w: frozenset() for w in epochs}
    for _ in range(5):  # heartbeats until both run their share
        for worker in epochs:
            response = ctx.heartbeat("g", worker, epochs[worker], owned=owned[worker])
            epochs[worker] = response.member_epoch
            if response.assignment is not None:
                owned[worker] = wire_units(response.assignment.assigned)
    assert all(owned.values())
    ctx.put_connector("h", "sink", 2)
    ctx.writer.close()
    assert len(list_segments(OsFileLayer(), data_dir).segments) >= 3
    return ctx


def tool(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "coordinator.cli", "log", *argv], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def tear(segment: Path) -> None:
    """Append half a batch: a crash in the middle of a write."""
    with open(segment, "ab") as file:
        file.write(segment.read_bytes()[:40])


async def failed_start(data_dir: Path, tmp_path: Path) -> tuple[dict[str, Any], str]:
    """Start `serve` on a damaged log: it must stop with one `log_load_failed` event and
    a clear last line, never a traceback. The event and the whole output."""
    server = ServerProcess(data_dir, tmp_path, SETTINGS)
    code = await server.run_to_exit()
    output = server.output()
    assert code != 0
    failed = [e for e in server.events() if e.get("event") == "log_load_failed"]
    assert len(failed) == 1, output
    assert "Traceback" not in output
    return failed[0], output


async def test_a_torn_tail_is_truncated_with_a_warning(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    ctx = build_log(data_dir)
    newest = list_segments(OsFileLayer(), data_dir).segments[-1].path
    intact = newest.stat().st_size
    tear(newest)

    server = ServerProcess(data_dir, tmp_path, SETTINGS)
    await server.start()
    try:
        warnings = [e for e in server.events() if e.get("event") == "log_damage_repaired"]
        assert len(warnings) == 1 and newest.name in warnings[0]["detail"]
        assert newest.stat().st_size == intact
        view = await server.group("g")
        assert connector_tasks(view) == {"source": len(ctx.core.store.groups["g"].units) - 1}
        assert sorted(m["member_id"] for m in view["members"]) == ["w1", "w2"]
    finally:
        server.kill()


async def test_a_crc_error_in_an_older_segment_stops_the_server(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    build_log(data_dir)
    older = list_segments(OsFileLayer(), data_dir).segments[0].path
    data = bytearray(older.read_bytes())
    data[HEADER_SIZE + 100] ^= 0x5A  # inside the first batch's records: a CRC mismatch
    older.write_bytes(bytes(data))

    failed, output = await failed_start(data_dir, tmp_path)
    assert failed["file"] == str(older) and failed["position"] == HEADER_SIZE
    assert "crc" in failed["error"].lower()
    assert f"{older} at byte {HEADER_SIZE}" in output.splitlines()[-1]
    # Nothing was repaired: the damage is left for an operator to look at.
    assert older.read_bytes() == bytes(data)
    checked = tool("check", "--data-dir", str(data_dir))
    assert checked.returncode == 1
    assert older.name in checked.stdout and "NOT repairable" in checked.stdout


async def test_a_malformed_batch_with_a_valid_crc_stops_the_server(tmp_path: Path) -> None:
    # Not a torn write (the CRC matches), so never repaired: start-up's fast reader must
    # refuse it as the careful one does, naming the file and the batch.
    data_dir = tmp_path / "data"
    build_log(data_dir)
    older = list_segments(OsFileLayer(), data_dir).segments[0].path
    data = bytearray(older.read_bytes())
    batch = HEADER_SIZE  # the first batch, right after the segment's header
    batch_end = batch + 12 + struct.unpack_from(">i", data, batch + 8)[0]
    count = struct.unpack_from(">i", data, batch + 57)[0]
    struct.pack_into(">i", data, batch + 57, count + 1)  # one record more than it holds
    struct.pack_into(">I", data, batch + 17, crc32c(bytes(data[batch + 21 : batch_end])))
    older.write_bytes(bytes(data))

    failed, _ = await failed_start(data_dir, tmp_path)
    assert failed["file"] == str(older) and failed["position"] == HEADER_SIZE
    assert f"{older} at byte {HEADER_SIZE}: malformed batch: record" in failed["error"]
    assert older.read_bytes() == bytes(data)


async def test_a_record_that_does_not_decode_stops_the_server(tmp_path: Path) -> None:
    # A well-formed batch whose record is no coordinator record (type id 99): start-up
    # stops and says which file, batch and offset, and why.
    data_dir = tmp_path / "data"
    ctx = build_log(data_dir)
    writer = LogWriter.open(data_dir)
    offset = writer.append([(struct.pack(">h", 99) + b"junk", b"\x00\x00")], ctx.now)
    writer.sync()
    writer.close()
    newest = list_segments(OsFileLayer(), data_dir).segments[-1].path

    failed, _ = await failed_start(data_dir, tmp_path)
    assert failed["file"] == str(newest)
    assert f"the record at offset {offset} does not decode" in failed["error"]
    assert "unknown record type id 99" in failed["error"]


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_log_snapshot_writes_the_rows(tmp_path: Path, suffix: str) -> None:
    data_dir = tmp_path / "data"
    ctx = build_log(data_dir)
    out = tmp_path / f"snapshot{suffix}"
    done = tool("snapshot", "--data-dir", str(data_dir), "--out", str(out))
    assert done.returncode == 0, done.stderr
    if suffix == ".parquet":
        table = pq.read_table(out)
        assert table.schema.field("task").type == "int64"
        written = table.to_pylist()
    else:
        written = [json.loads(line) for line in out.read_text().splitlines()]
    expected = snapshot_rows(ctx.core, written[0]["snapshot_ms"])
    columns = ["kind", "group_id", "group_state", "group_epoch", "assignment_epoch",
               "member_id", "instance_id", "worker_url", "member_epoch", "member_state",
               "connector", "task", "snapshot_ms"]
    assert all(list(row) == columns for row in written)
    assert [{k: v for k, v in row.items() if v is not None} for row in written] == [
        {k: v for k, v in row.items() if v is not None} for row in expected]
    kinds = [row["kind"] for row in written]
    assert kinds.count("group") == 2 and kinds.count("member") == 2
    units = [row for row in written if row["kind"] == "unit" and row["group_id"] == "g"]
    assert {row["member_id"] for row in units} == {"w1", "w2"}
    # The log was only read.
    assert tool("check", str(data_dir)).returncode == 0


def test_log_snapshot_refuses_another_extension(tmp_path: Path) -> None:
    build_log(tmp_path / "data")
    done = tool("snapshot", str(tmp_path / "data"), "--out", str(tmp_path / "rows.csv"))
    assert done.returncode == 2
    assert ".parquet or .jsonl" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "rows.csv").exists()


def test_log_check_and_dump_take_data_dir(tmp_path: Path) -> None:
    build_log(tmp_path / "data")
    checked = tool("check", "--data-dir", str(tmp_path / "data"))
    assert checked.returncode == 0 and checked.stdout.strip().endswith("OK")
    dumped = tool("dump", "--data-dir", str(tmp_path / "data"))
    assert dumped.returncode == 0
    assert "Connectors key(group_id='g') value(connectors=[{name='source'" in dumped.stdout
    assert "tombstone" not in dumped.stdout or "Member" in dumped.stdout
    both = tool("check", str(tmp_path / "data"), "--data-dir", str(tmp_path / "other"))
    assert both.returncode == 2 and "two different data dirs" in both.stderr


