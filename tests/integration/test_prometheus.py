"""A real Prometheus scrapes a real coordinator: the admin `/metrics` endpoint works as a
scrape target, and the series come out of PromQL with the names and labels README.md
documents.

The coordinator is the `serve` process (real TCP, a temporary data dir); Prometheus is the
Debian package's binary (`make system-deps` installs it), scraping every second. Workers
heartbeat, then the test asks Prometheus' HTTP API (/api/v1/query) for the counters.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import trio

from tests.programs import require_binary

from .helpers import ServerProcess, Worker, free_port, settle

SETTINGS = ["group.connect.assignment.interval.ms=0",
            "group.connect.assignor.offload.enable=false"]
JOB = "connect-coordinator"
TEST_BUDGET_S = 30.0


def prometheus_config(admin_port: int) -> str:
    return f"""\
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: {JOB}
    metrics_path: /metrics
    static_configs:
      - targets: ["127.0.0.1:{admin_port}"]
"""


def http_get(url: str) -> tuple[int, Any]:
    """(status, body as JSON or text); status 0 while nothing listens yet."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=5) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as error:
        status, raw = error.code, error.read()
        error.close()
    except (urllib.error.URLError, ConnectionError):
        return 0, None
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


class Prometheus:
    """The `prometheus` binary in a child process, on a free port, storing in `directory`."""

    def __init__(self, binary: str, directory: Path, admin_port: int) -> None:
        self.directory = directory
        self.port = free_port()
        self.config = directory / "prometheus.yml"
        self.config.write_text(prometheus_config(admin_port))
        self.log_path = directory / "prometheus.log"
        self.argv = [binary, f"--config.file={self.config}",
                     f"--storage.tsdb.path={directory / 'tsdb'}",
                     f"--web.listen-address=127.0.0.1:{self.port}"]
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log_path, "wb") as log_file:
            self.process = subprocess.Popen(self.argv, cwd=self.directory, stdout=log_file,
                                            stderr=subprocess.STDOUT)

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    async def get(self, path: str, **params: str) -> tuple[int, Any]:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        url = f"http://127.0.0.1:{self.port}{path}{query}"
        return await trio.to_thread.run_sync(http_get, url)

    async def wait_ready(self) -> None:
        assert self.process is not None
        while True:
            assert self.process.poll() is None, f"prometheus exited:\n{self.output()}"
            status, _ = await self.get("/-/ready")
            if status == 200:
                return
            await trio.sleep(0.1)

    async def query(self, promql: str) -> list[dict[str, Any]]:
        status, body = await self.get("/api/v1/query", query=promql)
        assert status == 200 and body["status"] == "success", body
        assert body["data"]["resultType"] == "vector", body
        return body["data"]["result"]  # type: ignore[no-any-return]

    async def wait_for(self, promql: str) -> list[dict[str, Any]]:
        """Query until the answer is non-empty with every value positive."""
        while True:
            result = await self.query(promql)
            if result and all(float(series["value"][1]) > 0 for series in result):
                return result
            await trio.sleep(0.2)

    def stop(self) -> int:
        """SIGTERM, then wait for a clean exit; its exit code."""
        if self.process is None:
            return 0
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=10)
        except subprocess.TimeoutExpired as error:
            self.process.kill()
            self.process.wait(timeout=10)
            raise AssertionError(
                f"prometheus did not stop on SIGTERM:\n{self.output()}") from error


def stop_server(server: ServerProcess) -> int:
    assert server.process is not None
    if server.process.poll() is None:
        server.process.send_signal(signal.SIGTERM)
    return server.process.wait(timeout=15)


async def test_prometheus_scrapes_the_coordinator(tmp_path: Path) -> None:
    binary = require_binary("prometheus")
    started = time.monotonic()
    server = ServerProcess(tmp_path / "data", tmp_path, SETTINGS)
    await server.start()
    prometheus: Prometheus | None = None
    try:
        status, body = await server.http("PUT", "/groups/g/connectors/source", {"tasks": 3})
        assert status == 200, body
        prom_dir = tmp_path / "prometheus"
        prom_dir.mkdir()
        prometheus = Prometheus(binary, prom_dir, server.admin_port)
        prometheus.start()
        with trio.fail_after(TEST_BUDGET_S - 5):
            await prometheus.wait_ready()
            workers = [Worker("w1"), Worker("w2")]
            async with await server.client() as client:
                await settle(client, workers)
                for _ in range(20):
                    for worker in workers:
                        await worker.heartbeat(client)

            # The target is up ...
            (up,) = await prometheus.wait_for(f'up{{job="{JOB}"}}')
            assert up["metric"]["instance"] == f"127.0.0.1:{server.admin_port}"
            # ... and the heartbeats are there, with their labels.
            result = await prometheus.wait_for(
                'connect_coordinator_requests_total{api="ConnectGroupHeartbeat"}')
            assert len(result) == 1, result
            (series,) = result
            assert series["metric"] == {
                "__name__": "connect_coordinator_requests_total", "api": "ConnectGroupHeartbeat",
                "error": "NONE", "job": JOB, "instance": f"127.0.0.1:{server.admin_port}"}
            assert float(series["value"][1]) >= 40  # 20 rounds of 2, plus settling
            # The rest of the catalogue answers PromQL too.
            (joined,) = await prometheus.wait_for(
                'connect_coordinator_rebalances_total{trigger="member_joined"}')
            assert float(joined["value"][1]) == 2
            stable = await prometheus.wait_for('connect_coordinator_groups{state="STABLE"}')
            assert [float(s["value"][1]) for s in stable] == [1]
            members = await prometheus.query("sum(connect_coordinator_members)")
            assert float(members[0]["value"][1]) == 2
            await prometheus.wait_for("connect_coordinator_time_to_stable_seconds_count")
            await prometheus.wait_for('connect_coordinator_group_members{group="g"}')
            await prometheus.wait_for("connect_coordinator_log_bytes")
            await prometheus.wait_for("process_resident_memory_bytes")
            # A histogram quantile over the request latencies is computable.
            latency = await prometheus.wait_for(
                "histogram_quantile(0.99, sum by (le) (connect_coordinator_request_duration_"
                'seconds_bucket{api="ConnectGroupHeartbeat"}))')
            assert 0 < float(latency[0]["value"][1]) <= 5
    finally:
        # Both shut down cleanly on SIGTERM (checked below when the test got that far).
        prometheus_code = prometheus.stop() if prometheus is not None else 0
        server_code = stop_server(server)
    assert prometheus is not None and prometheus_code == 0, prometheus.output()
    assert server_code == 0, server.output()
    assert time.monotonic() - started < TEST_BUDGET_S
