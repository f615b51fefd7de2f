"""Shared pieces: a `serve` subprocess, the admin API, and a well-behaved KRPC worker."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from coordinator.client import KafkaClient
from coordinator.core.group import units_to_wire
from coordinator.units import Unit
from protocol.errors import ErrorCode
from protocol.messages import ConnectGroupDescribeRequest, ConnectGroupHeartbeatRequest
from tests.core.context import wire_units

HEARTBEAT = 1000
DESCRIBE = 1003
ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 60.0  # a start-up on a machine busy with other work takes seconds


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServerProcess:
    """`connect-coordinator serve` in a child process, logging JSON lines to a file."""

    def __init__(self, data_dir: Path, log_dir: Path, settings: list[str]) -> None:
        self.data_dir = data_dir
        self.log_dir = log_dir
        self.settings = settings
        self.process: subprocess.Popen[bytes] | None = None
        self.kafka_port = 0
        self.admin_port = 0
        self.log_path = log_dir / "none.log"
        self.starts = 0

    def command(self) -> list[str]:
        argv = [sys.executable, "-m", "coordinator.cli", "serve",
                "--listen", f"127.0.0.1:{self.kafka_port}",
                "--admin-listen", f"127.0.0.1:{self.admin_port}",
                "--data-dir", str(self.data_dir), "--log-format", "json"]
        for setting in self.settings:
            argv += ["--set", setting]
        return argv

    def _spawn(self) -> None:
        self.starts += 1
        self.kafka_port, self.admin_port = free_port(), free_port()
        self.log_path = self.log_dir / f"serve-{self.starts}.log"
        with open(self.log_path, "wb") as log_file:
            self.process = subprocess.Popen(self.command(), cwd=ROOT, stdout=log_file,
                                            stderr=subprocess.STDOUT,
                                            env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def events(self) -> list[dict[str, Any]]:
        found = []
        for line in self.output().splitlines():
            if line.startswith("{"):
                try:
                    found.append(json.loads(line))
                except ValueError:
                    pass
        return found

    async def start(self) -> None:
        """Start and wait for the "ready" line; new ports on a clash (they were free a
        moment ago, but another test may have taken one since)."""
        for _ in range(5):
            self._spawn()
            if await self._wait_ready():
                return
            self.kill()  # exited already, or still not ready: either way, not left running
            if "address already in use" not in self.output().lower():
                break
        raise AssertionError(f"the server did not start:\n{self.output()}")

    async def _wait_ready(self) -> bool:
        assert self.process is not None
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if any(event.get("event") == "ready" for event in self.events()):
                return True
            if self.process.poll() is not None:
                return False
            await trio.sleep(0.02)
        return False

    async def run_to_exit(self, timeout_s: float = READY_TIMEOUT_S) -> int:
        """Start, expecting the process to stop on its own; its exit code."""
        self._spawn()
        assert self.process is not None
        deadline = time.monotonic() + timeout_s
        while self.process.poll() is None:
            if time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"the server did not exit:\n{self.output()}")
            await trio.sleep(0.02)
        return self.process.returncode

    def kill(self) -> None:
        """SIGKILL: nothing is flushed, nothing is closed."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.wait()

    def wait(self) -> None:
        if self.process is not None:
            self.process.wait(timeout=30)

    # -- the admin API ---------------------------------------------------------------------

    async def http(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        url = f"http://127.0.0.1:{self.admin_port}{path}"
        return await trio.to_thread.run_sync(http_call, method, url, body)

    async def group(self, group_id: str) -> dict[str, Any]:
        status, view = await self.http("GET", f"/groups/{group_id}")
        assert status == 200, view
        return view  # type: ignore[no-any-return]

    async def client(self) -> KafkaClient:
        return await KafkaClient.connect("127.0.0.1", self.kafka_port)


def http_call(method: str, url: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        request.add_header("content-type", "application/json")
    # No proxy: the admin API is on localhost.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=10) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as error:
        status, raw = error.code, error.read()
        error.close()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


# -- workers -------------------------------------------------------------------------------


@dataclass
class Worker:
    """A worker that adopts every assignment at once (stops revoked units instantly)."""

    member_id: str
    group_id: str = "g"
    epoch: int = 0
    owned: frozenset[Unit] = frozenset()
    joined: bool = False

    def join_request(self) -> ConnectGroupHeartbeatRequest:
        return ConnectGroupHeartbeatRequest(
            group_id=self.group_id, member_id=self.member_id, member_epoch=0,
            worker_url=f"http://{self.member_id}:8083", rebalance_timeout_ms=30_000,
            server_assignor="balanced")

    def heartbeat_request(self) -> ConnectGroupHeartbeatRequest:
        return ConnectGroupHeartbeatRequest(
            group_id=self.group_id, member_id=self.member_id, member_epoch=self.epoch,
            owned_connectors_and_tasks=units_to_wire(self.owned))

    def leave_request(self) -> ConnectGroupHeartbeatRequest:
        return ConnectGroupHeartbeatRequest(
            group_id=self.group_id, member_id=self.member_id, member_epoch=-1)

    def handle(self, response: Any) -> int:
        """Apply a heartbeat response; return its error code."""
        code = int(response.error_code)
        self.last_response = response
        if code in (ErrorCode.NONE, ErrorCode.COMPUTE_ASSIGNMENT):
            self.joined = True
            self.epoch = response.member_epoch
            if response.assignment is not None:
                self.owned = wire_units(response.assignment.assigned)
        elif code in (ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.FENCED_MEMBER_EPOCH):
            self.joined, self.epoch, self.owned = False, 0, frozenset()
        return code

    async def join(self, client: KafkaClient) -> int:
        return self.handle(await client.request(HEARTBEAT, self.join_request()))

    async def heartbeat(self, client: KafkaClient) -> int:
        return self.handle(await client.request(HEARTBEAT, self.heartbeat_request()))


async def describe(client: KafkaClient, group_id: str) -> Any:
    response = await client.request(DESCRIBE, ConnectGroupDescribeRequest(group_ids=(group_id,)))
    group = response.groups[0]
    assert group.error_code == 0, group.error_message
    return group


async def settle(client: KafkaClient, workers: list[Worker], group_id: str = "g",
                 timeout_s: float = 60.0) -> Any:
    """Heartbeat every worker until the group is STABLE with every member's assignment
    installed and reported back; the described group."""
    with trio.fail_after(timeout_s):
        while True:
            for worker in workers:
                if not worker.joined:
                    await worker.join(client)
                else:
                    await worker.heartbeat(client)
            group = await describe(client, group_id)
            settled = group.group_state == "STABLE" and all(
                m.member_state == "STABLE"
                and wire_units(m.assigned) == wire_units(m.target)
                and wire_units(m.assigned) == next(
                    w.owned for w in workers if w.member_id == m.member_id)
                for m in group.members)
            if settled and len(group.members) == len(workers):
                return group
            await trio.sleep(0.01)


def held_units(view: dict[str, Any]) -> dict[str, list[str]]:
    """Admin GET view -> unit name -> members holding it (assigned or pending)."""
    holders: dict[str, list[str]] = {}
    for member in view["members"]:
        for part in ("assigned", "pending_revocation"):
            units = member[part]
            names = list(units["connectors"]) + [
                f"{task['connector']}-{task['task']}" for task in units["tasks"]]
            for name in names:
                holders.setdefault(name, []).append(member["member_id"])
    return holders


def connector_tasks(view: dict[str, Any]) -> dict[str, int]:
    """Admin GET view -> connector -> task count."""
    units = view["connectors_and_tasks"]
    counts = {name: 0 for name in units["connectors"]}
    for task in units["tasks"]:
        counts[task["connector"]] = counts.get(task["connector"], 0) + 1
    return counts
