"""Stable-heartbeat throughput and latency over real TCP, driven by the worker library.

Who runs where (separate OS processes, so the load's CPU is not the coordinator's):

* the coordinator: `connect-coordinator serve` on free ports with a temporary data dir
  (`--in-process` runs it inside the bench process instead; `--bootstrap` and `--admin` aim
  at one that is already running);
* PROCESSES load processes. Between them they run GROUPS x WORKERS_PER_GROUP trio
  `Worker`s (coordinator/workers: the sans-IO `WorkerState` in its trio shell), one TCP
  connection each, spread so that every process runs workers of every group. Each worker
  heartbeats every INTERVAL_MS after its previous answer (`heartbeat_interval_override_ms`
  instead of the coordinator's interval; 0: back to back);
* this process: creates each group's connectors through the admin API, waits until every
  group and every member is STABLE, then opens measurement windows of DURATION seconds in
  every load process at the same wall-clock moment.

`--load-client raw` runs members that only heartbeat instead (`heartbeat_member`: join,
acknowledge each new assignment at once, then a stable heartbeat every INTERVAL_MS +-10%),
on one connection each: the latency is then the coordinator's and the connection's. The
worker library's own work in a load process (units, session watch, 100 workers' tasks)
added tail latency of its own (a p99 of 10.9 ms at 333 heartbeats a second, where raw
members at 300 a second see 1.2-1.9 ms), which matters when the question is what the
coordinator adds.

Only stable heartbeats are measured: sent with the member's epoch, answered without an
error and without an assignment. Whatever else a window sees is counted: `errors` by error
code (REQUEST_TIMEOUT and TRANSPORT for answers that never came) and `unstable` (answers
that carried an assignment, i.e. a rebalance happened). Latency runs from the worker
calling `KafkaClient.request` to the decoded answer, in the load process, so it includes
the client's own scheduling.

`--assignor-load` (the in-flight target in BENCHMARKS.md): before the heartbeat load
starts, a separate group of
ASSIGNOR_WORKERS lightweight members (raw `KafkaClient` joins on a few connections, naming
the server assignor `balanced`, heartbeating every 20 s) gets ASSIGNOR_CONNECTORS
connectors holding ASSIGNOR_TASKS tasks in all, with `connect.assignment.interval.ms` 0.
Every round then measures a baseline window (no assignor run anywhere, and every member of
that group STABLE at its target: they heartbeat every 20 s, so the bench wakes them to get
there first, instead of letting them write their records during the window) followed by
(`--assignor-windows`, default both):

* a continuously loaded window: the bench resizes one of that group's connectors (N <-> N+1
  tasks) every ASSIGNOR_PUT_INTERVAL_MS. Each resize bumps the group epoch; the coordinator
  keeps at most one offloaded run per group in flight and starts the next as soon as one
  lands, so a `balanced` run of the whole group is in flight for most of the window. The
  report puts it next to the baseline with the p99 ratio and, from the coordinator's
  /metrics, how many runs completed and what share of the time one was running.
* an in-flight window, the in-flight target as written: the same resize, but only every
  IN_FLIGHT_PUT_INTERVAL_MS, so one run at a time is in flight now and then. The
  coordinator logs when each run was in flight (`assignor_run_landed`: submitted when the
  core handed it over, landed when its outcome was applied and its records were durable),
  every load process sends back the wall-clock send time of each timed heartbeat, and each
  heartbeat of the window is sorted by that alone: sent while a run was in flight (ends
  included), or not (`between_runs`). The report gives p50/p99/p99.9 and counts for those
  and for the baseline windows, and the p99 ratio in flight / baseline (target < 1.2).
  `p99_ratio_between_runs` is in flight / between runs: the same window's load (resizes,
  landings, members moving to new epochs) without a run in flight, so the part of the
  ratio that the run being in flight makes. `where_in_flight` sorts the in-flight ones by
  when in their run's flight they were sent (its first 2 ms, the pool computing, the last
  2 ms before the result is back on the event loop, the landing) and gives the share of
  each slower than the baseline's p99 (1% in the baseline) and each one's p99 in ms:
  where the run costs them.
  It needs the coordinator's log or runtime, so not `--bootstrap`.

The load processes collect garbage just before each window and not during it
(`--load-gc on` keeps Python's own schedule): a full collection of a load process stalls
its 100 workers for 20-70 ms, which is the instrument's pause, not the coordinator's.
`machine_cpu` is what the whole machine used during the windows: on a shared machine, what
the coordinator, its pool and the load did not use is someone else's.
"""

from __future__ import annotations

import argparse
import bisect
import gc
import json
import math
import os
import random
import re
import shlex
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections import Counter, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h11
import trio
from kio.schema.api_versions.v0 import ApiVersionsRequest as ApiVersionsRequestV0

from coordinator.cli import module_command
from coordinator.client import KafkaClient
from protocol.errors import ErrorCode, error_name
from protocol.framing import API_VERSIONS
from protocol.messages import ConnectGroupDescribeRequest, ConnectGroupHeartbeatRequest

PROG = "connect-coordinator bench heartbeats"
HEARTBEAT = 1000
CLASSIC_HEARTBEAT = 12  # Kafka's Heartbeat, which classic members send
TIMED_APIS = (HEARTBEAT, CLASSIC_HEARTBEAT)
DESCRIBE = 1003
LOAD_PROCESS_FLAG = "--load-process"
TARGET_P99_RATIO = 1.2
BIG_GROUP_SESSION_MS = 120_000
BIG_GROUP_HEARTBEAT_MS = 20_000
BIG_GROUP_CONNECTIONS = 8
REJOIN = (ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.FENCED_MEMBER_EPOCH)


class BenchError(Exception):
    """The benchmark could not run (coordinator did not start, groups never settled...)."""


async def heartbeat_member(client: KafkaClient, group: str, member: str, *,
                           pause_s: Callable[[], float] | None,
                           on_answer: Callable[[int], None],
                           server_assignor: str | None = None,
                           rebalance_timeout_ms: int = 60_000,
                           wake: Callable[[], trio.Event] | None = None) -> None:
    """A member that only heartbeats, until cancelled: it joins, acknowledges each new
    assignment at once (a revocation must be), and otherwise sends a stable heartbeat after
    `pause_s()` seconds (None: the interval the coordinator asks for), or as soon as the
    event `wake()` returned when the pause began is set; the pause after that is a random
    part of the interval, so that members woken together do not heartbeat together from
    then on. `on_answer` gets the member epoch of every accepted answer. Errors other than
    a fencing (rejoin) are retried after half a second."""
    epoch, owned, send_owned = 0, None, None
    woken = False
    while True:
        if epoch == 0:
            request = ConnectGroupHeartbeatRequest(
                group_id=group, member_id=member, member_epoch=0,
                worker_url=f"http://{member}:8083", rebalance_timeout_ms=rebalance_timeout_ms,
                server_assignor=server_assignor)
        else:
            request = ConnectGroupHeartbeatRequest(
                group_id=group, member_id=member, member_epoch=epoch,
                owned_connectors_and_tasks=send_owned)
        response = await client.request(HEARTBEAT, request)
        if response.error_code in REJOIN:
            epoch, owned, send_owned = 0, None, None
            continue
        if response.error_code != 0:
            await trio.sleep(0.5)  # loading, not available...: retry
            continue
        epoch = response.member_epoch
        on_answer(epoch)
        if response.assignment is not None and response.assignment.assigned != owned:
            owned = send_owned = response.assignment.assigned
            continue
        send_owned = None
        pause = response.heartbeat_interval_ms / 1000 if pause_s is None else pause_s()
        if woken:
            pause, woken = random.uniform(0, pause), False
        if wake is None:
            await trio.sleep(pause)
        else:
            with trio.move_on_after(pause):
                await wake().wait()
                woken = True


# ============================================================================ load process
#
# Started as `python -m bench.heartbeats --load-process`. It reads JSON
# lines on stdin and answers with JSON lines on stdout:
#   in:  {"host", "port", "interval_ms", "request_timeout_ms", "workers": [[group, id]...]}
#   out: {"event": "started"}
#   in:  {"cmd": "measure", "start": WALL_CLOCK_S, "duration": S, "samples": BOOL}
#   out: {"event": "measured", "latencies_ms": [...], "errors": {...}, "unstable": N, ...}
#        (with "samples": also "sent_s": [...], the wall-clock send time of each latency)
#   in:  {"cmd": "stop"}  (or end of input)
#   out: {"event": "stopped", "failures": [...]}


@dataclass(slots=True)
class Recorder:
    """Heartbeats of one load process; only those *sent* inside the window count."""

    start: float = math.inf  # perf_counter() bounds of the window
    end: float = -math.inf
    window: int = 0  # bumped by open(): late answers to an older window are not counted
    latencies_ms: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    unstable: int = 0
    pending: int = 0  # window requests still waiting for their answer
    # With `samples`: the wall-clock send time of each timed heartbeat, in step with
    # latencies_ms (the bench sorts them into "sent while a run was in flight" or not).
    samples: bool = False
    sent_s: list[float] = field(default_factory=list)
    wall_offset: float = 0.0  # time.time() - time.perf_counter()

    def open(self, start: float, end: float, samples: bool = False) -> None:
        self.start, self.end, self.window = start, end, self.window + 1
        self.latencies_ms, self.errors, self.unstable, self.pending = [], Counter(), 0, 0
        self.samples, self.sent_s = samples, []
        self.wall_offset = time.time() - time.perf_counter()

    def counts(self, sent: float) -> bool:
        return self.start <= sent < self.end

    def answered(self, sent: float, request: Any, response: Any) -> None:
        # A classic Heartbeat's code is kio's enum and it carries no epoch or assignment.
        code = int(getattr(response.error_code, "value", response.error_code))
        if code != 0:
            self.errors[error_name(code)] += 1
        elif (getattr(request, "member_epoch", 1) <= 0
              or getattr(response, "assignment", None) is not None):
            self.unstable += 1
        else:
            self.latencies_ms.append((time.perf_counter() - sent) * 1000.0)
            if self.samples:
                self.sent_s.append(sent + self.wall_offset)


class TimedClient(KafkaClient):
    """The worker library's client, timing every heartbeat (ConnectGroupHeartbeat, or a
    classic member's Heartbeat) for the process's Recorder."""

    def __init__(self, stream: trio.SocketStream, client_id: str, recorder: Recorder) -> None:
        super().__init__(stream, client_id)
        self.recorder = recorder

    async def request(self, api_key: int, body: Any, api_version: int = 0) -> Any:
        if api_key not in TIMED_APIS:
            return await super().request(api_key, body, api_version)
        recorder = self.recorder
        sent = time.perf_counter()
        window = recorder.window if recorder.counts(sent) else None
        if window is not None:
            recorder.pending += 1
        try:
            response = await super().request(api_key, body, api_version)
        except BaseException as error:
            if window == recorder.window:
                # trio.Cancelled: the worker's request timeout (fail_after) cut it short
                kind = "REQUEST_TIMEOUT" if isinstance(error, trio.Cancelled) else "TRANSPORT"
                recorder.errors[kind] += 1
                recorder.pending -= 1
            raise
        if window == recorder.window:
            recorder.pending -= 1
            recorder.answered(sent, body, response)
        return response


async def _run_worker(worker: Any, failures: list[str]) -> None:
    try:
        await worker.run()
    except Exception as error:  # reported to the orchestrator, not fatal to the others
        failures.append(f"{worker.name}: {type(error).__name__}: {error}")


async def _measure_window(recorder: Recorder, start_wall: float, duration: float,
                          samples: bool = False, pause_gc: bool = False) -> dict[str, Any]:
    if pause_gc:
        # The instrument's own pauses are not the coordinator's: a full collection of a
        # load process (100 workers) takes 20-70 ms and came every few seconds, delaying
        # every answer that process was waiting for. Collect now, before the window opens,
        # and not again until it is over.
        gc.collect()
        gc.disable()
    try:
        return await _timed_window(recorder, start_wall, duration, samples)
    finally:
        if pause_gc:
            gc.enable()


async def _timed_window(recorder: Recorder, start_wall: float, duration: float,
                        samples: bool) -> dict[str, Any]:
    start = time.perf_counter() + (start_wall - time.time())
    recorder.open(start, start + duration, samples)
    await trio.sleep_until(trio.current_time() + (start - time.perf_counter()))
    cpu = time.process_time()
    await trio.sleep_until(trio.current_time() + (recorder.end - time.perf_counter()))
    cpu = time.process_time() - cpu
    with trio.move_on_after(10):  # the answers to requests sent inside the window
        while recorder.pending:  # noqa: ASYNC110 - the counter is bumped by other tasks
            await trio.sleep(0.01)
    result = {"event": "measured", "latencies_ms": [round(v, 4) for v in recorder.latencies_ms],
              "errors": dict(recorder.errors), "unstable": recorder.unstable,
              "unanswered": recorder.pending, "cpu_s": round(cpu, 3)}
    if samples:
        result["sent_s"] = [round(v, 6) for v in recorder.sent_s]
    recorder.open(math.inf, -math.inf)
    return result


async def _load_process(plan: dict[str, Any], out: Any) -> None:
    def send(message: dict[str, Any]) -> None:
        out.write(json.dumps(message) + "\n")
        out.flush()

    recorder = Recorder()
    loads: dict[str, type[Any]] = {"raw": _RawLoad, "classic": _ClassicLoad}
    load = loads.get(plan.get("client", "worker"), _WorkerLoad)(plan, recorder)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(load.run_all)
        send({"event": "started", "workers": len(plan["workers"])})
        while True:
            line = await trio.to_thread.run_sync(sys.stdin.readline)
            if not line:
                break
            command = json.loads(line)
            if command["cmd"] != "measure":
                break
            send(await _measure_window(recorder, command["start"], command["duration"],
                                       bool(command.get("samples")),
                                       plan.get("load_gc", "on") == "paused"))
        await load.leave()
        nursery.cancel_scope.cancel()
    send({"event": "stopped", "failures": load.failures})


class _WorkerLoad:
    """`--load-client worker`: the worker library's `Worker`s, as Connect workers would
    behave (units started and stopped, sessions watched)."""

    def __init__(self, plan: dict[str, Any], recorder: Recorder) -> None:
        from coordinator.workers.registry import UnitRegistry
        from coordinator.workers.state import WorkerConfig
        from coordinator.workers.worker import Worker

        registry = UnitRegistry()
        host, port = plan["host"], plan["port"]
        self.plan = plan
        self.failures: list[str] = []
        self.workers: list[Any] = []
        self._all_left = trio.Event()
        for group, member in plan["workers"]:
            async def connect(member: str = member) -> KafkaClient:
                return TimedClient(await trio.open_tcp_stream(host, port), member, recorder)

            config = WorkerConfig(group_id=group, worker_url=f"http://{member}:8083",
                                  member_id=member,
                                  heartbeat_interval_override_ms=plan["interval_ms"])
            self.workers.append(Worker(config, registry, connect=connect,
                                       request_timeout_ms=plan["request_timeout_ms"],
                                       name=member))

    async def run_all(self) -> None:
        # Spread the starts over one interval: workers that start together would heartbeat
        # in lockstep for ever, and every burst would queue behind itself.
        spread_s = self.plan["interval_ms"] / 1000 / max(1, len(self.workers))
        async with trio.open_nursery() as running:
            for worker in self.workers:
                running.start_soon(_run_worker, worker, self.failures)
                await trio.sleep(spread_s)
        self._all_left.set()

    async def leave(self) -> None:
        for worker in self.workers:
            worker.shutdown()
        with trio.move_on_after(10) as scope:  # each leaves the group, then run() returns
            await self._all_left.wait()
        if scope.cancelled_caught:
            self.failures.append("some workers did not leave within 10 s")


class _ClassicLoad(_WorkerLoad):
    """`--load-client classic`: the worker library's classic workers (Connect's
    `WorkerCoordinator` with `sessioned`: JoinGroup, SyncGroup, then a Heartbeat every
    INTERVAL_MS), each on its own `TimedClient`. A leader assigns the plan's `units`
    (connector -> tasks: the group's connectors, which a Connect leader reads from its
    config topic)."""

    def __init__(self, plan: dict[str, Any], recorder: Recorder) -> None:
        from coordinator.units import units_of
        from coordinator.workers.classic import ClassicWorker
        from coordinator.workers.registry import UnitRegistry

        registry = UnitRegistry()
        host, port = plan["host"], plan["port"]
        units = units_of(plan.get("units", {}))
        self.plan = plan
        self.failures = []
        self.workers = []
        self._all_left = trio.Event()
        for group, member in plan["workers"]:
            async def connect(member: str = member) -> KafkaClient:
                return TimedClient(await trio.open_tcp_stream(host, port), member, recorder)

            self.workers.append(ClassicWorker(
                member, group, (host, port), registry, lambda: units,
                heartbeat_interval_ms=plan["interval_ms"],
                session_timeout_ms=plan.get("session_timeout_ms", 10_000), connect=connect))


class _RawLoad:
    """`--load-client raw`: members that only heartbeat (`heartbeat_member`) on a
    `TimedClient` each, so the latency is the coordinator's and the connection's, without
    the worker library's own work in the load process."""

    def __init__(self, plan: dict[str, Any], recorder: Recorder) -> None:
        self.plan = plan
        self.recorder = recorder
        self.failures: list[str] = []
        self.epochs: dict[tuple[str, str], int] = {}
        self.clients: dict[tuple[str, str], KafkaClient] = {}
        self._running: trio.CancelScope | None = None

    async def run_all(self) -> None:
        members = self.plan["workers"]
        spread_s = self.plan["interval_ms"] / 1000 / max(1, len(members))
        with trio.CancelScope() as self._running:
            async with trio.open_nursery() as running:
                for group, member in members:
                    running.start_soon(self._member, group, member)
                    await trio.sleep(spread_s)

    def _pause(self) -> float:
        # INTERVAL_MS +- 10%: with the same pause after every answer, members answered
        # together (after any stall) would send together ever after, and the bursts would
        # grow into the latency being measured.
        return float(self.plan["interval_ms"] / 1000 * random.uniform(0.9, 1.1))

    async def _member(self, group: str, member: str) -> None:
        timeout_s = self.plan["request_timeout_ms"] / 1000
        while True:
            try:
                with trio.fail_after(timeout_s):
                    stream = await trio.open_tcp_stream(self.plan["host"], self.plan["port"])
                client = self.clients[group, member] = TimedClient(stream, member,
                                                                   self.recorder)
                await heartbeat_member(
                    client, group, member, pause_s=self._pause,
                    on_answer=lambda epoch: self.epochs.__setitem__((group, member), epoch))
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError,
                    trio.TooSlowError) as error:
                self.failures.append(f"{member}: {type(error).__name__}: {error}")
                self.clients.pop((group, member), None)
                await trio.sleep(0.5)  # then a new connection, and a rejoin if need be

    async def leave(self) -> None:
        if self._running is not None:
            self._running.cancel()
        with trio.move_on_after(10):
            async with trio.open_nursery() as leaving:
                for (group, member), client in self.clients.items():
                    epoch = self.epochs.get((group, member), 0)
                    leaving.start_soon(client.request, HEARTBEAT, ConnectGroupHeartbeatRequest(
                        group_id=group, member_id=member, member_epoch=-1 if epoch else 0))
        for client in self.clients.values():
            await client.aclose()


def load_process_main() -> int:
    out = sys.stdout
    sys.stdout = sys.stderr  # the protocol owns stdout
    plan = json.loads(sys.stdin.readline())
    trio.run(_load_process, plan, out)
    return 0


class LoadProcess:
    """The orchestrator's end of one load process."""

    def __init__(self, process: trio.Process) -> None:
        self.process = process
        self._buffer = b""

    @classmethod
    async def start(cls, plan: dict[str, Any]) -> LoadProcess:
        process = await trio.lowlevel.open_process(
            module_command("bench.heartbeats", LOAD_PROCESS_FLAG),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self = cls(process)
        await self.send(plan)
        return self

    async def send(self, message: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.send_all((json.dumps(message) + "\n").encode())

    async def receive(self, event: str) -> dict[str, Any]:
        assert self.process.stdout is not None
        while b"\n" not in self._buffer:
            data = await self.process.stdout.receive_some(1 << 20)
            if not data:
                raise BenchError(f"a load process exited (code {self.process.poll()}) "
                                 f"while the bench waited for {event!r}; see its stderr")
            self._buffer += data
        line, self._buffer = self._buffer.split(b"\n", 1)
        message: dict[str, Any] = json.loads(line)
        if message.get("event") != event:
            raise BenchError(f"a load process said {message!r}, expected {event!r}")
        return message

    async def stop(self) -> dict[str, Any] | None:
        result = None
        with trio.move_on_after(20):
            try:
                await self.send({"cmd": "stop"})
                result = await self.receive("stopped")
            except (BenchError, trio.BrokenResourceError, trio.ClosedResourceError):
                pass
        await _end(self.process, terminate=False)
        return result


# ============================================================================ coordinator


# (runs landed since the coordinator started, [(submitted, returned, landed) wall-clock
# seconds of the latest ones]): when the coordinator's offloaded assignor runs were in flight.
RunLog = Callable[[], tuple[int, list[tuple[float, float, float]]]]


@dataclass(frozen=True, slots=True)
class Target:
    host: str
    port: int
    admin: str  # admin API base URL
    pid: int | None = None  # when the bench started it as a subprocess
    runs: RunLog | None = None  # not known for a coordinator started elsewhere


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process so far (Linux /proc; None elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _machine_cpu_seconds() -> float | None:
    """CPU time all processes of the machine have used so far (Linux /proc/stat): on a
    shared machine, what the bench and the coordinator did not use is someone else's."""
    try:
        with open("/proc/stat", "rb") as stat:
            fields = [int(v) for v in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _children_cpu_seconds(pid: int) -> float | None:
    """The same for the live children of `pid` (the coordinator's assignor processes)."""
    try:
        children = {int(child) for task in os.listdir(f"/proc/{pid}/task")
                    for child in Path(f"/proc/{pid}/task/{task}/children").read_text().split()}
    except (OSError, ValueError):
        return None
    return sum(_cpu_seconds(child) or 0.0 for child in children)


def _admin(method: str, url: str, body: Any | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        raw = response.read()
    return json.loads(raw) if raw.startswith((b"{", b"[")) else raw.decode()


async def admin(method: str, url: str, body: Any | None = None) -> Any:
    return await trio.to_thread.run_sync(_admin, method, url, body)


class AdminConnection:
    """One kept-alive HTTP/1.1 connection to the admin API, spoken with h11 on the bench's
    event loop: the in-flight window's resizes. `admin` (urllib in a thread, a connection
    per request) woke a thread and then the loop for every answer, and those wake-ups took
    the CPU from the coordinator's event loop in the middle of a flight (perf sched: 17 ms
    a second of its run-queue wait while runs were in flight), which is the harness's cost,
    not the coordinator's."""

    def __init__(self, base_url: str) -> None:
        parts = urllib.parse.urlsplit(base_url)
        self._host, self._port = parts.hostname or "127.0.0.1", parts.port or 80
        self._prefix = parts.path.rstrip("/")
        self._stream: trio.SocketStream | None = None
        self._connection = h11.Connection(h11.CLIENT)

    async def request(self, method: str, path: str, body: Any | None = None) -> Any:
        """`method` `path` (under the base URL) with a JSON body; the decoded JSON answer.
        A failed request closes the connection; the next one opens another."""
        try:
            return await self._request(method, path, body)
        except BaseException:
            await self.aclose()
            raise

    async def _request(self, method: str, path: str, body: Any | None) -> Any:
        if self._stream is None:
            self._stream = await trio.open_tcp_stream(self._host, self._port)
            self._connection = h11.Connection(h11.CLIENT)
        data = b"" if body is None else json.dumps(body).encode()
        headers = [("host", f"{self._host}:{self._port}"), ("content-length", str(len(data)))]
        if body is not None:
            headers.append(("content-type", "application/json"))
        connection = self._connection
        await self._stream.send_all(
            connection.send(h11.Request(method=method, target=self._prefix + path,
                                        headers=headers))
            + connection.send(h11.Data(data=data)) + connection.send(h11.EndOfMessage()))
        status, chunks = 0, []
        while True:
            event = connection.next_event()
            if event is h11.NEED_DATA:
                connection.receive_data(await self._stream.receive_some(1 << 16))
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                break
            elif isinstance(event, h11.ConnectionClosed):
                raise BenchError(f"the admin API closed the connection during {method} {path}")
        raw = b"".join(chunks)
        if not 200 <= status < 300:
            answer = raw[:200].decode(errors="replace")
            raise BenchError(f"{method} {path}: HTTP {status}: {answer}")
        if connection.our_state is h11.DONE and connection.their_state is h11.DONE:
            connection.start_next_cycle()
        else:
            await self.aclose()
        return json.loads(raw) if raw.startswith((b"{", b"[")) else raw.decode()

    async def aclose(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            await stream.aclose()


def _address(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)


@asynccontextmanager
async def coordinator(args: argparse.Namespace) -> AsyncIterator[Target]:
    if args.bootstrap:
        host, port = _address(args.bootstrap)
        yield Target(host, port, args.admin.rstrip("/"))
    elif args.in_process:
        async with _in_process(args) as target:
            yield target
    else:
        async with _subprocess(args, args.server_command) as target:
            yield target


@asynccontextmanager
async def _in_process(args: argparse.Namespace) -> AsyncIterator[Target]:
    from coordinator.config import load_config
    from coordinator.logs import configure_logging
    from coordinator.server.app import run_server

    configure_logging("warning")
    config = load_config(None, args.set)
    async with trio.open_nursery() as nursery:
        handle = await nursery.start(run_server, config, ("127.0.0.1", 0), ("127.0.0.1", 0))
        runtime = handle.runtime

        def runs() -> tuple[int, list[tuple[float, float, float]]]:
            return runtime.runs_landed, [(t.submitted, t.returned, t.landed)
                                         for t in runtime.recent_runs]

        try:
            yield Target("127.0.0.1", handle.kafka_port, f"http://127.0.0.1:{handle.admin_port}",
                         runs=runs)
        finally:
            handle.stop()


@asynccontextmanager
async def _subprocess(args: argparse.Namespace, launcher: list[str] | None = None
                      ) -> AsyncIterator[Target]:
    """`connect-coordinator serve` on free ports; its JSON log tells where it listens.
    `launcher`: what runs `serve ...` instead of `python -m coordinator.cli`."""
    with tempfile.TemporaryDirectory(prefix="bench-heartbeats-") as tmp:
        command = [*(launcher or [sys.executable, "-m", "coordinator.cli"]), "serve",
                   "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
                   "--data-dir", str(Path(tmp) / "data"), "--log-format", "json",
                   "--log-level", "info"]
        if args.in_memory:
            command.append("--in-memory")
        for item in args.set:
            command += ["--set", item]
        log = ServerLog(Path(tmp) / "coordinator.log")
        with log.path.open("wb") as log_file:
            try:
                process = await trio.lowlevel.open_process(command, stdin=subprocess.DEVNULL,
                                                           stdout=subprocess.DEVNULL,
                                                           stderr=log_file)
            except OSError as error:  # a --server-command that is not there, say
                raise BenchError(f"cannot start the coordinator ({shlex.join(command[:1])}): "
                                 f"{error.strerror or error}") from error
        try:
            await log.wait_ready(process, 60)
            if log.target is None:
                raise BenchError("the coordinator did not become ready (exit code "
                                 f"{process.poll()}):\n" + "\n".join(log.tail))
            yield Target(log.target.host, log.target.port, log.target.admin, process.pid,
                         log.landed_runs)
        finally:
            with trio.CancelScope(shield=True):
                await _end(process, terminate=True)


class ServerLog:
    """The coordinator's log, which it writes to a file: the `ready` line, and the
    `assignor_run_landed` lines (when each offloaded run was in flight), read when asked.

    A file, not a pipe: a pipe's reader wakes up for every line the coordinator writes, and
    in the middle of a flight (three lines at each landing) those wake-ups took the CPU
    from the coordinator's event loop (perf sched), which is the harness's cost."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.target: Target | None = None
        self.tail: deque[str] = deque(maxlen=20)
        self.runs: list[tuple[float, float, float]] = []
        self._read = 0  # bytes of the file read so far
        self._partial = b""  # the start of a line not yet ended

    def landed_runs(self) -> tuple[int, list[tuple[float, float, float]]]:
        self.read_new_lines()
        return len(self.runs), list(self.runs)

    async def wait_ready(self, process: trio.Process, timeout_s: float) -> None:
        """Until the `ready` line, the coordinator's exit, or `timeout_s`."""
        with trio.move_on_after(timeout_s):
            while self.target is None and process.poll() is None:
                self.read_new_lines()
                await trio.sleep(0.02)
        self.read_new_lines()

    def read_new_lines(self) -> None:
        try:
            with self.path.open("rb") as log:
                log.seek(self._read)
                data = log.read()
        except FileNotFoundError:
            return
        self._read += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        for raw in lines:
            line = raw.decode(errors="replace")
            self.tail.append(line)
            if '"assignor_run_landed"' in line:
                entry = json.loads(line)
                if entry.get("event") == "assignor_run_landed":
                    self.runs.append((entry["submitted_at"], entry["returned_at"],
                                      entry["landed_at"]))
            elif self.target is None and '"ready"' in line:
                entry = json.loads(line)
                if entry.get("event") == "ready":
                    host, port = _address(entry["listen"])
                    self.target = Target(host, port, entry["admin"])


async def _end(process: trio.Process, *, terminate: bool) -> None:
    """Wait for a child (SIGTERM first if asked, SIGKILL after 15 s) and close its pipes."""
    if process.returncode is None and terminate:
        process.terminate()  # the coordinator drains and exits
    with trio.move_on_after(15):
        await process.wait()
    if process.returncode is None:
        process.kill()
        await process.wait()
    for stream in (process.stdin, process.stdout, process.stderr):
        if stream is not None:
            await stream.aclose()


async def _scrape(target: Target) -> dict[str, float]:
    """The assignor counters of /metrics (one scrape; it walks every group's units)."""
    text = await admin("GET", f"{target.admin}/metrics")
    wanted = {
        "runs_ok": r'^connect_coordinator_assignor_runs_total\{outcome="ok"\} (\S+)',
        "runs_failed": r'^connect_coordinator_assignor_runs_total\{outcome="failed"\} (\S+)',
        "runs_timeout": r'^connect_coordinator_assignor_runs_total\{outcome="timeout"\} (\S+)',
        "run_seconds": r'^connect_coordinator_assignor_run_seconds_sum\{assignor="balanced"\} '
                       r'(\S+)',
        "in_flight": r"^connect_coordinator_assignor_runs_in_flight (\S+)",
    }
    values = {}
    for key, pattern in wanted.items():
        found = re.search(pattern, text, re.MULTILINE)
        values[key] = float(found.group(1)) if found else 0.0
    values["at"] = time.perf_counter()
    return values


# ============================================================================ groups


def _plan_workers(args: argparse.Namespace, tag: str) -> list[list[list[str]]]:
    """[process][i] = [group, member id]: worker i of group g goes to process (g + i) % P."""
    shares: list[list[list[str]]] = [[] for _ in range(args.processes)]
    for g in range(args.groups):
        group = f"{args.group}-{g}"
        for i in range(args.workers_per_group):
            shares[(g + i) % args.processes].append([group, f"{group}-w{i:04d}-{tag}"])
    return shares


def _connectors(args: argparse.Namespace) -> dict[str, int]:
    """Each heartbeat group's connectors: name -> tasks."""
    return {f"connector-{index}": args.tasks for index in range(args.connectors)}


def _heartbeat_groups(args: argparse.Namespace) -> list[str]:
    return [f"{args.group}-{g}" for g in range(args.groups)]


async def _describe(target: Target, groups: Sequence[str]) -> Any:
    """Describe at the newest version both sides know: version 1 describes classic groups
    too; an older coordinator (`--server-command`) knows only version 0, which has every
    field the bench reads of a connect group."""
    async with await KafkaClient.connect(target.host, target.port) as client:
        versions = await client.request(API_VERSIONS, ApiVersionsRequestV0(), api_version=0)
        newest = max((entry.max_version for entry in versions.api_keys
                      if entry.api_key == DESCRIBE), default=None)
        if newest is None:
            raise BenchError("the coordinator does not list ConnectGroupDescribe in its "
                             "ApiVersions")
        return await client.request(DESCRIBE, ConnectGroupDescribeRequest(group_ids=tuple(groups)),
                                    api_version=min(newest, 1))


def _unsettled(described: Any, members: int) -> list[str]:
    """Why the groups are not all STABLE yet (empty: they are)."""
    problems = []
    for view in described.groups:
        if view.error_code:
            problems.append(f"{view.group_id}: {view.error_message}")
        elif view.group_state != "STABLE" or len(view.members) != members:
            problems.append(f"{view.group_id}: {view.group_state}, {len(view.members)} of "
                            f"{members} members")
        elif any(m.member_state != "STABLE" or m.member_epoch != view.assignment_epoch
                 or m.pending_revocation.tasks or m.pending_revocation.connectors
                 for m in view.members):
            problems.append(f"{view.group_id}: members still reconciling")
    return problems


async def _wait_stable(target: Target, groups: Sequence[str], members: int,
                       timeout_s: float, *, poll_s: float = 0.25,
                       before_each: Callable[[], None] | None = None) -> float:
    """Until the groups are STABLE (`_unsettled`), describing them every `poll_s`, after
    `before_each()` if given; the seconds it took."""
    started = time.perf_counter()
    problems = ["not described yet"]
    with trio.move_on_after(timeout_s):
        while problems:
            if before_each is not None:
                before_each()
            await trio.sleep(poll_s)
            problems = _unsettled(await _describe(target, groups), members)
    if problems:
        raise BenchError(f"the groups did not become stable within {timeout_s} s: "
                         + "; ".join(problems[:5]))
    return time.perf_counter() - started


class BigGroup:
    """The assignor load: a group big enough that every `balanced` run is expensive."""

    def __init__(self, target: Target, args: argparse.Namespace, tag: str) -> None:
        self.target = target
        self.group = f"{args.group}-assignor"
        self.members = [f"{self.group}-m{i:04d}-{tag}" for i in range(args.assignor_workers)]
        self.connectors = args.assignor_connectors
        self.tasks = args.assignor_tasks
        self.put_interval_s = args.assignor_put_interval_ms / 1000
        self.base = self.tasks // self.connectors  # connector-0's size; toggled to base + 1
        self.puts = 0
        self._clients: list[KafkaClient] = []
        self._epochs: dict[str, int] = {}
        self._wake = trio.Event()  # set: every member heartbeats now

    def _url(self, path: str) -> str:
        return f"{self.target.admin}{self._path(path)}"

    def _path(self, path: str) -> str:
        return f"/groups/{self.group}{path}"

    async def set_up(self, nursery: trio.Nursery, timeout_s: float) -> float:
        """Members join, then the connectors arrive; few runs happen on the way."""
        started = time.perf_counter()
        config = {
            # While the members join and the connectors arrive, batch everything into as
            # few runs as possible (each run of a half-built group costs as much as a full
            # one); the measurement wants every resize to start a run at once.
            "connect.assignment.interval.ms": 15_000,
            "connect.assignor.offload.enable": True,
            "connect.session.timeout.ms": BIG_GROUP_SESSION_MS,
            "connect.heartbeat.interval.ms": BIG_GROUP_HEARTBEAT_MS,
        }
        await admin("PUT", self._url("/config"), config)
        self._clients = [await KafkaClient.connect(self.target.host, self.target.port)
                         for _ in range(BIG_GROUP_CONNECTIONS)]
        # Join first, then add the connectors: no member is ever handed all 50,000 tasks.
        async with trio.open_nursery() as joining:
            for index, member in enumerate(self.members):
                client = self._clients[index % len(self._clients)]
                joining.start_soon(nursery.start, self._member, client, member)
        for index in range(self.connectors):
            tasks = self.base + (1 if index < self.tasks % self.connectors else 0)
            await admin("PUT", self._url(f"/connectors/connector-{index}"), {"tasks": tasks})
        await admin("PUT", self._url("/config"), {**config, "connect.assignment.interval.ms": 0})
        # The batched run is due up to 15 s from now; a resize starts it at once instead.
        for size in (self.base + 1, self.base):
            await admin("PUT", self._url("/connectors/connector-0"), {"tasks": size})
        await self.wait_idle(timeout_s)
        return time.perf_counter() - started

    async def _member(self, client: KafkaClient, member: str, *,
                      task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Join naming `balanced`, then heartbeat at the group's pace; ack at once."""
        def answered(epoch: int) -> None:
            self._epochs[member] = epoch
            if member not in reported:
                reported.add(member)
                task_status.started()

        reported: set[str] = set()
        await heartbeat_member(client, self.group, member, pause_s=None, on_answer=answered,
                               server_assignor="balanced", rebalance_timeout_ms=600_000,
                               wake=lambda: self._wake)

    async def wait_reconciled(self, timeout_s: float) -> None:
        """Until every member is STABLE at the group's assignment epoch. The members
        heartbeat every 20 s, so after a new target (the set-up's, or a window's last
        resize) they would reach it during the next 20 s, writing a record each: that is
        not the quiet a baseline window is meant to have. So they are woken to heartbeat
        now, and again while some are still on their way."""
        def wake_all() -> None:
            self._wake.set()
            self._wake = trio.Event()

        # A describe takes ~1 s of the coordinator's time at 1,000 x 50,000: once a second,
        # and never inside a window.
        await _wait_stable(self.target, [self.group], len(self.members), timeout_s,
                           poll_s=1.0, before_each=wake_all)

    async def wait_idle(self, timeout_s: float) -> None:
        """Until the target is computed for the current group epoch and no run is running."""
        with trio.move_on_after(timeout_s):
            while True:
                # ~1 s of the coordinator's time at 1,000 x 50,000: never inside a window.
                view = (await _describe(self.target, [self.group])).groups[0]
                if view.group_epoch == view.assignment_epoch \
                        and (await _scrape(self.target))["in_flight"] == 0:
                    return
                await trio.sleep(0.5)
        raise BenchError(f"{self.group}: assignor runs did not settle within {timeout_s} s")

    async def drive(self, until: float, interval_s: float | None = None) -> None:
        """Resize connector-0 back and forth every `interval_s` (default: so often that a
        run is always in flight)."""
        size = self.base
        pause = self.put_interval_s if interval_s is None else interval_s
        connection = AdminConnection(self.target.admin)
        try:
            while time.perf_counter() < until:
                size = self.base + 1 if size == self.base else self.base
                await connection.request("PUT", self._path("/connectors/connector-0"),
                                         {"tasks": size})
                self.puts += 1
                await trio.sleep(pause)
            if size != self.base:
                await connection.request("PUT", self._path("/connectors/connector-0"),
                                         {"tasks": self.base})
                self.puts += 1
        finally:
            await connection.aclose()

    async def leave(self) -> None:
        if not self._clients:
            return
        with trio.move_on_after(10):
            async with trio.open_nursery() as nursery:
                for index, (member, epoch) in enumerate(self._epochs.items()):
                    nursery.start_soon(
                        self._clients[index % len(self._clients)].request, HEARTBEAT,
                        ConnectGroupHeartbeatRequest(group_id=self.group, member_id=member,
                                                     member_epoch=-1 if epoch else 0))
        for client in self._clients:
            await client.aclose()


# ============================================================================ orchestration


def _percentile(sorted_values: Sequence[float], fraction: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, math.ceil(fraction * len(sorted_values)) - 1))
    return sorted_values[index]


def summarize(windows: Sequence[Sequence[dict[str, Any]]], duration: float) -> dict[str, Any]:
    """Pool the per-process reports of one or more windows into one set of figures."""
    latencies = sorted(v for window in windows for part in window for v in part["latencies_ms"])
    errors: Counter[str] = Counter()
    for window in windows:
        for part in window:
            errors.update(part["errors"])
    seconds = duration * len(windows)
    figures: dict[str, Any] = {
        "heartbeats_per_s": round(len(latencies) / seconds, 1),
        "p50_ms": round(_percentile(latencies, 0.50), 3),
        "p99_ms": round(_percentile(latencies, 0.99), 3),
        "p999_ms": round(_percentile(latencies, 0.999), 3),
        "max_ms": round(latencies[-1], 3) if latencies else None,
        "heartbeats": len(latencies),
        "errors": dict(sorted(errors.items())),
        "unstable": sum(part["unstable"] for window in windows for part in window),
        "unanswered": sum(part["unanswered"] for window in windows for part in window),
        # CPU time per wall-clock second: 1.0 is one core busy.
        "load_cpu": round(sum(part["cpu_s"] for window in windows for part in window)
                          / seconds, 2),
    }
    for key in ("server_cpu_s", "assignor_cpu_s", "machine_cpu_s"):
        name = key.removesuffix("_s")
        spent = [part[key] for window in windows for part in window if key in part]
        if len(spent) == len(windows):
            figures[name] = round(sum(spent) / seconds, 2)
    if "server_cpu" in figures and latencies:
        figures["server_us_per_heartbeat"] = round(
            1e6 * figures["server_cpu"] * seconds / len(latencies), 1)
    return figures


async def _window(processes: Sequence[LoadProcess], duration: float, target: Target,
                  samples: bool = False) -> list[dict[str, Any]]:
    """One window in every load process; the coordinator's CPU time rides along as the
    first report (`server_cpu_s`, `assignor_cpu_s`: its pool processes; `window_s`: the
    window's wall-clock bounds). `samples`: the load processes also send each timed
    heartbeat's send time."""
    start = time.time() + 0.3  # every process opens its window at this moment
    for process in processes:
        await process.send({"cmd": "measure", "start": start, "duration": duration,
                            "samples": samples})
    reports: list[dict[str, Any]] = []
    server: dict[str, Any] = {"latencies_ms": [], "errors": {}, "unstable": 0,
                              "unanswered": 0, "cpu_s": 0.0,
                              "window_s": [start, start + duration]}

    async def collect(process: LoadProcess) -> None:
        reports.append(await process.receive("measured"))

    async with trio.open_nursery() as nursery:
        for process in processes:
            nursery.start_soon(collect, process)
        await trio.sleep(start - time.time())
        machine = _machine_cpu_seconds()
        cpu = ((_cpu_seconds(target.pid), _children_cpu_seconds(target.pid))
               if target.pid is not None else (None, None))
        await trio.sleep(duration)
        machine_after = _machine_cpu_seconds()
        if target.pid is not None:
            after = _cpu_seconds(target.pid), _children_cpu_seconds(target.pid)
            if cpu[0] is not None and after[0] is not None:
                server["server_cpu_s"] = after[0] - cpu[0]
            if cpu[1] is not None and after[1] is not None:
                server["assignor_cpu_s"] = after[1] - cpu[1]
        if machine is not None and machine_after is not None:
            server["machine_cpu_s"] = machine_after - machine
    return [server, *reports]


async def _loaded_window(processes: Sequence[LoadProcess], big: BigGroup, duration: float,
                         target: Target) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    before = await _scrape(target)
    puts_before = big.puts
    async with trio.open_nursery() as nursery:
        # Start resizing a little before the window so a run is in flight when it opens.
        nursery.start_soon(big.drive, time.perf_counter() + 0.3 + duration)
        reports = await _window(processes, duration, target)
    after = await _scrape(target)
    elapsed = after["at"] - before["at"]
    runs = after["runs_ok"] - before["runs_ok"]
    stats = {
        "runs": int(runs),
        "runs_failed": int(after["runs_failed"] + after["runs_timeout"]
                           - before["runs_failed"] - before["runs_timeout"]),
        "run_ms_mean": round(1000 * (after["run_seconds"] - before["run_seconds"])
                             / runs, 1) if runs else None,
        "in_flight_share": round((after["run_seconds"] - before["run_seconds"]) / elapsed, 2),
        "puts": big.puts - puts_before,
    }
    return reports, stats


async def _landed_runs(target: Target, timeout_s: float
                       ) -> list[tuple[float, float, float]]:
    """Every run's (submitted, returned, landed) once each run /metrics counts has landed."""
    assert target.runs is not None
    landed, total = 0, 0.0
    with trio.move_on_after(timeout_s):
        while True:
            scraped = await _scrape(target)
            total = scraped["runs_ok"] + scraped["runs_failed"] + scraped["runs_timeout"]
            landed, runs = target.runs()
            if landed >= total:
                return runs
            await trio.sleep(0.05)
    raise BenchError(f"the coordinator counted {total:.0f} assignor runs but logged the "
                     f"landing of {landed} within {timeout_s} s")


async def _in_flight_window(processes: Sequence[LoadProcess], big: BigGroup, duration: float,
                            target: Target, args: argparse.Namespace
                            ) -> tuple[list[dict[str, Any]], list[tuple[float, float, float]],
                                       int]:
    """A window during which the big group is resized every IN_FLIGHT_PUT_INTERVAL_MS, so
    that one run at a time is in flight now and then; every heartbeat's send time comes
    back, and so does every run's (submitted, returned, landed)."""
    puts_before = big.puts
    async with trio.open_nursery() as nursery:
        nursery.start_soon(big.drive, time.perf_counter() + 0.3 + duration,
                           args.in_flight_put_interval_ms / 1000)
        reports = await _window(processes, duration, target, samples=True)
    await big.wait_idle(args.settle_timeout)
    return reports, await _landed_runs(target, args.settle_timeout), big.puts - puts_before


def _merge(intervals: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def split_by_runs(window: Sequence[dict[str, Any]],
                  runs: Sequence[tuple[float, float, float]]) -> tuple[list[float], list[float]]:
    """The latencies of one window's heartbeats sent while a run (submitted, returned,
    landed) was in flight (between its submission and its landing, ends included), and
    of the others."""
    intervals = _merge([(submitted, landed) for submitted, _returned, landed in runs])
    starts = [start for start, _ in intervals]
    in_flight: list[float] = []
    between: list[float] = []
    for part in window:
        latencies = part["latencies_ms"]
        sent = part.get("sent_s", [])
        if len(sent) != len(latencies):
            raise BenchError("a load process sent send times out of step with its latencies")
        for at, latency in zip(sent, latencies, strict=True):
            index = bisect.bisect_right(starts, at) - 1
            if index >= 0 and at <= intervals[index][1]:
                in_flight.append(latency)
            else:
                between.append(latency)
    return in_flight, between


def latency_figures(latencies: Sequence[float]) -> dict[str, Any]:
    ordered = sorted(latencies)
    return {"heartbeats": len(ordered),
            "p50_ms": round(_percentile(ordered, 0.50), 3),
            "p99_ms": round(_percentile(ordered, 0.99), 3),
            "p999_ms": round(_percentile(ordered, 0.999), 3),
            "max_ms": round(ordered[-1], 3) if ordered else None}


def in_flight_figures(baseline: Sequence[Sequence[dict[str, Any]]],
                      windows: Sequence[Sequence[dict[str, Any]]],
                      runs: Sequence[Sequence[tuple[float, float, float]]], duration: float
                      ) -> dict[str, Any]:
    """The in-flight target as written: heartbeats sent while a run was in flight against the
    baseline windows (no run anywhere); `between_runs` are the in-flight windows' others."""
    in_flight: list[float] = []
    between: list[float] = []
    flights: list[float] = []
    covered = 0.0
    for window, window_runs in zip(windows, runs, strict=True):
        inside, outside = split_by_runs(window, window_runs)
        in_flight += inside
        between += outside
        start, end = window[0]["window_s"]
        overlapping = [(submitted, landed) for submitted, _returned, landed in window_runs
                       if submitted < end and landed > start]
        flights += [b - a for a, b in overlapping]
        covered += sum(min(b, end) - max(a, start) for a, b in _merge(overlapping))
    base = [v for window in baseline for part in window for v in part["latencies_ms"]]
    figures: dict[str, Any] = {
        "runs": len(flights),
        "flight_ms_mean": round(1000 * sum(flights) / len(flights), 1) if flights else None,
        "flight_ms_max": round(1000 * max(flights), 1) if flights else None,
        "in_flight_share": round(covered / (duration * len(windows)), 3) if windows else 0.0,
        "baseline": latency_figures(base),
        "in_flight": latency_figures(in_flight),
        "between_runs": latency_figures(between),
    }
    for key in ("p99", "p999"):
        figures[f"{key}_ratio"] = _ratio(figures["in_flight"][f"{key}_ms"],
                                         figures["baseline"][f"{key}_ms"])
    # The same window with no run in flight: what the run itself adds, apart from the
    # resizes, landings and new member epochs that the baseline windows have none of.
    figures["p99_ratio_between_runs"] = _ratio(figures["in_flight"]["p99_ms"],
                                               figures["between_runs"]["p99_ms"])
    figures["where_in_flight"] = where_in_flight(windows, runs, figures["baseline"]["p99_ms"])
    return figures


# Where in its flight a heartbeat was sent (`where_in_flight`): a flight's ends are where
# the event loop works for the run (the resize and the packing at the start; the result
# and the landing at the end).
FLIGHT_END_S = 0.002
FLIGHT_PARTS = ("first_2ms", "computing", "last_2ms", "landing")


def where_in_flight(windows: Sequence[Sequence[dict[str, Any]]],
                    runs: Sequence[Sequence[tuple[float, float, float]]], slow_ms: float
                    ) -> dict[str, dict[str, Any]]:
    """The in-flight heartbeats by when in their run's flight they were sent: in the first
    2 ms after submission, in the last 2 ms before the result was back on the event loop,
    in between (the pool computing), or after it (the landing, until durable); with the
    share of each slower than `slow_ms` (the baseline's p99: 1% there, by definition) and
    each one's own p99 (in milliseconds: unlike the share, it does not move with the
    baseline). A heartbeat sent during two runs counts for the later one."""
    counts = {part: [0, 0] for part in FLIGHT_PARTS}  # part -> [heartbeats, slower]
    latencies: dict[str, list[float]] = {part: [] for part in FLIGHT_PARTS}
    for window, window_runs in zip(windows, runs, strict=True):
        sent = sorted((at, latency) for part in window
                      for at, latency in zip(part.get("sent_s", ()), part["latencies_ms"],
                                             strict=True))
        times = [at for at, _latency in sent]
        where: dict[int, str] = {}
        for submitted, returned, landed in sorted(window_runs):
            for index in range(bisect.bisect_left(times, submitted),
                               bisect.bisect_right(times, landed)):
                at = times[index]
                where[index] = ("landing" if at > returned
                                else "first_2ms" if at < submitted + FLIGHT_END_S
                                else "last_2ms" if at > returned - FLIGHT_END_S
                                else "computing")
        for index, part in where.items():
            counts[part][0] += 1
            counts[part][1] += sent[index][1] > slow_ms
            latencies[part].append(sent[index][1])
    return {part: {"heartbeats": total,
                   "slower_than_baseline_p99": round(slower / total, 4) if total else None,
                   "p99_ms": (round(_percentile(sorted(latencies[part]), 0.99), 3)
                              if total else None)}
            for part, (total, slower) in counts.items()}


def _ratio(high: float, low: float) -> float | None:
    if not low or math.isnan(low) or math.isnan(high):
        return None
    return round(high / low, 2)


@dataclass(slots=True)
class Measured:
    baseline: list[list[dict[str, Any]]] = field(default_factory=list)
    loaded: list[list[dict[str, Any]]] = field(default_factory=list)
    loaded_stats: list[dict[str, Any]] = field(default_factory=list)
    baseline_runs: int = 0
    in_flight: list[list[dict[str, Any]]] = field(default_factory=list)
    in_flight_runs: list[list[tuple[float, float, float]]] = field(default_factory=list)
    in_flight_puts: int = 0


async def _rounds(processes: Sequence[LoadProcess], big: BigGroup | None, target: Target,
                  args: argparse.Namespace) -> Measured:
    """ROUNDS baseline windows, each followed with --assignor-load by a continuously loaded
    one and one with runs in flight now and then (--assignor-windows)."""
    measured = Measured()
    for _ in range(args.rounds):
        if big is None:
            measured.baseline.append(await _window(processes, args.duration, target))
            continue
        await big.wait_reconciled(args.settle_timeout)
        before = await _scrape(target)
        measured.baseline.append(await _window(processes, args.duration, target))
        measured.baseline_runs += int((await _scrape(target))["runs_ok"] - before["runs_ok"])
        if args.assignor_windows in ("both", "continuous"):
            reports, stats = await _loaded_window(processes, big, args.duration, target)
            measured.loaded.append(reports)
            measured.loaded_stats.append(stats)
            await big.wait_idle(args.settle_timeout)  # the next window sees no run
        if args.assignor_windows in ("both", "in-flight"):
            reports, runs, puts = await _in_flight_window(processes, big, args.duration,
                                                          target, args)
            measured.in_flight.append(reports)
            measured.in_flight_runs.append(runs)
            measured.in_flight_puts += puts
    return measured


async def run_bench(args: argparse.Namespace) -> dict[str, Any]:
    tag = os.urandom(3).hex()  # fresh member ids, also against a long-running coordinator
    groups = _heartbeat_groups(args)
    report: dict[str, Any] = {}
    async with coordinator(args) as target, trio.open_nursery() as nursery:
        for group in groups:
            for name, tasks in _connectors(args).items():
                await admin("PUT", f"{target.admin}/groups/{group}/connectors/{name}",
                            {"tasks": tasks})
        big = BigGroup(target, args, tag) if args.assignor_load else None
        if big is not None:
            report["assignor_setup_s"] = round(await big.set_up(nursery, args.settle_timeout), 1)
        processes: list[LoadProcess] = []
        stopped: list[dict[str, Any] | None] = []
        try:
            for share in _plan_workers(args, tag):
                processes.append(await LoadProcess.start({
                    "host": target.host, "port": target.port, "interval_ms": args.interval_ms,
                    "request_timeout_ms": args.request_timeout_ms, "workers": share,
                    "load_gc": args.load_gc, "client": args.load_client,
                    "units": _connectors(args)}))
            for process in processes:
                await process.receive("started")
            settle = await _wait_stable(target, groups, args.workers_per_group,
                                        args.settle_timeout)
            report["settle_s"] = round(settle, 1)
            await trio.sleep(args.warmup)
            measured = await _rounds(processes, big, target, args)
            still = _unsettled(await _describe(target, groups), args.workers_per_group)
            report["stable_at_end"] = not still
        finally:
            with trio.CancelScope(shield=True):
                for process in processes:
                    stopped.append(await process.stop())
                if big is not None:
                    nursery.cancel_scope.cancel()  # the big group's members stop...
                    await big.leave()  # ...and leave
        report["worker_failures"] = [f for s in stopped if s for f in s["failures"]]
        nursery.cancel_scope.cancel()
    return _result(args, measured, report)


def _result(args: argparse.Namespace, measured: Measured, report: dict[str, Any]
            ) -> dict[str, Any]:
    figures = summarize(measured.baseline, args.duration)
    result: dict[str, Any] = {**figures, **_config(args), **report}
    if not args.assignor_load:
        return result
    result["baseline_runs"] = measured.baseline_runs
    if measured.in_flight:
        in_flight = in_flight_figures(measured.baseline, measured.in_flight,
                                      measured.in_flight_runs, args.duration)
        in_flight["puts"] = measured.in_flight_puts
        in_flight["window"] = summarize(measured.in_flight, args.duration)
        result["in_flight"] = in_flight
    stats = measured.loaded_stats
    if not stats:
        return result
    load = summarize(measured.loaded, args.duration)
    for key in ("runs", "runs_failed", "puts"):
        load[key] = sum(int(s[key]) for s in stats)
    means = [s["run_ms_mean"] for s in stats if s["run_ms_mean"] is not None]
    load["run_ms_mean"] = round(sum(means) / len(means), 1) if means else None
    load["in_flight_share"] = round(sum(s["in_flight_share"] for s in stats) / len(stats), 2)
    result["assignor_load"] = load
    result["p99_ratio"] = (round(load["p99_ms"] / figures["p99_ms"], 2)
                           if figures["p99_ms"] else None)
    return result


def _config(args: argparse.Namespace) -> dict[str, Any]:
    config: dict[str, Any] = {
        "coordinator": ("bootstrap " + args.bootstrap if args.bootstrap
                        else "in-process" if args.in_process
                        else f"subprocess: {shlex.join(args.server_command)}"
                        if args.server_command
                        else "subprocess"),
        "log": ("unknown" if args.bootstrap else "none (in memory)"
                if args.in_memory or args.in_process else "durable"),
        "processes": args.processes,
        "groups": args.groups,
        "workers_per_group": args.workers_per_group,
        "workers": args.groups * args.workers_per_group,
        "connectors_per_group": args.connectors,
        "tasks_per_connector": args.tasks,
        "interval_ms": args.interval_ms,
        "load_gc": args.load_gc,
        "load_client": args.load_client,
        "duration_s": args.duration,
        "rounds": args.rounds,
    }
    if args.assignor_load:
        config.update(assignor_workers=args.assignor_workers,
                      assignor_connectors=args.assignor_connectors,
                      assignor_tasks=args.assignor_tasks,
                      assignor_windows=args.assignor_windows,
                      assignor_put_interval_ms=args.assignor_put_interval_ms,
                      in_flight_put_interval_ms=args.in_flight_put_interval_ms)
    return config


# ============================================================================ command line


def _command(text: str) -> list[str]:
    """A command line split as a shell would; an empty one is refused."""
    words = shlex.split(text)
    if not words:
        raise argparse.ArgumentTypeError("empty command")
    return words


def add_server_command(group: argparse._ActionsContainer) -> None:
    group.add_argument("--server-command", metavar="COMMAND", type=_command,
                       help="what runs `serve ...` for the coordinator the bench starts, "
                            "split as a shell would (e.g. another checkout's "
                            "`.venv/bin/connect-coordinator`): compares two versions of the "
                            "server under the same load and report (default: this "
                            "interpreter's `-m coordinator.cli`)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Stable-heartbeat throughput and latency over TCP, load from "
        "the trio worker library in separate processes (see the module doc).")
    where = parser.add_argument_group("coordinator")
    where.add_argument("--bootstrap", metavar="HOST:PORT",
                       help="use a running coordinator instead of starting one")
    where.add_argument("--admin", metavar="URL",
                       help="its admin API base URL (required with --bootstrap)")
    where.add_argument("--in-memory", action="store_true",
                       help="start the coordinator with `serve --in-memory` (no log), to "
                            "compare with the durable default")
    where.add_argument("--in-process", action="store_true",
                       help="run the coordinator inside the bench process (default: its own "
                            "subprocess, so client and server CPU stay apart)")
    where.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="server config for the coordinator the bench starts (repeatable)")
    add_server_command(where)
    load = parser.add_argument_group("heartbeat load")
    load.add_argument("--group", default="bench", help="group id prefix (default %(default)s)")
    load.add_argument("--processes", type=int, default=2,
                      help="load processes (default %(default)s)")
    load.add_argument("--groups", type=int, default=4, help="default %(default)s")
    load.add_argument("--workers-per-group", type=int, default=50, help="default %(default)s")
    load.add_argument("--load-client", choices=["worker", "raw", "classic"],
                      default="worker",
                      help="worker: the worker library's Workers, as Connect workers behave; "
                           "raw: members that only heartbeat (join, acknowledge, then a "
                           "stable heartbeat every INTERVAL_MS), so the latency leaves out "
                           "the worker library's own work in the load process; classic: "
                           "classic workers (JoinGroup, SyncGroup, Heartbeat), bridged into "
                           "the connect groups (default %(default)s)")
    load.add_argument("--connectors", type=int, default=2,
                      help="connectors per group (default %(default)s)")
    load.add_argument("--tasks", type=int, default=25,
                      help="tasks per connector (default %(default)s)")
    load.add_argument("--interval-ms", type=int, default=50,
                      help="each worker's pause between an answer and its next heartbeat; "
                           "0: back to back (default %(default)s)")
    load.add_argument("--request-timeout-ms", type=int, default=5_000,
                      help="the workers' request timeout (default %(default)s)")
    load.add_argument("--load-gc", choices=("paused", "on"), default="paused",
                      help="the load processes' garbage collector during a window: paused "
                           "(a collection just before it) or on, as Python sets it (its "
                           "full collections then stall a load process for 20-70 ms every "
                           "few seconds, and those stalls count as latency) "
                           "(default %(default)s)")
    load.add_argument("--duration", type=float, default=10.0,
                      help="seconds per measurement window (default %(default)s)")
    load.add_argument("--rounds", type=int, default=1,
                      help="windows (with --assignor-load: baseline + loaded pairs) "
                           "(default %(default)s)")
    load.add_argument("--warmup", type=float, default=1.0,
                      help="seconds between stable and the first window (default %(default)s)")
    load.add_argument("--settle-timeout", type=float, default=180.0,
                      help="seconds to wait for groups to become stable (default %(default)s)")
    big = parser.add_argument_group("assignor load")
    big.add_argument("--assignor-load", action="store_true",
                     help="also measure while a server-side balanced run of a big group is "
                          "in flight, side by side with a baseline")
    big.add_argument("--assignor-workers", type=int, default=1_000, help="default %(default)s")
    big.add_argument("--assignor-connectors", type=int, default=1_000,
                     help="default %(default)s")
    big.add_argument("--assignor-tasks", type=int, default=50_000,
                     help="tasks in all, spread over the connectors (default %(default)s)")
    big.add_argument("--assignor-put-interval-ms", type=int, default=100,
                     help="pause between the resizes that trigger runs in the continuously "
                          "loaded window (default %(default)s)")
    big.add_argument("--assignor-windows", choices=("both", "continuous", "in-flight"),
                     default="both",
                     help="after each baseline window: a continuously loaded window, one "
                          "timing the heartbeats sent while a run is in flight, or both "
                          "(default %(default)s)")
    big.add_argument("--in-flight-put-interval-ms", type=int, default=750,
                     help="pause between the resizes in the in-flight window, so runs are "
                          "in flight now and then, not all the time (default %(default)s)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    return parser


def _print_text(result: dict[str, Any]) -> None:
    figures = ("heartbeats_per_s", "p50_ms", "p99_ms", "p999_ms", "max_ms", "heartbeats",
               "errors", "unstable", "unanswered", "load_cpu", "server_cpu", "assignor_cpu",
               "machine_cpu", "server_us_per_heartbeat")
    load = result.get("assignor_load")
    if load is None:
        for key in figures:
            if key in result:
                print(f"{key:>24}  {result[key]}")
    else:
        print(f"{'':>24}  {'baseline':>14}  {'assignor load':>14}")
        for key in figures:
            if key in result or key in load:
                print(f"{key:>24}  {result.get(key)!s:>14}  {load.get(key)!s:>14}")
        for key in ("runs", "runs_failed", "run_ms_mean", "in_flight_share", "puts"):
            print(f"{key:>24}  {'':>14}  {load[key]!s:>14}")
        print(f"{'p99 ratio':>24}  {result['p99_ratio']}")
    flight = result.get("in_flight")
    if flight is not None:
        print(f"heartbeats sent while a run was in flight (a resize every "
              f"{result['in_flight_put_interval_ms']} ms) against the baseline windows:")
        columns = ("baseline", "in_flight", "between_runs")
        print(f"{'':>24}  " + "  ".join(f"{name:>14}" for name in columns))
        for key in ("heartbeats", "p50_ms", "p99_ms", "p999_ms", "max_ms"):
            print(f"{key:>24}  " + "  ".join(f"{flight[name][key]!s:>14}" for name in columns))
        for key in ("p99_ratio", "p999_ratio", "p99_ratio_between_runs", "runs",
                    "flight_ms_mean", "flight_ms_max", "in_flight_share", "puts"):
            print(f"{key:>24}  {flight[key]}")
        where = flight.get("where_in_flight")
        if where is not None:
            print("in flight, by when sent: heartbeats, share slower than the baseline's p99,"
                  " p99 ms")
            for part, counted in where.items():
                share = counted["slower_than_baseline_p99"]
                print(f"{part:>24}  {counted['heartbeats']:>14}  "
                      f"{'-' if share is None else f'{100 * share:.1f}%':>14}  "
                      f"{'-' if counted['p99_ms'] is None else counted['p99_ms']!s:>14}")
        window = flight["window"]
        for key in ("errors", "unstable", "unanswered", "load_cpu", "server_cpu",
                    "assignor_cpu", "machine_cpu"):
            if key in window:
                print(f"{'window ' + key:>24}  {window[key]}")
    for key, value in result.items():
        if key not in figures and key not in ("assignor_load", "p99_ratio", "in_flight"):
            print(f"{key:>24}  {value}")


def _bench_errors(raised: BaseException) -> list[BenchError]:
    """The BenchErrors in what trio raised (its nurseries wrap errors in groups)."""
    if isinstance(raised, BenchError):
        return [raised]
    if isinstance(raised, BaseExceptionGroup):
        return [leaf for inner in raised.exceptions for leaf in _bench_errors(inner)]
    return []


def run_reporting_errors(prog: str, main: Callable[[argparse.Namespace], Awaitable[Any]],
                         args: argparse.Namespace) -> Any:
    """`trio.run(main, args)`; None once the bench's own errors are printed, a line each
    after `prog` (anything else is a bug and raised)."""
    try:
        return trio.run(main, args)
    except (BenchError, BaseExceptionGroup) as raised:
        problems = _bench_errors(raised)
        if not problems:
            raise
        for problem in problems:
            print(f"{prog}: {problem}", file=sys.stderr)
        return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if min(args.processes, args.groups, args.workers_per_group, args.connectors,
           args.rounds) < 1 or args.tasks < 0 or args.interval_ms < 0 or args.duration <= 0:
        parser.error("--processes, --groups, --workers-per-group, --connectors and --rounds "
                     "must be >= 1, --tasks and --interval-ms >= 0, --duration > 0")
    if args.assignor_load and min(args.assignor_workers, args.assignor_connectors,
                                  args.assignor_tasks) < 1:
        parser.error("--assignor-workers, --assignor-connectors and --assignor-tasks "
                     "must be >= 1")
    if args.bootstrap and not args.admin:
        parser.error("--bootstrap needs --admin (connectors are created through it)")
    if args.server_command is not None and (args.bootstrap or args.in_process):
        parser.error("--server-command starts the coordinator: not with --bootstrap or "
                     "--in-process")
    if args.assignor_load and args.assignor_windows != "continuous":
        if args.in_flight_put_interval_ms < 1:
            parser.error("--in-flight-put-interval-ms must be >= 1")
        if args.bootstrap:
            parser.error("the in-flight window needs the coordinator's log (when each run "
                         "was in flight), which --bootstrap does not give: pass "
                         "--assignor-windows continuous")
    result = run_reporting_errors(PROG, run_bench, args)
    if result is None:
        return 1
    if args.json:
        print(json.dumps(result))
    else:
        _print_text(result)
    met = result["heartbeats_per_s"] >= 10_000 and result["p99_ms"] < 5.0
    print(f"target (>= 10000 heartbeats/s, p99 < 5 ms): {'met' if met else 'NOT met'}",
          file=sys.stderr)
    if "p99_ratio" in result and result["p99_ratio"] is not None:
        met = result["p99_ratio"] < TARGET_P99_RATIO
        print(f"continuous load (p99 while runs follow each other < {TARGET_P99_RATIO} x "
              f"without): {'met' if met else 'NOT met'}", file=sys.stderr)
    ratio = result.get("in_flight", {}).get("p99_ratio")
    if ratio is not None:
        met = ratio < TARGET_P99_RATIO
        print(f"target (p99 of heartbeats sent while a run is in flight < {TARGET_P99_RATIO} "
              f"x without): {'met' if met else 'NOT met'}", file=sys.stderr)
    return 0 if not result["errors"] and not result["worker_failures"] else 1


if __name__ == "__main__":
    if sys.argv[1:] == [LOAD_PROCESS_FLAG]:
        sys.exit(load_process_main())
    sys.exit(main())
