"""`bench proxy`: producer and consumer throughput through the proxy vs directly to the broker.

Starts a KRaft broker from Apache Kafka's jars and the coordinator in proxy mode in front
of it, then runs Kafka's own ProducerPerformance and ConsumerPerformance (1 KB records by
default) alternately directly against the broker and through the proxy, a fresh topic per
run, and prints each run and the medians side by side with their ratio. Needs a checkout
(the jars' pom), java and mvn (see coordinator/realkafka.py).
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

from coordinator.realkafka import (
    Coordinator,
    InteropUnavailable,
    ensure_jars,
    require_java,
    run_tool,
    start_broker,
    start_coordinator,
)


def _producer_mb_per_s(stdout: str) -> float:
    match = re.search(r"records sent, [\d.]+ records/sec \(([\d.]+) MB/sec\)", stdout)
    if match is None:
        raise RuntimeError(f"no summary in ProducerPerformance's output:\n{stdout}")
    return float(match.group(1))


def _consumer_mb_per_s(stdout: str) -> tuple[float, int]:
    """(fetch.MB.sec, data.consumed.in.nMsg): fetch time excludes the group join."""
    lines = stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if "fetch.MB.sec" in line)
    columns = [column.strip() for column in lines[header].split(",")]
    values = [value.strip() for value in lines[header + 1].split(",")]
    return (float(values[columns.index("fetch.MB.sec")]),
            int(float(values[columns.index("data.consumed.in.nMsg")])))


def one_run(folder: Path, bootstrap: str, topic: str, records: int, record_size: int
            ) -> tuple[float, float]:
    produced = run_tool(
        "org.apache.kafka.tools.ProducerPerformance", folder / "producer", "--topic", topic,
        "--num-records", str(records), "--record-size", str(record_size),
        "--throughput", "-1", "--command-property", f"bootstrap.servers={bootstrap}",
        "acks=1", "linger.ms=5", timeout_s=600)
    if produced.returncode != 0:
        raise RuntimeError(produced.stdout + produced.stderr)
    consumed = run_tool(
        "org.apache.kafka.tools.ConsumerPerformance", folder / "consumer",
        "--bootstrap-server", bootstrap, "--topic", topic, "--num-records", str(records),
        "--group", f"bench-{topic}", "--timeout", "120000", timeout_s=600)
    if consumed.returncode != 0:
        raise RuntimeError(consumed.stdout + consumed.stderr)
    fetch_mb_per_s, count = _consumer_mb_per_s(consumed.stdout)
    if count != records:
        raise RuntimeError(f"consumed {count} of {records} records")
    return _producer_mb_per_s(produced.stdout), fetch_mb_per_s


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="connect-coordinator bench proxy",
        description="Producer and consumer throughput through the proxy vs direct.")
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--record-size", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=3, help="runs of each side (alternating)")
    args = parser.parse_args(argv)
    try:
        require_java()
        ensure_jars()
    except InteropUnavailable as error:
        print(f"bench proxy: {error}", file=sys.stderr)
        return 2
    results: dict[str, list[tuple[float, float]]] = {"direct": [], "proxy": []}
    with tempfile.TemporaryDirectory(prefix="bench-proxy-") as scratch:
        root = Path(scratch)
        broker = start_broker(root / "broker")
        coordinator: Coordinator | None = None
        try:
            coordinator = start_coordinator(root / "coordinator", broker.bootstrap,
                                            "owned-.*")
            sides = {"direct": broker.bootstrap, "proxy": coordinator.bootstrap}
            print(f"{args.records} records of {args.record_size} B, acks=1, "
                  f"{args.runs} runs per side, alternating", flush=True)
            for run in range(args.runs):
                for side, bootstrap in (sides.items() if run % 2 == 0
                                        else reversed(sides.items())):
                    started = time.monotonic()
                    produce, fetch = one_run(root / f"{side}-{run}", bootstrap,
                                             f"bench-{side}-{run}", args.records,
                                             args.record_size)
                    results[side].append((produce, fetch))
                    print(f"  run {run + 1} {side:6}: produce {produce:7.2f} MB/s  "
                          f"consume (fetch) {fetch:7.2f} MB/s  "
                          f"({time.monotonic() - started:.0f} s)", flush=True)
        finally:
            if coordinator is not None:
                coordinator.stop()
            broker.stop()
    medians = {side: (statistics.median(r[0] for r in runs),
                      statistics.median(r[1] for r in runs))
               for side, runs in results.items()}
    print("median        produce MB/s  consume MB/s")
    for side, (produce, fetch) in medians.items():
        print(f"  {side:10}  {produce:12.2f}  {fetch:12.2f}")
    print(f"  proxy/direct {medians['proxy'][0] / medians['direct'][0]:11.2f}  "
          f"{medians['proxy'][1] / medians['direct'][1]:12.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
