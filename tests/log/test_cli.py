"""`connect-coordinator log check|dump|compact`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from coordinator.log import cli
from coordinator.log.segments import segment_file_name

from .helpers import snapshot, write_log

ROOT = Path(__file__).resolve().parents[2]


def show_key(key: bytes, value: bytes | None) -> str:
    return f"<{key.decode()}>"


def test_check_dump_and_compact(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_log(
        tmp_path, [[(b"a", b"1" * 200)], [(b"a", b"2" * 200)], [(b"b", b"3")]], segment_bytes=1
    )
    assert cli.main(["check", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip().endswith("OK")

    assert cli.main(["dump", str(tmp_path), "--format-record", f"{__name__}:show_key"]) == 0
    out = capsys.readouterr().out
    assert "| offset: 1 " in out and "<a>" in out and "<b>" in out

    assert cli.main(["compact", str(tmp_path)]) == 0
    assert "1 of 2 closed segments rewritten (1 merged away)" in capsys.readouterr().out
    # The first segment, emptied, takes in the second: the log still starts at offset 0.
    assert (tmp_path / segment_file_name(0)).exists()
    assert not (tmp_path / segment_file_name(1)).exists()
    assert cli.main(["check", str(tmp_path)]) == 0


def test_check_fails_on_damage_without_repairing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_log(tmp_path, [[(b"a", b"1")]])
    with open(tmp_path / segment_file_name(0), "ab") as file:
        file.write(b"\x00" * 30)
    before = snapshot(tmp_path)
    assert cli.main(["check", str(tmp_path)]) == 1
    assert "repairable at start-up" in capsys.readouterr().out
    assert snapshot(tmp_path) == before


def test_commands_leave_no_hypothesis_directory_behind(tmp_path: Path) -> None:
    # kio would import Hypothesis (installed for the tests), which writes `.hypothesis/`
    # into the working directory of every command run.
    write_log(tmp_path / "data", [[(b"a", b"1")]])
    done = subprocess.run([sys.executable, "-m", "coordinator.cli", "log", "check", "data"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / ".hypothesis").exists()


def test_child_processes_skip_hypothesis_too(tmp_path: Path) -> None:
    from coordinator.cli import module_command

    probe = tmp_path / "probe.py"
    probe.write_text("import sys\nimport kio.static.primitive\n"
                     "print(sys.argv[1:], 'hypothesis' in sys.modules "
                     "and sys.modules['hypothesis'] is not None)\n")
    done = subprocess.run(module_command("probe", "a", "b"), cwd=tmp_path,
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": f"{ROOT}:{tmp_path}"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['a', 'b'] False"
    assert not (tmp_path / ".hypothesis").exists()
