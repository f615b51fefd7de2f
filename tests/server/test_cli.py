"""The command line as a subprocess: config errors, the ready line, SIGTERM, describe."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from coordinator.client import KafkaClient
from coordinator.server.app import ServerHandle
from tests.server.conftest import http
from tests.server.test_krpc import api_versions_request

CLI = [sys.executable, "-m", "coordinator.cli"]


async def run_cli(*args: str) -> subprocess.CompletedProcess[bytes]:
    with trio.fail_after(30):
        return await trio.run_process([*CLI, *args], capture_stdout=True, capture_stderr=True,
                                      check=False)


async def test_help_explains_the_commands() -> None:
    result = await run_cli("--help")
    assert result.returncode == 0
    text = result.stdout.decode()
    for command in ("serve", "describe", "bench", "log"):
        assert command in text
    serve_help = (await run_cli("serve", "--help")).stdout.decode()
    for option in ("--listen", "--admin-listen", "--data-dir", "--config", "--set",
                   "--log-level"):
        assert option in serve_help


@pytest.mark.parametrize(
    ("setting", "named"),
    [
        ("group.connect.session.timeout.ms=5", "group.connect.session.timeout.ms"),
        ("group.connect.heartbeat.interval.ms=abc", "group.connect.heartbeat.interval.ms"),
        ("no.such.key=1", "no.such.key"),
        ("group.connect.server.assignors=nope", "nope"),
    ],
)
async def test_config_errors_exit_2_naming_the_key(
    tmp_path: Path, setting: str, named: str
) -> None:
    result = await run_cli("serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
                           "--data-dir", str(tmp_path / "data"), "--set", setting)
    assert result.returncode == 2, result.stderr
    assert named in result.stderr.decode()


async def test_bad_config_file_exits_2(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text('"group.connect.max.size" = 0\n')
    result = await run_cli("serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
                           "--data-dir", str(tmp_path / "data"), "--config", str(config))
    assert result.returncode == 2
    assert "group.connect.max.size" in result.stderr.decode()


async def _read_json_lines(stream: Any, lines: list[dict[str, Any]], until: str) -> None:
    buffer = b""
    while True:
        chunk = await stream.receive_some(65536)
        if not chunk:
            return
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            if not line.strip():
                continue
            record = json.loads(line)  # every log line is one JSON object
            lines.append(record)
            if record.get("event") == until:
                return


async def test_serve_logs_ready_and_exits_0_on_sigterm(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    process = await trio.lowlevel.open_process(
        [*CLI, "serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
         "--data-dir", str(data_dir), "--set", "group.connect.assignor.offload.enable=false"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    assert process.stderr is not None
    lines: list[dict[str, Any]] = []
    try:
        with trio.fail_after(30):
            await _read_json_lines(process.stderr, lines, "ready")
        ready = [line for line in lines if line.get("event") == "ready"]
        assert len(ready) == 1, lines
        assert data_dir.is_dir()
        # `serve` owns its process: the loaded state is kept out of the collector's scans
        assert [line for line in lines if line.get("event") == "gc_frozen"], lines
        host, _, port = ready[0]["listen"].rpartition(":")
        async with await KafkaClient.connect(host, int(port)) as client:
            response = await client.request(18, api_versions_request(3), 3)
            assert int(response.error_code) == 0
        process.send_signal(signal.SIGTERM)
        with trio.fail_after(30):
            await _read_json_lines(process.stderr, lines, "stopped")
            code = await process.wait()
        assert code == 0
        assert [line for line in lines if line.get("event") == "stopped"]
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await process.stderr.aclose()


async def test_serve_in_memory_writes_nothing(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    process = await trio.lowlevel.open_process(
        [*CLI, "serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
         "--data-dir", str(data_dir), "--in-memory"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=tmp_path,
    )
    assert process.stderr is not None
    lines: list[dict[str, Any]] = []
    try:
        with trio.fail_after(30):
            await _read_json_lines(process.stderr, lines, "ready")
        ready = next(line for line in lines if line.get("event") == "ready")
        assert ready["data_dir"] is None
        admin = ready["admin"]
        status, _body = await trio.to_thread.run_sync(
            _put_connector, f"{admin}/groups/g/connectors/a")
        assert status == 200
        process.send_signal(signal.SIGTERM)
        with trio.fail_after(30):
            assert await process.wait() == 0
        assert not data_dir.exists()  # noqa: ASYNC240 - a check after the process ended
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await process.stderr.aclose()


def _put_connector(url: str) -> tuple[int, bytes]:
    import urllib.request
    request = urllib.request.Request(url, data=b'{"tasks": 2}', method="PUT")
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.status, response.read()


async def test_describe_command(server: ServerHandle) -> None:
    await http(server, "PUT", "/groups/shown/connectors/c", {"tasks": 2})
    bootstrap = f"127.0.0.1:{server.kafka_port}"
    result = await run_cli("describe", "--bootstrap", bootstrap, "shown", "--json")
    assert result.returncode == 0, result.stderr
    described = json.loads(result.stdout)
    assert described[0]["group_id"] == "shown"
    assert described[0]["state"] == "EMPTY"
    assert (described[0]["type"], described[0]["units_source"]) == ("connect", "admin")
    # no group named: listed through the admin API
    result = await run_cli("describe", "--bootstrap", bootstrap,
                           "--admin", f"http://127.0.0.1:{server.admin_port}")
    assert result.returncode == 0, result.stderr
    assert "shown" in result.stdout.decode()
    assert "EMPTY" in result.stdout.decode()
    assert "type=connect" in result.stdout.decode()
