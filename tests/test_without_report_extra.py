"""A server install has no `report` extra (pyspark, pyarrow, pandas, matplotlib): the
coordinator, its tools and the fake workers must import and run without them, and asking
for the report says which extra to install, in one line.

Each check is a child process whose import system refuses those packages, as if they were
not installed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.integration.helpers import ROOT

BLOCKED = ("pyspark", "pyarrow", "pandas", "matplotlib")
# Installed first thing in the child: any import of a blocked package fails as a missing one.
BLOCKER = f"""
import importlib.abc, sys
BLOCKED = {BLOCKED!r}
class Missing(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, Missing())
"""
SERVER_MODULES = [
    "coordinator.cli", "coordinator.server.app", "coordinator.server.admin",
    "coordinator.log.cli", "coordinator.workers.simulate", "coordinator.workers.worker",
    "coordinator.client", "coordinator.metrics", "coordinator.storage",
]


def run_blocked(code: str, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", BLOCKER + code, *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120, check=False)


def cli(*args: str) -> str:
    return ("import sys\nfrom coordinator.cli import main\n"
            f"sys.exit(main({list(args)!r}))\n")


def test_the_blocker_blocks() -> None:
    result = run_blocked("import pyarrow")
    assert result.returncode == 1 and "ModuleNotFoundError" in result.stderr


def test_server_modules_import_without_the_report_packages() -> None:
    code = ("import importlib, json, sys\n"
            f"for module in {SERVER_MODULES!r}:\n"
            "    importlib.import_module(module)\n"
            f"blocked = {BLOCKED!r}\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.partition('.')[0] in blocked)))")
    result = run_blocked(code)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []


def test_serve_describe_and_simulate_run_without_the_report_packages(tmp_path: Path) -> None:
    # serve: up, ready, a describe and a short simulation against it, then a graceful stop
    code = """
import json, signal, subprocess, sys
serve = subprocess.Popen([sys.executable, "-c", sys.argv[1]], stderr=subprocess.PIPE, text=True)
for line in serve.stderr:
    event = json.loads(line)
    if event.get("event") == "ready":
        break
described = subprocess.run([sys.executable, "-c", sys.argv[2]], capture_output=True,
                           text=True, timeout=60)
simulated = subprocess.run([sys.executable, "-c", sys.argv[3]], capture_output=True,
                           text=True, timeout=120)
serve.send_signal(signal.SIGTERM)
print(json.dumps({"describe": described.returncode, "stdout": described.stdout,
                  "stderr": described.stderr, "simulate": simulated.returncode,
                  "simulate_stderr": simulated.stderr[-2000:],
                  "serve": serve.wait(timeout=60)}))
"""
    # the port of the ready line is known only in the parent, so serve picks fixed ones
    from tests.integration.helpers import free_port

    kafka, admin = free_port(), free_port()
    serve = BLOCKER + cli("serve", "--listen", f"127.0.0.1:{kafka}",
                          "--admin-listen", f"127.0.0.1:{admin}",
                          "--data-dir", str(tmp_path / "data"), "--log-format", "json")
    describe = BLOCKER + cli("describe", "--bootstrap", f"127.0.0.1:{kafka}",
                             "--admin", f"http://127.0.0.1:{admin}", "--json")
    simulate = BLOCKER + cli("simulate", "--bootstrap", f"127.0.0.1:{kafka}",
                             "--admin", f"http://127.0.0.1:{admin}", "--group", "blocked",
                             "--workers", "2", "--connectors", "1",
                             "--tasks-per-connector", "1", "--duration", "1", "--quiet")
    result = subprocess.run([sys.executable, "-c", code, serve, describe, simulate], cwd=ROOT,
                            capture_output=True, text=True, timeout=180, check=False)
    assert result.returncode == 0, result.stderr
    outcome = json.loads(result.stdout)
    assert outcome["describe"] == 0, outcome["stderr"]
    assert json.loads(outcome["stdout"]) == []  # no groups yet
    assert outcome["simulate"] == 0, outcome["simulate_stderr"]
    assert outcome["serve"] == 0


def test_log_tools_run_without_the_report_packages(tmp_path: Path) -> None:
    result = run_blocked(cli("log", "check", str(tmp_path)))
    assert result.returncode == 0, result.stderr


def test_report_without_the_extra_says_what_to_install(tmp_path: Path) -> None:
    for args in (["report", "--metrics", str(tmp_path), "--out", str(tmp_path / "out")],
                 ["log", "snapshot", "--data-dir", str(tmp_path), "--out",
                  str(tmp_path / "s.parquet")],
                 ["metrics", "record", "--url", "http://127.0.0.1:1/metrics",
                  "--out", str(tmp_path / "m")]):
        result = run_blocked(cli(*args))
        assert result.returncode == 2, (args, result.stderr)
        lines = result.stderr.splitlines()
        assert len(lines) == 1, (args, result.stderr)
        assert "pip install '.[report]'" in lines[0], lines[0]
        assert "is not installed" in lines[0]


def test_report_without_java_says_to_install_it(tmp_path: Path) -> None:
    (tmp_path / "metrics").mkdir()
    result = subprocess.run(
        [sys.executable, "-m", "coordinator.cli", "report", "--metrics",
         str(tmp_path / "metrics"), "--out", str(tmp_path / "out")],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "JAVA_HOME": str(tmp_path / "no-java")})
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert "needs Java 17" in lines[0] and "JAVA_HOME" in lines[0]
