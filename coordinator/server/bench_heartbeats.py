"""Stable-heartbeat throughput and latency over real TCP.

1. Start a coordinator in this process (or use `--bootstrap` and `--admin` for one running
   elsewhere), create CONNECTORS x TASKS through the admin API.
2. Join MEMBERS members in one group and let them reconcile until the group and every member
   are STABLE.
3. Drive stable heartbeats (the member's epoch, nothing changed) from PROCESSES separate
   processes, each with CONNECTIONS connections keeping PIPELINE requests in flight, for
   DURATION seconds after a one-second warm-up.

Latency is measured in the load processes from just before a request is written to the
socket until its response is read back, so it includes the client's own scheduling.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import trio
import trio_parallel

from protocol.framing import FrameBuffer, decode_response, encode_request
from protocol.messages import ConnectGroupDescribeRequest, ConnectGroupHeartbeatRequest

HEARTBEAT = 1000
DESCRIBE = 1003
CORRELATION_OFFSET = 8  # size prefix (4) + api key (2) + api version (2)
WARMUP_S = 1.0


@dataclass(frozen=True, slots=True)
class WorkerPlan:
    host: str
    port: int
    group: str
    members: tuple[tuple[str, int], ...]  # (member id, member epoch)
    connections: int
    pipeline: int
    duration_s: float
    start_at: float  # wall-clock time.time() at which every process starts sending


@dataclass(slots=True)
class WorkerStats:
    latencies_ms: list[float]
    errors: int
    started_late_s: float


# ----------------------------------------------------------------------------- load process


def _heartbeat_frames(group: str, members: Sequence[tuple[str, int]]) -> list[bytes]:
    return [
        encode_request(
            HEARTBEAT, 0, 0, "bench",
            ConnectGroupHeartbeatRequest(group_id=group, member_id=member, member_epoch=epoch),
        )
        for member, epoch in members
    ]


async def _drive_connection(
    plan: WorkerPlan, frames: list[bytes], measure_from: float, stop_at: float,
    stats: WorkerStats,
) -> None:
    stream = await trio.open_tcp_stream(plan.host, plan.port)
    slots = trio.Semaphore(plan.pipeline)
    sent_at: dict[int, float] = {}
    drained = trio.Event()
    correlation = 0
    buffer = FrameBuffer(1 << 24)

    async def send() -> None:
        nonlocal correlation
        index = 0
        while time.perf_counter() < stop_at:
            await slots.acquire()
            batch = bytearray()
            while True:  # take every free slot: one write for all of them
                correlation += 1
                template = frames[index % len(frames)]
                index += 1
                frame = bytearray(template)
                frame[CORRELATION_OFFSET:CORRELATION_OFFSET + 4] = correlation.to_bytes(4, "big")
                batch += frame
                sent_at[correlation] = time.perf_counter()
                try:
                    slots.acquire_nowait()
                except trio.WouldBlock:
                    break
            await stream.send_all(batch)

    async def receive() -> None:
        while True:
            data = await stream.receive_some(1 << 16)
            if not data:
                return
            buffer.feed(data)
            now = time.perf_counter()
            for frame in buffer:
                cid, body = decode_response(frame, HEARTBEAT, 0)
                started = sent_at.pop(cid)
                if now >= measure_from:
                    stats.latencies_ms.append((now - started) * 1000.0)
                if getattr(body, "error_code", 0) != 0:
                    stats.errors += 1
                slots.release()
            if not sent_at and time.perf_counter() >= stop_at:
                drained.set()
                return

    async with stream, trio.open_nursery() as nursery:
        nursery.start_soon(receive)
        await send()
        with trio.move_on_after(5):  # collect the answers still in flight
            if sent_at:
                await drained.wait()
        nursery.cancel_scope.cancel()


async def _drive(plan: WorkerPlan) -> WorkerStats:
    frames = _heartbeat_frames(plan.group, plan.members)
    stats = WorkerStats([], 0, 0.0)
    delay = plan.start_at - time.time()
    if delay > 0:
        await trio.sleep(delay)
    else:
        stats.started_late_s = -delay
    start = time.perf_counter()
    measure_from = start + WARMUP_S
    stop_at = measure_from + plan.duration_s
    share = max(1, math.ceil(len(frames) / plan.connections))
    async with trio.open_nursery() as nursery:
        for first in range(0, len(frames), share):
            nursery.start_soon(
                _drive_connection, plan, frames[first:first + share], measure_from, stop_at,
                stats,
            )
    return stats


def _warm_up() -> None:
    time.sleep(0.2)  # keep the worker busy so each warm-up call lands in its own process


def run_load_process(plan: WorkerPlan) -> WorkerStats:
    """Entry point of one load process (module level so trio-parallel can pickle it)."""
    return trio.run(_drive, plan)


# ----------------------------------------------------------------------------- set-up


def _admin(method: str, url: str, body: Any | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, method=method, headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read() or b"null")


async def _request(client: Any, api_key: int, body: Any) -> Any:
    return await client.request(api_key, body)


async def _join_member(
    client: Any, group: str, member: str, stop: trio.Event, poll_s: float
) -> None:
    """A minimal worker: join, then heartbeat with what it owns until told to stop."""
    epoch = 0
    owned = None
    request = ConnectGroupHeartbeatRequest(
        group_id=group, member_id=member, member_epoch=0,
        worker_url=f"http://bench/{member}", rebalance_timeout_ms=60_000,
    )
    while not stop.is_set():
        response = await client.request(HEARTBEAT, request)
        if response.error_code in (25, 110):  # UNKNOWN_MEMBER_ID, FENCED_MEMBER_EPOCH: rejoin
            epoch, owned = 0, None
            request = ConnectGroupHeartbeatRequest(
                group_id=group, member_id=member, member_epoch=0,
                worker_url=f"http://bench/{member}", rebalance_timeout_ms=60_000,
            )
            continue
        if response.error_code not in (0, 1000):
            raise RuntimeError(f"{member}: heartbeat failed: {response.error_message}")
        epoch = response.member_epoch
        if response.assignment is not None:
            owned = response.assignment.assigned
        request = ConnectGroupHeartbeatRequest(
            group_id=group, member_id=member, member_epoch=epoch,
            owned_connectors_and_tasks=owned,
        )
        with trio.move_on_after(poll_s):
            await stop.wait()


async def _stable_epochs(client: Any, group: str, members: int) -> list[tuple[str, int]] | None:
    described = (await client.request(DESCRIBE, ConnectGroupDescribeRequest(group_ids=(group,))))
    view = described.groups[0]
    if view.group_state != "STABLE" or len(view.members) != members:
        return None
    if any(m.member_state != "STABLE" or m.member_epoch != view.assignment_epoch
           or m.pending_revocation.tasks or m.pending_revocation.connectors
           for m in view.members):
        return None
    return [(m.member_id, m.member_epoch) for m in view.members]


async def _prepare_group(
    host: str, port: int, admin_url: str, args: argparse.Namespace
) -> tuple[list[tuple[str, int]], float]:
    from coordinator.client import KafkaClient

    for index in range(args.connectors):
        await trio.to_thread.run_sync(
            _admin, "PUT", f"{admin_url}/groups/{args.group}/connectors/connector-{index}",
            {"tasks": args.tasks},
        )
    started = time.perf_counter()
    stop = trio.Event()
    clients = [await KafkaClient.connect(host, port) for _ in range(4)]
    epochs: list[tuple[str, int]] | None = None
    async with trio.open_nursery() as nursery:
        for index in range(args.members):
            nursery.start_soon(_join_member, clients[index % len(clients)], args.group,
                               f"member-{index:05d}", stop, 0.2)
        with trio.move_on_after(args.settle_timeout):
            while epochs is None:
                await trio.sleep(0.25)
                epochs = await _stable_epochs(clients[0], args.group, args.members)
        stop.set()
    for client in clients:
        await client.aclose()
    if epochs is None:
        raise RuntimeError(f"the group did not become stable within {args.settle_timeout} s")
    return epochs, time.perf_counter() - started


async def _leave_all(host: str, port: int, group: str, epochs: list[tuple[str, int]]) -> None:
    from coordinator.client import KafkaClient

    client = await KafkaClient.connect(host, port)
    async with client, trio.open_nursery() as nursery:
        for member, _ in epochs:
            nursery.start_soon(_request, client, HEARTBEAT, ConnectGroupHeartbeatRequest(
                group_id=group, member_id=member, member_epoch=-1))


def _percentile(sorted_values: list[float], fraction: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, math.ceil(fraction * len(sorted_values)) - 1))
    return sorted_values[index]


async def _measure(host: str, port: int, admin_url: str, args: argparse.Namespace
                   ) -> dict[str, Any]:
    epochs, settle_s = await _prepare_group(host, port, admin_url, args)
    shares = [epochs[i::args.processes] for i in range(args.processes)]
    results: list[WorkerStats] = []
    async with trio_parallel.open_worker_context() as context:
        # Spawn the load processes first so they all start sending at the same moment.
        async with trio.open_nursery() as nursery:
            for _ in shares:
                nursery.start_soon(context.run_sync, _warm_up)
        start_at = time.time() + 1.0
        plans = [
            WorkerPlan(host, port, args.group, tuple(share), args.connections, args.pipeline,
                       args.duration, start_at)
            for share in shares if share
        ]

        async def one(plan: WorkerPlan) -> None:
            results.append(await context.run_sync(run_load_process, plan))

        async with trio.open_nursery() as nursery:
            for plan in plans:
                nursery.start_soon(one, plan)
    await _leave_all(host, port, args.group, epochs)
    latencies = sorted(value for stats in results for value in stats.latencies_ms)
    return {
        "members": args.members,
        "connectors": args.connectors,
        "tasks_per_connector": args.tasks,
        "processes": args.processes,
        "connections_per_process": args.connections,
        "pipeline": args.pipeline,
        "duration_s": args.duration,
        "settle_s": round(settle_s, 2),
        "heartbeats": len(latencies),
        "errors": sum(stats.errors for stats in results),
        "heartbeats_per_s": round(len(latencies) / args.duration, 1),
        "p50_ms": round(_percentile(latencies, 0.50), 3),
        "p99_ms": round(_percentile(latencies, 0.99), 3),
        "p999_ms": round(_percentile(latencies, 0.999), 3),
        "max_ms": round(latencies[-1], 3) if latencies else None,
        "late_start_s": round(max((s.started_late_s for s in results), default=0.0), 2),
    }


async def _run_in_process(args: argparse.Namespace) -> dict[str, Any]:
    from coordinator.config import load_config
    from coordinator.logs import configure_logging
    from coordinator.server.app import run_server

    configure_logging("warning")
    config = load_config(None, args.set)
    async with trio.open_nursery() as nursery:
        handle = await nursery.start(run_server, config, ("127.0.0.1", 0), ("127.0.0.1", 0))
        try:
            return await _measure("127.0.0.1", handle.kafka_port,
                                  f"http://127.0.0.1:{handle.admin_port}", args)
        finally:
            handle.stop()


def _address(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="connect-coordinator bench heartbeats",
        description="Stable-heartbeat throughput and latency over TCP (see the module doc).",
    )
    parser.add_argument("--bootstrap", metavar="HOST:PORT",
                        help="use a running coordinator instead of starting one in-process")
    parser.add_argument("--admin", metavar="URL",
                        help="its admin API base URL (required with --bootstrap)")
    parser.add_argument("--group", default="bench", help="group id (default %(default)s)")
    parser.add_argument("--members", type=int, default=200, help="default %(default)s")
    parser.add_argument("--connectors", type=int, default=2, help="default %(default)s")
    parser.add_argument("--tasks", type=int, default=50, help="tasks per connector "
                        "(default %(default)s)")
    parser.add_argument("--processes", type=int, default=2,
                        help="load processes (default %(default)s)")
    parser.add_argument("--connections", type=int, default=4,
                        help="connections per load process (default %(default)s)")
    parser.add_argument("--pipeline", type=int, default=2,
                        help="requests in flight per connection (default %(default)s)")
    parser.add_argument("--duration", type=float, default=10.0,
                        help="measured seconds, after a 1 s warm-up (default %(default)s)")
    parser.add_argument("--settle-timeout", type=float, default=120.0,
                        help="seconds to wait for the group to become stable")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="server config for the in-process coordinator (repeatable)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args(argv)
    if args.members < 1 or args.processes < 1 or args.connections < 1 or args.pipeline < 1:
        parser.error("--members, --processes, --connections and --pipeline must be >= 1")
    if args.bootstrap:
        if not args.admin:
            parser.error("--bootstrap needs --admin (connectors are created through it)")
        host, port = _address(args.bootstrap)
        report = trio.run(_measure, host, port, args.admin.rstrip("/"), args)
    else:
        report = trio.run(_run_in_process, args)
    if args.json:
        print(json.dumps(report))
    else:
        for key, value in report.items():
            print(f"{key:>24}  {value}")
    target = report["heartbeats_per_s"] >= 10_000 and report["p99_ms"] < 5.0
    print(f"target (>= 10000 heartbeats/s, p99 < 5 ms): {'met' if target else 'NOT met'}",
          file=sys.stderr)
    return 0 if report["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
