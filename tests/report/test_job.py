"""End to end: job.main on the sample inputs; every output exists and they agree."""

from __future__ import annotations

import csv
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.report.sample_data import EXPECTED, START

pytest.importorskip("pyspark", reason="pyspark is not installed")
pytest.importorskip("matplotlib", reason="matplotlib is not installed")

from coordinator.report import job  # noqa: E402

CHARTS = ("request_rate.png", "latency.png", "members_groups.png", "tasks_per_worker.png")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


@pytest.fixture(scope="module")
def report_dir(spark: Any, sample_inputs: tuple[Path, Path],
               tmp_path_factory: pytest.TempPathFactory) -> Path:
    metrics, snapshot = sample_inputs
    out = tmp_path_factory.mktemp("report-out")
    # The shared session is active, so main() reuses it (and leaves it running).
    status = job.main([
        "--metrics", str(metrics), "--snapshot", str(snapshot), "--out", str(out),
        "--master", "local[2]", "--p99-limit-ms", "10",
    ])
    assert status == 0
    assert not spark.sparkContext._jsc.sc().isStopped()
    return out


def test_files_exist(report_dir: Path) -> None:
    for chart in CHARTS:
        assert (report_dir / chart).read_bytes().startswith(PNG_MAGIC), chart
    document = json.loads((report_dir / "figures.json").read_text())
    page = (report_dir / "index.html").read_text()
    for chart in CHARTS:
        assert f'src="{chart}"' in page
    for name, table in document["tables"].items():
        assert (report_dir / table["csv"]).is_file(), name
        assert f'href="{name}.csv"' in page
    assert (report_dir / "summary.csv").is_file()
    # The summary table comes first on the page.
    assert page.index('id="summary"') < page.index("<img")


def test_summary_figures(report_dir: Path) -> None:
    summary = json.loads((report_dir / "figures.json").read_text())["summary"]
    # Time told one way: the start once as a clock time, everything else in seconds.
    assert not [name for name in summary if "unix" in name]
    assert "2023-11-14 22:13:20 UTC" in summary["recording length"]["note"]
    for name, expected in EXPECTED.items():
        assert summary[name]["status"] == "ok", name
        assert summary[name]["value"] == pytest.approx(expected, rel=1e-6), name
    # Tasks per worker over all six workers [0,1,1,1,2,2]: imbalance 2 / (7/6) = 12/7.
    assert summary["tasks per worker: imbalance (max/mean)"]["value"] == pytest.approx(12 / 7)
    # Capacity: 0.06 cores / 6 members = 0.01 -> the 0.8 core budget allows 80 members
    # (the p99 of 4.84 ms is within its 10 ms budget and not scaled): 74 more workers,
    # 74 / (6 members / 2 groups) = 24 more groups.
    assert summary["capacity: max members"]["value"] == 80
    assert summary["capacity: additional workers"]["value"] == 74
    assert summary["capacity: additional groups of average size"]["value"] == 24


def test_csv_and_json_agree(report_dir: Path) -> None:
    document = json.loads((report_dir / "figures.json").read_text())
    for row in read_csv(report_dir / "summary.csv"):
        entry = document["summary"][row["figure"]]
        if entry["value"] is None:
            assert row["value"] == ""
        else:
            assert float(row["value"]) == pytest.approx(entry["value"])
    for name, table in document["tables"].items():
        rows = read_csv(report_dir / table["csv"])
        assert len(rows) == len(table["rows"]), name
        assert list(rows[0].keys()) == table["columns"] if rows else True
    groups = {row["group_id"]: row for row in read_csv(report_dir / "groups.csv")}
    assert groups["alpha"]["tasks_per_worker_imbalance"] == "2.0"
    assert float(groups["beta"]["tasks_per_worker_median"]) == 1.5
    # 3 epoch bumps in the 270 s recorded (counted, not extrapolated to an hour).
    assert float(groups["alpha"]["epoch_bumps"]) == pytest.approx(3.0)
    assert document["capacity"]["limited_by"] == "cpu"


def test_rates_name_the_window_they_were_measured_over(report_dir: Path) -> None:
    summary = json.loads((report_dir / "figures.json").read_text())["summary"]
    for name in ("heartbeats per second", "rebalances per minute", "CPU used (mean)",
                 "log growth per minute", "records written per second"):
        assert "over the 270 s recorded" in summary[name]["note"], name
    assert not [name for name in summary if "hour" in name]


def test_time_columns_are_seconds_from_the_start_and_clock_times(report_dir: Path) -> None:
    rows = read_csv(report_dir / "request_rate_over_time.csv")
    assert "bin_start" not in rows[0]
    seconds = sorted({float(row["t_s"]) for row in rows})
    assert 0.0 <= seconds[0] < seconds[-1] <= 270.0
    for row in rows:  # the recording starts at START, 2023-11-14 22:13:20 UTC
        clock = datetime.fromtimestamp(START + float(row["t_s"]), UTC).strftime("%H:%M:%S")
        assert row["time_utc"] == clock
    page = (report_dir / "index.html").read_text()
    assert "1,700,000,000" not in page


def test_headline_of_a_steady_run_gives_a_capacity_that_covers_what_ran(
        report_dir: Path) -> None:
    document = json.loads((report_dir / "figures.json").read_text())
    headline = document["headline"]
    assert headline["kind"] == "capacity", headline
    # 6 members at 0.01 cores each under a 0.8 core budget: 80
    assert "6 workers ran for 270 s" in headline["text"]
    assert "about 80 workers fit (74 more than ran) within the 0.8 core CPU budget" \
        in headline["text"]
    assert "latency at that load is not measured here" in headline["text"]
    # two groups in the snapshot and no --group: the page says how to pick one
    assert any("--group" in reason for reason in headline["reasons"])
    assert 'id="headline"' in (report_dir / "index.html").read_text()


def test_group_option_reports_on_one_group(spark: Any, sample_inputs: tuple[Path, Path],
                                           tmp_path: Path) -> None:
    metrics, snapshot = sample_inputs
    out = tmp_path / "alpha"
    assert job.main(["--metrics", str(metrics), "--snapshot", str(snapshot), "--out", str(out),
                     "--group", "alpha", "--p99-limit-ms", "10"]) == 0
    document = json.loads((out / "figures.json").read_text())
    assert document["summary"]["workers"]["value"] == 4
    assert document["summary"]["tasks"]["value"] == 5
    assert {row["group_id"] for row in document["tables"]["groups"]["rows"]} == {"alpha"}
    assert {row["group_id"] for row in document["tables"]["workers"]["rows"]} == {"alpha"}
    assert not any("--group" in reason for reason in document["headline"]["reasons"])


def test_simulation_results_and_a_disturbed_headline(
        spark: Any, sample_inputs: tuple[Path, Path], tmp_path: Path) -> None:
    metrics, snapshot = sample_inputs
    simulation = tmp_path / "simulation.json"
    simulation.write_text(json.dumps({
        "config": {"group": "alpha"}, "final": {"state": "STABLE"},
        "violations": [], "converged": True, "initial_convergence_s": 1.5,
        "time_to_converge_s": [4.0, 7.5],
        "disruptions": [
            {"kind": "kill", "target": "w1", "started_s": 10.0, "action_s": 0.1,
             "converged": True, "time_to_converge_s": 4.0},
            {"kind": "bounce", "target": "w2", "started_s": 30.0, "action_s": 0.2,
             "converged": True, "time_to_converge_s": 7.5}]}))
    out = tmp_path / "out"
    assert job.main(["--metrics", str(metrics), "--snapshot", str(snapshot), "--out", str(out),
                     "--simulation", str(simulation), "--p99-limit-ms", "10"]) == 0
    document = json.loads((out / "figures.json").read_text())
    summary = document["summary"]
    assert summary["units run on two workers (simulation)"]["value"] == 0
    assert summary["disruptions (simulation)"]["value"] == 2
    assert summary["time to converge: max (simulation)"]["value"] == 7.5
    # The simulated group's state as the simulator last saw it, beside the snapshot's.
    groups = {row["group_id"]: row for row in document["tables"]["groups"]["rows"]}
    assert groups["alpha"]["state_at_end_of_run"] == "STABLE"
    assert groups["beta"]["state_at_end_of_run"] is None
    kinds = [row["kind"] for row in document["tables"]["simulation_disruptions"]["rows"]]
    assert kinds == ["kill", "bounce"]
    headline = document["headline"]
    assert headline["kind"] == "disturbed"
    assert "no capacity figure" in headline["text"]
    assert any("bounce 1, kill 1" in reason for reason in headline["reasons"])
    assert summary["capacity: max members"]["status"] == "missing"
    assert "see the headline" in summary["capacity: max members"]["missing_reason"]


def test_a_bad_simulation_file_is_one_clear_error(
        sample_inputs: tuple[Path, Path], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    metrics, _ = sample_inputs
    (tmp_path / "sim.json").write_text('{"not": "a simulation"}')
    assert job.main(["--metrics", str(metrics), "--out", str(tmp_path / "out"),
                     "--simulation", str(tmp_path / "sim.json")]) == 2
    assert "not a simulator report" in capsys.readouterr().err


def test_missing_metrics_and_no_snapshot(spark: Any, tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    # Only the members gauge: everything else is reported missing, nothing crashes.
    pq.write_table(pa.table({
        "timestamp": [1.0, 11.0],
        "metric": ["connect_coordinator_members", "connect_coordinator_members"],
        "labels": ["{}", "{}"],
        "value": [3.0, 3.0],
    }), tmp_path / "only-members.parquet")
    out = tmp_path / "out"
    assert job.main(["--metrics", str(tmp_path), "--out", str(out)]) == 0
    summary = json.loads((out / "figures.json").read_text())["summary"]
    assert summary["members (mean over recording)"]["value"] == 3.0
    cpu = summary["CPU used (mean)"]
    assert cpu["status"] == "missing"
    assert "process_cpu_seconds_total" in cpu["missing_reason"]
    assert summary["workers"]["missing_reason"] == "no snapshot given"
    assert summary["capacity: additional workers"]["status"] == "missing"
    for chart in CHARTS:
        assert (out / chart).is_file()
    assert "missing" in (out / "index.html").read_text()


def test_bad_input_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                    spark: Any) -> None:
    assert job.main(["--metrics", str(tmp_path / "nope"), "--out", str(tmp_path)]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_the_steady_part_leaves_out_rebalances_and_the_bin_after() -> None:
    def buckets(bin_start: float, slow: bool) -> list[dict[str, Any]]:
        fast_count = 0.0 if slow else 10.0
        return [{"bin_start": bin_start, "api": "ConnectGroupHeartbeat", "le": le,
                 "increase": count}
                for le, count in (("0.001", fast_count), ("0.1", 10.0), ("+Inf", 10.0))]

    measured = job.Measured(bin_seconds=3.0)
    for index in range(10):
        # bin 4 holds a rebalance; its slow heartbeats land in bins 4 and 5
        measured.buckets_over_time += buckets(3.0 * index, slow=index in (4, 5))
    measured.rebalances_over_time = [{"bin_start": 12.0, "metric": "x", "per_second": 0.3}]
    # an EMPTY group is at rest: it is not in the rebalancing states the job selects
    measured.unstable_over_time = [{"bin_start": 27.0, "metric": "x", "value": 1.0}]
    steady = job.steady_part(measured)
    assert steady.bins == 6  # all but bin 4 (the rebalance), 5 and 6 (after it) and 9
    assert steady.seconds == 18.0
    assert steady.heartbeat_p99_ms is not None and steady.heartbeat_p99_ms <= 1.0


def test_a_steady_simulation_has_nothing_to_converge_from(
        spark: Any, sample_inputs: tuple[Path, Path], tmp_path: Path) -> None:
    metrics, snapshot = sample_inputs
    simulation = tmp_path / "simulation.json"
    simulation.write_text(json.dumps({
        "config": {"group": "alpha"}, "final": {"state": "STABLE"}, "violations": [],
        "converged": True, "initial_convergence_s": 1.5, "disruptions": []}))
    out = tmp_path / "out"
    assert job.main(["--metrics", str(metrics), "--snapshot", str(snapshot), "--out", str(out),
                     "--simulation", str(simulation), "--p99-limit-ms", "10"]) == 0
    summary = json.loads((out / "figures.json").read_text())["summary"]
    assert summary["disruptions (simulation)"]["value"] == 0
    # no "max: missing" for a run that had nothing to converge from
    assert not [name for name in summary if name.startswith("time to converge")]
    assert [name for name, row in summary.items()
            if "simulation" in name and row["status"] == "missing"] == []
