"""`bench heartbeats` end to end on tiny configurations (figures are not judged here).

Each run starts a real coordinator subprocess and two load processes of trio workers, so
these tests take a few seconds each.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
import trio

from bench.heartbeats import (
    AdminConnection,
    BenchError,
    ServerLog,
    heartbeat_member,
    in_flight_figures,
    split_by_runs,
    summarize,
)
from coordinator import cli
from coordinator.server.app import ServerHandle
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
    assert report["load_gc"] == "paused"  # the load's collections stay out of the window
    assert report["machine_cpu"] >= report["server_cpu"]  # the whole machine's, ours included
    assert report["stable_at_end"] is True and report["worker_failures"] == []
    assert "assignor_load" not in report


def test_raw_load_client_measures_members_that_only_heartbeat(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, report = run_cli([*TINY, "--load-client", "raw", "--assignor-load",
                            "--assignor-workers", "10", "--assignor-connectors", "5",
                            "--assignor-tasks", "50", "--assignor-windows", "in-flight",
                            "--in-flight-put-interval-ms", "20"], capsys)
    assert code == 0
    check_figures(report)  # every member joined, acknowledged and then only heartbeat
    assert report["load_client"] == "raw" and report["workers"] == 6
    # 6 members every 10 ms (+-10%) for a second: about 600 timed heartbeats.
    assert 300 <= report["heartbeats"] <= 700
    assert report["stable_at_end"] is True and report["worker_failures"] == []
    check_in_flight(report)


def test_assignor_load_is_reported_side_by_side(capsys: pytest.CaptureFixture[str]) -> None:
    code, report = run_cli([*TINY, "--assignor-load", "--assignor-workers", "10",
                            "--assignor-connectors", "5", "--assignor-tasks", "50",
                            "--in-flight-put-interval-ms", "20"], capsys)
    assert code == 0
    check_figures(report)
    load = report["assignor_load"]
    check_figures(load)
    assert load["runs"] > 0 and load["puts"] > 0  # runs were triggered during the window
    assert report["baseline_runs"] == 0  # ...and none in the baseline window
    assert report["p99_ratio"] == pytest.approx(load["p99_ms"] / report["p99_ms"], abs=0.01)
    check_in_flight(report)


def check_in_flight(report: dict[str, Any]) -> None:
    """The in-flight window (the in-flight target as written) is reported next to the rest."""
    flight = report["in_flight"]
    assert flight["runs"] > 0 and flight["puts"] > 0
    assert 0 < flight["in_flight_share"] < 1  # runs were in flight, but not all the time
    assert flight["flight_ms_mean"] > 0 and flight["flight_ms_max"] >= flight["flight_ms_mean"]
    for name in ("baseline", "in_flight", "between_runs"):
        part = flight[name]
        # A run of this tiny group takes a few ms: a resize every 20 ms puts some of the
        # heartbeats in flight, and most between runs.
        assert part["heartbeats"] > 0, name
        assert part["p50_ms"] <= part["p99_ms"] <= part["p999_ms"] <= part["max_ms"]
    assert flight["baseline"]["heartbeats"] == report["heartbeats"]
    # Every stable heartbeat of the window is in one of the two classes.
    assert (flight["in_flight"]["heartbeats"] + flight["between_runs"]["heartbeats"]
            == flight["window"]["heartbeats"])
    assert flight["window"]["errors"] == {} and flight["window"]["unstable"] == 0
    assert flight["p99_ratio"] == pytest.approx(
        flight["in_flight"]["p99_ms"] / flight["baseline"]["p99_ms"], abs=0.01)
    assert flight["p99_ratio_between_runs"] == pytest.approx(
        flight["in_flight"]["p99_ms"] / flight["between_runs"]["p99_ms"], abs=0.01)


@pytest.fixture
def logging_restored() -> Iterator[None]:
    """`--in-process` configures logging for the bench's process, onto this test's captured
    stderr; later tests must not log to it once it is closed."""
    saved = structlog.get_config()
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    structlog.configure(**saved)
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.mark.usefixtures("logging_restored")
def test_in_flight_window_alone_with_the_coordinator_in_process(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, report = run_cli([*TINY, "--in-process", "--assignor-load", "--assignor-workers", "10",
                            "--assignor-connectors", "5", "--assignor-tasks", "50",
                            "--assignor-windows", "in-flight", "--load-gc", "on",
                            "--in-flight-put-interval-ms", "20"],
                           capsys)
    assert code == 0
    check_figures(report)
    assert "assignor_load" not in report and "p99_ratio" not in report
    assert report["baseline_runs"] == 0 and report["in_flight_put_interval_ms"] == 20
    assert report["load_gc"] == "on"
    check_in_flight(report)


def test_heartbeats_are_split_by_when_they_were_sent() -> None:
    window = [{"latencies_ms": [], "window_s": [100.0, 110.0]},  # the coordinator's part
              {"latencies_ms": [1.0, 50.0, 2.0, 60.0, 3.0],
               "sent_s": [100.5, 101.0, 101.6, 103.0, 104.5]},
              {"latencies_ms": [70.0, 4.0], "sent_s": [103.5, 109.9]}]
    # Two overlapping runs make one flight (101-102); another runs 103-104 (ends included).
    # (submitted, returned, landed)
    runs = [(101.0, 101.4, 101.5), (101.4, 101.5, 101.55), (103.0, 103.9, 104.0),
            (50.0, 59.0, 60.0)]
    in_flight, between = split_by_runs(window, runs)
    assert sorted(in_flight) == [50.0, 60.0, 70.0]
    assert sorted(between) == [1.0, 2.0, 3.0, 4.0]
    baseline = [[{"latencies_ms": [1.0] * 99 + [10.0]}]]
    figures = in_flight_figures(baseline, [window], [runs], duration=10.0)
    assert figures["runs"] == 3  # (50, 60) is outside the window
    assert figures["in_flight_share"] == pytest.approx((0.55 + 1.0) / 10, abs=0.001)
    assert figures["flight_ms_max"] == 1000.0
    assert figures["baseline"]["p99_ms"] == 1.0 and figures["in_flight"]["p99_ms"] == 70.0
    assert figures["p99_ratio"] == 70.0 and figures["in_flight"]["heartbeats"] == 3
    # Between runs, p99 of [1, 2, 3, 4] is 4.
    assert figures["between_runs"]["p99_ms"] == 4.0
    assert figures["p99_ratio_between_runs"] == 17.5
    with pytest.raises(BenchError):
        split_by_runs([{"latencies_ms": [1.0], "sent_s": []}], runs)
    where = figures["where_in_flight"]  # 101.0 and 103.0 open their runs; 103.5 computes
    assert [where[part]["heartbeats"] for part in where] == [2, 1, 0, 0]
    assert where["computing"]["slower_than_baseline_p99"] == 1.0
    assert where["landing"]["slower_than_baseline_p99"] is None


def test_in_flight_heartbeats_are_told_by_when_in_the_flight_they_were_sent() -> None:
    # One run submitted at 100.0, back on the event loop at 100.010, landed at 100.013;
    # another submitted at 100.012 (while the first lands), back at 100.030.
    runs = [(100.0, 100.010, 100.013), (100.012, 100.030, 100.031)]
    sent = [100.0005, 100.004, 100.006, 100.0095, 100.011, 100.0125, 100.020, 100.040]
    latencies = [9.0, 1.0, 9.0, 9.0, 1.0, 9.0, 1.0, 9.0]
    window = [{"latencies_ms": [], "window_s": [99.0, 101.0]},
              {"latencies_ms": latencies, "sent_s": sent}]
    baseline = [[{"latencies_ms": [1.0] * 100}]]
    where = in_flight_figures(baseline, [window], [runs], duration=2.0)["where_in_flight"]
    assert where == {
        "first_2ms": {"heartbeats": 2, "slower_than_baseline_p99": 1.0,  # 0.5 ms; 100.0125
                      "p99_ms": 9.0},
        "computing": {"heartbeats": 3, "slower_than_baseline_p99": 0.3333, "p99_ms": 9.0},
        "last_2ms": {"heartbeats": 1, "slower_than_baseline_p99": 1.0, "p99_ms": 9.0},
        "landing": {"heartbeats": 1, "slower_than_baseline_p99": 0.0, "p99_ms": 1.0},
    }


def test_a_server_command_runs_the_coordinator_the_bench_starts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Another checkout's `connect-coordinator` runs under the same load and report: here a
    wrapper that leaves a mark and then runs this one's."""
    mark = tmp_path / "started"
    wrapper = tmp_path / "other-checkout-coordinator"
    wrapper.write_text(f"#!/bin/sh\necho \"$@\" > {mark}\n"
                       f"exec {sys.executable} -m coordinator.cli \"$@\"\n")
    wrapper.chmod(0o755)
    code, report = run_cli([*TINY, "--server-command", str(wrapper)], capsys)
    assert code == 0
    check_figures(report)
    assert mark.read_text().startswith("serve --listen 127.0.0.1:0")
    assert report["coordinator"] == f"subprocess: {wrapper}"


def test_a_server_command_that_cannot_start_is_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "no-such-coordinator"
    assert cli.main([*TINY, "--server-command", str(missing)]) == 1
    error = capsys.readouterr().err
    assert error.strip().splitlines() == [
        f"connect-coordinator bench heartbeats: cannot start the coordinator ({missing}): "
        "No such file or directory"]


def test_options_are_checked(capsys: pytest.CaptureFixture[str]) -> None:
    for server_command_misuse in (["--server-command", " "],
                                  ["--server-command", "x", "--in-process"],
                                  ["--server-command", "x", "--bootstrap", "127.0.0.1:1",
                                   "--admin", "http://127.0.0.1:2"]):
        with pytest.raises(SystemExit):
            cli.main(["bench", "heartbeats", *server_command_misuse])
    with pytest.raises(SystemExit):
        cli.main(["bench", "heartbeats", "--processes", "0"])
    with pytest.raises(SystemExit):
        cli.main(["bench", "heartbeats", "--bootstrap", "127.0.0.1:19092"])  # no --admin
    with pytest.raises(SystemExit):  # it cannot tell when runs were in flight
        cli.main(["bench", "heartbeats", "--bootstrap", "127.0.0.1:19092", "--admin",
                  "http://127.0.0.1:19093", "--assignor-load"])
    with pytest.raises(SystemExit):
        cli.main(["bench", "heartbeats", "--assignor-load", "--in-flight-put-interval-ms", "0"])
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


async def test_the_admin_connection_keeps_one_connection_and_reopens_after_an_error(
        server: ServerHandle) -> None:
    connection = AdminConnection(f"http://127.0.0.1:{server.admin_port}")
    try:
        put = await connection.request("PUT", "/groups/g/connectors/c", {"tasks": 2})
        first = connection._stream
        assert first is not None
        view = await connection.request("GET", "/groups/g")
        assert connection._stream is first  # kept alive
        assert put["tasks"] == 2 and "c" in view["connectors_and_tasks"]["connectors"]
        with pytest.raises(BenchError, match="HTTP 400"):
            await connection.request("PUT", "/groups/g/connectors/c", {"tasks": -1})
        assert connection._stream is None
        resized = await connection.request("PUT", "/groups/g/connectors/c", {"tasks": 3})
        assert resized["tasks"] == 3 and connection._stream is not None
    finally:
        await connection.aclose()


def test_the_coordinator_s_log_file_is_read_as_it_grows(tmp_path: Path) -> None:
    log = ServerLog(tmp_path / "coordinator.log")
    assert log.landed_runs() == (0, [])  # not written yet
    ready = {"event": "ready", "listen": "127.0.0.1:9092", "admin": "http://127.0.0.1:8080"}
    landed = {"event": "assignor_run_landed", "submitted_at": 10.5, "returned_at": 10.51,
              "landed_at": 10.52}
    first = json.dumps(ready) + "\n" + json.dumps(landed) + "\n"
    second = json.dumps({**landed, "submitted_at": 11.0, "returned_at": 11.02,
                         "landed_at": 11.03})
    with log.path.open("w") as file:
        file.write(first + second[:20])  # the coordinator is in the middle of a line
        file.flush()
        assert log.landed_runs() == (1, [(10.5, 10.51, 10.52)])
        assert log.target is not None and log.target.port == 9092
        assert log.target.admin == "http://127.0.0.1:8080"
        file.write(second[20:] + "\n")
        file.flush()
        assert log.landed_runs() == (2, [(10.5, 10.51, 10.52), (11.0, 11.02, 11.03)])
    assert list(log.tail)[-1] == second


async def test_woken_members_heartbeat_at_once_then_each_at_its_own_point_of_the_interval(
        autojump_clock: Any) -> None:
    # The big group's members are woken so that they reach the group's target before a
    # baseline window; woken together, they must not heartbeat together from then on.
    sent: dict[str, list[float]] = {}

    class Client:
        async def request(self, _api: int, request: Any) -> ConnectGroupHeartbeatResponse:
            sent.setdefault(request.member_id, []).append(trio.current_time())
            return ConnectGroupHeartbeatResponse(throttle_time_ms=0, error_code=0,
                                                 member_epoch=1, heartbeat_interval_ms=100_000)

    wake = [trio.Event()]  # as BigGroup does: set, then replaced for the next wake-up
    async with trio.open_nursery() as nursery:
        for index in range(20):
            nursery.start_soon(functools.partial(
                heartbeat_member, Client(), "g", f"m{index}", pause_s=None,
                on_answer=lambda _epoch: None, wake=lambda: wake[0]))
        await trio.sleep(10)
        assert all(times == [0.0] for times in sent.values())  # joined, then pausing 100 s
        wake[0].set()
        wake[0] = trio.Event()
        await trio.sleep(100)
        nursery.cancel_scope.cancel()
    assert len(sent) == 20
    for times in sent.values():
        assert times[1] == 10.0  # at once
        assert len(times) == 3 and 10.0 < times[2] < 110.0  # within the interval...
    assert len({times[2] for times in sent.values()}) == 20  # ...each at its own point
