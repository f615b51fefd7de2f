"""Mistakes a user can make with the command line, run as the user runs them (a child
process): each ends in one line on stderr that names the cause and what to do, and a
non-zero exit status; output cut short by its reader ends quietly."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from coordinator.server.app import ServerHandle
from tests.integration.helpers import ROOT, free_port
from tests.log.helpers import batch_records, write_log
from tests.server.conftest import http

CLI = [sys.executable, "-m", "coordinator.cli"]
TIMEOUT_S = 60


async def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[bytes]:
    with trio.fail_after(TIMEOUT_S):
        return await trio.run_process([*CLI, *args], capture_stdout=True, capture_stderr=True,
                                      check=False, cwd=cwd)


def one_line(stderr: bytes) -> str:
    """The whole of stderr, which must be exactly one line."""
    lines = stderr.decode().splitlines()
    assert len(lines) == 1, stderr.decode()
    return lines[0]


async def test_version() -> None:
    from importlib.metadata import version

    result = await run_cli("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.decode().strip() == f"connect-coordinator {version('connect-coordinator')}"


async def test_describe_against_a_closed_port_says_to_check_the_bootstrap() -> None:
    port = free_port()  # nothing listens there any more
    result = await run_cli("describe", "--bootstrap", f"127.0.0.1:{port}", "g")
    assert result.returncode == 1
    line = one_line(result.stderr)
    assert f"cannot connect to 127.0.0.1:{port}" in line
    assert "refused" in line.lower()
    assert "--bootstrap" in line and "19092" in line


async def test_describe_against_the_admin_port_says_it_is_http(server: ServerHandle) -> None:
    result = await run_cli("describe", "--bootstrap", f"127.0.0.1:{server.admin_port}", "g")
    assert result.returncode == 1
    line = one_line(result.stderr)
    assert "admin HTTP port" in line, line
    assert "Kafka" in line and "--bootstrap" in line and "--listen" in line


async def test_describe_listing_groups_from_a_wrong_admin_url(server: ServerHandle) -> None:
    # the Kafka port given as the admin URL: the HTTP client gets no HTTP back
    result = await run_cli("describe", "--bootstrap", f"127.0.0.1:{server.kafka_port}",
                           "--admin", f"http://127.0.0.1:{server.kafka_port}")
    assert result.returncode == 2
    line = one_line(result.stderr)
    assert "cannot list groups" in line and "--admin" in line


async def test_describe_with_a_bad_bootstrap_value() -> None:
    result = await run_cli("describe", "--bootstrap", "localhost", "g")
    assert result.returncode == 2
    assert "--bootstrap" in one_line(result.stderr)


def run_into_closed_pipe(*args: str) -> subprocess.CompletedProcess[bytes]:
    """The command with its stdout a pipe whose reader is gone, as in `... | head` once
    head has what it wants: every write fails with EPIPE."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run([*CLI, *args], stdout=write_end, stderr=subprocess.PIPE,
                              timeout=TIMEOUT_S, check=False)
    finally:
        os.close(write_end)


async def test_describe_json_into_a_closed_pipe_is_quiet(server: ServerHandle) -> None:
    await http(server, "PUT", "/groups/piped/connectors/c", {"tasks": 3})
    result = await trio.to_thread.run_sync(
        run_into_closed_pipe, "describe", "--bootstrap", f"127.0.0.1:{server.kafka_port}",
        "piped", "--json")
    assert result.stderr == b""
    assert result.returncode == 141  # as a program ended by SIGPIPE


def test_log_dump_into_a_closed_pipe_is_quiet(tmp_path: Path) -> None:
    write_log(tmp_path, [batch_records(index) for index in range(20)])
    result = run_into_closed_pipe("log", "dump", str(tmp_path))
    assert result.stderr == b""
    assert result.returncode == 141


def test_log_dump_into_head(tmp_path: Path) -> None:
    """The shell pipeline itself: head's lines, nothing on stderr, pipefail sees 141."""
    write_log(tmp_path, [batch_records(index, count=20) for index in range(200)],
              segment_bytes=1 << 20)
    command = " ".join([*CLI, "log", "dump", str(tmp_path)])
    result = subprocess.run(["bash", "-c", f"set -o pipefail; {command} | head -n 2"],
                            capture_output=True, timeout=TIMEOUT_S, check=False)
    assert len(result.stdout.decode().splitlines()) == 2
    assert result.stderr == b""
    assert result.returncode == 141


def serve_args(kafka: str, admin: str, data_dir: Path) -> list[str]:
    return ["serve", "--listen", kafka, "--admin-listen", admin, "--data-dir", str(data_dir),
            "--log-format", "json"]


def damaged_log(data_dir: Path) -> None:
    """A log whose load fails (a bad byte in the first of two segments): a start-up that
    got as far as loading would say so instead of naming the port."""
    write_log(data_dir, [batch_records(index) for index in range(6)], segment_bytes=256)
    first = sorted(data_dir.glob("*.log"))[0]
    raw = bytearray(first.read_bytes())
    raw[70] ^= 0xFF
    first.write_bytes(bytes(raw))


@pytest.mark.parametrize(("which", "option", "named"), [
    ("kafka", "--listen", "Kafka listener"),
    ("admin", "--admin-listen", "admin HTTP listener"),
])
async def test_address_in_use_names_the_listener_before_loading_the_log(
        tmp_path: Path, which: str, option: str, named: str) -> None:
    data_dir = tmp_path / "data"
    damaged_log(data_dir)
    loading = await run_cli(*serve_args("127.0.0.1:0", "127.0.0.1:0", data_dir))
    assert loading.returncode == 1 and b"cannot start" in loading.stderr  # the damage
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        kafka = f"127.0.0.1:{port}" if which == "kafka" else "127.0.0.1:0"
        admin = f"127.0.0.1:{port}" if which == "admin" else "127.0.0.1:0"
        result = await run_cli(*serve_args(kafka, admin, data_dir))
    assert result.returncode == 2
    line = one_line(result.stderr)
    assert f"cannot open the {named} on 127.0.0.1:{port}" in line, line
    assert "address already in use" in line and option in line


WORKERS_EXAMPLE = re.compile(r"```python\n(.*?)```", re.DOTALL)


async def test_readme_workers_example_stops_quietly_on_ctrl_c(
        server: ServerHandle, tmp_path: Path) -> None:
    """The README's two-worker script, run as the README says, then Ctrl-C (SIGINT)."""
    (source,) = [block for block in WORKERS_EXAMPLE.findall((ROOT / "README.md").read_text())
                 if "KafkaClient" in block]
    assert "19092" in source
    script = tmp_path / "workers.py"
    script.write_text(source.replace("19092", str(server.kafka_port)))
    process = await trio.lowlevel.open_process(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert process.stdout is not None and process.stderr is not None
    try:
        seen = b""
        with trio.fail_after(TIMEOUT_S):
            while b"worker-2 epoch" not in seen:
                chunk = await process.stdout.receive_some(4096)
                assert chunk, seen
                seen += chunk
        process.send_signal(signal.SIGINT)
        with trio.fail_after(TIMEOUT_S):
            code = await process.wait()
            stderr = b""
            while chunk := await process.stderr.receive_some(65536):
                stderr += chunk
        assert stderr == b""
        assert code == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await process.stdout.aclose()
        await process.stderr.aclose()


async def test_deleting_an_unknown_connector_names_it(server: ServerHandle) -> None:
    await http(server, "PUT", "/groups/g/connectors/present", {"tasks": 1})
    url = f"http://127.0.0.1:{server.admin_port}/groups/g/connectors/absent"
    with trio.fail_after(TIMEOUT_S):
        result = await trio.run_process(
            ["curl", "-sS", "-X", "DELETE", "-w", "\n%{http_code}", url],
            capture_stdout=True, capture_stderr=True, check=False)
    body, status = result.stdout.decode().rsplit("\n", 1)
    assert status == "404"
    answer = json.loads(body)
    assert answer["error"] == "CONNECTOR_NOT_FOUND"
    assert "'absent'" in answer["message"] and "'g'" in answer["message"]
    # an unknown group is still the group that is not found
    status_code, missing = await http(server, "DELETE", "/groups/nope/connectors/absent")
    assert status_code == 404 and missing["error"] == "GROUP_ID_NOT_FOUND"


async def groups_on(server: ServerHandle) -> list[str]:
    status, body = await http(server, "GET", "/groups")
    assert status == 200, body
    return [group["group_id"] for group in body["groups"]]


@pytest.mark.parametrize("where", ["closed", "admin"])
async def test_simulate_against_a_wrong_bootstrap_says_so_and_creates_nothing(
        server: ServerHandle, where: str) -> None:
    port = free_port() if where == "closed" else server.admin_port
    result = await run_cli("simulate", "--bootstrap", f"127.0.0.1:{port}",
                           "--admin", f"http://127.0.0.1:{server.admin_port}",
                           "--group", "never-made", "--duration", "5")
    assert result.returncode == 1, result.stderr
    line = one_line(result.stderr)
    expected = "refused" if where == "closed" else "admin HTTP port"
    assert expected in line and "--bootstrap" in line, line
    assert result.stdout == b""
    assert "never-made" not in await groups_on(server)


async def test_simulate_against_a_wrong_admin_url_says_so(server: ServerHandle) -> None:
    for admin in (f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{server.kafka_port}"):
        result = await run_cli("simulate", "--bootstrap", f"127.0.0.1:{server.kafka_port}",
                               "--admin", admin, "--group", "never-made", "--duration", "5")
        assert result.returncode == 1, result.stderr
        line = one_line(result.stderr)
        assert admin in line and "--admin" in line, line
    assert "never-made" not in await groups_on(server)


async def test_metrics_record_against_a_wrong_url_says_so(
        server: ServerHandle, tmp_path: Path) -> None:
    for url in (f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{server.kafka_port}"):
        result = await run_cli("metrics", "record", "--url", url, "--interval", "1",
                               "--duration", "30", "--out", str(tmp_path / "m"))
        assert result.returncode == 1, result.stderr
        # after the line that says what it would record
        line = result.stderr.decode().splitlines()[-1]
        assert "Traceback" not in result.stderr.decode()
        assert url in line and "--url" in line and "scrape" not in line, line
    assert not (tmp_path / "m").exists() or not any((tmp_path / "m").iterdir())


async def test_a_mistyped_config_key_gets_the_near_one(tmp_path: Path) -> None:
    result = await run_cli("serve", "--in-memory", "--listen", "127.0.0.1:0",
                           "--admin-listen", "127.0.0.1:0",
                           "--set", "group.connect.sesion.timeout.ms=10000")
    assert result.returncode == 2
    line = one_line(result.stderr)
    assert "did you mean 'group.connect.session.timeout.ms'?" in line, line


async def test_a_mistyped_group_config_key_gets_the_near_one_and_every_key(
        server: ServerHandle) -> None:
    status, body = await http(server, "PUT", "/groups/typo/config",
                              {"connect.session.timout.ms": 10000})
    assert status == 400, body
    assert "did you mean 'connect.session.timeout.ms'?" in body["message"], body
    assert "connect.classic.group.type" in body["message"], body
    status, body = await http(server, "PUT", "/groups/typo/config",
                              {"connect.clasic.group.type": "connect"})
    assert status == 400 and "did you mean 'connect.classic.group.type'?" in body["message"]


async def test_a_port_in_use_leaves_no_data_dir_and_says_how_make_run_passes_it(
        tmp_path: Path) -> None:
    data_dir = tmp_path / "never-made"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = await run_cli(*serve_args(f"127.0.0.1:{port}", "127.0.0.1:0", data_dir))
    assert result.returncode == 2
    line = one_line(result.stderr)
    assert "address already in use" in line and "make run ARGS='--listen 127.0.0.1:PORT'" in line
    assert not data_dir.exists()


async def test_describe_with_no_groups_says_so(server: ServerHandle) -> None:
    result = await run_cli("describe", "--bootstrap", f"127.0.0.1:{server.kafka_port}",
                           "--admin", f"http://127.0.0.1:{server.admin_port}")
    assert result.returncode == 0, result.stderr
    assert "no groups" in result.stdout.decode(), result.stdout
    as_json = await run_cli("describe", "--bootstrap", f"127.0.0.1:{server.kafka_port}",
                            "--admin", f"http://127.0.0.1:{server.admin_port}", "--json")
    assert json.loads(as_json.stdout) == []


def status_lines_on_a_terminal(*args: str) -> list[str]:
    """simulate's live status lines, with its stderr a terminal (a pseudo-terminal)."""
    import pty

    leader, follower = pty.openpty()
    process = subprocess.Popen([*CLI, *args], stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=follower)
    os.close(follower)
    seen = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the terminal's other side is closed
            break
        if not chunk:
            break
        seen += chunk
    os.close(leader)
    assert process.stdout is not None
    process.stdout.close()
    assert process.wait(TIMEOUT_S * 3) == 0, seen.decode(errors="replace")
    return re.split(r"[\r\n]", seen.decode(errors="replace"))


async def test_simulates_status_line_gives_a_steady_heartbeat_rate(server: ServerHandle) -> None:
    # 4 workers heartbeating every 3 s: about 1.3 heartbeats/s, in bursts.
    await http(server, "PUT", "/groups/rate/config", {"connect.heartbeat.interval.ms": 3000})
    lines = await trio.to_thread.run_sync(
        status_lines_on_a_terminal, "simulate", "--bootstrap",
        f"127.0.0.1:{server.kafka_port}", "--admin", f"http://127.0.0.1:{server.admin_port}",
        "--group", "rate", "--workers", "4", "--duration", "30")
    rates = []
    for line in lines:
        found = re.search(r"\[\s*([\d.]+)s\] group .* ([\d.]+) heartbeats/s", line)
        if found and float(found.group(1)) >= 15:  # after the first window
            rates.append(float(found.group(2)))
    assert len(rates) >= 5, lines
    assert all(0.8 <= rate <= 2.2 for rate in rates), rates
