"""One local[2] SparkSession for the whole test session (start-up costs seconds)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.report.sample_data import write_metrics_dir, write_snapshot_jsonl


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    pytest.importorskip("pyspark", reason="pyspark is not installed")
    pytest.importorskip("pyarrow", reason="pyarrow is not installed")
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("connect-coordinator-report-tests")
        # Small inputs: few partitions, no UI, no progress bar in the test output.
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        # Tiny data: compiling whole-stage code and re-planning stages cost more than
        # they save. Results are the same either way.
        .config("spark.sql.codegen.wholeStage", "false")
        .config("spark.sql.adaptive.enabled", "false")
        .config("spark.driver.memory", "1g")
        # Short-lived JVM: the quick C1 compiler alone costs far less CPU during warm-up.
        .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def sample_inputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(metrics dir, snapshot .jsonl) of tests/report/sample_data.py."""
    pytest.importorskip("pyarrow", reason="pyarrow is not installed")
    root = tmp_path_factory.mktemp("report-inputs")
    write_metrics_dir(root / "metrics")
    write_snapshot_jsonl(root / "snapshot.jsonl")
    return root / "metrics", root / "snapshot.jsonl"
