"""Spark aggregations on small fixed inputs, expected figures worked out by hand."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark", reason="pyspark is not installed")

from pyspark.sql import Row  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402
from pyspark.sql.types import (  # noqa: E402
    DoubleType,
    MapType,
    StringType,
    StructField,
    StructType,
)
from pyspark.testing import assertDataFrameEqual  # noqa: E402

from coordinator.report import aggregate as agg  # noqa: E402
from coordinator.report.figures import histogram_quantile, parse_le  # noqa: E402
from coordinator.report.job import coordinator_totals  # noqa: E402

RAW_SCHEMA = StructType([
    StructField("timestamp", DoubleType()),
    StructField("metric", StringType()),
    StructField("labels", MapType(StringType(), StringType())),
    StructField("value", DoubleType()),
])
REQUESTS = "connect_coordinator_requests_total"


def samples(spark: Any, rows: list[tuple[float, str, dict[str, str], float]]) -> Any:
    return agg.normalize_metrics(spark.createDataFrame(rows, RAW_SCHEMA))


def test_tasks_per_worker_per_group(spark: Any, sample_inputs: tuple[Path, Path]) -> None:
    snapshot = agg.load_snapshot(spark, sample_inputs[1])
    result = agg.group_stats(snapshot).select(
        "group_id", "workers", "connectors", "tasks", "tasks_per_worker_min",
        "tasks_per_worker_median", "tasks_per_worker_max", "tasks_per_worker_imbalance",
        "unassigned_units",
    )
    expected = [
        # alpha: a1 orders/0,1 = 2, a2 orders/2 = 1, a3 users/0 = 1, a4 nothing = 0; the
        # connector instances (task -1) are not tasks. [0,1,1,2]: median 1, mean 1,
        # imbalance 2 / 1 = 2. Connectors orders, users; tasks 3 + 2 = 5; users/1 has no
        # member -> 1 unassigned.
        Row(group_id="alpha", workers=4, connectors=2, tasks=5, tasks_per_worker_min=0.0,
            tasks_per_worker_median=1.0, tasks_per_worker_max=2.0,
            tasks_per_worker_imbalance=2.0, unassigned_units=0 + 1),
        # beta: b1 clicks/0 = 1, b2 clicks/1,2 = 2. median 1.5, mean 1.5, imbalance 2 / 1.5.
        Row(group_id="beta", workers=2, connectors=1, tasks=3, tasks_per_worker_min=1.0,
            tasks_per_worker_median=1.5, tasks_per_worker_max=2.0,
            tasks_per_worker_imbalance=2 / 1.5, unassigned_units=0),
    ]
    assertDataFrameEqual(result, expected)

    # All six workers pooled: [0,1,1,2,1,2] -> sorted [0,1,1,1,2,2]: median 1, mean 7/6,
    # imbalance 2 / (7/6) = 12/7.
    workers = agg.worker_tasks(snapshot).select("group_id", "member_id", "tasks")
    assertDataFrameEqual(workers, [
        Row(group_id="alpha", member_id="a1", tasks=2),
        Row(group_id="alpha", member_id="a2", tasks=1),
        Row(group_id="alpha", member_id="a3", tasks=1),
        Row(group_id="alpha", member_id="a4", tasks=0),
        Row(group_id="beta", member_id="b1", tasks=1),
        Row(group_id="beta", member_id="b2", tasks=2),
    ])
    totals = coordinator_totals([row.asDict() for row in result.collect()],
                                [row.asDict() for row in workers.collect()])
    assert totals["tasks_per_worker_median"] == 1.0
    assert totals["tasks_per_worker_imbalance"] == pytest.approx(12 / 7)
    assert (totals["workers"], totals["connectors"], totals["tasks"]) == (6, 3, 8)


def test_snapshot_from_parquet_with_missing_columns(spark: Any, tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    # Only the columns a unit and a member need; everything else must come back null.
    pq.write_table(pa.table({
        "kind": ["member", "unit", "unit"],
        "group_id": ["g", "g", "g"],
        "member_id": ["m", "m", None],
        "connector": [None, "c", "c"],
        "task": [None, 0, 1],
    }), tmp_path / "snapshot.parquet")
    snapshot = agg.load_snapshot(spark, tmp_path / "snapshot.parquet")
    assert snapshot.columns == [field.name for field in agg.SNAPSHOT_SCHEMA.fields]
    stats = agg.group_stats(snapshot).select("group_id", "group_state", "workers", "tasks",
                                             "unassigned_units")
    assertDataFrameEqual(stats, [Row(group_id="g", group_state=None, workers=1, tasks=2,
                                     unassigned_units=1)])


def test_counter_rate_survives_a_reset(spark: Any) -> None:
    heartbeat = {"api": "ConnectGroupHeartbeat", "error": "NONE"}
    describe = {"api": "ConnectGroupDescribe", "error": "NONE"}
    data = samples(spark, [
        # 0 -> 5 -> 12, restart, 3 -> 8: increases 5 + 7 + 3 (the reset) + 5 = 20.
        (0.0, REQUESTS, heartbeat, 0.0),
        (10.0, REQUESTS, heartbeat, 5.0),
        (20.0, REQUESTS, heartbeat, 12.0),
        (30.0, REQUESTS, heartbeat, 3.0),
        (40.0, REQUESTS, heartbeat, 8.0),
        # Created at t=20, after the recording began: it counts from 0, so 4 + 2 = 6.
        (20.0, REQUESTS, describe, 4.0),
        (40.0, REQUESTS, describe, 6.0),
    ])
    recording = agg.recording_extent(data)
    assert recording is not None
    assert (recording.start, recording.end, recording.scrapes) == (0.0, 40.0, 5)
    assert recording.metrics == {REQUESTS}
    start, end = recording.start, recording.end
    deltas = agg.counter_deltas(data, start)
    rates = agg.counter_rates(deltas, end - start, "api").drop("metric")
    assertDataFrameEqual(rates, [
        Row(api="ConnectGroupHeartbeat", increase=20.0, per_second=20 / 40),
        Row(api="ConnectGroupDescribe", increase=6.0, per_second=6 / 40),
    ])
    # 20 s bins. Heartbeat bin [0,20): the 10 s sample covers 10 s with +5 -> 0.5/s;
    # bin [20,40): +7 and +3 over 20 s -> 0.5/s; bin [40,60): +5 over 10 s -> 0.5/s.
    # Describe's first sample has no gap before it, so only its t=40 delta (+2 over 20 s)
    # gives a rate: 0.1/s in [40,60).
    over_time = agg.binned_rates(deltas, start, 20.0, "api").drop("metric")
    assertDataFrameEqual(over_time, [
        Row(bin_start=0.0, api="ConnectGroupHeartbeat", per_second=0.5),
        Row(bin_start=20.0, api="ConnectGroupHeartbeat", per_second=0.5),
        Row(bin_start=40.0, api="ConnectGroupHeartbeat", per_second=0.5),
        Row(bin_start=40.0, api="ConnectGroupDescribe", per_second=0.1),
    ])


def test_rebalances_per_hour(spark: Any) -> None:
    metric = "connect_coordinator_rebalances_total"
    data = samples(spark, [
        # join: 10 -> 13 -> 16 over the hour: 6.
        (0.0, metric, {"trigger": "join"}, 10.0),
        (1800.0, metric, {"trigger": "join"}, 13.0),
        (3600.0, metric, {"trigger": "join"}, 16.0),
        # leave appears half-way with 1, then 2: 2 in all.
        (1800.0, metric, {"trigger": "leave"}, 1.0),
        (3600.0, metric, {"trigger": "leave"}, 2.0),
    ])
    deltas = agg.counter_deltas(data, 0.0)
    per_hour = agg.counter_rates(deltas, 3600.0, "trigger").select(
        "trigger", (F.col("per_second") * 3600).alias("per_hour")
    )
    assertDataFrameEqual(per_hour, [Row(trigger="join", per_hour=6.0),
                                    Row(trigger="leave", per_hour=2.0)])


def test_histogram_quantiles_from_bucket_deltas(spark: Any) -> None:
    metric = "connect_coordinator_request_duration_seconds_bucket"
    api = "ConnectGroupHeartbeat"
    rows = []
    # Two scrapes; increases per bucket: le=0.001 +30, le=0.01 +90, +Inf +100 (cumulative).
    for le, first, last in (("0.001", 10.0, 40.0), ("0.01", 10.0, 100.0), ("+Inf", 10.0, 110.0)):
        rows.append((0.0, metric, {"api": api, "le": le}, first))
        rows.append((60.0, metric, {"api": api, "le": le}, last))
    deltas = agg.counter_deltas(samples(spark, rows), 0.0)
    increases = agg.bucket_increase(deltas, "api").drop("metric")
    assertDataFrameEqual(increases, [
        Row(api=api, le="0.001", increase=30.0),
        Row(api=api, le="0.01", increase=90.0),
        Row(api=api, le="+Inf", increase=100.0),
    ])
    buckets = [(parse_le(row["le"]), row["increase"]) for row in increases.collect()]
    # p50: rank 50 in (30, 90] of (1 ms, 10 ms]: 0.001 + 0.009 * 20 / 60 = 4 ms.
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.004)
    # p99: rank 99 is past 90, in the +Inf bucket: the highest finite bound, 10 ms.
    assert histogram_quantile(0.99, buckets) == pytest.approx(0.01)


def test_labels_as_json_text_and_as_map_agree(spark: Any) -> None:
    text_schema = StructType([
        StructField("timestamp", DoubleType()),
        StructField("metric", StringType()),
        StructField("labels", StringType()),
        StructField("value", DoubleType()),
    ])
    as_text = agg.normalize_metrics(spark.createDataFrame([
        (1.0, "m", json.dumps({"b": "2", "a": "1"}), 5.0),
        (2.0, "m", None, 6.0),
        (3.0, "m", "", float("nan")),  # NaN samples are dropped
    ], text_schema))
    as_map = samples(spark, [(1.0, "m", {"a": "1", "b": "2"}, 5.0), (2.0, "m", {}, 6.0)])
    assertDataFrameEqual(as_text.select("timestamp", "series", "value"),
                         as_map.select("timestamp", "series", "value"))
    # The series key is the sorted label list, whatever order the labels came in.
    assert as_text.where("timestamp = 1").first()["series"] == (
        '[{"key":"a","value":"1"},{"key":"b","value":"2"}]'
    )


def test_gauge_summary_slope(spark: Any) -> None:
    metric = "connect_coordinator_log_bytes"
    # 1000 bytes, +600 per 10 min, then a compaction drop at the end is not in this data:
    # exact line, slope 1 byte/s = 3600 bytes per hour.
    data = samples(spark, [(t, metric, {}, 1000.0 + t) for t in (0.0, 600.0, 1200.0)])
    summary = agg.gauge_summary(data).select("first", "last", "max", "slope_per_hour")
    assertDataFrameEqual(summary, [Row(first=1000.0, last=2200.0, max=2200.0,
                                       slope_per_hour=3600.0)])
