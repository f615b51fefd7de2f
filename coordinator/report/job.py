"""``connect-coordinator report``: a capacity report from recorded metrics and a snapshot.

Spark reads the samples and does every per-sample step (counter deltas with resets,
time bins, bucket sums, snapshot joins); the driver gets small tables back, computes
quantiles and the capacity projection (``figures``) and writes HTML, PNG, CSV and JSON
(``render``).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from coordinator.report.figures import (
    CPU_MODEL,
    LATENCY_MODEL,
    CapacityProjection,
    Figure,
    histogram_quantile,
    parse_le,
    present,
    project_capacity,
    spread,
)
from coordinator.report.headline import (
    DEFAULT_MIN_STEADY_SECONDS,
    Headline,
    RunFacts,
    make_headline,
)
from coordinator.report.render import (
    Chart,
    Report,
    Table,
    line_chart,
    missing_chart,
    tasks_per_worker_chart,
    write_csv,
    write_figures_json,
    write_html,
)

PREFIX = "connect_coordinator_"
REQUESTS = PREFIX + "requests_total"
REQUEST_BUCKETS = PREFIX + "request_duration_seconds_bucket"
REBALANCES = PREFIX + "rebalances_total"
TIME_TO_STABLE_BUCKETS = PREFIX + "time_to_stable_seconds_bucket"
GROUPS = PREFIX + "groups"
MEMBERS = PREFIX + "members"
UNASSIGNED = PREFIX + "unassigned_units"
LOG_BYTES = PREFIX + "log_bytes"
RECORDS_WRITTEN = PREFIX + "records_written_total"
CPU = "process_cpu_seconds_total"
RESIDENT_MEMORY = "process_resident_memory_bytes"
GROUP_EPOCH = PREFIX + "group_epoch"
GROUP_MEMBERS = PREFIX + "group_members"
GROUP_UNITS = PREFIX + "group_units"
GROUP_UNASSIGNED = PREFIX + "group_unassigned_units"
HEARTBEAT_API = "ConnectGroupHeartbeat"
# Group states while a rebalance is under way (EMPTY and STABLE groups are at rest).
REBALANCING_STATES = ("ASSIGNING", "RECONCILING")
# Error label values that mean success (ErrorCode.NONE, or a bare 0 from other exporters).
SUCCESS_ERRORS = {"NONE", "0", ""}

# Metrics whose per-sample increase matters; group_epoch only ever grows within a group's
# life, so its "resets" (group deleted and re-created) are handled like a counter's.
COUNTERS = {REQUESTS, REQUEST_BUCKETS, REBALANCES, TIME_TO_STABLE_BUCKETS, RECORDS_WRITTEN,
            CPU, GROUP_EPOCH}
GAUGES = {GROUPS, MEMBERS, UNASSIGNED, LOG_BYTES, RESIDENT_MEMORY, GROUP_MEMBERS,
          GROUP_UNITS, GROUP_UNASSIGNED}
CHART_BINS = 120
T = TypeVar("T")


@dataclass
class Options:
    metrics: Path
    snapshot: Path | None
    out: Path
    master: str = "local[*]"
    cpu_limit: float = 0.8
    p99_limit_ms: float = 5.0
    group: str | None = None
    simulation: Path | None = None
    min_steady_seconds: float = DEFAULT_MIN_STEADY_SECONDS


class Progress:
    """Numbered step lines on stderr with their durations, while Spark's own bar runs."""

    def __init__(self, steps: int, stream: Any = None) -> None:
        self.steps = steps
        self.done = 0
        self.stream = stream if stream is not None else sys.stderr
        self.started = time.monotonic()

    @contextmanager
    def step(self, text: str) -> Iterator[None]:
        self.done += 1
        print(f"[report {self.done}/{self.steps}] {text} ...", file=self.stream, flush=True)
        began = time.monotonic()
        yield
        print(
            f"[report {self.done}/{self.steps}] {text}: done in {time.monotonic() - began:.1f}s",
            file=self.stream,
            flush=True,
        )

    def run(self, text: str, action: Callable[[], T]) -> T:
        with self.step(text):
            return action()


@dataclass
class Measured:
    """What the Spark steps hand to the driver-side math (all small)."""

    window: tuple[float, float] | None = None
    scrapes: int = 0
    metric_names: set[str] = field(default_factory=set)
    request_rates: list[dict[str, Any]] = field(default_factory=list)
    request_buckets: list[dict[str, Any]] = field(default_factory=list)
    rebalances: list[dict[str, Any]] = field(default_factory=list)
    stable_buckets: list[dict[str, Any]] = field(default_factory=list)
    increases: dict[str, float] = field(default_factory=dict)
    gauges: dict[str, dict[str, Any]] = field(default_factory=dict)
    gauge_totals: dict[str, dict[str, Any]] = field(default_factory=dict)
    group_gauges: list[dict[str, Any]] = field(default_factory=list)
    group_epochs: list[dict[str, Any]] = field(default_factory=list)
    rate_over_time: list[dict[str, Any]] = field(default_factory=list)
    buckets_over_time: list[dict[str, Any]] = field(default_factory=list)
    gauges_over_time: list[dict[str, Any]] = field(default_factory=list)
    groups: list[dict[str, Any]] = field(default_factory=list)
    workers: list[dict[str, Any]] = field(default_factory=list)
    coordinator: dict[str, Any] | None = None
    snapshot_groups: list[str] = field(default_factory=list)
    bin_seconds: float = 0.0
    rebalances_over_time: list[dict[str, Any]] = field(default_factory=list)
    unstable_over_time: list[dict[str, Any]] = field(default_factory=list)

    @property
    def window_seconds(self) -> float:
        return self.window[1] - self.window[0] if self.window else 0.0


def parse_args(argv: Sequence[str] | None) -> Options:
    parser = argparse.ArgumentParser(
        prog="connect-coordinator report",
        description=(
            "Build a capacity report (index.html, PNG charts, one CSV per table, "
            "figures.json) from metrics recorded by `connect-coordinator metrics record` "
            "and a group snapshot."
        ),
    )
    parser.add_argument("--metrics", required=True, type=Path, metavar="DIR",
                        help="directory of Parquet files (timestamp, metric, labels, value)")
    parser.add_argument("--snapshot", type=Path, metavar="FILE",
                        help="group snapshot, .parquet or .jsonl (one row per group, member "
                             "and unit); without it the snapshot figures are missing")
    parser.add_argument("--out", required=True, type=Path, metavar="DIR",
                        help="output directory (created if needed)")
    parser.add_argument("--master", default="local[*]",
                        help="Spark master URL (default: %(default)s)")
    parser.add_argument("--cpu-limit", type=float, default=0.8, metavar="FRACTION",
                        help="CPU budget in cores, e.g. 0.8 = 80%% of one core "
                             "(default: %(default)s)")
    parser.add_argument("--p99-limit-ms", type=float, default=5.0, metavar="MS",
                        help="p99 heartbeat latency budget in ms (default: %(default)s)")
    parser.add_argument("--group", metavar="GROUP",
                        help="report on this group only: the snapshot's figures, the groups "
                             "and workers tables (requests, latency, CPU and capacity are "
                             "the coordinator's, over every group)")
    parser.add_argument("--simulation", type=Path, metavar="FILE.json",
                        help="the simulator's report (simulate --report): its violations, "
                             "disruptions and times to converge go into the report")
    parser.add_argument("--min-steady-seconds", type=float,
                        default=DEFAULT_MIN_STEADY_SECONDS, metavar="S",
                        help="the shortest recording that gets a capacity figure "
                             "(default: %(default)s)")
    args = parser.parse_args(argv)
    if args.cpu_limit <= 0 or args.p99_limit_ms <= 0:
        parser.error("--cpu-limit and --p99-limit-ms must be positive")
    return Options(args.metrics, args.snapshot, args.out, args.master, args.cpu_limit,
                   args.p99_limit_ms, args.group, args.simulation, args.min_steady_seconds)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (0 ok, 2 unusable input, 130 Ctrl-C)."""
    options = parse_args(argv)
    import signal
    import threading

    from coordinator.processes import stop_descendants

    interrupted = False

    def on_interrupt(signum: int, frame: Any) -> None:
        nonlocal interrupted
        if interrupted:
            return
        interrupted = True
        # Spark's JVM ignores SIGINT (PySpark starts it so): it is ended here, before the
        # Python side unwinds, so that it neither stays behind nor prints a Java stack.
        stop_descendants()
        raise KeyboardInterrupt

    if threading.current_thread() is not threading.main_thread():
        return _run(options, lambda: False)  # a caller's thread: Ctrl-C is the caller's
    previous = signal.signal(signal.SIGINT, on_interrupt)
    try:
        return _run(options, lambda: interrupted)
    except BaseException:
        if not interrupted:
            raise
    finally:
        signal.signal(signal.SIGINT, previous)
        if interrupted:
            stop_descendants()
    print("connect-coordinator report: interrupted; no report written", file=sys.stderr)
    return 130


def _run(options: Options, interrupted: Callable[[], bool]) -> int:
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        print("connect-coordinator report: error: pyspark is not installed: "
              "pip install '.[report]'", file=sys.stderr)
        return 2
    from coordinator.report.aggregate import InputError

    try:
        load_simulation(options.simulation)
    except InputError as error:
        print(f"connect-coordinator report: error: {error}", file=sys.stderr)
        return 2
    # Reuse a running session (tests share one); otherwise start our own and stop it after.
    spark = SparkSession.getActiveSession()
    owned = spark is None
    if spark is None:
        problem = java_problem()
        if problem is not None:
            print(f"connect-coordinator report: error: {problem}", file=sys.stderr)
            return 2
        print(f"[report] starting Spark ({options.master})", file=sys.stderr, flush=True)
        try:
            spark = (
                SparkSession.builder.master(options.master)
                .appName("connect-coordinator-report")
                .config("spark.ui.showConsoleProgress", "true")
                .config("spark.sql.shuffle.partitions", "8")
                .config("spark.sql.session.timeZone", "UTC")
                .getOrCreate()
            )
        except Exception as error:  # pyspark's start-up errors share no base class
            if "JAVA_GATEWAY" not in str(error) and "Java gateway" not in str(error):
                raise
            print(f"connect-coordinator report: error: {JAVA_NEEDED} (Spark: {error})",
                  file=sys.stderr)
            return 2
        spark.sparkContext.setLogLevel("WARN")
    try:
        run_report(spark, options)
    except InputError as error:
        print(f"connect-coordinator report: error: {error}", file=sys.stderr)
        return 2
    finally:
        if owned and not interrupted():  # (its JVM was ended already)
            spark.stop()
    print(f"[report] written to {options.out / 'index.html'}", file=sys.stderr)
    return 0


JAVA_NEEDED = ("report needs Java 17 to run Spark, and Spark could not start it: install "
               "one (e.g. sudo apt-get install -y openjdk-17-jre-headless) or set JAVA_HOME")


def java_problem() -> str | None:
    """Why Spark cannot start Java here, before it tries (it would print a page of noise)."""
    import os
    import shutil

    home = os.environ.get("JAVA_HOME")
    if home:
        java = Path(home) / "bin" / "java"
        if not os.access(java, os.X_OK):
            return f"{JAVA_NEEDED} (JAVA_HOME={home} has no bin/java)"
        return None
    if shutil.which("java") is None:
        return f"{JAVA_NEEDED} (no java on PATH)"
    return None


def load_simulation(path: Path | None) -> dict[str, Any] | None:
    """The simulator's JSON report, checked for the keys the report reads."""
    import json

    from coordinator.report.aggregate import InputError

    if path is None:
        return None
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise InputError(f"--simulation {path}: {error}") from None
    if not isinstance(document, dict) or not {"violations", "disruptions", "converged"} \
            <= document.keys():
        raise InputError(f"--simulation {path}: not a simulator report (simulate --report "
                         "writes one: violations, disruptions, converged)")
    return document


# ---------------------------------------------------------------------------------------
# Spark steps


def _rows(frame: Any) -> list[dict[str, Any]]:
    return [row.asDict() for row in frame.collect()]


def measure(spark: Any, options: Options, progress: Progress) -> Measured:
    from pyspark.sql import functions as F

    from coordinator.report import aggregate as agg

    measured = Measured()
    samples = progress.run("reading metrics", lambda: agg.load_metrics(spark, options.metrics))
    samples = samples.cache()
    with progress.step("scanning the time range"):
        recording = agg.recording_extent(samples)
    if recording is None:
        raise agg.InputError(f"no samples in {options.metrics}")
    measured.window = (recording.start, recording.end)
    measured.scrapes = recording.scrapes
    measured.metric_names = set(recording.metrics)
    start = recording.start
    span = measured.window_seconds
    # Bins no narrower than the mean scrape interval, so most bins hold a sample.
    mean_interval = span / (recording.scrapes - 1) if recording.scrapes > 1 else 1.0
    bin_seconds = max(span / CHART_BINS, mean_interval, 1.0)
    measured.bin_seconds = bin_seconds

    counters = agg.counter_deltas(samples.where(F.col("metric").isin(*COUNTERS)), start).cache()
    gauges = samples.where(F.col("metric").isin(*GAUGES)).cache()

    with progress.step("counter increases (rates, rebalances, CPU, histograms)"):
        # One pass for every counter; the few resulting rows are sorted out on the driver.
        increases = _rows(agg.counter_increase(counters, "api", "error", "trigger", "group",
                                               "le"))
        split_increases(measured, increases, options.group)
    with progress.step("gauges"):
        for row in _rows(agg.gauge_summary(
                gauges.where(~F.col("metric").isin(GROUPS, MEMBERS, UNASSIGNED)), "group")):
            if row["group"] is None:
                measured.gauges[row["metric"]] = row
            elif options.group is None or row["group"] == options.group:
                measured.group_gauges.append(row)
        for row in _rows(agg.total_gauge_mean(
                gauges.where(F.col("metric").isin(GROUPS, MEMBERS, UNASSIGNED)))):
            measured.gauge_totals[row["metric"]] = row
    with progress.step("time series for the charts"):
        measured.rate_over_time = _rows(agg.binned_rates(
            counters.where(F.col("metric") == REQUESTS), start, bin_seconds, "api"
        ))
        measured.buckets_over_time = _rows(agg.bucket_increase(
            counters.where(F.col("metric") == REQUEST_BUCKETS), "api",
            window_start=start, bin_seconds=bin_seconds,
        ))
        measured.gauges_over_time = _rows(agg.gauge_over_time(
            gauges.where(F.col("metric").isin(GROUPS, MEMBERS)), start, bin_seconds
        ))
        # Where the groups rebalanced: the steady part of the run is the rest.
        measured.rebalances_over_time = _rows(agg.binned_rates(
            counters.where(F.col("metric") == REBALANCES), start, bin_seconds))
        measured.unstable_over_time = _rows(agg.gauge_over_time(
            gauges.where((F.col("metric") == GROUPS)
                         & F.col("labels").getItem("state").isin(*REBALANCING_STATES)),
            start, bin_seconds))
    if options.snapshot is not None:
        with progress.step("snapshot: groups, workers, tasks"):
            snapshot = agg.load_snapshot(spark, options.snapshot)
            measured.snapshot_groups = sorted(
                row["group_id"] for row in snapshot.select("group_id").distinct().collect()
                if row["group_id"] is not None)
            if options.group is not None:
                snapshot = snapshot.where(F.col("group_id") == options.group)
            snapshot = snapshot.cache()
            measured.groups = _rows(agg.group_stats(snapshot).orderBy("group_id"))
            measured.workers = _rows(
                agg.worker_tasks(snapshot).orderBy("group_id", "member_id")
            )
            snapshot.unpersist()
        measured.coordinator = coordinator_totals(measured.groups, measured.workers)
    else:
        progress.run("snapshot: none given", lambda: None)
    for frame in (samples, counters, gauges):
        frame.unpersist()
    return measured


def split_increases(measured: Measured, rows: list[dict[str, Any]],
                    group: str | None = None) -> None:
    """Sort the per-series counter increases into the figures that use them."""
    span = measured.window_seconds
    requests: dict[tuple[Any, Any], float] = defaultdict(float)
    rebalances: dict[Any, float] = defaultdict(float)
    epochs: dict[Any, float] = defaultdict(float)
    for row in rows:
        metric, increase = row["metric"], row["increase"] or 0.0
        if metric == REQUESTS:
            requests[(row["api"], row["error"])] += increase
        elif metric == REBALANCES:
            rebalances[row["trigger"]] += increase
        elif metric == GROUP_EPOCH:
            if group is None or row["group"] == group:
                epochs[row["group"]] += increase
        elif metric == REQUEST_BUCKETS:
            measured.request_buckets.append(row)
        elif metric == TIME_TO_STABLE_BUCKETS:
            measured.stable_buckets.append(row)
        else:
            measured.increases[metric] = measured.increases.get(metric, 0.0) + increase
    if span > 0:
        measured.request_rates = [
            {"api": api, "error": error, "increase": value, "per_second": value / span}
            for (api, error), value in requests.items()
        ]
        measured.rebalances = [
            {"trigger": trigger, "increase": value, "per_second": value / span}
            for trigger, value in rebalances.items()
        ]
    measured.group_epochs = [{"group": group, "increase": value}
                             for group, value in epochs.items()]


def coordinator_totals(groups: list[dict[str, Any]],
                       workers: list[dict[str, Any]]) -> dict[str, Any]:
    """Snapshot figures over all groups; tasks per worker pools every group's workers."""
    tasks = spread([float(row["tasks"]) for row in workers])
    return {
        "groups": len(groups),
        "workers": len(workers),
        "connectors": sum(row["connectors"] or 0 for row in groups),
        "tasks": sum(row["tasks"] or 0 for row in groups),
        "unassigned_units": sum(row["unassigned_units"] or 0 for row in groups),
        "tasks_per_worker_min": tasks.minimum,
        "tasks_per_worker_median": tasks.median,
        "tasks_per_worker_max": tasks.maximum,
        "tasks_per_worker_imbalance": tasks.imbalance,
    }


# ---------------------------------------------------------------------------------------
# Driver-side figures


def _buckets_by(rows: list[dict[str, Any]], *keys: str) -> dict[tuple[Any, ...], list[
        tuple[float, float]]]:
    """Group bucket increases into cumulative-histogram lists keyed by ``keys``."""
    grouped: dict[tuple[Any, ...], dict[float, float]] = defaultdict(lambda: defaultdict(float))
    for row in rows:
        try:
            upper = parse_le(row["le"])
        except (TypeError, ValueError):
            continue
        grouped[tuple(row.get(key) for key in keys)][upper] += row["increase"] or 0.0
    return {key: sorted(buckets.items()) for key, buckets in grouped.items()}


def _merge_buckets(histograms: list[list[tuple[float, float]]]) -> list[tuple[float, float]]:
    merged: dict[float, float] = defaultdict(float)
    for histogram in histograms:
        for upper, count in histogram:
            merged[upper] += count
    return sorted(merged.items())


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def _missing(metric: str) -> str:
    return f"metric {metric} not in the recording"


class FigureBuilder:
    """Turns a Measured into the report's tables, charts and summary."""

    def __init__(self, measured: Measured, options: Options) -> None:
        self.m = measured
        self.options = options
        self.summary: list[Figure] = []
        self.tables: list[Table] = []
        self.projection: CapacityProjection | None = None
        self.simulation_document: dict[str, Any] | None = None

    def has(self, metric: str) -> bool:
        return metric in self.m.metric_names

    def reason(self, metric: str) -> str:
        if not self.has(metric):
            return _missing(metric)
        if self.m.window_seconds <= 0:
            return "the recording holds a single scrape: no rates"
        return "not enough data"

    def add(self, figure: Figure) -> Figure:
        self.summary.append(figure)
        return figure

    def over(self) -> str:
        """Where a rate was measured: a short recording gives a rate of that window only."""
        return f"measured over the {self.m.window_seconds:,.0f} s recorded"

    # --- sections -------------------------------------------------------------------

    def window(self) -> None:
        if self.m.window is None:
            return
        start, end = self.m.window
        # One way of telling time throughout: seconds from the recording's start (the
        # charts' axes and the tables' t_s); the start itself is said once, as a clock time.
        self.add(present("recording length", self.m.window_seconds, "s",
                         note=f"from {_clock(start)} to {_clock(end)}; every time in this "
                              "report is in seconds from its start"))

    def snapshot(self) -> None:
        coordinator = self.m.coordinator or {}
        reason = "no snapshot given" if self.options.snapshot is None else "snapshot is empty"
        for name, key, unit in (
            ("groups (snapshot)", "groups", "groups"),
            ("workers", "workers", "workers"),
            ("connectors", "connectors", "connectors"),
            ("tasks", "tasks", "tasks"),
            ("tasks per worker: min", "tasks_per_worker_min", "tasks"),
            ("tasks per worker: median", "tasks_per_worker_median", "tasks"),
            ("tasks per worker: max", "tasks_per_worker_max", "tasks"),
            ("tasks per worker: imbalance (max/mean)", "tasks_per_worker_imbalance", "ratio"),
            ("unassigned units (snapshot)", "unassigned_units", "units"),
        ):
            self.add(present(name, coordinator.get(key), unit, missing_reason=reason))

    def requests(self) -> tuple[float | None, float | None]:
        """Adds request figures; returns (heartbeats per second, heartbeat p99 in ms)."""
        rates = self.m.request_rates
        reason = self.reason(REQUESTS)
        total = sum(row["per_second"] for row in rates) if rates else None
        heartbeats = (
            sum(row["per_second"] for row in rates if row["api"] == HEARTBEAT_API)
            if rates
            else None
        )
        errors = (
            sum(row["per_second"] for row in rates if (row["error"] or "") not in SUCCESS_ERRORS)
            if rates
            else None
        )
        over = self.over()
        self.add(present("requests per second", total, "1/s", missing_reason=reason,
                         note=over))
        self.add(present("heartbeats per second", heartbeats, "1/s", missing_reason=reason,
                         note=over))
        by_code: dict[str, float] = defaultdict(float)
        for row in rates or []:
            if (row["error"] or "") not in SUCCESS_ERRORS:
                by_code[f"{row['api']} {row['error']}"] += row.get("increase") or 0.0
        codes = ", ".join(f"{name} {_count(count)}" for name, count in sorted(by_code.items())
                          if count)
        self.add(present("error responses per second", errors, "1/s", missing_reason=reason,
                         note=f"{over}; by API and code: {codes}" if codes else over))

        histograms = _buckets_by(self.m.request_buckets, "api")
        per_api: dict[str, dict[str, Any]] = defaultdict(
            lambda: {"requests_per_second": 0.0, "errors_per_second": 0.0}
        )
        api_codes: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        for row in rates:
            entry = per_api[row["api"] or ""]
            entry["requests_per_second"] += row["per_second"]
            if (row["error"] or "") not in SUCCESS_ERRORS:
                entry["errors_per_second"] += row["per_second"]
                api_codes[row["api"] or ""][str(row["error"])] += row.get("increase") or 0.0
        for api, counted in api_codes.items():
            # Which errors, not only how many: an error's code says whose fault it was.
            per_api[api]["error_codes"] = ", ".join(
                f"{code} {_count(count)}" for code, count in sorted(counted.items()) if count)
        for (api,), buckets in histograms.items():
            entry = per_api[api or ""]
            entry["observations"] = buckets[-1][1] if buckets else 0.0
            entry["p50_ms"] = _ms(histogram_quantile(0.50, buckets))
            entry["p99_ms"] = _ms(histogram_quantile(0.99, buckets))
        self.tables.append(Table(
            "requests_by_api",
            "Requests and latency per API",
            ["api", "requests_per_second", "errors_per_second", "error_codes", "observations",
             "p50_ms", "p99_ms"],
            [{"api": api, **values} for api, values in sorted(per_api.items())],
            note="Rates from requests_total increases over the recording; error_codes: "
                 "the error responses by code, counted over the recording; latency "
                 "quantiles from request_duration_seconds bucket increases.",
        ))
        latency_reason = self.reason(REQUEST_BUCKETS)
        heartbeat = histograms.get((HEARTBEAT_API,), [])
        all_apis = _merge_buckets(list(histograms.values())) if histograms else []
        heartbeat_p99 = _ms(histogram_quantile(0.99, heartbeat)) if heartbeat else None
        for name, buckets, quantile in (
            ("heartbeat latency p50", heartbeat, 0.50),
            ("heartbeat latency p99", heartbeat, 0.99),
            ("request latency p99 (all APIs)", all_apis, 0.99),
        ):
            value = _ms(histogram_quantile(quantile, buckets)) if buckets else None
            self.add(present(name, value, "ms", missing_reason=latency_reason))
        return heartbeats, heartbeat_p99

    def rebalances(self) -> None:
        rows = self.m.rebalances
        minutes = self.m.window_seconds / 60
        total = sum(row["increase"] for row in rows) if rows else None
        self.add(present("rebalances", total, "rebalances",
                         missing_reason=self.reason(REBALANCES), note=self.over()))
        self.add(present("rebalances per minute",
                         total / minutes if total is not None and minutes > 0 else None,
                         "1/min", missing_reason=self.reason(REBALANCES), note=self.over()))
        self.tables.append(Table(
            "rebalances_by_trigger",
            "Rebalances per trigger",
            ["trigger", "rebalances", "per_minute"],
            [
                {"trigger": row["trigger"], "rebalances": row["increase"],
                 "per_minute": row["increase"] / minutes if minutes > 0 else None}
                for row in sorted(rows, key=lambda row: str(row["trigger"]))
            ],
            note=f"Counts {self.over()}.",
        ))
        histogram = _merge_buckets(list(_buckets_by(self.m.stable_buckets).values()))
        rows_out = []
        for quantile in (0.5, 0.9, 0.99):
            value = histogram_quantile(quantile, histogram) if histogram else None
            label = f"time to stable p{quantile * 100:g}"
            self.add(present(label, value, "s",
                             missing_reason=self.reason(TIME_TO_STABLE_BUCKETS)))
            rows_out.append({"quantile": quantile, "seconds": value})
        self.tables.append(Table(
            "time_to_stable", "Time for a group to converge (from time_to_stable_seconds)",
            ["quantile", "seconds"], rows_out,
        ))

    def gauges(self) -> tuple[float | None, float | None]:
        """Adds gauge figures; returns (mean members, mean groups)."""
        totals = self.m.gauge_totals
        members = totals.get(MEMBERS, {}).get("mean")
        groups = totals.get(GROUPS, {}).get("mean")
        self.add(present("members (mean over recording)", members, "members",
                         missing_reason=self.reason(MEMBERS)))
        self.add(present("groups (mean over recording)", groups, "groups",
                         missing_reason=self.reason(GROUPS)))
        self.add(present("unassigned units (last scrape)", totals.get(UNASSIGNED, {}).get("last"),
                         "units", missing_reason=self.reason(UNASSIGNED)))
        log = self.m.gauges.get(LOG_BYTES, {})
        self.add(present("log size (last scrape)", log.get("last"), "bytes",
                         missing_reason=self.reason(LOG_BYTES)))
        slope = log.get("slope_per_hour")
        self.add(present("log growth per minute", None if slope is None else slope / 60,
                         "bytes/min", missing_reason=self.reason(LOG_BYTES),
                         note="least-squares slope of log_bytes, " + self.over()))
        memory = self.m.gauges.get(RESIDENT_MEMORY, {})
        self.add(present("resident memory (max)", memory.get("max"), "bytes",
                         missing_reason=self.reason(RESIDENT_MEMORY)))
        span = self.m.window_seconds
        written = self.m.increases.get(RECORDS_WRITTEN)
        self.add(present("records written per second",
                         written / span if written is not None and span > 0 else None, "1/s",
                         missing_reason=self.reason(RECORDS_WRITTEN), note=self.over()))
        return members, groups

    def cpu(self, heartbeats_per_second: float | None) -> float | None:
        """Adds CPU figures; returns the mean CPU use in cores."""
        span = self.m.window_seconds
        cpu_seconds = self.m.increases.get(CPU)
        cores = cpu_seconds / span if cpu_seconds is not None and span > 0 else None
        self.add(present("CPU used (mean)", cores, "cores", missing_reason=self.reason(CPU),
                         note=self.over()))
        per_thousand = None
        if cores is not None and heartbeats_per_second:
            per_thousand = cores / heartbeats_per_second * 1000
        reason = self.reason(CPU) if cores is None else "no heartbeats recorded"
        self.add(present("CPU seconds per 1,000 heartbeats", per_thousand, "s",
                         missing_reason=reason))
        return cores

    def capacity(self, *, members: float | None, groups: float | None, cores: float | None,
                 heartbeats: float | None, p99_ms: float | None) -> None:
        coordinator = self.m.coordinator or {}
        if members is None and coordinator.get("workers") is not None:
            members = float(coordinator["workers"])
        if groups is None and coordinator.get("groups") is not None:
            groups = float(coordinator["groups"])
        average_size = members / groups if members and groups else None
        projection = project_capacity(
            members_now=members,
            cpu_cores_now=cores,
            heartbeats_per_second=heartbeats,
            p99_now_ms=p99_ms,
            average_group_size=average_size,
            cpu_limit_cores=self.options.cpu_limit,
            p99_limit_ms=self.options.p99_limit_ms,
        )
        self.projection = projection
        reason = "; ".join(projection.notes) or "not enough data"
        # Whole workers, as the headline counts them.
        fit = (None if projection.max_members is None
               else math.floor(projection.max_members + 1e-9))
        self.add(present("capacity: max members", fit, "members",
                         missing_reason=reason, note=f"limited by {projection.limited_by}"))
        self.add(present("capacity: additional workers", projection.additional_workers,
                         "workers", missing_reason=reason))
        self.add(present("capacity: additional groups of average size",
                         projection.additional_groups, "groups", missing_reason=reason))
        rows = [
            {"quantity": key, "value": value}
            for key, value in projection.as_dict().items()
            if key not in ("models", "notes")
        ]
        rows += [{"quantity": "note", "value": note} for note in projection.notes]
        self.tables.append(Table("capacity", "Capacity projection", ["quantity", "value"], rows,
                                 note=" ".join(projection.models)))

    def simulation(self, document: dict[str, Any] | None) -> None:
        """The simulator's own verdict: units run twice, disruptions, times to converge."""
        reason = "no --simulation given"
        if document is None:
            for name in ("units run on two workers (simulation)", "disruptions (simulation)",
                         "time to converge: max (simulation)"):
                self.add(present(name, None, missing_reason=reason))
            return
        self.simulation_document = document
        disruptions = list(document.get("disruptions") or [])
        times = [d["time_to_converge_s"] for d in disruptions
                 if d.get("time_to_converge_s") is not None]
        self.add(present("units run on two workers (simulation)",
                         len(document.get("violations") or []), "violations"))
        self.add(present("disruptions (simulation)", len(disruptions), "disruptions"))
        if disruptions:  # a steady run has nothing to converge from: no row, not a missing one
            self.add(present("time to converge: max (simulation)", max(times) if times
                             else None, "s", missing_reason="no disruption converged"))
        self.add(present("initial convergence (simulation)",
                         document.get("initial_convergence_s"), "s"))
        self.tables.append(Table(
            "simulation_disruptions", "Disruptions the simulator applied",
            ["kind", "target", "started_s", "time_to_converge_s", "converged"],
            [{key: d.get(key) for key in ("kind", "target", "started_s",
                                          "time_to_converge_s", "converged")}
             for d in disruptions],
            note=f"From {self.options.simulation}: seconds from the start of the simulation; "
                 f"the group converged at the end: {document.get('converged')}; "
                 f"units run on two workers at once: "
                 f"{len(document.get('violations') or [])}.",
        ))

    def steady(self, steady: SteadyPart) -> SteadyPart:
        note = (f"the time bins ({self.m.bin_seconds:,.1f} s each) in which no group "
                "rebalanced, assigned or reconciled, nor in the two bins before")
        self.add(present("steady part of the recording", steady.seconds, "s", note=note))
        reason = "no steady part: a group was rebalancing throughout"
        self.add(present("heartbeat latency p50 (steady part)", steady.heartbeat_p50_ms, "ms",
                         missing_reason=reason))
        self.add(present("heartbeat latency p99 (steady part)", steady.heartbeat_p99_ms, "ms",
                         missing_reason=reason,
                         note="the p99 the capacity projection scales from"))
        return steady

    def headline(self, heartbeats: float | None, p99_ms: float | None,
                 simulation: dict[str, Any] | None, steady: SteadyPart) -> Headline:
        all_members = self.m.gauge_totals.get(MEMBERS, {}).get("max")
        members = all_members
        if self.options.group is not None:  # the workers of that group, not of every group
            members = next((row["max"] for row in self.m.group_gauges
                            if row["metric"] == GROUP_MEMBERS), None)
        if members is None and self.m.coordinator:
            members = self.m.coordinator.get("workers")
        facts = RunFacts(
            window_seconds=self.m.window_seconds, scrapes=self.m.scrapes,
            members_max=None if members is None else float(members),
            heartbeats_per_second=heartbeats, heartbeat_p99_ms=p99_ms,
            rebalances_by_trigger={str(row["trigger"]): float(row["increase"])
                                   for row in self.m.rebalances},
            simulation=simulation, projection=self.projection,
            min_steady_seconds=self.options.min_steady_seconds,
            steady_seconds=steady.seconds if self.m.rebalances_over_time
            or self.m.unstable_over_time else None,
            all_members_max=None if all_members is None else float(all_members))
        found = make_headline(facts)
        others = [g for g in self.m.snapshot_groups if g != self.options.group]
        if self.options.group is None and len(self.m.snapshot_groups) > 1:
            found.reasons.append(
                f"the snapshot holds {len(self.m.snapshot_groups)} groups "
                f"({', '.join(self.m.snapshot_groups[:5])}"
                f"{', ...' if len(self.m.snapshot_groups) > 5 else ''}): "
                "--group NAME reports on one")
        elif self.options.group is not None and self.options.group not in \
                self.m.snapshot_groups and self.options.snapshot is not None:
            found.reasons.append(f"the snapshot has no group {self.options.group!r} "
                                 f"(it holds: {', '.join(others) or 'none'})")
        return found

    def withhold_capacity(self, headline: Headline) -> None:
        """The run cannot support a capacity figure: the summary shows none, so that no
        table contradicts the headline (the model's arithmetic stays in its own table)."""
        reason = f"no capacity figure for this run ({headline.kind.replace('_', ' ')}): " \
                 "see the headline"
        self.summary = [
            Figure(figure.name, None, figure.unit, reason, "")
            if figure.name.startswith("capacity:") else figure
            for figure in self.summary]
        for table in self.tables:
            if table.name == "capacity":
                table.note = (f"Not a capacity figure for this run ({reason}): only the "
                              "model's arithmetic on what was measured. " + table.note)

    def groups(self) -> Table:
        by_group: dict[str, dict[str, Any]] = {}
        for row in self.m.groups:
            by_group[row["group_id"]] = dict(row)
        gauge_columns = {
            GROUP_MEMBERS: ("members_mean", "mean"),
            GROUP_UNITS: ("units_last", "last"),
            GROUP_UNASSIGNED: ("unassigned_max", "max"),
        }
        for row in self.m.group_gauges:
            if row["metric"] not in gauge_columns:
                continue
            entry = by_group.setdefault(row["group"], {"group_id": row["group"]})
            column, statistic = gauge_columns[row["metric"]]
            entry[column] = row[statistic]
            if row["metric"] == GROUP_UNASSIGNED:
                entry["unassigned_time_fraction"] = row["fraction_positive"]
        for row in self.m.group_epochs:
            entry = by_group.setdefault(row["group"], {"group_id": row["group"]})
            entry["epoch_bumps"] = row["increase"]
        simulated = self.simulation_document or {}
        simulated_group = (simulated.get("config") or {}).get("group")
        final_state = (simulated.get("final") or {}).get("state")
        if simulated_group in by_group and final_state:
            # The snapshot comes after the workers stopped, whose leaving can start one
            # more rebalance: the state the simulator last saw while they ran is the run's.
            by_group[simulated_group]["state_at_end_of_run"] = final_state
        columns = [
            "group_id", "group_state", "group_epoch", "assignment_epoch", "workers",
            "connectors", "tasks", "tasks_per_worker_min", "tasks_per_worker_median",
            "tasks_per_worker_max", "tasks_per_worker_imbalance", "unassigned_units",
            "members_mean", "units_last", "unassigned_max", "unassigned_time_fraction",
            "epoch_bumps",
        ]
        if any("state_at_end_of_run" in entry for entry in by_group.values()):
            columns.insert(1, "state_at_end_of_run")
        table = Table(
            "groups", "Groups", columns, [by_group[key] for key in sorted(by_group)],
            note="state_at_end_of_run: the group's state as the simulator last saw it "
                 "while its workers ran (with --simulation). Snapshot columns "
                 "(group_state ... unassigned_units) come from --snapshot, taken after the "
                 "workers stopped, so a group whose workers just left can show "
                 "RECONCILING there; "
                 "members_mean ... epoch_bumps from the per-group gauges, which the "
                 f"coordinator exports for at most metrics.per_group.max groups; epoch_bumps "
                 f"counts the rebalances {self.over()}.",
        )
        self.tables.append(table)
        return table


@dataclass(frozen=True)
class SteadyPart:
    """The time bins of the recording in which no group was rebalancing, and the heartbeat
    latency measured in them alone."""

    seconds: float
    bins: int
    heartbeat_p50_ms: float | None
    heartbeat_p99_ms: float | None


def steady_part(measured: Measured) -> SteadyPart:
    """A bin is steady when it and the two bins before it saw no rebalance and no group
    assigning or reconciling: the heartbeats that reconcile a rebalance can land in the
    scrape after it, and with bins as wide as the scrape interval a bin may hold no scrape."""
    disturbed = {row["bin_start"] for row in measured.rebalances_over_time
                 if (row["per_second"] or 0) > 0}
    disturbed |= {row["bin_start"] for row in measured.unstable_over_time
                  if (row["value"] or 0) > 0}
    width = measured.bin_seconds
    buckets: dict[float, list[tuple[float, float]]] = defaultdict(list)
    for (bin_start, api), histogram in _buckets_by(measured.buckets_over_time, "bin_start",
                                                   "api").items():
        if api == HEARTBEAT_API:
            buckets[bin_start] = histogram
    steady = [bin_start for bin_start in buckets
              if not any(bin_start - 2.5 * width < other <= bin_start for other in disturbed)]
    merged = _merge_buckets([buckets[bin_start] for bin_start in steady])
    return SteadyPart(
        seconds=len(steady) * width, bins=len(steady),
        heartbeat_p50_ms=_ms(histogram_quantile(0.5, merged)) if merged else None,
        heartbeat_p99_ms=_ms(histogram_quantile(0.99, merged)) if merged else None)


def _clock(moment: float) -> str:
    return datetime.fromtimestamp(moment, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _count(value: float) -> str:
    """A counter's increase as a whole count (a reset-corrected increase can be fractional
    only by rounding)."""
    return f"{round(value):,}"


def _series_rows(rows: list[dict[str, Any]], key: str, value: str) -> dict[str, list[
        tuple[float, float]]]:
    series: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for row in rows:
        if row[value] is not None:
            series[str(row[key])].append((row["bin_start"], row[value]))
    return series


def _timed(rows: list[dict[str, Any]], start: float) -> list[dict[str, Any]]:
    """Rows with their bin's start as seconds from the recording's start and as a UTC clock
    time, in place of the epoch seconds Spark binned by."""
    timed = []
    for row in sorted(rows, key=lambda row: (row["bin_start"], str(row.get("api") or
                                                                   row.get("metric")))):
        entry = {key: value for key, value in row.items() if key != "bin_start"}
        entry["t_s"] = round(row["bin_start"] - start, 1)
        entry["time_utc"] = datetime.fromtimestamp(row["bin_start"], UTC).strftime("%H:%M:%S")
        timed.append(entry)
    return timed


def build_charts(measured: Measured, out: Path) -> tuple[list[Chart], list[Table]]:
    """The four PNG charts and the CSV tables behind them."""
    charts: list[Chart] = []
    tables: list[Table] = []
    start = measured.window[0] if measured.window else 0.0

    def chart(file: str, title: str, draw: Callable[[Path], object] | None, reason: str) -> None:
        path = out / file
        if draw is None:
            missing_chart(path, title, reason)
            charts.append(Chart(file, title, reason))
        else:
            draw(path)
            charts.append(Chart(file, title))

    rates = measured.rate_over_time
    rate_series = _series_rows(rates, "api", "per_second")
    over_time_note = ("t_s: seconds from the start of the recording to the start of the "
                      "time bin; time_utc: the same moment on the clock.")
    tables.append(Table("request_rate_over_time", "Request rate over time",
                        ["t_s", "time_utc", "api", "per_second"], _timed(rates, start),
                        note=over_time_note))
    chart("request_rate.png", "Requests per second by API",
          (lambda path: line_chart(path, "Requests per second by API", rate_series,
                                   window_start=start, y_label="requests / s"))
          if rate_series else None, _missing(REQUESTS))

    latency_rows = []
    for (bin_start, api), buckets in sorted(
            _buckets_by(measured.buckets_over_time, "bin_start", "api").items(),
            key=lambda item: (item[0][0], str(item[0][1]))):
        latency_rows.append({
            "bin_start": bin_start, "api": api,
            "p50_ms": _ms(histogram_quantile(0.5, buckets)),
            "p99_ms": _ms(histogram_quantile(0.99, buckets)),
        })
    tables.append(Table("latency_over_time", "Request latency percentiles over time",
                        ["t_s", "time_utc", "api", "p50_ms", "p99_ms"],
                        _timed(latency_rows, start), note=over_time_note))
    latency_series: dict[str, list[tuple[float, float]]] = {}
    for quantile in ("p50_ms", "p99_ms"):
        for name, points in _series_rows(latency_rows, "api", quantile).items():
            latency_series[f"{name} {quantile[:-3]}"] = points
    chart("latency.png", "Request latency p50 / p99 by API",
          (lambda path: line_chart(path, "Request latency p50 / p99 by API", latency_series,
                                   window_start=start, y_label="ms", log_y=True))
          if latency_series else None, _missing(REQUEST_BUCKETS))

    gauge_rows = measured.gauges_over_time
    names = {MEMBERS: "members", GROUPS: "groups"}
    gauge_series = {
        names.get(metric, metric): points
        for metric, points in _series_rows(gauge_rows, "metric", "value").items()
    }
    tables.append(Table("members_groups_over_time", "Members and groups over time",
                        ["t_s", "time_utc", "metric", "value"], _timed(gauge_rows, start),
                        note=over_time_note))
    chart("members_groups.png", "Members and groups",
          (lambda path: line_chart(path, "Members and groups", gauge_series,
                                   window_start=start, y_label="count"))
          if gauge_series else None, f"{_missing(MEMBERS)} / {_missing(GROUPS)}")

    tasks_by_group: dict[str, list[int]] = defaultdict(list)
    for row in measured.workers:
        tasks_by_group[row["group_id"]].append(row["tasks"])
    chart("tasks_per_worker.png", "Tasks per worker per group",
          (lambda path: tasks_per_worker_chart(path, tasks_by_group)) if tasks_by_group else None,
          "no snapshot with members given")
    return charts, tables


def run_report(spark: Any, options: Options, stream: Any = None) -> Report:
    """Measure with Spark, compute the figures, write everything into ``options.out``."""
    progress = Progress(steps=7, stream=stream)
    simulation = load_simulation(options.simulation)
    measured = measure(spark, options, progress)
    with progress.step("figures, charts and files"):
        options.out.mkdir(parents=True, exist_ok=True)
        builder = FigureBuilder(measured, options)
        builder.window()
        builder.snapshot()
        heartbeats, heartbeat_p99 = builder.requests()
        steady = builder.steady(steady_part(measured))
        if steady.heartbeat_p99_ms is not None:
            # Capacity is about steady load: the heartbeats of rebalances wait for the log.
            heartbeat_p99 = steady.heartbeat_p99_ms
        builder.rebalances()
        members, groups = builder.gauges()
        cores = builder.cpu(heartbeats)
        if heartbeat_p99 is None:
            # No heartbeat histogram: fall back to the p99 over every API.
            all_apis = _merge_buckets(list(_buckets_by(measured.request_buckets, "api").values()))
            heartbeat_p99 = _ms(histogram_quantile(0.99, all_apis)) if all_apis else None
        builder.capacity(members=members, groups=groups, cores=cores, heartbeats=heartbeats,
                         p99_ms=heartbeat_p99)
        builder.simulation(simulation)
        headline = builder.headline(heartbeats, heartbeat_p99, simulation, steady)
        if headline.kind not in ("capacity", "over_budget"):
            builder.withhold_capacity(headline)
        builder.groups()
        charts, chart_tables = build_charts(measured, options.out)
        workers = Table(
            "workers", "Workers (members) and their tasks",
            ["group_id", "member_id", "worker_url", "member_state", "member_epoch", "tasks",
             "connectors"], measured.workers,
        )
        details = _group_details(measured.workers)
        summary = Table(
            "summary", "Summary",
            ["figure", "value", "unit", "status", "missing_reason", "note"],
            [figure.as_row() for figure in builder.summary],
        )
        report = Report(
            title="connect-coordinator capacity report",
            generated_at=datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
            inputs={
                "metrics": str(options.metrics),
                "snapshot": str(options.snapshot) if options.snapshot else "none",
                "simulation": str(options.simulation) if options.simulation else "none",
                "group": options.group or "every group in the snapshot",
                "cpu limit (cores)": options.cpu_limit,
                "p99 limit (ms)": options.p99_limit_ms,
            },
            summary=summary,
            tables=builder.tables + chart_tables + [workers],
            charts=charts,
            models=[CPU_MODEL, LATENCY_MODEL],
            group_details=details,
            headline=headline.as_dict(),
        )
        for table in [summary, *report.tables]:
            write_csv(options.out / f"{table.name}.csv", table)
        projection = builder.projection.as_dict() if builder.projection else None
        write_figures_json(options.out / "figures.json", report,
                           {"capacity": projection, "headline": headline.as_dict(),
                            "simulation": simulation,
                            "window_unix_s": list(measured.window) if measured.window
                            else None})
        write_html(options.out / "index.html", report)
    return report


# The page lists members of at most this many groups; workers.csv has them all.
DETAIL_GROUPS = 50


def _group_details(workers: list[dict[str, Any]]) -> list[Table]:
    by_group: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in workers:
        by_group[row["group_id"]].append(row)
    tables = []
    for group in sorted(by_group)[:DETAIL_GROUPS]:
        tables.append(Table(
            "workers", f"Group {group}",
            ["member_id", "worker_url", "member_state", "member_epoch", "tasks", "connectors"],
            by_group[group],
        ))
    return tables


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
