"""Ctrl-C, as a terminal sends it (SIGINT to the command's whole process group), at a moment
the test waits for: the command ends with status 130 and no traceback, writes what it has,
and leaves no process of its group behind (Spark's JVM included)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from coordinator.server.app import ServerHandle
from tests.integration.helpers import ROOT

CLI = [sys.executable, "-m", "coordinator.cli"]
WAIT_S = 240


class Command:
    """A CLI command in a session of its own, its stderr read line by line as it comes."""

    def __init__(self, *args: str) -> None:
        self.process = subprocess.Popen([*CLI, *args], cwd=ROOT, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True,
                                        start_new_session=True)
        self.lines: list[str] = []
        self.seen = threading.Condition()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            with self.seen:
                self.lines.append(line)
                self.seen.notify_all()
        with self.seen:
            self.lines.append("")  # EOF
            self.seen.notify_all()

    def wait_for(self, text: str) -> None:
        with self.seen:
            found = self.seen.wait_for(
                lambda: any(text in line for line in self.lines) or "" in self.lines, WAIT_S)
        assert found and any(text in line for line in self.lines), "".join(self.lines)

    def ctrl_c(self) -> tuple[int, str, str]:
        os.killpg(self.process.pid, signal.SIGINT)  # the whole group, as a terminal does
        stdout = self.process.stdout.read() if self.process.stdout else ""
        status = self.process.wait(WAIT_S)
        self.reader.join(WAIT_S)
        return status, stdout, "".join(self.lines)

    def group_left(self) -> bool:
        """Whether any process of the command's group is still there, after a bound."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.killpg(self.process.pid, 0)
            except ProcessLookupError:
                return False
            time.sleep(0.1)
        return True

    def kill(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(WAIT_S)
        self.reader.join(WAIT_S)
        for pipe in (self.process.stdout, self.process.stderr):
            if pipe is not None:
                pipe.close()


def started(*args: str) -> Iterator[Command]:
    command = Command(*args)
    try:
        yield command
    finally:
        command.kill()


def assert_quiet(status: int, stderr: str) -> None:
    assert status == 130, stderr
    for noise in ("Traceback", "ExceptionGroup", "KeyboardInterrupt", "Exception in thread",
                  "java."):
        assert noise not in stderr, stderr


@pytest.mark.parametrize("processes", [1, 2])
async def test_ctrl_c_in_simulate_writes_the_report_and_stops_its_workers(
        server: ServerHandle, tmp_path: Path, processes: int) -> None:
    report = tmp_path / "simulation.json"
    for command in started(
            "simulate", "--bootstrap", f"127.0.0.1:{server.kafka_port}",
            "--admin", f"http://127.0.0.1:{server.admin_port}", "--group", "interrupted",
            "--workers", "4", "--processes", str(processes), "--duration", "600",
            "--report", str(report)):
        await trio.to_thread.run_sync(command.wait_for, "converged")
        status, stdout, stderr = await trio.to_thread.run_sync(command.ctrl_c)
        assert_quiet(status, stderr)
        assert "interrupted" in stdout, stdout
        written = json.loads(report.read_text())
        assert written["interrupted"] is True
        assert written["config"]["workers"] == 4 and written["violations"] == []
        assert not await trio.to_thread.run_sync(command.group_left)


async def test_ctrl_c_while_spark_starts_stops_its_jvm(tmp_path: Path) -> None:
    pytest.importorskip("pyspark")
    (tmp_path / "metrics").mkdir()
    for command in started("report", "--metrics", str(tmp_path / "metrics"),
                           "--out", str(tmp_path / "out"), "--master", "local[1]"):
        await trio.to_thread.run_sync(command.wait_for, "starting Spark")
        status, _, stderr = await trio.to_thread.run_sync(command.ctrl_c)
        assert_quiet(status, stderr)
        assert "interrupted" in stderr
        assert not await trio.to_thread.run_sync(command.group_left), "a process is left"
