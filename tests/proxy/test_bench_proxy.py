"""`bench proxy` reads the perf tools' own summaries (figures are not judged here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.proxy import _consumer_mb_per_s, _producer_mb_per_s, cpu_seconds, main


def _producer_output(windows: list[float], total: float) -> str:
    """ProducerPerformance's stdout: a progress line per reporting window, then the total
    (the only line with percentiles)."""
    lines = [f"{20000 * (i + 1)} records sent, {rate * 1024:.1f} records/sec "
             f"({rate:.2f} MB/sec), 120.0 ms avg latency, 900.0 ms max latency."
             for i, rate in enumerate(windows)]
    lines.append(f"200000 records sent, {total * 1024:.6f} records/sec ({total:.2f} MB/sec), "
                 "95.00 ms avg latency, 900.00 ms max latency, 80 ms 50th, 300 ms 95th, "
                 "600 ms 99th, 850 ms 99.9th.")
    return "\n".join(lines) + "\n"


def test_the_producer_figure_is_the_whole_runs_not_the_first_windows() -> None:
    # The first window holds the start-up (metadata, topic creation): far below the total.
    assert _producer_mb_per_s(_producer_output([1.5, 18.25, 19.0], 14.75)) == 14.75


def test_a_producer_run_without_its_total_is_an_error() -> None:
    output = _producer_output([3.0], 3.0).splitlines()[0]
    with pytest.raises(RuntimeError, match="no summary"):
        _producer_mb_per_s(output)


def test_the_consumer_figure_is_fetch_mb_per_s() -> None:
    output = ("start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, "
              "nMsg.sec, rebalance.time.ms, fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec\n"
              "2026-01-01 10:00:00:000, 2026-01-01 10:00:05:000, 195.3125, 39.0625, 200000, "
              "40000.0, 3000, 2000, 97.6563, 100000.0\n")
    assert _consumer_mb_per_s(output) == (97.6563, 200000)


def test_the_proxys_cpu_is_read_from_its_metrics() -> None:
    metrics = ("# HELP process_cpu_seconds_total Total user and system CPU time.\n"
               "# TYPE process_cpu_seconds_total counter\n"
               "process_cpu_seconds_total 12.5\n"
               "process_cpu_seconds_created 1.7e9\n")
    assert cpu_seconds(metrics) == 12.5
    assert cpu_seconds("connect_coordinator_groups 3\n") is None


def test_another_checkout_without_the_coordinator_is_refused_before_anything_starts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--other-checkout", str(tmp_path)]) == 2
    assert f"{tmp_path} has no coordinator package" in capsys.readouterr().err
