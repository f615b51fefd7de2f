"""What `make run` and `make test` install, and the install commands the README and the
commands' messages give: the package is not on PyPI, so each names the checkout."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.integration.helpers import ROOT

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def make_dry_run(target: str, tmp_path: Path, *args: str) -> list[str]:
    """The commands `make TARGET` would run on a fresh clone (a virtualenv not yet made)."""
    result = subprocess.run(["make", "-n", target, f"VENV={tmp_path / 'venv'}", *args],
                            cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def pip_installs(commands: list[str]) -> list[str]:
    return [line for line in commands if " pip install " in line and "--upgrade pip" not in line]


def test_make_run_installs_the_server_only(tmp_path: Path) -> None:
    installs = pip_installs(make_dry_run("run", tmp_path))
    assert installs, "make run installs nothing on a fresh clone"
    for line in installs:
        assert "[" not in line, f"make run installs an extra: {line}"
        assert line.rstrip().endswith("-e ."), line


def test_make_test_installs_every_extra(tmp_path: Path) -> None:
    installs = pip_installs(make_dry_run("test", tmp_path))
    assert any("'.[test]'" in line for line in installs), installs


def test_make_run_passes_args_to_serve(tmp_path: Path) -> None:
    commands = make_dry_run("run", tmp_path, "ARGS=--listen 127.0.0.1:29092")
    serve = [line for line in commands if " serve " in line]
    assert serve and serve[-1].rstrip().endswith("--listen 127.0.0.1:29092"), serve


def test_install_commands_name_the_checkout_not_an_unpublished_package() -> None:
    unpublished = re.compile(r"pip install '?connect-coordinator")
    for path in [ROOT / "README.md", *sorted((ROOT / "coordinator").rglob("*.py"))]:
        text = path.read_text()
        assert not unpublished.search(text), f"{path} tells to pip install from PyPI"
    readme = (ROOT / "README.md").read_text()
    assert "`pip install .`" in readme and "`pip install '.[report]'`" in readme
