"""`bench heartbeats` end to end on tiny configurations (figures are not judged here).

Each run starts a real coordinator subprocess and two load processes of trio workers, so
these tests take a few seconds each.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from coordinator import cli
from coordinator.server.bench_heartbeats import summarize
from coordinator.workers.state import WorkerConfig, WorkerState
from protocol.messages import ConnectGroupHeartbeatResponse

TINY = ["bench", "heartbeats", "--processes", "2", "--groups", "2", "--workers-per-group", "3",
        "--connectors", "1", "--tasks", "4", "--interval-ms", "10", "--duration", "1",
        "--warmup", "0", "--json"]
FIGURES = ("heartbeats_per_s", "p50_ms", "p99_ms", "p999_ms", "errors")


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    code = cli.main(argv)
    out = capsys.readouterr().out
    return code, json.loads(out)


def check_figures(figures: dict[str, Any]) -> None:
    for key in FIGURES:
        assert key in figures, key
    assert figures["heartbeats_per_s"] > 0
    assert figures["p50_ms"] <= figures["p99_ms"] <= figures["p999_ms"]
    assert figures["errors"] == {}
    assert figures["unstable"] == 0  # the windows only saw stable heartbeats


def test_json_report_of_a_tiny_run(capsys: pytest.CaptureFixture[str]) -> None:
    code, report = run_cli(TINY, capsys)
    assert code == 0
    check_figures(report)
    assert report["processes"] == 2 and report["workers"] == 6
    assert report["coordinator"] == "subprocess"
    assert report["stable_at_end"] is True and report["worker_failures"] == []
    assert "assignor_load" not in report


def test_assignor_load_is_reported_side_by_side(capsys: pytest.CaptureFixture[str]) -> None:
    code, report = run_cli([*TINY, "--assignor-load", "--assignor-workers", "10",
                            "--assignor-connectors", "5", "--assignor-tasks", "50"], capsys)
    assert code == 0
    check_figures(report)
    load = report["assignor_load"]
    check_figures(load)
    assert load["runs"] > 0 and load["puts"] > 0  # runs were triggered during the window
    assert report["baseline_runs"] == 0  # ...and none in the baseline window
    assert report["p99_ratio"] == pytest.approx(load["p99_ms"] / report["p99_ms"], abs=0.01)


def test_options_are_checked(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["bench", "heartbeats", "--processes", "0"])
    with pytest.raises(SystemExit):
        cli.main(["bench", "heartbeats", "--bootstrap", "127.0.0.1:19092"])  # no --admin
    capsys.readouterr()


def test_windows_of_all_processes_are_pooled() -> None:
    def part(latencies: list[float], **errors: int) -> dict[str, Any]:
        return {"latencies_ms": latencies, "errors": errors, "unstable": 0, "unanswered": 0,
                "cpu_s": 0.5}

    windows = [[part([1.0, 3.0]), part([2.0], TRANSPORT=1)],
               [part([4.0] * 97, FENCED_MEMBER_EPOCH=2)]]
    figures = summarize(windows, duration=2.0)
    assert figures["heartbeats"] == 100
    assert figures["heartbeats_per_s"] == 25.0  # 100 over two 2 s windows
    assert (figures["p50_ms"], figures["p99_ms"], figures["p999_ms"]) == (4.0, 4.0, 4.0)
    assert figures["errors"] == {"FENCED_MEMBER_EPOCH": 2, "TRANSPORT": 1}
    assert figures["load_cpu"] == 0.38  # 1.5 CPU seconds over 4 s
    assert math.isnan(summarize([[part([])]], 1.0)["p99_ms"])


def _answer(interval_ms: int) -> ConnectGroupHeartbeatResponse:
    return ConnectGroupHeartbeatResponse(throttle_time_ms=0, error_code=0, error_message=None,
                                         member_epoch=3, heartbeat_interval_ms=interval_ms,
                                         assignment=None)


@pytest.mark.parametrize(("override", "expected_wakeup"), [(None, 1_000 + 3_000),
                                                            (0, 1_000), (25, 1_025)])
def test_worker_heartbeat_pace_override(override: int | None, expected_wakeup: int) -> None:
    """The pace the bench drives workers at; without it the coordinator's interval rules."""
    state = WorkerState(WorkerConfig(group_id="g", worker_url="http://w:8083", member_id="w",
                                     heartbeat_interval_override_ms=override))
    state.heartbeat_request(1_000)
    state.on_heartbeat_response(_answer(3_000), 1_000)
    assert state.next_wakeup_ms == expected_wakeup


def test_worker_heartbeat_pace_override_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="heartbeat_interval_override_ms"):
        WorkerConfig(group_id="g", worker_url="http://w:8083",
                     heartbeat_interval_override_ms=-1)
