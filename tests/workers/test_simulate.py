"""`connect-coordinator simulate`: its options, its overlap check, and bounded chaos runs
against real coordinators over TCP."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio

from coordinator.config import ServerConfig
from coordinator.server.app import ServerHandle, run_server
from coordinator.workers import worker as worker_module
from coordinator.workers.simulate import (
    CHAOS_KINDS,
    CONVERSION_KINDS,
    ChaosPlan,
    Simulation,
    SimulationError,
    build_parser,
    find_violations,
    options_from,
    parse_chaos,
)
from tests.integration.helpers import ROOT, free_port, http_call

pytestmark = pytest.mark.filterwarnings(
    "ignore:Exception ignored in. <socket.socket:pytest.PytestUnraisableExceptionWarning")


# ---------------------------------------------------------------------------- options
def test_chaos_spec() -> None:
    assert parse_chaos("none", can_restart=False) == ChaosPlan()
    assert parse_chaos("kill,drop=0.5,kill", can_restart=False) == \
        ChaosPlan(("kill", "drop"), drop_share=0.5)
    every = parse_chaos("all", can_restart=True, mixed_group=True)
    assert every.mixed and set(every.kinds) == set(CHAOS_KINDS) and every.converts
    # without a restart command or classic workers, `all` leaves out what it cannot do
    assert "restart" not in parse_chaos("all", can_restart=False).kinds
    assert set(parse_chaos("all", can_restart=True).kinds) == \
        set(CHAOS_KINDS) - {"upgrade", "downgrade"}
    assert parse_chaos("downgrade", can_restart=False, mixed_group=True) == \
        ChaosPlan(("downgrade",))


@pytest.mark.parametrize(("spec", "message"), [
    ("explode", "unknown chaos kind 'explode'"),
    ("drop=2", "between 0 and 1"),
    ("drop=lots", "between 0 and 1"),
    ("kill=3", "takes no value"),
    ("restart", "needs --restart-command"),
    ("kill,upgrade", "chaos kind 'upgrade' needs --classic-workers N"),
])
def test_bad_chaos_spec(spec: str, message: str) -> None:
    with pytest.raises(SimulationError, match=message):
        parse_chaos(spec, can_restart=False)


@pytest.mark.parametrize(("argv", "message"), [
    (["--bootstrap", "nohost"], "expected HOST:PORT"),
    (["--workers", "0"], "--workers must be at least 1"),
    (["--assignor", "client:magic"], "client:incremental-cooperative"),
    (["--group-config", "novalue"], "expected KEY=VALUE"),
    (["--chaos", "restart"], "needs --restart-command"),
    (["--chaos", "downgrade"], "needs --classic-workers N"),
    (["--chaos", "upgrade", "--classic-workers", "1", "--assignor", "server:balanced"],
     "needs a client assignor"),
])
def test_usage_errors_exit_2(argv: list[str], message: str,
                             capsys: pytest.CaptureFixture[str]) -> None:
    from coordinator.workers.simulate import main
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_help_explains_chaos(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    text = capsys.readouterr().out
    for kind in CHAOS_KINDS:
        assert f"  {kind} " in text
    assert "need --classic-workers" in text


# ---------------------------------------------------------------------------- overlap check
def run(unit: tuple[str, int], worker: str, start: float, stop: float | None) -> dict[str, Any]:
    return {"unit": list(unit), "worker": worker, "started_ms": start, "stopped_ms": stop}


def test_violations_are_overlapping_runs_of_one_unit() -> None:
    runs = [
        run(("a", 0), "w1", 1_000, 2_000),
        run(("a", 0), "w2", 2_000, None),  # starts exactly when w1 stopped: fine
        run(("a", 1), "w1", 1_000, 3_000),
        run(("a", 1), "w2", 2_500, 4_000),  # overlaps w1 from 2.5 s to 3 s
        run(("b", -1), "w1", 1_000, None),
        run(("b", -1), "w3", 5_000, None),  # both still running
    ]
    found = find_violations(runs, origin_ms=1_000)
    assert [(v["unit"], v["overlap_s"]) for v in found] == [
        ("a-1", [1.5, 2.0]),
        ("b", [4.0, None]),
    ]
    first, second = found[0]["runs"]
    assert first == {"worker": "w1", "from_s": 0.0, "to_s": 2.0}
    assert second == {"worker": "w2", "from_s": 1.5, "to_s": 3.0}
    assert find_violations(runs[:2], origin_ms=0) == []


# ---------------------------------------------------------------------------- in-process runs
FAST = ServerConfig(assignment_interval_ms=0, assignor_offload_enable=False,
                    heartbeat_interval_ms=100, session_timeout_ms=1_500,
                    scheduled_rebalance_max_delay_ms=500, shutdown_timeout_ms=500)


async def simulate_against(handle: ServerHandle, *extra: str) -> dict[str, Any]:
    args = build_parser().parse_args([
        "--bootstrap", f"127.0.0.1:{handle.kafka_port}",
        "--admin", f"http://127.0.0.1:{handle.admin_port}",
        "--workers", "3", "--connectors", "2", "--tasks-per-connector", "3",
        "--quiet", *extra])
    return await Simulation(options_from(args)).run()


async def test_a_quiet_group_converges_with_every_unit_once(nursery: trio.Nursery) -> None:
    handle: ServerHandle = await nursery.start(run_server, FAST, ("127.0.0.1", 0),
                                               ("127.0.0.1", 0))
    report = await simulate_against(handle, "--duration", "1", "--assignor", "client:eager")
    assert report["violations"] == []
    assert report["converged"] is True
    assert report["final"]["units_running"] == report["final"]["units"] == 8
    assert report["final"]["state"] == "STABLE" and report["final"]["members"] == 3
    assert report["heartbeats"] > 0 and report["disruptions"] == []
    handle.stop()


async def test_connectors_the_run_did_not_create_count_too(nursery: trio.Nursery) -> None:
    handle: ServerHandle = await nursery.start(run_server, FAST, ("127.0.0.1", 0),
                                               ("127.0.0.1", 0))
    await handle.runtime.put_connector("connect-cluster", "legacy", 2)  # an earlier run's
    report = await simulate_against(handle, "--duration", "0.5")
    assert report["converged"] is True
    assert report["final"]["units"] == report["final"]["units_running"] == 8 + 3
    handle.stop()


async def test_a_worker_that_never_stops_revoked_units_is_caught(
        nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check can fail: workers that ignore revocations run units twice."""
    async def keep_running(self: Any, units: Any) -> None:
        return None

    monkeypatch.setattr(worker_module.UnitRunner, "stop", keep_running)
    handle: ServerHandle = await nursery.start(run_server, FAST, ("127.0.0.1", 0),
                                               ("127.0.0.1", 0))
    report = await simulate_against(handle, "--duration", "1", "--converge-timeout", "2",
                                    "--assignor", "server:balanced")
    assert report["violations"], report
    assert report["converged"] is False
    violation = report["violations"][0]
    assert len({interval["worker"] for interval in violation["runs"]}) == 2
    handle.stop()


# ---------------------------------------------------------------------------- the chaos run
SUPERVISOR = """\
#!/bin/bash
# Keeps the coordinator running: the restart command kills it, this loop starts it again.
dir=$1; shift
while [ ! -e "$dir/stop" ]; do
  "$@" >> "$dir/serve.log" 2>&1 &
  echo $! > "$dir/pid"
  wait $!
done
"""


@pytest.fixture
def supervise(tmp_path: Path) -> Any:
    """Starts a coordinator under the supervisor loop, with extra `--set` settings."""
    started: list[subprocess.Popen[bytes]] = []

    def start(*settings: str) -> tuple[int, int, Path]:
        kafka_port, admin_port = free_port(), free_port()
        script = tmp_path / "supervise.sh"
        script.write_text(SUPERVISOR)
        serve = [sys.executable, "-m", "coordinator.cli", "serve",
                 "--listen", f"127.0.0.1:{kafka_port}",
                 "--admin-listen", f"127.0.0.1:{admin_port}",
                 "--data-dir", str(tmp_path / "data"), "--log-format", "json",
                 "--set", "group.connect.session.timeout.ms=2000",
                 "--set", "group.connect.heartbeat.interval.ms=200",
                 "--set", "group.connect.assignment.interval.ms=0"]
        for setting in settings:
            serve += ["--set", setting]
        started.append(subprocess.Popen(["bash", str(script), str(tmp_path), *serve],
                                        cwd=ROOT))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if http_call("GET", f"http://127.0.0.1:{admin_port}/readyz")[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.1)
        return kafka_port, admin_port, tmp_path

    yield start
    for supervisor in started:
        (tmp_path / "stop").touch()
        try:
            os.kill(int((tmp_path / "pid").read_text()), signal.SIGTERM)
        except ProcessLookupError:
            pass
        supervisor.wait(timeout=30)


@pytest.fixture
def supervised_coordinator(supervise: Any) -> Any:
    return supervise()


def test_chaos_run_with_every_kind_keeps_units_single(supervised_coordinator: Any) -> None:
    """20 workers in two processes, every kind of chaos including coordinator restarts
    (SIGKILL): no unit ever runs on two workers, and the group converges after each."""
    kafka_port, admin_port, tmp_path = supervised_coordinator
    report_path = tmp_path / "report.json"
    command = [
        sys.executable, "-m", "coordinator.cli", "simulate",
        "--bootstrap", f"127.0.0.1:{kafka_port}", "--admin", f"http://127.0.0.1:{admin_port}",
        "--workers", "20", "--connectors", "4", "--tasks-per-connector", "5",
        "--duration", "20", "--chaos", "all", "--chaos-interval", "0.3", "--downtime", "1",
        "--rebalance-delay-ms", "1000", "--processes", "2", "--seed", "7",
        "--restart-command", f"kill -9 $(cat {tmp_path / 'pid'})",
        "--report", str(report_path)]
    finished = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=90)
    assert report_path.exists(), finished.stderr
    report = json.loads(report_path.read_text())
    assert report["violations"] == [], report["violations"]
    # (without classic workers, `all` leaves out the conversions)
    assert {d["kind"] for d in report["disruptions"]} == \
        set(CHAOS_KINDS) - set(CONVERSION_KINDS)
    assert all(d["converged"] for d in report["disruptions"]), report["disruptions"]
    assert report["converged"] is True
    assert len(report["time_to_converge_s"]) == len(report["disruptions"])
    assert report["heartbeats"] > 0 and report["dropped"] > 0
    assert isinstance(report["errors"], dict)
    assert report["final"]["units_running"] == 24
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert "violations: 0" in finished.stdout


CLASSIC_FAST = msgspec.structs.replace(FAST, classic_min_session_timeout_ms=1_000,
                                       initial_rebalance_delay_ms=0)


async def test_classic_workers_mix_in_and_keep_units_single(nursery: trio.Nursery) -> None:
    handle: ServerHandle = await nursery.start(run_server, CLASSIC_FAST, ("127.0.0.1", 0),
                                               ("127.0.0.1", 0))
    report = await simulate_against(handle, "--duration", "6", "--classic-workers", "2",
                                    "--chaos", "kill,bounce", "--chaos-interval", "2",
                                    "--downtime", "0.2", "--converge-timeout", "15")
    assert report["violations"] == []
    assert report["converged"] is True
    assert report["final"]["units_running"] == report["final"]["units"] == 8
    bridged = handle.runtime.core.store.classic.bridged
    assert any(member_id.startswith("worker-") for _, member_id in bridged)
    handle.stop()



def test_chaos_run_with_mixed_protocols_and_live_conversions(supervise: Any) -> None:
    """Classic and new-protocol workers in two processes under every kind of chaos, the
    group converted connect -> classic and back live, the coordinator SIGKILLed, workers
    killed and requests lost while the group is classic and while it is connect: no unit
    ever runs on two workers, and the group converges (of the right type) after each."""
    kafka_port, admin_port, tmp_path = supervise(
        "group.min.session.timeout.ms=1000", "group.initial.rebalance.delay.ms=0",
        "group.connect.migration.policy=bidirectional")
    report_path = tmp_path / "report.json"
    command = [
        sys.executable, "-m", "coordinator.cli", "simulate",
        "--bootstrap", f"127.0.0.1:{kafka_port}", "--admin", f"http://127.0.0.1:{admin_port}",
        "--workers", "8", "--classic-workers", "3", "--connectors", "3",
        "--tasks-per-connector", "4", "--duration", "5",
        "--chaos", "downgrade,kill,restart,drop,upgrade,pause,bounce,rolling",
        "--chaos-interval", "0.3", "--downtime", "0.5", "--rebalance-delay-ms", "1000",
        "--converge-timeout", "20", "--processes", "2", "--seed", "11",
        "--restart-command", f"kill -9 $(cat {tmp_path / 'pid'})",
        "--report", str(report_path)]
    finished = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=90)
    assert report_path.exists(), finished.stderr
    report = json.loads(report_path.read_text())
    assert report["violations"] == [], report["violations"]
    assert all(d["converged"] for d in report["disruptions"]), report["disruptions"]
    assert {d["kind"] for d in report["disruptions"]} == set(CHAOS_KINDS)
    conversions = [d["detail"] for d in report["disruptions"]
                   if d["kind"] in ("upgrade", "downgrade")]
    assert any("classic -> connect" in detail for detail in conversions), conversions
    assert any("connect -> classic" in detail for detail in conversions), conversions
    while_classic = {d["kind"] for d in report["disruptions"] if d["group_type"] == "classic"}
    assert {"kill", "restart", "drop", "upgrade"} <= while_classic, report["disruptions"]
    assert report["converged"] is True
    assert report["final"]["units_running"] == report["final"]["units"] == 15
    assert finished.returncode == 0, finished.stdout + finished.stderr
