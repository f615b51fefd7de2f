"""`connect-coordinator simulate`: fake Connect workers under chaos, checked for double runs.

The simulator creates the group's connectors through the admin API, starts N workers (in
this process, or spread over child processes when N is large), and then, one disruption at
a time, breaks something and measures how long the group takes to converge again:
STABLE, with every connector and task running on exactly one worker. At the end it checks
every unit's recorded runs for overlaps (a task on two workers at once) and writes a JSON
report.
"""

from __future__ import annotations

import argparse
import http.client
import inspect
import json
import math
import os
import random
import signal
import sys
import time
import urllib.error
import urllib.request
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from coordinator.client import Unreachable, ask_coordinator
from coordinator.units import CONNECTOR, Unit, format_unit
from coordinator.urls import open_url
from coordinator.workers.host import RemoteHost, Traffic, WorkerHost, WorkerSpec, unit_of
from protocol.messages import ConnectGroupDescribeRequest

PROG = "connect-coordinator simulate"
CHAOS_KINDS = ("kill", "bounce", "pause", "drop", "rolling", "restart", "upgrade", "downgrade")
CONVERSION_KINDS = ("upgrade", "downgrade")
CHAOS_HELP = {
    "kill": "a worker dies abruptly (no leave; its units die with it) and comes back "
            "after --downtime",
    "bounce": "a worker shuts down cleanly (stops its units, leaves) and comes back "
              "after --downtime",
    "pause": "a worker's requests hang for 1.5 session timeouts (a stopped JVM, a long GC)",
    "drop": "for 2 session timeouts every worker loses a share of its requests or of their "
            "answers (drop=SHARE, default 0.3)",
    "rolling": "every worker is bounced, one after the other",
    "restart": "the coordinator is restarted with --restart-command",
    "upgrade": "the group turns from classic into connect live: the workers that started on "
               "the new protocol, now classic, are rolled back to it one by one (the "
               "first one's join converts the group); if some worker still speaks the new "
               "protocol, all such are first rolled to classic (the group turns classic)",
    "downgrade": "the group turns from connect into classic live: every worker of the new "
                 "protocol is rolled to classic one by one (the last one's leave converts "
                 "the group); if none speaks it, the group is first upgraded",
}
CHAOS_NOTES = (
    "Rolling a worker to the other protocol stops it cleanly and starts it again at once\n"
    "with the same name and url. `upgrade` and `downgrade` need --classic-workers (a mixed\n"
    "group; naming them without is a usage error, and `all` leaves them out), a client\n"
    "assignor, and a group whose connectors were never set through the admin API (a group\n"
    "with admin connectors is never turned classic): with them, the run does not create\n"
    "its connectors through the admin API; the workers' leaders assign them, as Connect's\n"
    "leaders do from their config topic. The coordinator's group.connect.migration.policy\n"
    "must be bidirectional.")
DEFAULT_DROP_SHARE = 0.3
WORKERS_PER_PROCESS = 200  # above this, workers are spread over child processes


class SimulationError(Exception):
    """Something the user must fix before a simulation can run (bad option, no coordinator)."""


# ------------------------------------------------------------------------------ chaos spec
@dataclass(frozen=True, slots=True)
class ChaosPlan:
    kinds: tuple[str, ...] = ()
    drop_share: float = DEFAULT_DROP_SHARE
    mixed: bool = False  # `all`: every kind once, in random order, then kinds at random


    @property
    def converts(self) -> bool:
        """Whether the run rolls workers between protocols (and converts the group)."""
        return any(kind in CONVERSION_KINDS for kind in self.kinds)


def parse_chaos(spec: str | None, can_restart: bool, mixed_group: bool = False) -> ChaosPlan:
    """`none`, `all`, or a comma-separated list of kinds (`drop=0.5` sets the share).
    `mixed_group`: some workers speak the classic protocol (`upgrade`, `downgrade`)."""
    if spec is None or spec.strip() in ("", "none"):
        return ChaosPlan()
    if spec.strip() == "all":
        every = tuple(k for k in CHAOS_KINDS
                      if (k != "restart" or can_restart)
                      and (k not in CONVERSION_KINDS or mixed_group))
        return ChaosPlan(every, mixed=True)
    kinds: list[str] = []
    share = DEFAULT_DROP_SHARE
    for item in spec.split(","):
        name, _, value = item.strip().partition("=")
        if name not in CHAOS_KINDS:
            raise SimulationError(f"unknown chaos kind {name!r}; choose from "
                                  f"{', '.join(CHAOS_KINDS)}, or 'all'")
        if value:
            if name != "drop":
                raise SimulationError(f"chaos kind {name!r} takes no value")
            try:
                share = float(value)
            except ValueError:
                raise SimulationError(f"drop={value!r}: give a share between 0 and 1") \
                    from None
            if not 0 < share <= 1:
                raise SimulationError(f"drop={value}: give a share between 0 and 1")
        if name == "restart" and not can_restart:
            raise SimulationError("chaos kind 'restart' needs --restart-command")
        if name in CONVERSION_KINDS and not mixed_group:
            raise SimulationError(f"chaos kind {name!r} needs --classic-workers N "
                                  "(a mixed group)")
        if name not in kinds:
            kinds.append(name)
    return ChaosPlan(tuple(kinds), share)


# The live status line's heartbeats/s: over this many seconds of the run.
RATE_WINDOW_S = 10.0


# ------------------------------------------------------------------------------ admin API
class Admin:
    """The coordinator's admin HTTP API (blocking urllib calls, run in a thread)."""

    def __init__(self, base_url: str) -> None:
        if "://" not in base_url:
            base_url = "http://" + base_url
        self.base_url = base_url.rstrip("/")

    def _call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base_url + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with open_url(request, 5) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as error:
            raw = error.read()
            try:
                return error.code, json.loads(raw)
            except ValueError:
                return error.code, raw.decode(errors="replace")

    async def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        return await trio.to_thread.run_sync(self._call, method, path, body)

    async def checked(self, method: str, path: str, body: Any = None) -> Any:
        try:
            status, answer = await self.call(method, path, body)
        except (OSError, ValueError) as error:
            raise SimulationError(f"admin API {self.base_url}: {error}") from None
        if status != 200:
            message = answer.get("message", answer) if isinstance(answer, dict) else answer
            raise SimulationError(f"admin API {method} {path}: HTTP {status}: {message}")
        return answer

    async def group(self, group: str) -> dict[str, Any] | None:
        """The group's view, or None while the coordinator cannot say (restarting, loading)."""
        try:
            status, answer = await self.call("GET", f"/groups/{group}")
        except (OSError, ValueError):
            return None
        return answer if status == 200 and isinstance(answer, dict) else None

    async def wait_ready(self, timeout_s: float, unreachable_s: float = 5.0) -> None:
        """Waits while the coordinator loads its log (/readyz says 503); nobody listening
        for `unreachable_s`, or something that does not answer in HTTP, ends the run."""
        hint = ("--admin takes the coordinator's admin HTTP listener (serve --admin-listen, "
                "default http://127.0.0.1:19093)")
        started = trio.current_time()
        last = "no answer"
        while trio.current_time() < started + timeout_s:
            try:
                status, answer = await self.call("GET", "/readyz")
                if status == 200:
                    return
                last = f"HTTP {status} {answer}"
            except (http.client.BadStatusLine, ConnectionResetError) as error:
                # A Kafka listener closes the connection on an HTTP request.
                raise SimulationError(
                    f"{self.base_url} did not answer in HTTP ({error or type(error).__name__}):"
                    f" that looks like the Kafka port, not the admin port; {hint}") from None
            except (OSError, ValueError) as error:
                reason = getattr(error, "reason", None) or error
                reason = getattr(reason, "strerror", None) or reason
                if trio.current_time() >= started + unreachable_s:
                    raise SimulationError(f"cannot reach {self.base_url} ({reason}): is the "
                                          f"coordinator running there? {hint}") from None
                last = str(reason)
            await trio.sleep(0.2)
        raise SimulationError(f"the coordinator's admin API {self.base_url} was not ready "
                              f"within {timeout_s:.0f} s ({last}); {hint}")


# ------------------------------------------------------------------------------ the run
async def _settled(value: Any) -> Any:
    """A local host answers at once, a remote one with an awaitable; either way the value."""
    return await value if inspect.isawaitable(value) else value


@dataclass(slots=True)
class Disruption:
    kind: str
    target: str | None
    started_s: float  # since the simulation started
    action_s: float = 0.0  # how long the fault itself lasted
    converged: bool = False
    time_to_converge_s: float | None = None  # from the start of the disruption
    detail: str = ""
    group_type: str | None = None  # when it started: `connect` or `classic`

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "target": self.target, "group_type": self.group_type,
                "started_s": round(self.started_s, 3), "action_s": round(self.action_s, 3),
                "converged": self.converged,
                "time_to_converge_s": None if self.time_to_converge_s is None
                else round(self.time_to_converge_s, 3),
                "detail": self.detail}


@dataclass(slots=True)
class Snapshot:
    """One look at the group and at what the workers run."""

    state: str | None
    group_epoch: int | None  # a classic group's generation
    members: int
    running: dict[str, list[str]]
    traffic: Traffic
    failures: list[str] = field(default_factory=list)
    group_type: str | None = None  # `connect` or `classic`

    def doubled(self) -> dict[str, list[str]]:
        return {unit: holders for unit, holders in self.running.items() if len(holders) > 1}


@dataclass(frozen=True, slots=True)
class Options:
    host: str
    port: int
    admin: str
    group: str
    workers: int
    connectors: int
    tasks_per_connector: int
    duration_s: float
    assignor: str
    chaos: ChaosPlan
    seed: int
    report: Path | None
    processes: int
    restart_command: str | None
    downtime_s: float
    chaos_interval_s: float
    converge_timeout_s: float | None
    rebalance_delay_ms: int | None
    rebalance_timeout_ms: int
    static: bool
    group_config: dict[str, Any]
    progress: bool
    classic_workers: int = 0


class Simulation:
    def __init__(self, options: Options) -> None:
        self.options = options
        self.admin = Admin(options.admin)
        self.rng = random.Random(options.seed)
        self.connectors = {f"connector-{index}": options.tasks_per_connector
                           for index in range(options.connectors)}
        # Every unit the group runs, read back from the coordinator in `prepare`.
        self.units: frozenset[Unit] = frozenset()
        self.unit_names: frozenset[str] = frozenset()
        self.names = [f"worker-{index:0{len(str(options.workers - 1))}d}"
                      for index in range(options.workers)]
        self.hosts: list[Any] = []
        self.host_of: dict[str, Any] = {}
        self.disruptions: list[Disruption] = []
        self.initial_convergence_s: float | None = None
        self.started = 0.0
        self.last: Snapshot | None = None
        self.last_at = -math.inf
        self.restart_failures: list[str] = []
        # Who speaks the classic protocol now (the last N workers at the start), and who
        # `upgrade` rolls back to the new protocol: those that started on it.
        first_classic = len(self.names) - options.classic_workers
        self.classic_now = set(self.names[first_classic:])
        self.upgraders = self.names[:first_classic] or self.names[:1]
        self.session_timeout_ms = 10_000
        self.started_monotonic_ms = 0.0  # the same moment as `started`, on the shared clock
        self.interrupted = False  # by Ctrl-C: the report covers the run up to then

    def elapsed(self) -> float:
        return trio.current_time() - self.started

    # -------------------------------------------------------------- set-up
    async def prepare(self) -> WorkerSpec:
        options = self.options
        # Both listeners are checked before anything is created in the group.
        await self.admin.wait_ready(30)
        try:
            await ask_coordinator(options.host, options.port,
                                  ConnectGroupDescribeRequest(group_ids=()), 10.0)
        except Unreachable as error:
            raise SimulationError(str(error)) from None
        group = options.group
        from_config_topic = options.chaos.converts
        if from_config_topic:
            # Only a group whose units come from its workers' assignments can turn classic.
            _status, before = await self.admin.call("GET", f"/groups/{group}")
            if isinstance(before, dict) and before.get("units_source") == "admin":
                raise SimulationError(
                    f"group {group!r} has connectors set through the admin API, so it can "
                    "never turn classic: chaos upgrade/downgrade needs another --group")
        else:
            for name, tasks in self.connectors.items():
                await self.admin.checked("PUT", f"/groups/{group}/connectors/{name}",
                                         {"tasks": tasks})
        config = dict(options.group_config)
        if options.rebalance_delay_ms is not None and options.assignor.startswith("server:"):
            config.setdefault("scheduled.rebalance.max.delay.ms", options.rebalance_delay_ms)
        if config or from_config_topic:
            # (an empty config creates the group, to read its effective config below)
            await self.admin.checked("PUT", f"/groups/{group}/config", config)
        if from_config_topic:
            self.units = frozenset(
                (name, task) for name, tasks in self.connectors.items()
                for task in [CONNECTOR, *range(tasks)])
        else:
            # The group may run connectors of its own besides ours (an earlier run with
            # more connectors, say): convergence means every unit of the group runs once.
            view = await self.admin.checked("GET", f"/groups/{group}")
            held = view["connectors_and_tasks"]
            self.units = frozenset(
                [(name, CONNECTOR) for name in held["connectors"]]
                + [(task["connector"], task["task"]) for task in held["tasks"]])
        self.unit_names = frozenset(format_unit(unit) for unit in self.units)
        extra = sorted({name for name, _ in self.units} - set(self.connectors))
        if extra:
            self.say(f"the group also runs {len(extra)} connector(s) not created by this "
                     f"run ({', '.join(extra[:5])}{', ...' if len(extra) > 5 else ''}); "
                     "they count towards convergence")
        effective = (await self.admin.checked("GET", f"/groups/{group}/config"))["effective"]
        self.session_timeout_ms = int(effective["connect.session.timeout.ms"])
        delay = options.rebalance_delay_ms
        if delay is None:
            delay = int(effective["scheduled.rebalance.max.delay.ms"])
        return WorkerSpec(
            host=options.host, port=options.port, group=group, assignor=options.assignor,
            session_timeout_ms=self.session_timeout_ms,
            rebalance_timeout_ms=options.rebalance_timeout_ms, rebalance_delay_ms=delay,
            static=options.static,
            # The last N workers speak the classic protocol (bridged into the group).
            classic_workers=tuple(sorted(self.classic_now)),
            units=tuple(sorted(self.units)), units_from_config_topic=from_config_topic)

    async def open_hosts(self, nursery: trio.Nursery, spec: WorkerSpec) -> None:
        processes = self.options.processes
        if processes <= 1:
            host: Any = WorkerHost(spec, self.names, nursery, self.options.seed)
            self.hosts = [host]
        else:
            shares = [self.names[index::processes] for index in range(processes)]
            for index, names in enumerate(shares):
                remote = await RemoteHost.open(nursery, spec, names,
                                               self.options.seed * 1000 + index)
                self.hosts.append(remote)
        for index, host in enumerate(self.hosts):
            for name in self.names[index::len(self.hosts)]:
                self.host_of[name] = host

    # -------------------------------------------------------------- looking
    async def snapshot(self) -> Snapshot:
        view = await self.admin.group(self.options.group)
        running: dict[str, list[str]] = {}
        traffic = Traffic()
        failures: list[str] = []
        for host in self.hosts:
            status = await _settled(host.status())
            for unit, holders in status["running"].items():
                running.setdefault(unit, []).extend(holders)
            traffic.add(status["traffic"])
            failures.extend(status["failures"])
        self.last_at = trio.current_time()
        self.last = Snapshot(
            state=view["state"] if view else None,
            group_epoch=view.get("group_epoch", view.get("generation")) if view else None,
            members=len(view["members"]) if view else 0,
            running=running, traffic=traffic, failures=failures,
            group_type=view.get("type") if view else None)
        return self.last

    def expected_type(self) -> str | None:
        """The group's type once converged, when the run rolls workers between protocols:
        `classic` with every worker classic, else `connect`."""
        if not self.options.chaos.converts:
            return None
        return "classic" if self.classic_now == set(self.names) else "connect"

    def is_converged(self, snap: Snapshot) -> bool:
        # (the admin API spells both group types' states alike)
        expected = self.expected_type()
        return (snap.state == "STABLE" and set(snap.running) == self.unit_names
                and all(len(holders) == 1 for holders in snap.running.values())
                and (expected is None or snap.group_type == expected))

    async def wait_converged(self, timeout_s: float) -> float | None:
        """Seconds until the group converged (None if it did not within `timeout_s`)."""
        start = trio.current_time()
        while trio.current_time() - start < timeout_s:
            if self.is_converged(await self.snapshot()):
                return trio.current_time() - start
            await trio.sleep(0.1)
        return None

    def converge_timeout_s(self) -> float:
        if self.options.converge_timeout_s is not None:
            return self.options.converge_timeout_s
        delay = 0 if self.options.rebalance_delay_ms is None else self.options.rebalance_delay_ms
        return max(30.0, 6 * self.session_timeout_ms / 1000 + delay / 1000)

    # -------------------------------------------------------------- chaos
    def kinds(self) -> Any:
        plan = self.options.chaos
        if plan.mixed:
            first = list(plan.kinds)
            self.rng.shuffle(first)
            yield from first
            while True:
                yield self.rng.choice(plan.kinds)
        while True:
            yield from plan.kinds

    async def disrupt(self, kind: str) -> Disruption:
        session_s = self.session_timeout_ms / 1000
        target = self.rng.choice(self.names) if kind in ("kill", "bounce", "pause") else None
        disruption = Disruption(kind, target, self.elapsed(),
                                group_type=self.last.group_type if self.last else None)
        began = trio.current_time()
        downtime = self.options.downtime_s * self.rng.uniform(0.5, 1.5)
        if kind in ("kill", "bounce"):
            assert target is not None
            await self.host_of[target].restart(target, downtime, graceful=kind == "bounce")
            disruption.detail = f"back after {downtime:.1f} s"
        elif kind == "pause":
            assert target is not None
            seconds = 1.5 * session_s
            await _settled(self.host_of[target].pause(target, seconds))
            await trio.sleep(seconds)
            disruption.detail = f"paused {seconds:.1f} s"
        elif kind == "drop":
            share, seconds = self.options.chaos.drop_share, 2 * session_s
            for host in self.hosts:
                await _settled(host.drop(share, seconds))
            await trio.sleep(seconds)
            disruption.detail = f"{share:.0%} of requests lost for {seconds:.1f} s"
        elif kind == "rolling":
            for name in self.names:
                await self.host_of[name].restart(name, 0.1, graceful=True)
            disruption.detail = f"{len(self.names)} workers bounced one by one"
        elif kind == "restart":
            disruption.detail = await self.restart_coordinator()
        elif kind in CONVERSION_KINDS:
            disruption.detail = await self.convert(kind)
        disruption.action_s = trio.current_time() - began
        waited = await self.wait_converged(self.converge_timeout_s())
        if waited is not None:
            disruption.converged = True
            disruption.time_to_converge_s = disruption.action_s + waited
        else:
            disruption.detail += "; " + await self.diagnose()
        return disruption

    async def diagnose(self) -> str:
        """Why the group is not converged: units not running or doubled, and where the
        coordinator places them."""
        snap = self.last or await self.snapshot()
        view = await self.admin.group(self.options.group) or {}
        placed: dict[str, list[str]] = {}
        for member in view.get("members", []):
            held = member.get("assigned") or member.get("holds") or {}
            units = [name for name in held.get("connectors", [])] + [
                f"{task['connector']}-{task['task']}" for task in held.get("tasks", [])]
            for unit in units:
                placed.setdefault(unit, []).append(str(member.get("worker_url", "?")))
        missing = sorted(self.unit_names - set(snap.running))
        parts = [f"group {view.get('type', '?')} {snap.state or '?'}"]
        parts += [f"{unit} runs nowhere (coordinator: {placed.get(unit) or 'nobody'})"
                  for unit in missing[:5]]
        parts += [f"{unit} runs on {holders}" for unit, holders in snap.doubled().items()][:5]
        return ", ".join(parts)

    async def roll(self, names: list[str], classic: bool) -> None:
        """Roll workers to the classic protocol (or to the new one), one after the other."""
        for name in names:
            await _settled(self.host_of[name].switch(name, classic))
            if classic:
                self.classic_now.add(name)
            else:
                self.classic_now.discard(name)
            await trio.sleep(0.1)

    async def convert(self, kind: str) -> str:
        """`upgrade` or `downgrade`: roll workers so that the group converts that way,
        first converting it the other way if it is not in the state to start from."""
        steps = []
        new_protocol = [name for name in self.names if name not in self.classic_now]
        if kind == "downgrade" and not new_protocol:
            await self.roll(self.upgraders, classic=False)
            converged = await self.wait_converged(self.converge_timeout_s()) is not None
            steps.append(f"first upgraded ({'converged' if converged else 'NOT converged'})")
            new_protocol = list(self.upgraders)
        if kind == "upgrade" and new_protocol:
            await self.roll(new_protocol, classic=True)
            converged = await self.wait_converged(self.converge_timeout_s()) is not None
            steps.append(f"first downgraded ({'converged' if converged else 'NOT converged'})")
        before = (await self.snapshot()).group_type
        if kind == "upgrade":
            await self.roll(self.upgraders, classic=False)
            steps.append(f"{len(self.upgraders)} worker(s) rolled to the new protocol")
        else:
            await self.roll(new_protocol, classic=True)
            steps.append(f"{len(new_protocol)} worker(s) rolled to classic")
        return "; ".join(steps) + f"; group {before or '?'} -> {self.expected_type()}"

    async def restart_coordinator(self) -> str:
        command = self.options.restart_command
        assert command is not None
        result = await trio.run_process(command, shell=True, check=False,
                                        capture_stdout=True, capture_stderr=True)
        if result.returncode != 0:
            message = (f"restart command exited {result.returncode}: "
                       f"{result.stderr.decode(errors='replace').strip()[-300:]}")
            self.restart_failures.append(message)
            return message
        return f"ran {command!r}"

    async def chaos_loop(self, deadline: float) -> None:
        if not self.options.chaos.kinds:
            await trio.sleep_until(deadline)
            return
        kinds = self.kinds()
        plan = self.options.chaos
        while True:
            gap = self.options.chaos_interval_s * self.rng.uniform(0.5, 1.5)
            # Every kind asked for runs at least once, even past the deadline.
            owed = len({d.kind for d in self.disruptions}) < len(plan.kinds)
            if trio.current_time() + gap >= deadline and not owed:
                break
            await trio.sleep(gap)
            disruption = await self.disrupt(next(kinds))
            self.disruptions.append(disruption)
            self.say(f"{disruption.kind}{' ' + disruption.target if disruption.target else ''}"
                     f": {disruption.detail}; "
                     + (f"converged after {disruption.time_to_converge_s:.1f} s"
                        if disruption.converged else "did NOT converge"))
        await trio.sleep_until(max(deadline, trio.current_time()))

    # -------------------------------------------------------------- terminal
    def say(self, line: str) -> None:
        if self.options.progress:
            end = "\n"
            if sys.stderr.isatty():
                line = "\r\x1b[K" + line
            print(f"[{self.elapsed():6.1f}s] {line}", file=sys.stderr, end=end, flush=True)

    async def show_progress(self) -> None:
        interactive = sys.stderr.isatty()
        every = 1.0 if interactive else 5.0
        # Workers heartbeat every few seconds, so a count per second comes in bursts: the
        # rate is taken over the last RATE_WINDOW_S of snapshots.
        counts: deque[tuple[float, int]] = deque()
        while True:
            await trio.sleep(every)
            snap = self.last
            if snap is None or not self.options.progress:
                continue
            running = sum(1 for unit in snap.running if unit in self.unit_names)
            if not counts or counts[-1][0] != self.last_at:
                counts.append((self.last_at, snap.traffic.heartbeats))
            while len(counts) > 2 and counts[-1][0] - counts[1][0] >= RATE_WINDOW_S:
                counts.popleft()
            (first_at, first), (last_at, last) = counts[0], counts[-1]
            rate = (last - first) / (last_at - first_at) if last_at > first_at else 0.0
            line = (f"[{self.elapsed():6.1f}s] group {snap.state or '?'} epoch "
                    f"{snap.group_epoch if snap.group_epoch is not None else '?'}, "
                    f"{snap.members} members, {running}/{len(self.units)} units running, "
                    f"{len(snap.doubled())} doubled, {len(self.disruptions)} disruptions, "
                    f"{rate:.1f} heartbeats/s, {sum(snap.traffic.errors.values())} errors")
            if interactive:
                print("\r\x1b[K" + line, file=sys.stderr, end="", flush=True)
            else:
                print(line, file=sys.stderr, flush=True)

    async def poll(self) -> None:
        """Keep `last` fresh for the progress line (`wait_converged` polls faster)."""
        while True:
            if trio.current_time() - self.last_at >= 0.5:
                await self.snapshot()
            await trio.sleep(0.5)

    # -------------------------------------------------------------- the whole run
    async def run(self) -> dict[str, Any]:
        options = self.options
        self.started = trio.current_time()
        spec = await self.prepare()
        self.started = trio.current_time()
        self.started_monotonic_ms = time.monotonic_ns() / 1e6
        async with trio.open_nursery() as nursery:
            await self.open_hosts(nursery, spec)
            self.say(f"{options.workers} workers ({options.processes} process"
                     f"{'es' if options.processes > 1 else ''}), {len(self.units)} units, "
                     f"assignor {options.assignor}, chaos "
                     f"{','.join(options.chaos.kinds) or 'none'}")
            # Ctrl-C ends the run's middle, not the run: the workers still stop and the
            # report still tells what ran (marked interrupted); a second Ctrl-C ends it all.
            running = trio.CancelScope()
            await nursery.start(self._interrupt_on_sigint, running)
            watchers = trio.CancelScope()
            settled: float | None = None
            with running:
                for name in self.names:
                    await self.host_of[name].start(name)

                async def watch() -> None:
                    with watchers:
                        async with trio.open_nursery() as inner:
                            inner.start_soon(self.show_progress)
                            inner.start_soon(self.poll)

                nursery.start_soon(watch)
                self.initial_convergence_s = await self.wait_converged(
                    self.converge_timeout_s())
                self.say("converged" if self.initial_convergence_s is not None
                         else "the group did NOT converge after the workers joined")
                await self.chaos_loop(self.started + options.duration_s)
                settled = await self.wait_converged(self.converge_timeout_s())
            watchers.cancel()
            if self.interrupted:
                self.say("interrupted: stopping the workers")
                await self.snapshot()
            final = self.last
            if sys.stderr.isatty() and options.progress:
                print(file=sys.stderr)
            for host in self.hosts:
                await host.close()
            runs: list[dict[str, Any]] = []
            for host in self.hosts:
                runs.extend(await _settled(host.runs()))
                if isinstance(host, RemoteHost):
                    await host.disconnect()
            nursery.cancel_scope.cancel()
        assert final is not None
        return self.report(final, settled is not None, runs)

    async def _interrupt_on_sigint(self, running: trio.CancelScope,
                                   task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                                   ) -> None:
        with trio.open_signal_receiver(signal.SIGINT) as signals:
            task_status.started()
            async for _ in signals:
                if self.interrupted:
                    raise KeyboardInterrupt
                self.interrupted = True
                running.cancel()

    def report(self, final: Snapshot, converged: bool,
               runs: list[dict[str, Any]]) -> dict[str, Any]:
        options = self.options
        violations = find_violations(runs, self.started_monotonic_ms)
        ttc = [d.time_to_converge_s for d in self.disruptions]
        return {
            "interrupted": self.interrupted,
            "violations": violations,
            "converged": converged,
            "disruptions": [d.to_json() for d in self.disruptions],
            "time_to_converge_s": [None if t is None else round(t, 3) for t in ttc],
            "errors": dict(sorted(final.traffic.errors.items())),
            "heartbeats": final.traffic.heartbeats,
            "heartbeats_per_s": round(final.traffic.heartbeats / max(self.elapsed(), 1e-9), 1),
            "requests": final.traffic.requests,
            "transport_errors": final.traffic.transport_errors,
            "dropped": final.traffic.dropped,
            "compute_assignment": final.traffic.compute_assignment,
            "initial_convergence_s": None if self.initial_convergence_s is None
            else round(self.initial_convergence_s, 3),
            "final": {"state": final.state, "group_epoch": final.group_epoch,
                      "group_type": final.group_type,
                      "classic_workers": len(self.classic_now),
                      "members": final.members,
                      "units_running": sum(1 for u in final.running if u in self.unit_names),
                      "units": len(self.units)},
            "worker_failures": final.failures + self.restart_failures,
            "elapsed_s": round(self.elapsed(), 3),
            "config": {
                "group": options.group, "workers": options.workers,
                "connectors": options.connectors,
                "tasks_per_connector": options.tasks_per_connector,
                "duration_s": options.duration_s, "assignor": options.assignor,
                "chaos": list(options.chaos.kinds), "seed": options.seed,
                "processes": options.processes, "session_timeout_ms": self.session_timeout_ms,
            },
        }


def find_violations(runs: list[dict[str, Any]], origin_ms: float) -> list[dict[str, Any]]:
    """Pairs of runs of one unit on two workers at overlapping times (seconds from
    `origin_ms` on the machine's monotonic clock)."""
    by_unit: dict[Unit, list[dict[str, Any]]] = {}
    for run in runs:
        by_unit.setdefault(unit_of(run["unit"]), []).append(run)
    found = []
    for unit, unit_runs in sorted(by_unit.items()):
        unit_runs.sort(key=lambda run: run["started_ms"])
        for index, first in enumerate(unit_runs):
            first_end = _end_ms(first)
            for second in unit_runs[index + 1:]:
                if second["started_ms"] >= first_end:
                    break
                overlap_end = min(first_end, _end_ms(second))
                found.append({
                    "unit": format_unit(unit),
                    "runs": [_interval(first, origin_ms), _interval(second, origin_ms)],
                    "overlap_s": [_seconds(second["started_ms"], origin_ms),
                                  None if math.isinf(overlap_end)
                                  else _seconds(overlap_end, origin_ms)],
                })
    return found


def _end_ms(run: dict[str, Any]) -> float:
    """When a run stopped; infinity while it still runs."""
    return math.inf if run["stopped_ms"] is None else float(run["stopped_ms"])


def _seconds(ms: float, origin_ms: float) -> float:
    return round((ms - origin_ms) / 1000, 3)


def _interval(run: dict[str, Any], origin_ms: float) -> dict[str, Any]:
    stopped = run["stopped_ms"]
    return {"worker": run["worker"], "from_s": _seconds(run["started_ms"], origin_ms),
            "to_s": None if stopped is None else _seconds(stopped, origin_ms)}


# ------------------------------------------------------------------------------ command line
def build_parser() -> argparse.ArgumentParser:
    chaos_lines = "\n".join(f"  {kind:<9} {text}" for kind, text in CHAOS_HELP.items())
    parser = argparse.ArgumentParser(
        prog=PROG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run fake Kafka Connect workers against a coordinator, break things on "
                    "purpose, and check that no connector or task ever ran on two workers "
                    "at once and that the group converges after every disruption.",
        epilog=f"chaos kinds (--chaos KIND[,KIND...] or all):\n{chaos_lines}\n\n"
               f"{CHAOS_NOTES}\n\n"
               "Exit status: 0 when there were no violations and the group converged after "
               "every disruption and at the end, 1 otherwise, 2 on a usage error.")
    parser.add_argument("--bootstrap", default="127.0.0.1:19092", metavar="HOST:PORT",
                        help="the coordinator's KRPC listener (default %(default)s)")
    parser.add_argument("--admin", default="http://127.0.0.1:19093", metavar="URL",
                        help="the coordinator's admin API (default %(default)s)")
    parser.add_argument("--group", default="connect-cluster",
                        help="group id (default %(default)s)")
    parser.add_argument("--workers", type=int, default=3, metavar="N",
                        help="simulated workers (default %(default)s)")
    parser.add_argument("--connectors", type=int, default=2, metavar="C",
                        help="connectors to create through the admin API (default %(default)s)")
    parser.add_argument("--tasks-per-connector", type=int, default=4, metavar="T",
                        help="tasks of each connector (default %(default)s)")
    parser.add_argument("--duration", type=float, default=60.0, metavar="S",
                        help="seconds of chaos after the group first converged; then the "
                             "simulator waits for a final convergence (default %(default)s)")
    parser.add_argument("--assignor", default="client:incremental-cooperative",
                        metavar="KIND:NAME",
                        help="client:incremental-cooperative, client:eager or server:NAME "
                             "(a server-side assignor, e.g. server:balanced) "
                             "(default %(default)s)")
    parser.add_argument("--chaos", default="none", metavar="SPEC",
                        help="none, all (every kind at least once, then kinds at random), "
                             "or kinds separated by commas, used in turn (each at least "
                             "once, even past --duration) (default %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default %(default)s)")
    parser.add_argument("--report", type=Path, metavar="FILE.json",
                        help="write the JSON report here (it is also summed up on stdout)")
    parser.add_argument("--processes", type=int, metavar="P",
                        help=f"worker processes (default: 1 up to {WORKERS_PER_PROCESS} "
                             "workers, else one per CPU)")
    parser.add_argument("--restart-command", metavar="CMD",
                        help="shell command that restarts the coordinator (for --chaos "
                             "restart), e.g. 'docker restart coordinator'")
    parser.add_argument("--downtime", type=float, default=2.0, metavar="S",
                        help="how long a killed or bounced worker stays away, +-50%% "
                             "(default %(default)s)")
    parser.add_argument("--chaos-interval", type=float, default=5.0, metavar="S",
                        help="quiet seconds between disruptions, +-50%% (default %(default)s)")
    parser.add_argument("--converge-timeout", type=float, metavar="S",
                        help="how long to wait for convergence after a disruption "
                             "(default: max(30, 6 session timeouts + the rebalance delay))")
    parser.add_argument("--rebalance-delay-ms", type=int, metavar="MS",
                        help="scheduled.rebalance.max.delay.ms: the incremental cooperative "
                             "assignor's delay; with a server assignor it is set as the "
                             "group's config (default: the group's config)")
    parser.add_argument("--rebalance-timeout-ms", type=int, default=60_000, metavar="MS",
                        help="the workers' rebalance timeout (default %(default)s)")
    parser.add_argument("--classic-workers", type=int, default=0, metavar="N",
                        help="of the workers, N speak Kafka's classic group protocol "
                             "(JoinGroup/SyncGroup), as released Connect workers do "
                             "(default %(default)s)")
    parser.add_argument("--static", action="store_true",
                        help="static members: each worker's name is its instance id")
    parser.add_argument("--group-config", action="append", default=[], metavar="KEY=VALUE",
                        help="set a group config key through the admin API before starting, "
                             "e.g. connect.session.timeout.ms=3000 (repeatable)")
    parser.add_argument("--quiet", action="store_true", help="no live progress on stderr")
    return parser


def _host_port(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise SimulationError(f"--bootstrap {value!r}: expected HOST:PORT")
    return host, int(port)


def _config_value(raw: str) -> Any:
    lowered = raw.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    try:
        return int(raw)
    except ValueError:
        return raw


def options_from(args: argparse.Namespace) -> Options:
    host, port = _host_port(args.bootstrap)
    for name in ("workers", "connectors", "tasks_per_connector"):
        if getattr(args, name) < (1 if name == "workers" else 0):
            raise SimulationError(f"--{name.replace('_', '-')} must be at least "
                                  f"{1 if name == 'workers' else 0}")
    if args.duration < 0 or args.downtime < 0 or args.chaos_interval <= 0:
        raise SimulationError("--duration and --downtime must not be negative, "
                              "--chaos-interval must be positive")
    kind, _, name = args.assignor.partition(":")
    if kind not in ("client", "server") or not name or (
            kind == "client" and name not in ("incremental-cooperative", "eager")):
        raise SimulationError(f"--assignor {args.assignor!r}: use "
                              "client:incremental-cooperative, client:eager or server:NAME")
    group_config = {}
    for item in args.group_config:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SimulationError(f"--group-config {item!r}: expected KEY=VALUE")
        group_config[key.strip()] = _config_value(value.strip())
    processes = args.processes
    if processes is None:
        processes = 1 if args.workers <= WORKERS_PER_PROCESS else min(
            os.cpu_count() or 1, math.ceil(args.workers / WORKERS_PER_PROCESS))
    if processes < 1:
        raise SimulationError("--processes must be at least 1")
    if not 0 <= args.classic_workers <= args.workers:
        raise SimulationError("--classic-workers must be between 0 and --workers")
    chaos = parse_chaos(args.chaos, args.restart_command is not None,
                        mixed_group=args.classic_workers > 0)
    if chaos.converts and kind == "server":
        raise SimulationError("chaos upgrade/downgrade needs a client assignor: a classic "
                              "group's units come from its workers' own assignments")
    return Options(
        host=host, port=port, admin=args.admin, group=args.group, workers=args.workers,
        connectors=args.connectors, tasks_per_connector=args.tasks_per_connector,
        duration_s=args.duration, assignor=args.assignor,
        chaos=chaos, seed=args.seed,
        report=args.report, processes=min(processes, args.workers),
        restart_command=args.restart_command, downtime_s=args.downtime,
        chaos_interval_s=args.chaos_interval, converge_timeout_s=args.converge_timeout,
        rebalance_delay_ms=args.rebalance_delay_ms,
        rebalance_timeout_ms=args.rebalance_timeout_ms, static=args.static,
        group_config=group_config, progress=not args.quiet,
        classic_workers=args.classic_workers)


def summary(report: dict[str, Any]) -> list[str]:
    ttc = [t for t in report["time_to_converge_s"] if t is not None]
    lines = [f"interrupted after {report['elapsed_s']:.1f} s: what ran until then"
             ] if report.get("interrupted") else []
    lines += [
        f"violations: {len(report['violations'])}",
        f"converged: {report['converged']}",
        f"disruptions: {len(report['disruptions'])} ("
        + ", ".join(f"{kind} {count}" for kind, count in sorted(Counter(
            d["kind"] for d in report["disruptions"]).items())) + ")",
    ]
    if ttc:
        ordered = sorted(ttc)
        lines.append(f"time to converge: median {ordered[len(ordered) // 2]:.1f} s, "
                     f"max {ordered[-1]:.1f} s")
    not_converged = [d for d in report["disruptions"] if not d["converged"]]
    for disruption in not_converged:
        lines.append(f"  did not converge after {disruption['kind']} at "
                     f"{disruption['started_s']:.1f} s")
    lines.append(f"heartbeats: {report['heartbeats']} ({report['heartbeats_per_s']}/s), "
                 f"errors: {report['errors'] or 'none'}")
    for violation in report["violations"][:10]:
        first, second = violation["runs"]
        lines.append(f"  VIOLATION {violation['unit']}: on {first['worker']} "
                     f"[{first['from_s']}, {first['to_s']}] and {second['worker']} "
                     f"[{second['from_s']}, {second['to_s']}]")
    for failure in report["worker_failures"][:10]:
        lines.append(f"  failure: {failure}")
    return lines


def passed(report: dict[str, Any]) -> bool:
    return (not report["violations"] and report["converged"]
            and all(d["converged"] for d in report["disruptions"]))


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        options = options_from(args)
    except SimulationError as error:
        parser.error(str(error))
    from coordinator.logs import configure_logging

    # stdout is the summary's; the workers' own logs (warnings only) go to stderr.
    configure_logging("warning")
    simulation = Simulation(options)
    try:
        report = trio.run(simulation.run)
    except BaseException as raised:  # noqa: B036 - trio's groups hold what the run raised
        leaves = _leaves(raised)
        failure = next((leaf for leaf in leaves if isinstance(leaf, SimulationError)), None)
        if failure is not None:
            print(f"{PROG}: {failure}", file=sys.stderr)
            return 1
        if leaves and all(isinstance(leaf, KeyboardInterrupt) for leaf in leaves):
            print(f"{PROG}: interrupted", file=sys.stderr)
            return 130
        raise
    if options.report is not None:
        options.report.parent.mkdir(parents=True, exist_ok=True)
        options.report.write_text(json.dumps(report, indent=2) + "\n")
    for line in summary(report):
        print(line)
    if report["interrupted"]:
        return 130
    return 0 if passed(report) else 1


def _leaves(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in _leaves(inner)]
    return [error]


if __name__ == "__main__":
    sys.exit(main())
