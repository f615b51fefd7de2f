"""One coordinator per data directory: a second `serve` (or `log compact`) on it is refused
with the holder's pid; the lock goes with the process, SIGKILL included."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import trio

from coordinator.config import ServerConfig
from coordinator.log.lock import DataDirInUseError, DataDirLock
from coordinator.server.app import run_server

from .helpers import ROOT, ServerProcess

SETTINGS = ["group.connect.session.timeout.ms=600000"]


def compact_tool(data_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "coordinator.cli", "log", "compact",
                           str(data_dir)], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)


async def test_a_second_serve_on_the_same_data_dir_is_refused(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    first = ServerProcess(data_dir, tmp_path, SETTINGS)
    await first.start()
    try:
        assert first.process is not None
        second = ServerProcess(data_dir, tmp_path, SETTINGS)
        code = await second.run_to_exit()
        assert code == 1
        last_line = second.output().strip().splitlines()[-1]
        assert last_line == (
            f"connect-coordinator: cannot start: {data_dir} is in use by another process "
            f"(pid {first.process.pid}): one coordinator (or `log compact`) per data "
            f"directory")
        compacted = compact_tool(data_dir)
        assert compacted.returncode == 1
        assert f"pid {first.process.pid}" in compacted.stderr
        # The first one is untouched and still serves.
        assert (await first.http("GET", "/readyz"))[0] == 200
    finally:
        first.kill()  # SIGKILL: the kernel drops the lock with the process
    restarted = ServerProcess(data_dir, tmp_path, SETTINGS)
    await restarted.start()
    restarted.kill()
    assert compact_tool(data_dir).returncode == 0


async def test_the_lock_is_released_when_the_server_stops(tmp_path: Path) -> None:
    config = ServerConfig(shutdown_timeout_ms=1_000)
    async with trio.open_nursery() as nursery:
        handle = await nursery.start(run_server, config, ("127.0.0.1", 0),
                                     ("127.0.0.1", 0), tmp_path)
        with pytest.raises(DataDirInUseError, match="is in use by another process"):
            DataDirLock.acquire(tmp_path)
        handle.stop()
    with DataDirLock.acquire(tmp_path):  # free again
        pass
