"""The assignor benchmark on scenarios small enough for the test suite."""

from __future__ import annotations

import json

import pytest

from bench import assignors as assignor_bench

KEYS = {"assignor", "workers", "tasks", "median_ms", "p99_ms", "moved", "min_moved"}


@pytest.mark.parametrize("name", ["balanced", "round-robin"])
def test_run_reports_the_figures(name: str) -> None:
    figures = assignor_bench.run(name, workers=4, connectors=3, tasks=22, repeats=3)
    assert KEYS <= set(figures)
    assert (figures["assignor"], figures["workers"], figures["tasks"]) == (name, 4, 22)
    assert figures["min_moved"] == 3 // 5 + 22 // 5
    assert figures["moved"] >= figures["min_moved"]
    assert 0 <= figures["median_ms"] <= figures["p99_ms"]


def test_balanced_moves_no_more_than_needed() -> None:
    figures = assignor_bench.run("balanced", workers=7, connectors=9, tasks=100, repeats=2)
    assert figures["moved"] == figures["min_moved"] == 9 // 8 + 100 // 8
    assert figures["stable_moved"] == 0


def test_main_prints_json(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--assignor", "balanced", "--workers", "3", "--connectors", "2", "--tasks", "9",
            "--repeats", "2", "--json"]
    assert assignor_bench.main(argv) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["workers"] == 3 and figures["moved"] >= figures["min_moved"]


def test_main_prints_a_readable_line(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--assignor", "round-robin", "--workers", "2", "--connectors", "1", "--tasks", "4",
            "--repeats", "1"]
    assert assignor_bench.main(argv) == 0
    line = capsys.readouterr().out
    assert line.startswith("round-robin: 2 workers") and "median" in line


def test_main_refuses_an_unknown_assignor(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        assignor_bench.main(["--assignor", "nope", "--workers", "1", "--connectors", "1",
                             "--tasks", "1"])
    assert exit_info.value.code == 2
    assert "unknown server assignor 'nope'" in capsys.readouterr().err


def test_help_describes_the_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        assignor_bench.main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for option in ("--assignor", "--workers", "--connectors", "--tasks", "--repeats", "--json"):
        assert option in text
