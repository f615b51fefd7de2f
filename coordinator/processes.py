"""Ending the processes a command started, for a Ctrl-C that must leave nothing behind.

A child that was told to ignore SIGINT (Spark's JVM, which PySpark starts that way) or that
started children of its own never sees the terminal's Ctrl-C through its parent: the
command finds its descendants in /proc and ends them itself."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def descendants(pid: int | None = None) -> list[int]:
    """Every process below `pid` (default: this one), parents before their children."""
    root = os.getpid() if pid is None else pid
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            # "pid (name) state ppid ...": the name may hold spaces and parentheses.
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # it ended while we looked
        fields = stat.rpartition(")")[2].split()
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: list[int] = []
    waiting = [root]
    while waiting:
        for child in children.get(waiting.pop(), []):
            found.append(child)
            waiting.append(child)
    return found


def stop_descendants(grace_s: float = 5.0) -> None:
    """SIGTERM to every descendant, then SIGKILL to those still there after `grace_s`."""
    targets = descendants()
    for pid in targets:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        _reap()
        if not [pid for pid in targets if _alive(pid)]:
            return
        time.sleep(0.05)
    for pid in targets:
        _signal(pid, signal.SIGKILL)
    _reap()


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has ended; its parent has not read its status yet


def _reap() -> None:
    """Reads the status of this process's own children that ended, so none is a zombie."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
