"""The log benchmarks run end to end on tiny inputs (figures are not judged here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import log as log_bench


def test_bench_main_prints_figures_as_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "--writers",
        "1,5",
        "--records",
        "40",
        "--load-records",
        "500",
        "--json",
        "--data-dir",
        str(tmp_path),
    ]
    assert log_bench.main(argv) == 0
    figures = json.loads(capsys.readouterr().out)
    runs = figures["group_commit"]
    assert [run["writers"] for run in runs] == [1, 5]
    for run in runs:
        assert run["records"] == run["writes"] * 4 > 0
        assert 0 < run["fsyncs"] <= run["writes"]
    assert figures["load"]["records"] == 500
    assert figures["load"]["read_all_records_per_s"] > 0


def test_bench_rejects_bad_writer_counts(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        log_bench.main(["--writers", "0"])
