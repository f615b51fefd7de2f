"""`connect-coordinator bench replay`: the start-up load benchmark's own behaviour."""

from __future__ import annotations

import json

import pytest

from bench.replay import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    assert main([*argv, "--json"]) == 0
    row: dict[str, object] = json.loads(capsys.readouterr().out)
    return row


def test_reports_the_median_of_its_rounds(capsys: pytest.CaptureFixture[str]) -> None:
    row = run(capsys, "--records", "3000", "--rounds", "3")
    assert isinstance(row["records"], int) and row["records"] >= 3000
    each = row["wall_s_each"]
    assert isinstance(each, list) and len(each) == 3
    assert row["wall_s"] == sorted(each)[1]
    # wall_s is rounded to the millisecond: a few per cent on a load this small.
    assert row["records_per_s"] == pytest.approx(row["records"] / row["wall_s"], rel=0.15)


def test_a_compacted_log_holds_only_the_newest_records(
    capsys: pytest.CaptureFixture[str],
) -> None:
    full = run(capsys, "--records", "3000", "--rounds", "1")
    compacted = run(capsys, "--records", "3000", "--rounds", "1", "--compacted")
    assert compacted["compacted"] is True
    # Each member's heartbeats rewrite its records: about a third of them survive.
    assert isinstance(compacted["records"], int) and isinstance(full["records"], int)
    assert full["records"] * 0.2 < compacted["records"] < full["records"] * 0.5


def test_rejects_nonsense(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--rounds", "0"])
    assert exited.value.code == 2
    assert "--rounds must be at least 1" in capsys.readouterr().err
