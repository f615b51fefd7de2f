"""Small, fixed report inputs: a metrics directory and a snapshot, written with pyarrow.

Ten scrapes 30 s apart (270 s in all) of a coordinator with 2 groups and 6 members that
answers 2 heartbeats per member per second; see ``EXPECTED`` for the figures they imply.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

START = 1_700_000_000.0
INTERVAL = 30.0
SCRAPES = 10
LATENCY_BOUNDS = ("0.0005", "0.001", "0.005", "+Inf")

Sample = tuple[float, str, dict[str, str], float]


def metric_samples() -> list[Sample]:
    samples: list[Sample] = []
    for index in range(SCRAPES):
        now = START + index * INTERVAL
        elapsed = index * INTERVAL

        def add(metric: str, value: float, at: float = now, **labels: str) -> None:
            samples.append((at, "connect_coordinator_" + metric, labels, value))

        # 6 members x 2 heartbeats/s = 12 heartbeats/s; Describe 1 every 10 s.
        heartbeats = 12.0 * elapsed
        add("requests_total", heartbeats, api="ConnectGroupHeartbeat", error="NONE")
        add("requests_total", elapsed / 10, api="ConnectGroupDescribe", error="NONE")
        # Latency: of every 4 heartbeats 2 take <= 0.5 ms, 1 <= 1 ms, 1 <= 5 ms.
        cumulative = (heartbeats / 2, heartbeats * 3 / 4, heartbeats, heartbeats)
        for bound, count in zip(LATENCY_BOUNDS, cumulative, strict=True):
            add("request_duration_seconds_bucket", count, api="ConnectGroupHeartbeat", le=bound)
        add("request_duration_seconds_count", heartbeats, api="ConnectGroupHeartbeat")
        # One rebalance per 90 s (a worker joining): 3 over 270 s = 0.667 a minute.
        add("rebalances_total", float(index // 3), trigger="member_joined")
        # Every rebalance took between 1 and 2 s.
        add("time_to_stable_seconds_bucket", 0.0, le="1.0")
        add("time_to_stable_seconds_bucket", float(index // 3), le="2.0")
        add("time_to_stable_seconds_bucket", float(index // 3), le="+Inf")
        add("groups", 2.0, state="STABLE")
        add("groups", 0.0, state="ASSIGNING")
        add("members", 6.0)
        add("unassigned_units", 1.0)
        # 360 bytes per 30 s = 43,200 bytes per hour.
        add("log_bytes", 10_000.0 + 12.0 * elapsed)
        add("records_written_total", 2.0 * elapsed)
        for group, members in (("alpha", 4.0), ("beta", 2.0)):
            add("group_members", members, group=group)
            add("group_epoch", 5.0 + index // 3, group=group)
        samples.append((now, "process_cpu_seconds_total", {}, 100.0 + 0.06 * elapsed))
        samples.append((now, "process_resident_memory_bytes", {}, 50_000_000.0))
    return samples


# Figures implied by the samples above, worked out by hand.
EXPECTED: dict[str, float] = {
    "recording length": 270.0,  # 9 intervals of 30 s
    "heartbeats per second": 12.0,  # 12 * 270 / 270
    "requests per second": 12.1,  # 12 + 27 / 270
    "rebalances": 3.0,
    "rebalances per minute": 3 / 4.5,  # 3 in 270 s = 4.5 min
    # Ranks: p50 of 3240 = 1620 = the whole first bucket (0.5 ms).
    "heartbeat latency p50": 0.5,
    # p99 rank 3207.6 in (2430, 3240] of (1 ms, 5 ms]: 1 + 4 * 777.6 / 810 = 4.84 ms.
    "heartbeat latency p99": 4.84,
    "time to stable p50": 1.5,  # rank 1.5 of 3 in (0, 3] of (1 s, 2 s]
    "CPU used (mean)": 0.06,  # 16.2 CPU s / 270 s
    # 0.06 cores / 12 heartbeats/s * 1000
    "CPU seconds per 1,000 heartbeats": 5.0,
    "log growth per minute": 720.0,  # 12 bytes/s
    "members (mean over recording)": 6.0,
    "groups (mean over recording)": 2.0,
    "records written per second": 2.0,
    "workers": 6.0,
    "tasks": 8.0,
    "connectors": 3.0,
    "unassigned units (snapshot)": 1.0,
}


def write_metrics_dir(directory: Path) -> None:
    """The samples split over two files: labels as a map in one, as JSON text in the other."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir(parents=True, exist_ok=True)
    samples = metric_samples()
    half = len(samples) // 2
    for name, part, as_text in (("a.parquet", samples[:half], False),
                                ("b.parquet", samples[half:], True)):
        if as_text:
            labels = pa.array([json.dumps(sample[2]) for sample in part], pa.string())
        else:
            labels = pa.array([list(sample[2].items()) for sample in part],
                              pa.map_(pa.string(), pa.string()))
        table = pa.table({
            "timestamp": pa.array([sample[0] for sample in part], pa.float64()),
            "metric": pa.array([sample[1] for sample in part], pa.string()),
            "labels": labels,
            "value": pa.array([sample[3] for sample in part], pa.float64()),
        })
        pq.write_table(table, directory / name)


def snapshot_rows() -> list[dict[str, Any]]:
    """Group alpha: 4 workers with 2,1,1,0 tasks (+1 unassigned task); beta: 2 workers, 1, 2."""
    rows: list[dict[str, Any]] = []

    def group(group_id: str, epoch: int) -> None:
        rows.append({"kind": "group", "group_id": group_id, "group_state": "STABLE",
                     "group_epoch": epoch, "assignment_epoch": epoch, "snapshot_ms": 1})

    def member(group_id: str, member_id: str) -> None:
        rows.append({"kind": "member", "group_id": group_id, "member_id": member_id,
                     "instance_id": None, "worker_url": f"http://{member_id}:8083",
                     "member_epoch": 7, "member_state": "STABLE", "snapshot_ms": 1})

    def unit(group_id: str, member_id: str | None, connector: str, task: int) -> None:
        rows.append({"kind": "unit", "group_id": group_id, "member_id": member_id,
                     "connector": connector, "task": task, "snapshot_ms": 1})

    group("alpha", 7)
    for name in ("a1", "a2", "a3", "a4"):
        member("alpha", name)
    unit("alpha", "a1", "orders", -1)
    unit("alpha", "a1", "orders", 0)
    unit("alpha", "a1", "orders", 1)
    unit("alpha", "a2", "orders", 2)
    unit("alpha", "a3", "users", -1)
    unit("alpha", "a3", "users", 0)
    unit("alpha", None, "users", 1)
    group("beta", 3)
    for name in ("b1", "b2"):
        member("beta", name)
    unit("beta", "b1", "clicks", -1)
    unit("beta", "b1", "clicks", 0)
    unit("beta", "b2", "clicks", 1)
    unit("beta", "b2", "clicks", 2)
    return rows


def write_snapshot_jsonl(path: Path) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in snapshot_rows()))
