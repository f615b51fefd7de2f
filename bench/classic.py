"""Classic members over real TCP: stable heartbeats next to new-protocol ones, and a joiner
into a group of 1,000 classic members.

    connect-coordinator bench classic heartbeats [--rounds N] [--interval-ms MS] ...
    connect-coordinator bench classic join [--members 1000] [--joiners N] ...

The coordinator, the load processes, the windows and the CPU accounting are those of the
stable-heartbeat bench (`bench/heartbeats.py`): the coordinator in its own process on free
ports with a durable log, the members in separate load processes, and the coordinator's
CPU time read from /proc over each window.

**heartbeats** measures three kinds of member, one after the other, ROUNDS times in
alternation (connect, bridged, classic, connect, bridged, classic, ...), each time in
fresh groups of GROUPS x WORKERS_PER_GROUP members:

* `connect`: new-protocol members that only heartbeat (`--load-client raw`);
* `bridged`: classic workers (JoinGroup, SyncGroup, then Heartbeat) in connect groups whose
  connectors were set through the admin API, so the bridge answers them;
* `classic`: the same classic workers in classic groups (no connectors set), answered by
  the classic engine as a broker would.

Each window gives the stable heartbeats answered per second and the coordinator's CPU time
per heartbeat; the report gives, per kind, the median over the rounds and the lowest and
highest, and the ratio of each classic kind's medians to the new protocol's (the target: a
classic heartbeat costs at most 1.2 x a new-protocol one, in CPU and in throughput).

**join** builds a group of MEMBERS classic workers (heartbeat every 3 s, as Connect's
default), waits until it is stable, then times JOINERS joiners one after the other: the
JoinGroup (both calls, the first answered MEMBER_ID_REQUIRED) and the SyncGroup of a new
classic worker, from its first send to each answer; it then leaves and the group settles
before the next. Once in a connect group (connectors set through the admin API: the members
are bridged, no barrier), once in a classic group (the barrier waits for every member to
rejoin, which they do at their next heartbeat), in alternation for ROUNDS rounds.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

import trio

from bench.heartbeats import (
    BenchError,
    LoadProcess,
    Target,
    _describe,
    _plan_workers,
    _wait_stable,
    _window,
    add_server_command,
    admin,
    coordinator,
    run_reporting_errors,
    summarize,
)
from coordinator.client import KafkaClient
from coordinator.connect_protocol import (
    SESSIONED_VERSION,
    ConnectAssignment,
    ConnectProtocolError,
    WorkerMetadata,
    decode_worker_metadata,
    encode_assignment,
    encode_worker_metadata,
)
from coordinator.units import Unit, units_of
from coordinator.workers.classic import (
    HEARTBEAT_VERSION,
    JOIN_VERSION,
    LEAVE_VERSION,
    SYNC_VERSION,
    _request,
    cooperative_plan,
)
from protocol import classic as wire
from protocol.errors import ErrorCode

PROG = "connect-coordinator bench classic"
KINDS = ("connect", "bridged", "classic")
TARGET_RATIO = 1.2
JOIN_KINDS = ("bridged", "classic")


def _connectors(count: int, tasks: int) -> dict[str, int]:
    return {f"connector-{index}": tasks for index in range(count)}


async def _put_connectors(target: Target, group: str, connectors: dict[str, int]) -> None:
    for name, tasks in connectors.items():
        await admin("PUT", f"{target.admin}/groups/{group}/connectors/{name}", {"tasks": tasks})


async def _start_load(target: Target, shares: list[list[list[str]]], *, client: str,
                      interval_ms: int, units: dict[str, int],
                      request_timeout_ms: int = 30_000,
                      session_timeout_ms: int = 10_000) -> list[LoadProcess]:
    processes: list[LoadProcess] = []
    try:
        for share in shares:
            if not share:
                continue
            processes.append(await LoadProcess.start({
                "host": target.host, "port": target.port, "interval_ms": interval_ms,
                "request_timeout_ms": request_timeout_ms, "workers": share,
                "load_gc": "paused", "client": client, "units": units,
                "session_timeout_ms": session_timeout_ms}))
        for process in processes:
            await process.receive("started")
    except BaseException:
        with trio.CancelScope(shield=True):
            await _stop(processes)
        raise
    return processes


async def _stop(processes: Sequence[LoadProcess]) -> list[str]:
    failures: list[str] = []
    for process in processes:
        stopped = await process.stop()
        if stopped:
            failures += stopped["failures"]
    return failures


# ============================================================================ heartbeats


async def _heartbeat_window(target: Target, args: argparse.Namespace, kind: str,
                            tag: str) -> dict[str, Any]:
    """One window of `kind` members in groups of their own: the figures of summarize()."""
    phase = copy.copy(args)
    phase.group = f"{args.group}-{kind}-{tag}"
    groups = [f"{phase.group}-{g}" for g in range(args.groups)]
    units = _connectors(args.connectors, args.tasks)
    if kind != "classic":  # connectors set through the admin API: a connect group
        for group in groups:
            await _put_connectors(target, group, units)
    processes = await _start_load(target, _plan_workers(phase, tag),
                                  client="raw" if kind == "connect" else "classic",
                                  interval_ms=args.interval_ms, units=units,
                                  session_timeout_ms=args.session_timeout_ms)
    try:
        await _wait_stable(target, groups, args.workers_per_group, args.settle_timeout)
        await trio.sleep(args.warmup)
        reports = await _window(processes, args.duration, target)
    finally:
        with trio.CancelScope(shield=True):
            failures = await _stop(processes)
    figures = summarize([reports], args.duration)
    figures["worker_failures"] = failures
    return figures


def _spread(values: Sequence[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 1), "low": round(min(values), 1),
            "high": round(max(values), 1)}


async def run_heartbeats(args: argparse.Namespace) -> dict[str, Any]:
    windows: dict[str, list[dict[str, Any]]] = {kind: [] for kind in KINDS}
    async with coordinator(args) as target:
        if target.pid is None:
            raise BenchError("CPU per heartbeat needs the coordinator's process: run it "
                             "as a subprocess (no --in-process or --bootstrap)")
        for round_index in range(args.rounds):
            tag = f"{os.urandom(2).hex()}{round_index}"
            for kind in KINDS:
                windows[kind].append(await _heartbeat_window(target, args, kind, tag))
    result: dict[str, Any] = {"kinds": {}}
    for kind, figures in windows.items():
        result["kinds"][kind] = {
            "heartbeats_per_s": _spread([f["heartbeats_per_s"] for f in figures]),
            "server_us_per_heartbeat": _spread([f["server_us_per_heartbeat"]
                                                for f in figures]),
            "p99_ms": _spread([f["p99_ms"] for f in figures]),
            "machine_cpu": _spread([f.get("machine_cpu", float("nan")) for f in figures]),
            "errors": [f["errors"] for f in figures],
            "unstable": sum(f["unstable"] for f in figures),
            "worker_failures": [x for f in figures for x in f["worker_failures"]],
        }
    connect = result["kinds"]["connect"]
    for kind in ("bridged", "classic"):
        mine = result["kinds"][kind]
        mine["cpu_ratio"] = round(mine["server_us_per_heartbeat"]["median"]
                                  / connect["server_us_per_heartbeat"]["median"], 2)
        mine["throughput_ratio"] = round(connect["heartbeats_per_s"]["median"]
                                         / mine["heartbeats_per_s"]["median"], 2)
    result["config"] = {
        "rounds": args.rounds, "groups": args.groups,
        "workers_per_group": args.workers_per_group, "processes": args.processes,
        "interval_ms": args.interval_ms, "duration_s": args.duration,
        "connectors_per_group": args.connectors, "tasks_per_connector": args.tasks,
        "session_timeout_ms": args.session_timeout_ms,
        "order": "connect, bridged, classic; repeated per round"}
    return result


# ============================================================================ join


class Joiner:
    """One new classic worker: JoinGroup (MEMBER_ID_REQUIRED, then with its id) and
    SyncGroup, timed from its first send; as leader it assigns as Connect's cooperative
    rule would."""

    def __init__(self, client: KafkaClient, group: str, name: str,
                 units: frozenset[Unit]) -> None:
        self.client, self.group, self.name, self.units = client, group, name, units
        self.member_id = ""

    def _metadata(self) -> bytes:
        return encode_worker_metadata(WorkerMetadata(
            SESSIONED_VERSION, f"http://{self.name}:8083", 0,
            ConnectAssignment(SESSIONED_VERSION)))

    async def _join(self) -> Any:
        protocols = (_request(wire.JOIN_GROUP, JOIN_VERSION, "JoinGroupRequestProtocol",
                              name="sessioned", metadata=self._metadata()),)
        body = _request(wire.JOIN_GROUP, JOIN_VERSION, group_id=self.group,
                        session_timeout=10_000, rebalance_timeout=60_000,
                        member_id=self.member_id, protocol_type="connect",
                        protocols=protocols)
        return await self.client.request(wire.JOIN_GROUP, body, JOIN_VERSION)

    def _assign(self, members: Any) -> tuple[Any, ...]:
        owned: dict[str, frozenset[Unit]] = {}
        for member in members:
            try:
                metadata = decode_worker_metadata(member.metadata)
                held = metadata.allocation.assigned if metadata.allocation else frozenset()
            except ConnectProtocolError:
                held = frozenset()
            owned[member.member_id] = held
        return tuple(
            _request(wire.SYNC_GROUP, SYNC_VERSION, "SyncGroupRequestAssignment",
                     member_id=member_id, assignment=encode_assignment(ConnectAssignment(
                         SESSIONED_VERSION, leader=self.member_id,
                         leader_url=f"http://{self.name}:8083", assigned=granted,
                         revoked=revoked)))
            for member_id, (granted, revoked) in cooperative_plan(self.units, owned).items())

    async def join_and_sync(self) -> dict[str, Any]:
        started = time.perf_counter()
        joined = await self._join()
        if int(joined.error_code.value) == ErrorCode.MEMBER_ID_REQUIRED:
            self.member_id = joined.member_id
            joined = await self._join()
        joined_s = time.perf_counter() - started
        if int(joined.error_code.value) != ErrorCode.NONE:
            raise BenchError(f"the joiner's JoinGroup failed: {joined.error_code}")
        leader = joined.leader == self.member_id
        sync = _request(wire.SYNC_GROUP, SYNC_VERSION, group_id=self.group,
                        generation_id=joined.generation_id, member_id=self.member_id,
                        protocol_type="connect", protocol_name=joined.protocol_name,
                        assignments=self._assign(joined.members) if leader else ())
        sync_started = time.perf_counter()
        synced = await self.client.request(wire.SYNC_GROUP, sync, SYNC_VERSION)
        done = time.perf_counter()
        if int(synced.error_code.value) not in (ErrorCode.NONE,
                                                ErrorCode.REBALANCE_IN_PROGRESS):
            raise BenchError(f"the joiner's SyncGroup failed: {synced.error_code}")
        return {"join_ms": round(joined_s * 1000, 2),
                "sync_ms": round((done - sync_started) * 1000, 2),
                "total_ms": round((done - started) * 1000, 2), "leader": leader,
                "sync_error": int(synced.error_code.value)}

    async def leave(self) -> None:
        member = _request(wire.LEAVE_GROUP, LEAVE_VERSION, "MemberIdentity",
                          member_id=self.member_id)
        await self.client.request(wire.LEAVE_GROUP, _request(
            wire.LEAVE_GROUP, LEAVE_VERSION, group_id=self.group, members=(member,)),
            LEAVE_VERSION)

    async def heartbeat(self, generation: int) -> int:
        body = _request(wire.HEARTBEAT, HEARTBEAT_VERSION, group_id=self.group,
                        generation_id=generation, member_id=self.member_id)
        answer = await self.client.request(wire.HEARTBEAT, body, HEARTBEAT_VERSION)
        return int(answer.error_code.value)


async def _join_phase(target: Target, args: argparse.Namespace, kind: str,
                      tag: str) -> list[dict[str, Any]]:
    group = f"{args.group}-join-{kind}-{tag}"
    connectors = _connectors(args.connectors, args.tasks)
    if kind == "bridged":
        await _put_connectors(target, group, connectors)
    shares: list[list[list[str]]] = [[] for _ in range(args.processes)]
    for index in range(args.members):
        shares[index % args.processes].append([group, f"{group}-w{index:04d}"])
    processes = await _start_load(target, shares, client="classic",
                                  interval_ms=args.heartbeat_ms, units=connectors,
                                  session_timeout_ms=args.session_timeout_ms)
    timed: list[dict[str, Any]] = []
    try:
        units = units_of(connectors)
        for index in range(args.joiners):
            stable = await _settle(target, group, args)
            async with await KafkaClient.connect(target.host, target.port,
                                                 f"joiner-{index}") as client:
                joiner = Joiner(client, group, f"joiner-{tag}-{index}", units)
                joined = await joiner.join_and_sync()
                joined["group_stable_before"] = stable
                timed.append(joined)
                await joiner.leave()
    finally:
        with trio.CancelScope(shield=True):
            await _stop(processes)
    return timed


async def _settle(target: Target, group: str, args: argparse.Namespace) -> bool:
    """Until the group is STABLE with all its members (True), or, if it is not within the
    settle timeout, until all its members are in it at least (False): a big bridged group
    on a busy machine may keep raising its epoch (each classic rejoin with a new
    allocation is new metadata) and a joiner's latency is still its own."""
    try:
        await _wait_stable(target, [group], args.members, args.settle_timeout, poll_s=1.0)
        return True
    except BenchError:
        pass
    with trio.move_on_after(args.settle_timeout):
        while True:
            described = (await _describe(target, [group])).groups[0]
            if not described.error_code and len(described.members) >= args.members:
                return False
            await trio.sleep(1.0)
    raise BenchError(f"{group} did not get its {args.members} members back within "
                     f"{args.settle_timeout} s")


async def run_join(args: argparse.Namespace) -> dict[str, Any]:
    timed: dict[str, list[dict[str, Any]]] = {kind: [] for kind in JOIN_KINDS}
    async with coordinator(args) as target:
        for round_index in range(args.rounds):
            tag = f"{os.urandom(2).hex()}{round_index}"
            for kind in JOIN_KINDS:
                timed[kind] += await _join_phase(target, args, kind, tag)
    result: dict[str, Any] = {"kinds": {}}
    for kind, joins in timed.items():
        result["kinds"][kind] = {
            part: _spread([j[part] for j in joins]) for part in ("join_ms", "sync_ms",
                                                                  "total_ms")}
        result["kinds"][kind]["joiners"] = len(joins)
        result["kinds"][kind]["joiner_was_leader"] = sum(j["leader"] for j in joins)
        result["kinds"][kind]["joined_a_stable_group"] = sum(j["group_stable_before"]
                                                             for j in joins)
    result["config"] = {"members": args.members, "joiners_per_round": args.joiners,
                        "rounds": args.rounds, "heartbeat_ms": args.heartbeat_ms,
                        "session_timeout_ms": args.session_timeout_ms,
                        "processes": args.processes, "connectors": args.connectors,
                        "tasks_per_connector": args.tasks,
                        "order": "bridged, classic; repeated per round"}
    return result


# ============================================================================ command line


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="Classic members over TCP "
                                     "(see the module doc and BENCHMARKS.md).")
    parser.add_argument("which", choices=("heartbeats", "join"))
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="server config for the coordinator the bench starts")
    add_server_command(parser)
    parser.add_argument("--group", default="classic-bench")
    parser.add_argument("--processes", type=int, default=2, help="load processes")
    parser.add_argument("--rounds", type=int, default=3,
                        help="alternating rounds (default %(default)s)")
    parser.add_argument("--connectors", type=int, default=2)
    parser.add_argument("--tasks", type=int, default=25, help="tasks per connector")
    parser.add_argument("--settle-timeout", type=float, default=300.0)
    parser.add_argument("--session-timeout-ms", type=int, default=30_000,
                        help="the classic members' session timeout: Connect's default is "
                             "10000, but members in a load process on a busy machine can "
                             "miss heartbeats for longer than that, and a member that "
                             "expires sets off a rebalance in the measured window "
                             "(default %(default)s)")
    beats = parser.add_argument_group("heartbeats")
    beats.add_argument("--groups", type=int, default=4)
    beats.add_argument("--workers-per-group", type=int, default=25)
    beats.add_argument("--interval-ms", type=int, default=0,
                       help="pause between an answer and the next heartbeat; 0: back to "
                            "back, the coordinator's throughput (default %(default)s)")
    beats.add_argument("--duration", type=float, default=5.0, help="seconds per window")
    beats.add_argument("--warmup", type=float, default=1.0)
    join = parser.add_argument_group("join")
    join.add_argument("--members", type=int, default=1_000)
    join.add_argument("--joiners", type=int, default=3, help="joiners per group and round")
    join.add_argument("--heartbeat-ms", type=int, default=3_000,
                      help="the members' heartbeat interval (Connect's default 3000)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if min(args.processes, args.rounds, args.groups, args.workers_per_group, args.members,
           args.joiners, args.connectors) < 1 or args.duration <= 0:
        parser.error("counts must be >= 1 and --duration > 0")
    # What coordinator() in bench/heartbeats.py reads: always a subprocess with a log, and
    # room for a connection per member and the bench's own (--set may say otherwise).
    args.bootstrap, args.admin, args.in_process, args.in_memory = None, None, False, False
    args.set = [f"server.max.connections={max(1_000, 2 * args.members + 100)}", *args.set]
    result = run_reporting_errors(
        PROG, run_heartbeats if args.which == "heartbeats" else run_join, args)
    if result is None:
        return 1
    print(json.dumps(result, indent=None if args.json else 2))
    if args.which == "heartbeats":
        for kind in ("bridged", "classic"):
            figures = result["kinds"][kind]
            met = max(figures["cpu_ratio"], figures["throughput_ratio"]) <= TARGET_RATIO
            print(f"target ({kind} heartbeat <= {TARGET_RATIO} x a new-protocol one, CPU "
                  f"{figures['cpu_ratio']}, throughput {figures['throughput_ratio']}): "
                  f"{'met' if met else 'NOT met'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
