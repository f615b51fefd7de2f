"""`connect-coordinator bench hostile`: healthy members' heartbeat latency while an attacker
sends the worst requests the limits still let through, back to back.

Who runs where (separate OS processes, so the attacker's CPU is not the coordinator's):

* the coordinator: `connect-coordinator serve --in-memory` on free ports, default limits;
* HEALTHY members in group "healthy", in this process: joined once, then each heartbeats
  every INTERVAL_MS on its own connection; every heartbeat's latency is recorded, and any
  error (a member evicted or fenced) is counted; and one classic member, alone in group
  "classic" (listing MAX protocols), whose classic heartbeats are timed and counted too;
* ATTACKERS processes per attack, each on its own connection sending the attack's request
  again as soon as the previous one is answered (or reconnecting if it was closed).

Each attack runs for SECONDS after a quiet baseline window of the same length. The attacks
are the most expensive requests that are not refused early, plus two that are refused
only after the whole frame has been read:

* `describe-largest`: a describe of a group whose answer is just under the frame limit
  (one connector of long-named tasks; built and encoded off the event loop);
* `describe-max-ids`: the most group ids a describe may name, none of them existing;
* `heartbeat-max-owned`: a heartbeat owning the most units it may (short names);
* `install-max`: an Install of the most members and units it may list, from a member
  that is not in the group;
* `unknown-tags-max-frame`: a heartbeat whose tagged-field section holds the most unknown
  tagged fields a section may (MAX_TAGGED_FIELDS), filling a frame of the maximum size;
* `long-url-max-frame`: a heartbeat whose worker url fills a frame of the maximum size
  (refused once decoded);
* `garbage`: frames of the maximum size whose body does not parse;
* `join-max-protocols`: a JoinGroup to group "classic" listing the most protocols it may,
  none of them the classic member's (refused once checked against the group's);
* `leave-max-members`: a LeaveGroup of group "classic" naming the most members it may,
  none of them in it;
* `describe-groups-max`: a DescribeGroups naming the most groups it may (of ids of the
  longest allowed, none of them existing);
* `find-coordinator-max`: a FindCoordinator naming the most keys it may;
* `leave-over-limit-max-frame`: a LeaveGroup naming as many members as a frame of the
  maximum size holds (refused as its count is read).

The proxy attacks run against a second coordinator, in proxy mode (`--proxy-upstream`: a
broker's address, `start` to start a real KRaft broker from the interop jars, or, by
default, an address where nothing listens: these attacks are refused before anything
is forwarded), with its own healthy members heartbeating through the proxy listener:

* `proxy-find-coordinator-huge`, `proxy-list-groups-huge`, `proxy-join-group-huge`:
  FindCoordinator v4, ListGroups v4 and an owned group's JoinGroup v9 whose array
  declares 2^32 - 2 elements in a frame of a few dozen bytes (the requests the proxy
  reads itself);
* `proxy-idle-beyond-cap`: IDLE_OVER_CAP times `server.max.connections` (PROXY_CAP here)
  connections opened and held idle, each reopened when the proxy closes it.

Target: p99 < 20 ms under every attack, no eviction.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import socket
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from bench import loopsteps
from coordinator.cli import module_command
from coordinator.client import KafkaClient
from coordinator.config import ServerConfig
from coordinator.urls import open_url
from protocol import classic as wire
from protocol._codec import INT32, uvarint
from protocol.framing import FrameBuffer, encode_request
from protocol.guard import MAX_TAGGED_FIELDS
from protocol.messages import (
    ConnectGroupDescribeRequest,
    ConnectGroupHeartbeatRequest,
    ConnectGroupInstallAssignmentRequest,
    ConnectorsAndTasks,
)
from protocol.messages.common import ConnectorTaskId
from protocol.messages.connect_group_install_assignment_request import MemberAssignment

HEARTBEAT, DESCRIBE, INSTALL = 1000, 1003, 1002
DEFAULTS = ServerConfig()


def _framed(payload: bytes) -> bytes:
    return INT32.pack(len(payload)) + payload


def _request(api_key: int, body: Any) -> bytes:
    return encode_request(api_key, 0, 1, "attacker", body)


def _owned(tasks: int, name: str = "c") -> ConnectorsAndTasks:
    return ConnectorsAndTasks(connectors=(), tasks=tuple(
        ConnectorTaskId(connector=name, task=index) for index in range(tasks)))


def wide_group_tasks(config: ServerConfig) -> int:
    """Tasks of a connector with a name of the longest allowed whose describe answer is
    estimated just under the frame limit (coordinator/server/limits.py's estimate)."""
    per_unit = config.max_id_bytes + 6
    return int(config.max_frame_bytes * 0.95) // (3 * per_unit) - 1


def _classic(api_key: int, version: int, **values: Any) -> bytes:
    return encode_request(api_key, version, 1, "attacker",
                          wire.build(wire.REQUEST_CLASSES[api_key, version], **values))


def _classic_struct(api_key: int, version: int, struct: str, **values: Any) -> Any:
    return wire.build(getattr(wire.module(api_key, version, "request"), struct), **values)


def _join_protocols(names: list[str]) -> tuple[Any, ...]:
    return tuple(_classic_struct(wire.JOIN_GROUP, 3, "JoinGroupRequestProtocol", name=name,
                                 metadata=b"m") for name in names)


def _leave(member_ids: Any) -> bytes:
    return _classic(wire.LEAVE_GROUP, 5, group_id="classic", members=tuple(
        _classic_struct(wire.LEAVE_GROUP, 5, "MemberIdentity", member_id=member_id,
                        group_instance_id=None) for member_id in member_ids))


def classic_attacks(config: ServerConfig) -> dict[str, bytes]:
    """The attacks on Kafka's own APIs (see the module's docstring)."""
    longest = config.max_id_bytes

    def name(prefix: str, index: int) -> str:
        return f"{prefix}{index}".rjust(longest, "x")

    join = _classic(wire.JOIN_GROUP, 3, group_id="classic", member_id="",
                    protocol_type="connect", session_timeout=10_000,
                    rebalance_timeout=10_000,
                    protocols=_join_protocols([name("a", index) for index in
                                               range(config.max_join_protocols)]))
    # One-letter member ids: as many as a frame of the maximum size holds, 5 bytes each
    # (written out rather than built: a million entries took seconds to build).
    empty = _leave(())[4:]
    assert empty[-2:] == b"\x01\x00"  # no members, no tagged fields
    over = (config.max_frame_bytes - len(empty) - 8) // 5
    over_limit = _framed(empty[:-2] + uvarint(over + 1) + b"\x02m\x00\x00\x00" * over
                         + b"\x00")
    return {
        "join-max-protocols": join,
        "leave-max-members": _leave(name("m", index)
                                    for index in range(config.max_leave_members)),
        "describe-groups-max": _classic(wire.DESCRIBE_GROUPS, 5, groups=tuple(
            name("g", index) for index in range(config.max_describe_groups))),
        "find-coordinator-max": _classic(wire.FIND_COORDINATOR, 4, key_type=0,
                                         coordinator_keys=tuple(
            name("k", index) for index in range(config.max_find_coordinator_keys))),
        "leave-over-limit-max-frame": over_limit,
    }


CLASSIC_PROTOCOLS = [f"p{index}" for index in range(DEFAULTS.max_join_protocols)]


def attacks(config: ServerConfig) -> dict[str, bytes]:
    """Attack name -> the framed request it sends over and over."""
    frame_room = config.max_frame_bytes - 1_024
    heartbeat = ConnectGroupHeartbeatRequest(group_id="target", member_id="attacker",
                                             member_epoch=5)
    plain = _request(HEARTBEAT, heartbeat)[4:]
    # as many unknown tagged fields as a section may hold, filling the frame with data
    fields = MAX_TAGGED_FIELDS
    size = (frame_room - len(plain)) // fields - 8
    tag = uvarint(size) + b"\x00" * size
    tagged = _framed(plain[:-1] + uvarint(fields)
                     + b"".join(uvarint(number) + tag for number in range(fields)))
    url = ConnectGroupHeartbeatRequest(group_id="target", member_id="attacker",
                                       member_epoch=0, rebalance_timeout_ms=1_000,
                                       worker_url="u" * (frame_room - 100))
    units_per_member = config.max_group_units // config.max_size
    members = tuple(
        MemberAssignment(member_id=f"member-{index}",
                         assigned=ConnectorsAndTasks(connectors=(), tasks=tuple(
                             ConnectorTaskId(connector="c", task=index * units_per_member + t)
                             for t in range(units_per_member))),
                         version=1, metadata=b"")
        for index in range(config.max_size))
    install = ConnectGroupInstallAssignmentRequest(group_id="target", member_id="attacker",
                                                   member_epoch=1, group_epoch=1, error=0,
                                                   members=members)
    garbage_header = _request(DESCRIBE, ConnectGroupDescribeRequest(group_ids=()))[4:-2]
    return {
        "describe-largest": _request(DESCRIBE, ConnectGroupDescribeRequest(group_ids=("wide",))),
        "describe-max-ids": _request(DESCRIBE, ConnectGroupDescribeRequest(
            group_ids=tuple(f"no-such-group-{index}"
                            for index in range(config.max_describe_groups)))),
        "heartbeat-max-owned": _request(HEARTBEAT, ConnectGroupHeartbeatRequest(
            group_id="target", member_id="attacker", member_epoch=5,
            owned_connectors_and_tasks=_owned(config.max_owned_units))),
        "install-max": _request(INSTALL, install),
        "unknown-tags-max-frame": tagged,
        "long-url-max-frame": _request(HEARTBEAT, url),
        "garbage": _framed(garbage_header + b"\x02" + b"\xff" * (frame_room - 100)),
        **classic_attacks(config),
    }


_FLEXIBLE_CLIENT = b"attacker"
HUGE_COUNT = uvarint(2**32 - 1)  # a compact array of 2^32 - 2 elements


def _flexible_header(api_key: int, version: int, correlation_id: int = 7) -> bytes:
    return (api_key.to_bytes(2, "big") + version.to_bytes(2, "big") + INT32.pack(correlation_id)
            + len(_FLEXIBLE_CLIENT).to_bytes(2, "big") + _FLEXIBLE_CLIENT + b"\x00")


def _compact(text: str) -> bytes:
    return uvarint(len(text.encode()) + 1) + text.encode()


def huge_find_coordinator() -> bytes:
    """FindCoordinator v4 whose coordinator_keys declares 2^32 - 2 entries."""
    return _framed(_flexible_header(10, 4) + b"\x00" + HUGE_COUNT + b"\x00")


def huge_list_groups() -> bytes:
    """ListGroups v4 whose states_filter declares 2^32 - 2 entries."""
    return _framed(_flexible_header(16, 4) + HUGE_COUNT + b"\x00")


def huge_join_group(group: str = "owned-huge") -> bytes:
    """JoinGroup v9 of `group` whose protocols declares 2^32 - 2 entries."""
    body = (_compact(group) + INT32.pack(30_000) + INT32.pack(60_000) + _compact("")
            + b"\x00" + _compact("consumer") + HUGE_COUNT + b"\x00" + b"\x00")
    return _framed(_flexible_header(11, 9) + body)


PROXY_GROUPS = "owned-.*"
PROXY_CAP = 100  # server.max.connections of the proxy target
IDLE_OVER_CAP = 1.5  # the idle attack opens this many times the cap
PROXY_IDLE_TIMEOUT_MS = 2_000  # the proxy target's server.connection.idle.timeout.ms
IDLE_ATTACK = "proxy-idle-beyond-cap"


def proxy_attacks() -> dict[str, bytes]:
    """The proxy's attack name -> its frame (the idle attack sends none)."""
    return {"proxy-find-coordinator-huge": huge_find_coordinator(),
            "proxy-list-groups-huge": huge_list_groups(),
            "proxy-join-group-huge": huge_join_group(),
            IDLE_ATTACK: b""}


def hold_idle(port: int, connections: int, seconds: float, result: Any) -> None:
    """In an attacker process: keep `connections` connections open and silent for
    `seconds`, reopening each one the server closes. Counts: opened (`sent`) and closed
    by the server (`closed`)."""
    import select

    opened = closed = 0
    deadline = time.monotonic() + seconds
    held: list[socket.socket] = []
    while time.monotonic() < deadline:
        while len(held) < connections and time.monotonic() < deadline:
            try:
                held.append(socket.create_connection(("127.0.0.1", port), timeout=1))
                opened += 1
            except OSError:
                closed += 1
                break
        readable, _, _ = select.select(held, [], [], 0.1)
        for sock in readable:  # an idle connection is readable only once it is closed
            try:
                data = sock.recv(1)
            except OSError:
                data = b""
            if not data:
                closed += 1
                held.remove(sock)
                sock.close()
    for sock in held:
        sock.close()
    result.put({"sent": opened, "answered": 0, "closed": closed})


def attack(port: int, frame: bytes, seconds: float, result: Any) -> None:
    """In an attacker process: send `frame`, read its answer, again, for `seconds`."""
    sent = answered = closed = 0
    deadline = time.monotonic() + seconds
    sock: socket.socket | None = None
    buffer = FrameBuffer(1 << 30)
    while time.monotonic() < deadline:
        if sock is None:
            sock = socket.create_connection(("127.0.0.1", port), timeout=30)
            buffer = FrameBuffer(1 << 30)
        try:
            sock.sendall(frame)
            sent += 1
            while buffer.next_frame() is None:
                data = sock.recv(1 << 20)
                if not data:
                    raise ConnectionError
                buffer.feed(data)
            answered += 1
        except (OSError, ConnectionError):
            closed += 1
            sock.close()
            sock = None
    if sock is not None:
        sock.close()
    result.put({"sent": sent, "answered": answered, "closed": closed})


class Healthy:
    """The healthy members: each heartbeats every `interval_s` on its own connection from
    `start` until `stop`; each latency is kept with when it was sent."""

    def __init__(self, port: int, members: int, interval_s: float,
                 classic_group: str = "classic") -> None:
        self.port = port
        self.classic_group = classic_group
        self.members = members
        self.interval_s = interval_s
        self.samples: list[tuple[float, float]] = []  # (sent at, latency), monotonic s
        self.errors: list[tuple[float, str]] = []
        self.stop = trio.Event()

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            for index in range(self.members):
                nursery.start_soon(self.member, f"healthy-{index}")
            nursery.start_soon(self.classic_member)

    async def classic_member(self) -> None:
        """Alone in its group ("classic"; through the proxy, one the proxy owns): joins
        (listing CLASSIC_PROTOCOLS), syncs as its leader, then heartbeats; an error is
        counted and it joins again."""
        async with await KafkaClient.connect("127.0.0.1", self.port) as client:
            member_id, generation = "", -1
            while not self.stop.is_set():
                if generation < 0:
                    joined = await client.request(wire.JOIN_GROUP, wire.build(
                        wire.REQUEST_CLASSES[wire.JOIN_GROUP, 3], group_id=self.classic_group,
                        member_id=member_id, protocol_type="connect",
                        session_timeout=10_000, rebalance_timeout=10_000,
                        protocols=_join_protocols(CLASSIC_PROTOCOLS)), 3)
                    member_id, generation = joined.member_id, int(joined.generation_id)
                    await client.request(wire.SYNC_GROUP, wire.build(
                        wire.REQUEST_CLASSES[wire.SYNC_GROUP, 3], group_id=self.classic_group,
                        member_id=member_id, generation_id=generation,
                        assignments=()), 3)
                    continue
                started = time.perf_counter()
                beat = await client.request(wire.HEARTBEAT, wire.build(
                    wire.REQUEST_CLASSES[wire.HEARTBEAT, 3], group_id=self.classic_group,
                    member_id=member_id, generation_id=generation), 3)
                self.samples.append((started, time.perf_counter() - started))
                code = int(beat.error_code)
                if code:
                    self.errors.append((started, f"classic {member_id}: {code}"))
                    generation = -1
                await trio.sleep(self.interval_s)

    async def member(self, name: str) -> None:
        async with await KafkaClient.connect("127.0.0.1", self.port) as client:
            epoch = 0
            while not self.stop.is_set():
                joining = epoch == 0
                request = ConnectGroupHeartbeatRequest(
                    group_id="healthy", member_id=name, member_epoch=epoch,
                    worker_url=f"http://{name}:8083" if joining else None,
                    rebalance_timeout_ms=30_000 if joining else -1)
                started = time.perf_counter()
                response = await client.request(HEARTBEAT, request)
                if epoch:  # the join is not timed
                    self.samples.append((started, time.perf_counter() - started))
                if response.error_code:
                    self.errors.append((started, f"{name}: {response.error_code} "
                                                 f"{response.error_message}"))
                    epoch = 0
                else:
                    epoch = response.member_epoch
                await trio.sleep(self.interval_s)

    def between(self, start: float, end: float) -> tuple[list[float], list[str]]:
        return ([latency for sent, latency in self.samples if start <= sent < end],
                [error for sent, error in self.errors if start <= sent < end])


def _summary(latencies: list[float]) -> dict[str, float]:
    if not latencies:
        return {"count": 0}
    ordered = sorted(latencies)

    def at(share: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(share * len(ordered)))] * 1000, 2)

    return {"count": len(ordered), "p50_ms": at(0.5), "p99_ms": at(0.99),
            "max_ms": round(ordered[-1] * 1000, 2),
            "mean_ms": round(statistics.fmean(ordered) * 1000, 2)}


async def window(port: int, args: argparse.Namespace, healthy: Healthy,
                 frame: bytes | None, idle_connections: int = 0) -> dict[str, Any]:
    """`args.seconds` of healthy heartbeats while attacker processes send `frame` (or,
    with `idle_connections`, hold that many connections idle between them), and on until
    the attackers' last requests are answered: a stall an attack causes is its window's
    even when it outlasts the attack's time (a LeaveGroup of a million members held the
    loop for half a minute once its sender had stopped)."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    processes = []
    if idle_connections:
        share = -(-idle_connections // args.attackers)
        processes = [context.Process(target=hold_idle,
                                     args=(port, share, args.seconds, results))
                     for _ in range(args.attackers)]
    elif frame is not None:
        processes = [context.Process(target=attack, args=(port, frame, args.seconds, results))
                     for _ in range(args.attackers)]
    for process in processes:
        process.start()
    if processes:
        await trio.sleep(0.5)  # the attackers' start-up (spawned interpreters) is not timed
    start, monotonic_start = time.perf_counter(), time.monotonic()
    await trio.sleep(args.seconds - (0.5 if processes else 0))
    sent = {"sent": 0, "answered": 0, "closed": 0}
    for process in processes:
        outcome = await trio.to_thread.run_sync(results.get, True, 120)
        for key in sent:
            sent[key] += outcome[key]
        await trio.to_thread.run_sync(process.join)
    if processes:  # the heartbeats held up with the attackers' last requests come back
        await trio.sleep(2 * healthy.interval_s)
    latencies, errors = healthy.between(start, time.perf_counter())
    monotonic_end = time.monotonic()
    return {**_summary(latencies), "errors": len(errors), "first_errors": errors[:3],
            "attack": sent if processes else None,
            "window": (monotonic_start, monotonic_end)}


async def set_up(admin: str, config: ServerConfig) -> None:
    """The group whose describe is the largest legal answer."""
    name = "w" * config.max_id_bytes
    tasks = wide_group_tasks(config)
    request = urllib.request.Request(f"{admin}/groups/wide/connectors/{name}",
                                     data=json.dumps({"tasks": tasks}).encode(), method="PUT",
                                     headers={"content-type": "application/json"})

    def put() -> None:
        with open_url(request, 30) as response:
            response.read()

    await trio.to_thread.run_sync(put)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    frames = attacks(DEFAULTS)
    proxied = proxy_attacks()
    chosen = args.attack or [*frames, *proxied]
    rows: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-hostile-") as tmp:
        plain = [name for name in chosen if name in frames]
        if plain:
            await _target_windows(args, [], Path(tmp), frames, plain, rows, "")
        through_proxy = [name for name in chosen if name in proxied]
        if through_proxy:
            upstream, broker = _proxy_upstream(args.proxy_upstream, Path(tmp) / "broker")
            try:
                settings = [f"proxy.upstream={upstream}", f"proxy.groups={PROXY_GROUPS}",
                            f"server.max.connections={PROXY_CAP}",
                            f"server.connection.idle.timeout.ms={PROXY_IDLE_TIMEOUT_MS}"]
                await _target_windows(args, settings, Path(tmp), proxied,
                                      through_proxy, rows, "proxy-")
            finally:
                if broker is not None:
                    broker.stop()
    return rows


def _proxy_upstream(choice: str | None, folder: Path) -> tuple[str, Any]:
    """The proxy target's upstream address, and the broker started for it (or None)."""
    if choice == "start":
        from coordinator.realkafka import start_broker

        broker = start_broker(folder)
        return broker.bootstrap, broker
    if choice:
        return choice, None
    with socket.socket() as probe:  # a free port: nothing listens there
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}", None


async def _target_windows(args: argparse.Namespace, settings: list[str], folder: Path,
                          frames: dict[str, bytes], chosen: list[str], rows: dict[str, Any],
                          prefix: str) -> None:
    """A coordinator with `settings`; its baseline and attack windows, into `rows`
    (its loop steps recorded in `folder`)."""
    from bench.heartbeats import _subprocess

    steps_file = folder / f"{prefix or 'plain-'}loop-steps.json"
    launcher = module_command("bench.loopsteps", str(steps_file)) if args.loop_steps else None
    # (no initial delay: the classic member's first join is answered at once)
    target_args = argparse.Namespace(in_memory=True,
                                     set=["group.initial.rebalance.delay.ms=0", *settings])
    own: dict[str, Any] = {}
    async with _subprocess(target_args, launcher) as target:
        await _windows(target, args, frames, chosen, own, prefix)
    recorded = json.loads(steps_file.read_text()) if args.loop_steps else None
    for name, row in own.items():
        window_bounds = row.pop("window")
        if recorded is not None:
            row.update(loopsteps.longest(recorded, *window_bounds))
        rows[name] = row


async def _windows(target: Any, args: argparse.Namespace, frames: dict[str, bytes],
                   chosen: list[str], rows: dict[str, Any], prefix: str = "") -> None:
    """The baseline window, then one window per attack in `chosen`, into `rows`."""
    if not prefix:
        await set_up(target.admin, DEFAULTS)
    healthy = Healthy(target.port, args.healthy, args.interval_ms / 1000,
                      "owned-classic" if prefix else "classic")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(healthy.run)
        await trio.sleep(args.warm_up)  # joined and STABLE before anything is timed
        rows[prefix + "baseline"] = await window(target.port, args, healthy, None)
        for name in chosen:
            idle = int(PROXY_CAP * IDLE_OVER_CAP) if name == IDLE_ATTACK else 0
            rows[name] = await window(target.port, args, healthy, frames[name], idle)
            rows[name]["frame_bytes"] = len(frames[name])
        healthy.stop.set()


def _line(name: str, row: dict[str, Any]) -> str:
    attack = row.get("attack") or {}
    steps = (f"  longest loop step {row['loop_step_cpu_ms']:6.2f} ms CPU"
             if "loop_step_cpu_ms" in row else "")
    return (f"  {name:24} p50 {row.get('p50_ms', 0):7.2f}  p99 {row.get('p99_ms', 0):7.2f}  "
            f"max {row.get('max_ms', 0):8.2f} ms  n={row.get('count', 0):5}  "
            f"errors={row['errors']}  attack requests={attack.get('sent', '-')}{steps}")


def main(argv: list[str] | None = None, *, printer: Callable[[str], None] = print) -> int:
    parser = argparse.ArgumentParser(prog="connect-coordinator bench hostile",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0, help="per window")
    parser.add_argument("--warm-up", type=float, default=3.0,
                        help="seconds for the healthy members to join before timing")
    parser.add_argument("--healthy", type=int, default=10, help="healthy members")
    parser.add_argument("--interval-ms", type=float, default=20.0,
                        help="each healthy member's pause between heartbeats")
    parser.add_argument("--attackers", type=int, default=2,
                        help="attacker processes (connections) per attack")
    parser.add_argument("--attack", action="append",
                        choices=sorted([*attacks(DEFAULTS), *proxy_attacks()]),
                        help="run only this attack (repeatable; default: all)")
    parser.add_argument("--proxy-upstream", metavar="HOST:PORT|start",
                        help="the proxy target's upstream broker; `start`: a real KRaft "
                             "broker from the interop jars; default: an address where "
                             "nothing listens")
    parser.add_argument("--no-loop-steps", dest="loop_steps", action="store_false",
                        help="without timing the coordinator's event-loop steps "
                             "(bench/loopsteps.py)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    rows = trio.run(run, args)
    if args.json:
        printer(json.dumps(rows))
    else:
        printer(f"Healthy heartbeats ({args.healthy} members, every {args.interval_ms:g} ms) "
                f"while {args.attackers} attackers send each request back to back, "
                f"{args.seconds:g} s each:")
        for name, row in rows.items():
            printer(_line(name, row))
        worst = max(row.get("p99_ms", 0) for row in rows.values())
        evicted = sum(row["errors"] for row in rows.values())
        printer(f"worst p99 {worst:.2f} ms (target < 20), healthy errors {evicted} "
                f"(target 0)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
