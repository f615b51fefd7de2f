"""`bench core` on groups small enough for the test suite."""

from __future__ import annotations

import json

import pytest

from coordinator.core import bench


def test_stable_heartbeats_write_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--members", "3,20", "--heartbeats", "200", "--rounds", "2",
                       "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [row["members"] for row in rows] == [3, 20]
    assert all(row["median_us"] > 0 and row["heartbeats_per_s"] > 0 for row in rows)


def test_epoch_bump_moves_every_member_to_the_new_epoch() -> None:
    row = bench.measure_epoch_bump(members=6, tasks_per_member=5, rounds=3)
    assert (row["members"], row["tasks_per_member"]) == (6, 5)
    assert row["core_us"] > 0 and row["records_us"] > 0 and row["answer_us"] > 0
    assert row["total_us"] == pytest.approx(row["core_us"] + row["records_us"]
                                            + row["answer_us"], abs=0.2)


def test_epoch_bump_prints_a_line_per_group_size(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--epoch-bump", "--members", "2,4", "--tasks-per-member", "3",
                       "--rounds", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    assert lines[0].split()[:4] == ["2", "members", "x", "3"]
    assert "per heartbeat to a new epoch" in lines[1]


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(SystemExit):
        bench.main(["--epoch-bump", "--rounds", "0"])
