"""`bench compare`: the verdict of an alternating A/B, from the benchmarks' JSON files."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from bench.compare import CompareError, compare, compare_files, main, numeric_leaves


def write_runs(directory: Path, side: str, ratios: list[float]) -> list[Path]:
    paths = []
    for index, ratio in enumerate(ratios):
        path = directory / f"{side}-{index}.json"
        path.write_text(json.dumps({"in_flight": {"p99_ratio": ratio, "runs": 10 + index,
                                                  "stable": True, "missing": None},
                                    "coordinator": "subprocess"}))
        paths.append(path)
    return paths


def test_pair_by_pair_is_the_median_of_the_pairs_ratios_not_of_the_medians() -> None:
    a = [1.0, 2.0, 4.0, 8.0, 16.0]
    b = [1.1, 2.2, 4.4, 8.8, 1.0]  # 10% higher in four pairs, one pair far lower
    result = compare(a, b, "x")
    assert result.pair_ratio == pytest.approx(1.1)
    assert result.medians_ratio == pytest.approx(statistics.median(b) / 4.0)
    assert result.b_lower == 1
    assert (result.a_min, result.a_max, result.b_min, result.b_max) == (1.0, 16.0, 1.0, 8.8)


def test_a_shift_in_every_pair_is_a_verdict_and_a_mixed_one_is_noise() -> None:
    a = [1.0, 1.3, 0.8, 2.0, 1.1, 0.9, 1.6, 1.2]
    higher = compare(a, [v * 1.25 for v in a], "x")
    assert higher.verdict == "B higher"
    assert higher.interval == pytest.approx((1.25, 1.25))
    lower = compare(a, [v * 0.8 for v in a], "x")
    assert lower.verdict == "B lower"
    mixed = compare(a, [v * f for v, f in zip(a, [0.7, 1.4, 0.9, 1.2, 0.8, 1.3, 1.05, 0.95],
                                              strict=True)], "x")
    assert mixed.verdict == "within noise"
    low, high = mixed.interval or (0.0, 0.0)
    assert low < 1.0 < high
    assert low <= mixed.pair_ratio <= high  # type: ignore[operator]


def test_the_interval_narrows_as_pairs_accumulate_and_is_the_same_for_the_same_seed() -> None:
    factors = [0.8, 1.3, 0.95, 1.15, 1.05, 0.9, 1.2, 1.0]
    few = compare([1.0] * 8, factors, "x")
    many = compare([1.0] * 64, factors * 8, "x")
    assert few.interval is not None and many.interval is not None
    assert many.interval[1] - many.interval[0] < few.interval[1] - few.interval[0]
    assert compare([1.0] * 8, factors, "x").interval == few.interval
    other_seed = compare([1.0] * 8, factors, "x", seed=7).interval
    assert other_seed is not None and other_seed[0] <= few.pair_ratio <= other_seed[1]  # type: ignore[operator]


def test_a_zero_in_a_leaves_that_pair_out_of_the_ratios() -> None:
    result = compare([0.0, 1.0, 2.0], [5.0, 1.5, 3.0], "x")
    assert result.pair_ratio == pytest.approx(1.5)
    assert result.pairs == 3


def test_files_give_every_number_they_share_by_default(tmp_path: Path) -> None:
    a = write_runs(tmp_path, "a", [1.0, 1.2, 1.4])
    b = write_runs(tmp_path, "b", [1.1, 1.3, 1.5])
    figures = {result.figure: result for result in compare_files(a, b)}
    assert set(figures) == {"in_flight.p99_ratio", "in_flight.runs"}  # no bool, None, str
    assert figures["in_flight.p99_ratio"].a_median == pytest.approx(1.2)
    assert figures["in_flight.runs"].pair_ratio == pytest.approx(1.0)


@pytest.mark.parametrize(("a_count", "b_count", "figure", "message"), [
    (3, 2, None, "3 A files but 2 B files"),
    (3, 3, "in_flight.p50_ms", "no number at 'in_flight.p50_ms'"),
    (3, 3, "in_flight.stable", "no number at 'in_flight.stable'"),
    (1, 1, None, "at least 2 pairs are needed"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          a_count: int, b_count: int, figure: str | None,
                                          message: str) -> None:
    a = write_runs(tmp_path, "a", [1.0, 1.1, 1.2][:a_count])
    b = write_runs(tmp_path, "b", [1.0, 1.1, 1.2][:b_count])
    argv = ["--a", *map(str, a), "--b", *map(str, b)]
    if figure:
        argv += ["--figure", figure]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_a_file_that_is_not_json_is_named(tmp_path: Path) -> None:
    a = write_runs(tmp_path, "a", [1.0, 1.1])
    broken = tmp_path / "broken.json"
    broken.write_text("target met\n{")
    with pytest.raises(CompareError, match="broken.json: not a JSON document"):
        compare_files(a, [a[0], broken])
    with pytest.raises(CompareError, match="absent.json: cannot read it"):
        compare_files(a, [a[0], tmp_path / "absent.json"])


def test_the_command_prints_a_table_or_json(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    a = write_runs(tmp_path, "a", [1.0, 1.2, 1.4, 1.1])
    b = write_runs(tmp_path, "b", [1.5, 1.8, 2.1, 1.65])
    assert main(["--a", *map(str, a), "--b", *map(str, b),
                 "--figure", "in_flight.p99_ratio"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert len(table) == 2 and table[1].startswith("in_flight.p99_ratio")
    assert table[1].endswith("B higher") and "4/4" not in table[1] and "0/4" in table[1]
    assert main(["--a", *map(str, a), "--b", *map(str, b), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [row["figure"] for row in rows] == ["in_flight.p99_ratio", "in_flight.runs"]
    assert rows[0]["pair_ratio"] == pytest.approx(1.5) and rows[0]["verdict"] == "B higher"


def test_numeric_leaves_skip_booleans_and_non_finite_numbers() -> None:
    leaves = dict(numeric_leaves({"a": 1, "b": {"c": 2.5, "d": True, "e": float("nan")},
                                  "f": [1, 2]}))
    assert leaves == {"a": 1.0, "b.c": 2.5}
