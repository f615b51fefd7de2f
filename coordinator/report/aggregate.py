"""Spark side of the capacity report: load metrics and snapshot, turn samples into figures.

Every function takes and returns DataFrames so the tests can compare them with
``assertDataFrameEqual``; results that reach the driver are small (per series, per group,
per time bin).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import (
    DoubleType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
)

PREFIX = "connect_coordinator_"
HEARTBEAT_API = "ConnectGroupHeartbeat"
# Two samples closer than this are one scrape (recorder and Prometheus share a timestamp).
SAME_SCRAPE_SECONDS = 1e-3

LABELS_TYPE = MapType(StringType(), StringType())

SNAPSHOT_SCHEMA = StructType(
    [
        StructField("kind", StringType()),
        StructField("group_id", StringType()),
        StructField("group_state", StringType()),
        StructField("group_epoch", LongType()),
        StructField("assignment_epoch", LongType()),
        StructField("member_id", StringType()),
        StructField("instance_id", StringType()),
        StructField("worker_url", StringType()),
        StructField("member_epoch", LongType()),
        StructField("member_state", StringType()),
        StructField("connector", StringType()),
        StructField("task", LongType()),
        StructField("snapshot_ms", LongType()),
    ]
)


class InputError(ValueError):
    """An input file or directory that cannot be used, with a message saying why."""


# ---------------------------------------------------------------------------------------
# Loading


def metric_files(path: Path) -> list[Path]:
    """The Parquet files under a metrics directory (or the file itself), hidden ones skipped."""
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise InputError(f"metrics path {path} does not exist")
    files = sorted(
        candidate
        for candidate in path.rglob("*.parquet")
        if candidate.is_file()
        and not any(part.startswith((".", "_")) for part in candidate.relative_to(path).parts)
    )
    if not files:
        raise InputError(f"no Parquet files under {path}")
    return files


def _labels_are_text(file: Path) -> bool:
    import pyarrow.parquet as pq

    try:
        schema = pq.read_schema(file)
    except Exception as error:  # pyarrow raises several types for a bad file
        raise InputError(f"{file} is not a readable Parquet file: {error}") from None
    missing = {"timestamp", "metric", "labels", "value"} - set(schema.names)
    if missing:
        raise InputError(f"{file} lacks column(s) {', '.join(sorted(missing))}")
    import pyarrow as pa

    return bool(pa.types.is_string(schema.field("labels").type)
                or pa.types.is_large_string(schema.field("labels").type))


def normalize_metrics(frame: DataFrame) -> DataFrame:
    """Fixed column types, labels as a map, a canonical ``series`` key, no NaN, no dupes."""
    labels_type = frame.schema["labels"].dataType
    labels = F.col("labels")
    if isinstance(labels_type, StringType):
        text = F.when(F.trim(labels) == "", F.lit(None)).otherwise(labels)
        labels = F.from_json(F.coalesce(text, F.lit("{}")), LABELS_TYPE)
    labels = F.coalesce(labels, F.create_map().cast(LABELS_TYPE))
    normalized = frame.select(
        F.col("timestamp").cast(DoubleType()).alias("timestamp"),
        F.col("metric").cast(StringType()).alias("metric"),
        labels.alias("labels"),
        F.col("value").cast(DoubleType()).alias("value"),
    ).where(
        F.col("timestamp").isNotNull()
        & F.col("metric").isNotNull()
        & F.col("value").isNotNull()
        & ~F.isnan("value")
    )
    # Maps cannot be grouped on; a sorted JSON rendering of the labels names the series.
    normalized = normalized.withColumn(
        "series", F.to_json(F.array_sort(F.map_entries("labels")))
    )
    return normalized.dropDuplicates(["metric", "series", "timestamp"])


def load_metrics(spark: SparkSession, path: Path) -> DataFrame:
    """All metric samples under ``path``; files whose labels are JSON text or maps both work."""
    files = metric_files(path)
    by_kind: dict[bool, list[str]] = {}
    for file in files:
        by_kind.setdefault(_labels_are_text(file), []).append(str(file))
    frames = [normalize_metrics(spark.read.parquet(*paths)) for paths in by_kind.values()]
    combined = frames[0]
    for frame in frames[1:]:
        combined = combined.unionByName(frame)
    return combined


def load_snapshot(spark: SparkSession, path: Path) -> DataFrame:
    """Snapshot rows with every documented column (absent ones become null)."""
    if not path.is_file():
        raise InputError(f"snapshot {path} does not exist")
    suffix = path.suffix.lower()
    if suffix == ".jsonl" or suffix == ".json":
        frame = spark.read.schema(SNAPSHOT_SCHEMA).json(str(path))
    elif suffix == ".parquet":
        frame = spark.read.parquet(str(path))
    else:
        raise InputError(f"snapshot {path} must be .parquet or .jsonl")
    columns = []
    for column in SNAPSHOT_SCHEMA.fields:
        if column.name in frame.columns:
            columns.append(F.col(column.name).cast(column.dataType).alias(column.name))
        else:
            columns.append(F.lit(None).cast(column.dataType).alias(column.name))
    return frame.select(*columns)


# ---------------------------------------------------------------------------------------
# Counters


@dataclass(frozen=True)
class Recording:
    """The extent of a recording: first and last timestamp, scrapes, metric names."""

    start: float
    end: float
    scrapes: int
    metrics: frozenset[str]


def recording_extent(metrics: DataFrame) -> Recording | None:
    """One pass over the samples for their time range and metric names; None when empty."""
    row = metrics.agg(
        F.min("timestamp").alias("start"),
        F.max("timestamp").alias("end"),
        F.countDistinct("timestamp").alias("scrapes"),
        F.collect_set("metric").alias("metrics"),
    ).first()
    if row is None or row["start"] is None:
        return None
    return Recording(float(row["start"]), float(row["end"]), int(row["scrapes"]),
                     frozenset(row["metrics"]))


def counter_deltas(samples: DataFrame, window_start: float) -> DataFrame:
    """Per sample: the counter increase since the series' previous sample, and the gap.

    A value below the previous one is a counter reset (the process restarted), so the
    increase is the new value itself. A series whose first sample comes after the start of
    the recording was created during it and so started from zero.
    """
    in_series = Window.partitionBy("metric", "series").orderBy("timestamp")
    previous_value = F.lag("value").over(in_series)
    previous_time = F.lag("timestamp").over(in_series)
    born_inside = F.col("timestamp") > F.lit(window_start + SAME_SCRAPE_SECONDS)
    delta = (
        F.when(previous_value.isNull(), F.when(born_inside, F.col("value")).otherwise(0.0))
        .when(F.col("value") < previous_value, F.col("value"))
        .otherwise(F.col("value") - previous_value)
    )
    return samples.withColumn("delta", delta).withColumn(
        "elapsed", F.col("timestamp") - previous_time
    )


def counter_increase(deltas: DataFrame, *label_names: str) -> DataFrame:
    """Total increase per metric and the given labels (other labels are summed over)."""
    keys = [F.col("metric")] + [
        F.col("labels").getItem(name).alias(name) for name in label_names
    ]
    return deltas.groupBy(*keys).agg(F.sum("delta").alias("increase"))


def counter_rates(deltas: DataFrame, window_seconds: float, *label_names: str) -> DataFrame:
    """Increase and average rate per second over the recording, per metric and labels."""
    if window_seconds <= 0:
        raise ValueError("a rate needs a recording longer than one scrape")
    return counter_increase(deltas, *label_names).withColumn(
        "per_second", F.col("increase") / F.lit(window_seconds)
    )


def time_bin(window_start: float, bin_seconds: float) -> Column:
    """The start of the chart bin a sample's timestamp falls in."""
    index = F.floor((F.col("timestamp") - F.lit(window_start)) / F.lit(bin_seconds))
    return F.lit(window_start) + index * F.lit(bin_seconds)


def binned_rates(deltas: DataFrame, window_start: float, bin_seconds: float,
                 *label_names: str) -> DataFrame:
    """Rate per second in each time bin: each series' increase over its own covered time in
    the bin (so bins narrower than the scrape interval do not spike), summed over series."""
    label_columns = [F.col("labels").getItem(name).alias(name) for name in label_names]
    per_series = deltas.where(F.col("elapsed").isNotNull()).groupBy(
        time_bin(window_start, bin_seconds).alias("bin_start"),
        F.col("metric"),
        F.col("series"),
        *label_columns,
    ).agg(F.sum("delta").alias("increase"), F.sum("elapsed").alias("covered"))
    return (
        per_series.where(F.col("covered") > 0)
        .groupBy("bin_start", "metric", *label_names)
        .agg(F.sum(F.col("increase") / F.col("covered")).alias("per_second"))
    )


def bucket_increase(deltas: DataFrame, *label_names: str, window_start: float | None = None,
                    bin_seconds: float | None = None) -> DataFrame:
    """Histogram ``_bucket`` increases per le (and labels, and time bin when asked)."""
    keys = [F.col("metric")] + [F.col("labels").getItem(n).alias(n) for n in label_names]
    if window_start is not None and bin_seconds is not None:
        keys.insert(0, time_bin(window_start, bin_seconds).alias("bin_start"))
    keys.append(F.col("labels").getItem("le").alias("le"))
    is_bucket = F.col("metric").endswith("_bucket") & F.col("labels").getItem("le").isNotNull()
    return (
        deltas.where(is_bucket)
        .groupBy(*keys)
        .agg(F.sum("delta").alias("increase"))
    )


# ---------------------------------------------------------------------------------------
# Gauges


def gauge_over_time(samples: DataFrame, window_start: float, bin_seconds: float,
                    *label_names: str) -> DataFrame:
    """Per time bin: each series' mean value, summed over series (e.g. groups of all states)."""
    label_columns = [F.col("labels").getItem(name).alias(name) for name in label_names]
    per_series = samples.groupBy(
        time_bin(window_start, bin_seconds).alias("bin_start"),
        "metric",
        "series",
        *label_columns,
    ).agg(F.avg("value").alias("mean"))
    return per_series.groupBy("bin_start", "metric", *label_names).agg(
        F.sum("mean").alias("value")
    )


def gauge_summary(samples: DataFrame, *label_names: str) -> DataFrame:
    """Per metric and labels: mean, min, max, first, last and the least-squares slope per hour.

    The slope is what "growth per hour" means for a gauge such as log_bytes; compaction makes
    the first-to-last difference alone misleading.
    """
    label_columns = [F.col("labels").getItem(name).alias(name) for name in label_names]
    return samples.groupBy("metric", *label_columns).agg(
        F.avg("value").alias("mean"),
        F.min("value").alias("min"),
        F.max("value").alias("max"),
        F.min_by("value", "timestamp").alias("first"),
        F.max_by("value", "timestamp").alias("last"),
        F.min("timestamp").alias("first_timestamp"),
        F.max("timestamp").alias("last_timestamp"),
        (F.covar_pop("timestamp", "value") / F.var_pop("timestamp") * F.lit(3600.0)).alias(
            "slope_per_hour"
        ),
        F.avg(F.when(F.col("value") > 0, 1.0).otherwise(0.0)).alias("fraction_positive"),
    )


def total_gauge_mean(samples: DataFrame) -> DataFrame:
    """A gauge summed over its series at each scrape, then averaged over the scrapes."""
    per_scrape = samples.groupBy("metric", "timestamp").agg(F.sum("value").alias("total"))
    return per_scrape.groupBy("metric").agg(
        F.avg("total").alias("mean"), F.max("total").alias("max"),
        F.max_by("total", "timestamp").alias("last")
    )


# ---------------------------------------------------------------------------------------
# Snapshot


def worker_tasks(snapshot: DataFrame) -> DataFrame:
    """One row per member: its group, worker URL, state and the tasks/connectors it runs.

    Member and unit rows are grouped together in one pass, so members with nothing
    assigned still come out, with zero tasks.
    """
    is_member = F.col("kind") == "member"
    is_unit = F.col("kind") == "unit"
    per_member = (
        snapshot.where((is_member | is_unit) & F.col("member_id").isNotNull())
        .groupBy("group_id", "member_id")
        .agg(
            F.max(is_member.cast("int")).alias("is_member"),
            F.first(F.when(is_member, F.col("worker_url")), ignorenulls=True).alias("worker_url"),
            F.first(F.when(is_member, F.col("member_state")), ignorenulls=True).alias(
                "member_state"
            ),
            F.max(F.when(is_member, F.col("member_epoch"))).alias("member_epoch"),
            F.sum(F.when(is_unit & (F.col("task") >= 0), 1).otherwise(0)).alias("tasks"),
            F.sum(F.when(is_unit & (F.col("task") < 0), 1).otherwise(0)).alias("connectors"),
        )
    )
    # Units of a member that has no member row (left already) are not a worker's load.
    return per_member.where(F.col("is_member") == 1).select(
        "group_id",
        "member_id",
        "worker_url",
        "member_state",
        "member_epoch",
        F.col("tasks").cast(LongType()).alias("tasks"),
        F.col("connectors").cast(LongType()).alias("connectors"),
    )


def _spread_columns(column: str) -> list[Column]:
    return [
        F.min(column).cast(DoubleType()).alias("tasks_per_worker_min"),
        F.median(column).cast(DoubleType()).alias("tasks_per_worker_median"),
        F.max(column).cast(DoubleType()).alias("tasks_per_worker_max"),
        # max / mean; undefined (null) when no worker has a task.
        F.when(F.avg(column) > 0, F.max(column) / F.avg(column)).alias(
            "tasks_per_worker_imbalance"
        ),
    ]


def group_stats(snapshot: DataFrame) -> DataFrame:
    """Per group: state, epochs, workers, connectors, tasks, spread, unassigned units."""
    is_group = F.col("kind") == "group"
    is_unit = F.col("kind") == "unit"
    per_group = (
        snapshot.where(F.col("group_id").isNotNull())
        .groupBy("group_id")
        .agg(
            F.first(F.when(is_group, F.col("group_state")), ignorenulls=True).alias(
                "group_state"
            ),
            F.max(F.when(is_group, F.col("group_epoch"))).alias("group_epoch"),
            F.max(F.when(is_group, F.col("assignment_epoch"))).alias("assignment_epoch"),
            F.count_distinct(F.when(is_unit, F.col("connector"))).alias("connectors"),
            F.sum(F.when(is_unit & (F.col("task") >= 0), 1).otherwise(0)).alias("tasks"),
            F.sum(F.when(is_unit & F.col("member_id").isNull(), 1).otherwise(0)).alias(
                "unassigned_units"
            ),
        )
    )
    spreads = worker_tasks(snapshot).groupBy("group_id").agg(
        F.count("member_id").alias("workers"), *_spread_columns("tasks")
    )
    return per_group.join(spreads, "group_id", "left").select(
        "group_id",
        "group_state",
        "group_epoch",
        "assignment_epoch",
        F.coalesce("workers", F.lit(0)).cast(LongType()).alias("workers"),
        F.col("connectors").cast(LongType()).alias("connectors"),
        F.col("tasks").cast(LongType()).alias("tasks"),
        "tasks_per_worker_min",
        "tasks_per_worker_median",
        "tasks_per_worker_max",
        "tasks_per_worker_imbalance",
        F.col("unassigned_units").cast(LongType()).alias("unassigned_units"),
    )
