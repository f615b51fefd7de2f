"""`make demo-connect` as a newcomer runs it: the real workers' group is on the coordinator,
the banner's `describe` command works as printed, and Ctrl-C at any moment (start-up
included) ends it with every process it started stopped."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from coordinator.processes import descendants
from tests.integration.helpers import ROOT
from tests.interop.conftest import _require_interop

WAIT_S = 420


class Demo:
    def __init__(self, folder: Path) -> None:
        _require_interop()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "coordinator.cli", "demo-connect", "--dir", str(folder)],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True)
        self.lines: list[str] = []
        self.changed = threading.Condition()
        self.started: set[int] = set()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with self.changed:
                self.lines.append(line)
                self.changed.notify_all()
        with self.changed:
            self.lines.append("")
            self.changed.notify_all()

    def wait_for(self, text: str) -> None:
        with self.changed:
            self.changed.wait_for(lambda: any(text in line for line in self.lines)
                                  or "" in self.lines, WAIT_S)
        assert any(text in line for line in self.lines), "".join(self.lines)

    def ctrl_c(self) -> int:
        self.started |= set(descendants(self.process.pid))
        os.killpg(self.process.pid, signal.SIGINT)  # as a terminal does
        return self.process.wait(WAIT_S)

    def left_behind(self) -> list[int]:
        deadline = time.monotonic() + 60
        alive = list(self.started)
        while alive and time.monotonic() < deadline:
            alive = [pid for pid in alive if Path(f"/proc/{pid}").exists()]
            time.sleep(0.2)
        return alive

    def close(self) -> None:
        for pid in [self.process.pid, *self.started]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.process.wait(WAIT_S)
        if self.process.stdout is not None:
            self.process.stdout.close()


def test_the_demo_puts_the_workers_group_on_the_coordinator(tmp_path: Path) -> None:
    demo = Demo(tmp_path / "demo")
    try:
        demo.wait_for("Ctrl-C stops everything.")
        banner = "".join(demo.lines)
        assert "served by this coordinator" in banner, banner
        describe = next(line.strip() for line in demo.lines if " describe --bootstrap" in line)
        assert describe.startswith("/"), describe  # a full path: .venv/bin is not on PATH
        shown = subprocess.run(shlex.split(describe), capture_output=True, text=True,
                               timeout=120, check=False)
        assert shown.returncode == 0, shown.stderr
        assert "GROUP connect-demo" in shown.stdout, shown.stdout
        members = [line for line in shown.stdout.splitlines() if "classic/" in line]
        assert len(members) == 3, shown.stdout
        assert demo.ctrl_c() == 130
        assert "Traceback" not in "".join(demo.lines)
        assert demo.left_behind() == []
    finally:
        demo.close()


def test_ctrl_c_during_start_up_stops_at_once(tmp_path: Path) -> None:
    demo = Demo(tmp_path / "demo")
    try:
        demo.wait_for("starting three Connect workers")
        assert demo.ctrl_c() == 130
        output = "".join(demo.lines)
        assert "Running." not in output and "Traceback" not in output, output
        assert demo.left_behind() == []
    finally:
        demo.close()
