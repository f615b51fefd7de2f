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

HEARTBEAT = 1000  # ConnectGroupHeartbeat


def _producer_mb_per_s(stdout: str) -> float:
    """The whole run's MB/sec: the total line, the only one with percentiles (the progress
    lines before it cover one reporting window each, the first one mostly start-up)."""
    match = re.search(r"records sent, [\d.]+ records/sec \(([\d.]+) MB/sec\).* 50th",
                      stdout)
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


def cpu_seconds(metrics_text: str) -> float | None:
    """The coordinator's `process_cpu_seconds_total` (None where the platform has none)."""
    for line in metrics_text.splitlines():
        if line.startswith("process_cpu_seconds_total "):
            return float(line.split()[1])
    return None


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


def heartbeat_latencies(host: str, port: int, seconds: float, interval_s: float = 0.02
                        ) -> list[float]:
    """ConnectGroupHeartbeat round trips (seconds) of one member of an owned group, sent
    through the proxy's listener every `interval_s` for `seconds`."""
    import trio

    from coordinator.client import KafkaClient
    from protocol.messages import ConnectGroupHeartbeatRequest
    from protocol.messages.connect_group_heartbeat_request import ClientAssignor

    assignor = ClientAssignor(name="incremental-cooperative", minimum_version=1,
                              maximum_version=2, reason=0, version=2, metadata=b"")

    async def probe() -> list[float]:
        latencies: list[float] = []
        async with await KafkaClient.connect(host, port) as client:
            member, epoch = "bench-member", 0
            joined = await client.request(HEARTBEAT, ConnectGroupHeartbeatRequest(
                group_id="owned-bench", member_id=member, member_epoch=0,
                worker_url="http://bench:8083", rebalance_timeout_ms=30_000,
                client_assignors=(assignor,)))
            epoch = joined.member_epoch
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                started = time.perf_counter()
                answer = await client.request(HEARTBEAT, ConnectGroupHeartbeatRequest(
                    group_id="owned-bench", member_id=member, member_epoch=epoch))
                latencies.append(time.perf_counter() - started)
                if answer.error_code == 0:
                    epoch = answer.member_epoch
                await trio.sleep(interval_s)
        return latencies

    return trio.run(probe)


def _percentiles(latencies: list[float]) -> str:
    ordered = sorted(latencies)

    def at(share: float) -> float:
        return ordered[min(len(ordered) - 1, int(share * len(ordered)))] * 1000

    return (f"n={len(ordered):5d}  p50 {at(0.5):6.2f} ms  p99 {at(0.99):6.2f} ms  "
            f"max {ordered[-1] * 1000:6.2f} ms")


def heartbeats_under_fetch(root: Path, proxies: dict[str, Coordinator],
                           broker_bootstrap: str, records: int) -> None:
    """Heartbeat latency through each proxy, idle and while a consumer fetches `records`
    records through the same proxy (the forwarded stream and the heartbeats share the
    coordinator's event loop)."""
    import threading

    def under_fetch(coordinator: Coordinator, bootstrap: str, name: str) -> list[float]:
        done = threading.Event()

        def fetch_repeatedly() -> None:
            run = 0
            while not done.is_set():
                run_tool("org.apache.kafka.tools.ConsumerPerformance",
                         root / f"hb-consumer-{name}-{run}", "--bootstrap-server", bootstrap,
                         "--topic", "bench-hb", "--num-records", str(records),
                         "--group", f"bench-hb-{name}-{run}", "--timeout", "60000",
                         timeout_s=300)
                run += 1

        fetcher = threading.Thread(target=fetch_repeatedly, daemon=True)
        fetcher.start()
        time.sleep(3.0)  # past the consumer's start-up, into its fetches
        latencies = heartbeat_latencies(coordinator.host, coordinator.port, 8.0)
        done.set()
        fetcher.join(timeout=300)
        return latencies

    produced = run_tool(
        "org.apache.kafka.tools.ProducerPerformance", root / "hb-producer", "--topic",
        "bench-hb", "--num-records", str(records), "--record-size", "1024", "--throughput",
        "-1", "--command-property", f"bootstrap.servers={broker_bootstrap}", "acks=1",
        timeout_s=600)
    if produced.returncode != 0:
        raise RuntimeError(produced.stdout + produced.stderr)
    for label, coordinator in proxies.items():
        idle = heartbeat_latencies(coordinator.host, coordinator.port, 8.0)
        direct = under_fetch(coordinator, broker_bootstrap, f"{label}-direct")
        loaded = under_fetch(coordinator, coordinator.bootstrap, f"{label}-via")
        forwarded = coordinator.metrics()
        fetched = [line for line in forwarded.splitlines() if line.startswith(
            'connect_coordinator_proxy_forwarded_response_bytes_total{api="Fetch"}')]
        print(f"heartbeats through the {label} (an owned group's member, every 20 ms):")
        print(f"  idle                      {_percentiles(idle)}")
        print(f"  consumer fetching direct  {_percentiles(direct)}  (the same CPU load)")
        print(f"  consumer fetching via it  {_percentiles(loaded)}")
        print(f"  ({fetched[0].rsplit(' ', 1)[1] if fetched else '?'} Fetch bytes relayed)",
              flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="connect-coordinator bench proxy",
        description="Producer and consumer throughput through the proxy vs direct.")
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--record-size", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=3, help="runs of each side (alternating)")
    parser.add_argument("--heartbeats", action="store_true",
                        help="also: heartbeat latency through the proxy while a consumer "
                             "fetches through it")
    parser.add_argument("--only-heartbeats", action="store_true")
    parser.add_argument("--other-checkout", type=Path,
                        help="also: a third side, the proxy from this checkout of the "
                             "coordinator (an older version, say), for before/after figures "
                             "against the same broker")
    args = parser.parse_args(argv)
    if args.other_checkout is not None and not (args.other_checkout / "coordinator").is_dir():
        print(f"bench proxy: {args.other_checkout} has no coordinator package",
              file=sys.stderr)
        return 2
    try:
        require_java()
        ensure_jars()
    except InteropUnavailable as error:
        print(f"bench proxy: {error}", file=sys.stderr)
        return 2
    results: dict[str, list[tuple[float, float]]] = {}
    proxy_cpu: dict[str, list[float]] = {}  # a proxy's CPU seconds per run
    with tempfile.TemporaryDirectory(prefix="bench-proxy-") as scratch:
        root = Path(scratch)
        broker = start_broker(root / "broker")
        proxies: dict[str, Coordinator] = {}
        try:
            proxies["proxy"] = start_coordinator(
                root / "coordinator", broker.bootstrap, "owned-.*")
            if args.other_checkout is not None:
                proxies["other"] = start_coordinator(
                    root / "other", broker.bootstrap, "owned-.*",
                    checkout=args.other_checkout.resolve())
            if args.heartbeats or args.only_heartbeats:
                heartbeats_under_fetch(root, proxies, broker.bootstrap, args.records)
                if args.only_heartbeats:
                    return 0
            sides = {"direct": broker.bootstrap,
                     **{name: proxy.bootstrap for name, proxy in proxies.items()}}
            results.update({side: [] for side in sides})
            proxy_cpu.update({name: [] for name in proxies})
            print(f"{args.records} records of {args.record_size} B, acks=1, "
                  f"{args.runs} runs per side, alternating, after a warm-up run of each"
                  + (f"; other = the proxy from {args.other_checkout}"
                     if args.other_checkout else ""), flush=True)
            for side, bootstrap in sides.items():  # topic creation, the broker's JIT
                one_run(root / f"warm-{side}", bootstrap, f"warm-{side}",
                        max(args.records // 4, 1000), args.record_size)
            for run in range(args.runs):
                order = list(sides) if run % 2 == 0 else list(reversed(sides))
                for side in order:
                    started = time.monotonic()
                    proxy = proxies.get(side)
                    cpu_before = cpu_seconds(proxy.metrics()) if proxy else None
                    produce, fetch = one_run(root / f"{side}-{run}", sides[side],
                                             f"bench-{side}-{run}", args.records,
                                             args.record_size)
                    cpu_after = cpu_seconds(proxy.metrics()) if proxy else None
                    results[side].append((produce, fetch))
                    cpu = ""
                    if cpu_before is not None and cpu_after is not None:
                        proxy_cpu[side].append(cpu_after - cpu_before)
                        cpu = f"  proxy CPU {proxy_cpu[side][-1]:5.2f} s"
                    print(f"  run {run + 1} {side:6}: produce {produce:7.2f} MB/s  "
                          f"consume (fetch) {fetch:7.2f} MB/s  "
                          f"({time.monotonic() - started:.0f} s){cpu}", flush=True)
        finally:
            for proxy in proxies.values():
                proxy.stop()
            broker.stop()
    medians = {side: (statistics.median(r[0] for r in runs),
                      statistics.median(r[1] for r in runs))
               for side, runs in results.items()}
    direct = medians["direct"]
    print("median (min-max)   produce MB/s          consume MB/s       / direct    proxy CPU s")
    for side, (produce, fetch) in medians.items():
        runs = results[side]
        cpus = proxy_cpu.get(side)
        print(f"  {side:10}  {produce:7.2f} ({min(r[0] for r in runs):.1f}-"
              f"{max(r[0] for r in runs):.1f})  {fetch:8.2f} ({min(r[1] for r in runs):.1f}-"
              f"{max(r[1] for r in runs):.1f})  {produce / direct[0]:5.2f} {fetch / direct[1]:5.2f}"
              + (f"  {statistics.median(cpus):.2f} ({min(cpus):.2f}-{max(cpus):.2f})"
                 if cpus else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
