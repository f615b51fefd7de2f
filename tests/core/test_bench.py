"""`bench core` on groups small enough for the test suite."""

from __future__ import annotations

import json

import pytest

from bench import core as core_bench


def test_stable_heartbeats_write_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    assert core_bench.main(["--members", "3,20", "--heartbeats", "200", "--rounds", "2",
                       "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [row["members"] for row in rows] == [3, 20]
    assert all(row["median_us"] > 0 and row["heartbeats_per_s"] > 0 for row in rows)


def test_epoch_bump_moves_every_member_to_the_new_epoch() -> None:
    row = core_bench.measure_epoch_bump(members=6, tasks_per_member=5, rounds=3)
    assert (row["members"], row["tasks_per_member"]) == (6, 5)
    assert row["core_us"] > 0 and row["records_us"] > 0 and row["answer_us"] > 0
    assert row["total_us"] == pytest.approx(row["core_us"] + row["records_us"]
                                            + row["answer_us"], abs=0.2)


def test_epoch_bump_prints_a_line_per_group_size(capsys: pytest.CaptureFixture[str]) -> None:
    assert core_bench.main(["--epoch-bump", "--members", "2,4", "--tasks-per-member", "3",
                       "--rounds", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    assert lines[0].split()[:4] == ["2", "members", "x", "3"]
    assert "per heartbeat to a new epoch" in lines[1]


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(SystemExit):
        core_bench.main(["--epoch-bump", "--rounds", "0"])


def test_a_pool_run_sends_less_to_a_pool_process_that_did_the_last_run() -> None:
    row = core_bench.measure_pool_run(members=8, tasks_per_member=40, rounds=2)
    assert (row["members"], row["tasks_per_member"]) == (8, 40)
    # A resize changes one member's target: that worker is told little of the group.
    assert row["sent_kb"] < row["sent_cold_kb"] / 4
    assert all(row[key] > 0 for key in ("put_ms", "pack_ms", "pack_whole_ms",
                                        "pool_warm_ms", "pool_cold_ms", "landing_ms"))


def test_a_pool_runs_told_pack_goes_by_versions_as_in_serve(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # `serve` tells every pack what changed, the whole ones too, so a told pack finds the
    # keys to look at from the versions instead of going over the group. The bench's told
    # pack must take that path, or its "pack" column times a path `serve` does not take.
    from coordinator.assignors import transport

    by_version: list[bool] = []
    compare = transport._differences

    def watched(now, last, last_version, change, by_value=False):  # type: ignore[no-untyped-def]
        by_version.append(change is not None and last_version is not None
                          and change.base == last_version)
        return compare(now, last, last_version, change, by_value)

    monkeypatch.setattr(transport, "_differences", watched)
    core_bench.measure_pool_run(members=8, tasks_per_member=40, rounds=2)
    # Three mappings (members, previous target, connectors) per told pack: the second and
    # third of the three (the first has nothing to be told against).
    assert len(by_version) == 3 * 2
    assert all(by_version)


def test_pool_run_prints_a_line_per_group_size(capsys: pytest.CaptureFixture[str]) -> None:
    assert core_bench.main(["--pool-run", "--members", "3", "--tasks-per-member", "20",
                       "--rounds", "1"]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert line.split()[:4] == ["3", "members", "x", "20"]
    assert "put" in line and "cold" in line


def test_two_measurements_at_once_are_refused() -> None:
    with pytest.raises(SystemExit):
        core_bench.main(["--epoch-bump", "--pool-run"])
