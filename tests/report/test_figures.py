"""The driver-side math: histogram quantiles, spreads and the capacity projection."""

from __future__ import annotations

import math

import pytest

from coordinator.report.figures import histogram_quantile, present, project_capacity, spread

INF = math.inf


def test_quantile_interpolates_inside_the_bucket() -> None:
    # 100 observations: 30 <= 1 ms, 60 more <= 10 ms, 10 above.
    buckets = [(0.001, 30.0), (0.01, 90.0), (INF, 100.0)]
    # p50: rank 50 lies in (30, 90] of (1 ms, 10 ms]: 1 + 9 * (50 - 30) / 60 = 4 ms.
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.004)
    # p10: rank 10 in the first bucket, which starts at 0: 1 ms * 10 / 30.
    assert histogram_quantile(0.1, buckets) == pytest.approx(0.001 / 3)
    # p99: rank 99 falls in +Inf, so the answer is the highest finite bound.
    assert histogram_quantile(0.99, buckets) == pytest.approx(0.01)


def test_quantile_order_and_empty_buckets() -> None:
    # Unsorted input; the (1 ms, 2 ms] bucket is empty, rank 15 of 20 is in (2 ms, 4 ms]:
    # 2 + 2 * (15 - 10) / 10 = 3 ms.
    buckets = [(INF, 20.0), (0.004, 20.0), (0.002, 10.0), (0.001, 10.0)]
    assert histogram_quantile(0.75, buckets) == pytest.approx(0.003)


def test_quantile_without_observations_or_inf_bucket() -> None:
    assert histogram_quantile(0.5, [(0.1, 0.0), (INF, 0.0)]) is None
    assert histogram_quantile(0.5, [(0.1, 5.0)]) is None
    assert histogram_quantile(0.5, []) is None
    with pytest.raises(ValueError):
        histogram_quantile(1.5, [(INF, 1.0)])


def test_quantile_tolerates_non_monotonic_counts() -> None:
    # 0.002 dips below 0.001 (scrape jitter); the running max makes it 10, so the p50
    # rank 10 of 20 is the top of the first bucket.
    buckets = [(0.001, 10.0), (0.002, 9.0), (INF, 20.0)]
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.001)


def test_spread() -> None:
    # [0, 1, 1, 2]: median (1 + 1) / 2 = 1, mean 1, imbalance 2 / 1 = 2.
    result = spread([2, 1, 1, 0])
    assert (result.minimum, result.median, result.maximum, result.imbalance) == (0, 1, 2, 2)
    # [1, 2]: median 1.5, mean 1.5, imbalance 2 / 1.5.
    assert spread([1, 2]).imbalance == pytest.approx(4 / 3)
    assert spread([0, 0]).imbalance is None
    assert spread([]).median is None


def test_projection_is_the_cpu_budget_over_the_cost_of_a_worker() -> None:
    projection = project_capacity(
        members_now=20, cpu_cores_now=0.1, heartbeats_per_second=10.0, p99_now_ms=2.0,
        average_group_size=4.0, cpu_limit_cores=0.8, p99_limit_ms=5.0,
    )
    # 10 heartbeats/s over 20 members; 0.1 cores / 10 heartbeats/s = 10 ms CPU per heartbeat.
    assert projection.heartbeats_per_member_per_second == pytest.approx(0.5)
    assert projection.cpu_seconds_per_heartbeat == pytest.approx(0.01)
    # 0.8 cores / (0.5 heartbeats/s x 0.01 s) = 160 members; latency is not scaled.
    assert projection.max_members_by_cpu == pytest.approx(160)
    assert projection.max_members_by_latency is None
    assert projection.limited_by == "cpu"
    assert projection.additional_workers == 140
    assert projection.additional_groups == 35


def test_projection_never_goes_beyond_the_benchmarked_throughput() -> None:
    # A coordinator measured at 57 us per heartbeat (BENCHMARKS.md's low end), workers at
    # Connect's 1 heartbeat per 3 s: the CPU allows 0.8 / (57e-6 / 3) = 42,105 workers,
    # 14,035 heartbeats/s, more than one coordinator was measured to answer; the figure is
    # what that measured 7,506/s carries: 22,518 workers.
    workers = 1_000
    projection = project_capacity(
        members_now=workers, cpu_cores_now=workers / 3 * 57e-6,
        heartbeats_per_second=workers / 3, p99_now_ms=1.0, average_group_size=None)
    assert projection.max_members_by_cpu == pytest.approx(0.8 / (57e-6 / 3))
    assert projection.limited_by == "measured throughput"
    assert projection.max_members == pytest.approx(7_506 * 3)
    assert projection.max_members * projection.heartbeats_per_member_per_second \
        == pytest.approx(7_506)


def test_projection_limited_by_cpu_and_over_the_limit() -> None:
    # 0.5 cores for 10 members: 0.05 each -> 0.8 / 0.05 = 16 members.
    projection = project_capacity(
        members_now=10, cpu_cores_now=0.5, heartbeats_per_second=5.0, p99_now_ms=0.5,
        average_group_size=3.0,
    )
    assert projection.limited_by == "cpu"
    assert projection.max_members == pytest.approx(16)
    assert projection.additional_workers == 6  # 16 - 10
    assert projection.additional_groups == 2  # 6 / 3
    # Already above the CPU budget: no headroom, said in a note.
    over = project_capacity(members_now=10, cpu_cores_now=1.0, heartbeats_per_second=5.0,
                            p99_now_ms=None, average_group_size=None)
    assert over.additional_workers == 0
    assert over.additional_groups is None
    assert any("over the cpu limit" in note for note in over.notes)
    assert any("p99 latency not measured" in note for note in over.notes)


def test_projection_without_data_is_missing() -> None:
    projection = project_capacity(members_now=None, cpu_cores_now=None,
                                  heartbeats_per_second=None, p99_now_ms=None,
                                  average_group_size=None)
    assert projection.max_members is None
    assert projection.additional_workers is None
    assert projection.limited_by == "unknown"


def test_present_marks_missing_values() -> None:
    assert present("x", None, missing_reason="gone").as_row()["status"] == "missing"
    assert present("x", math.nan).missing
    assert present("x", 3).as_row() == {
        "figure": "x", "value": 3.0, "unit": "", "status": "ok", "missing_reason": "",
        "note": "",
    }
