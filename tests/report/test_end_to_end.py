"""The README's "Report on a run", end to end: a coordinator subprocess, a chaos run of the
simulator with the metrics recorder beside it (docs/simulate-and-record.sh), the capacity
report from what they recorded, and the page opened in headless Chromium.

The figures asserted follow from the run's options (workers, connectors, tasks), not from
numbers seen once. Chromium is the Debian package `chromium`; without it these tests skip,
except under CI=true, where they fail.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from html.parser import HTMLParser
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.integration.helpers import ROOT, free_port, http_call

pytest.importorskip("pyspark", reason="pyspark is not installed")
pytest.importorskip("pyarrow", reason="pyarrow is not installed")
pytest.importorskip("matplotlib", reason="matplotlib is not installed")

import matplotlib.image  # noqa: E402
import numpy as np  # noqa: E402

from coordinator.report import job  # noqa: E402

WRAPPER = ROOT / "docs" / "simulate-and-record.sh"
GROUP = "e2e"
WORKERS, CONNECTORS, TASKS_PER_CONNECTOR = 6, 3, 4
# Short timings so the run takes seconds. A static worker that leaves stays in the group
# for the session timeout: the snapshot the wrapper takes right after the run must come
# first, so that timeout is not as short as the heartbeat interval allows.
SERVER_SETTINGS = {
    "group.connect.session.timeout.ms": 5000,
    "group.connect.heartbeat.interval.ms": 200,
    "group.connect.assignment.interval.ms": 0,
}
# A steady run must stay steady on a busy machine, where a worker's heartbeats can stall
# for seconds: nothing in it waits for a session to expire, so a long timeout costs nothing.
STEADY_SERVER_SETTINGS = {**SERVER_SETTINGS, "group.connect.session.timeout.ms": 60_000}
SCREEN = (1280, 2000)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TITLE = "connect-coordinator capacity report"
CHROMIUM_TIMEOUT_S = 60


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() not in ("", "0", "false", "no")


def chromium_path() -> str:
    """Chromium, or a failure under CI (it must run there) and a skip elsewhere."""
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found is not None:
            return found
    if os.access("/usr/bin/chromium", os.X_OK):
        return "/usr/bin/chromium"
    message = ("chromium is not installed (Debian package `chromium`; `make system-deps` "
               "installs it as root)")
    if in_ci():
        pytest.fail(message + " and CI is set: tests that need it must run in CI")
    pytest.skip(message)


def local_env() -> dict[str, str]:
    """The environment for the children: nothing on 127.0.0.1 goes through a proxy."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    for key in ("no_proxy", "NO_PROXY"):
        env[key] = ",".join(filter(None, [env.get(key, ""), "127.0.0.1", "localhost"]))
    return env


# ---------------------------------------------------------------------------- the run
@dataclass
class Run:
    out: Path
    report: Path
    simulation: dict[str, Any]
    figures: dict[str, Any]
    seconds: dict[str, float]


class Coordinator:
    """`connect-coordinator serve` in a child process with its own data dir."""

    def __init__(self, root: Path, settings: dict[str, int]) -> None:
        self.data_dir = root / "data"
        self.log_path = root / "serve.log"
        self.kafka_port, self.admin_port = free_port(), free_port()
        command = [sys.executable, "-m", "coordinator.cli", "serve",
                   "--listen", f"127.0.0.1:{self.kafka_port}",
                   "--admin-listen", f"127.0.0.1:{self.admin_port}",
                   "--data-dir", str(self.data_dir), "--log-format", "json"]
        for key, value in settings.items():
            command += ["--set", f"{key}={value}"]
        with open(self.log_path, "wb") as log_file:
            self.process = subprocess.Popen(command, cwd=ROOT, stdout=log_file,
                                            stderr=subprocess.STDOUT, env=local_env())

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    def wait_ready(self, timeout_s: float = 90) -> None:  # a busy machine starts slowly
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.log_path.read_text(errors="replace")
            try:
                if http_call("GET", f"{self.admin_url}/readyz")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"not ready:\n{self.log_path.read_text(errors='replace')}")

    def stop(self) -> int:
        """SIGTERM (a graceful drain) and its exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise


CHAOS = ["--chaos", "kill,bounce", "--chaos-interval", "2", "--downtime", "0.5"]


@pytest.fixture(scope="module")
def run(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    """The README's three steps against a coordinator subprocess; the report's outputs."""
    yield from record_and_report(tmp_path_factory.mktemp("end-to-end"), CHAOS)


@pytest.fixture(scope="module")
def steady_run(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    """The same with no chaos: the workers join, then only heartbeat."""
    yield from record_and_report(tmp_path_factory.mktemp("end-to-end-steady"), [],
                                 min_steady_seconds=5, settings=STEADY_SERVER_SETTINGS)


def record_and_report(root: Path, chaos: list[str], min_steady_seconds: float | None = None,
                      settings: dict[str, int] = SERVER_SETTINGS) -> Iterator[Run]:
    cli = Path(sys.executable).parent / "connect-coordinator"
    assert cli.exists(), f"{cli} is missing: install the project (make install)"
    seconds: dict[str, float] = {}
    coordinator = Coordinator(root, settings)
    try:
        began = time.monotonic()
        coordinator.wait_ready()
        seconds["coordinator start"] = time.monotonic() - began

        began = time.monotonic()
        recorded = subprocess.run(
            ["bash", str(WRAPPER), str(root / "run"),
             "--bootstrap", f"127.0.0.1:{coordinator.kafka_port}", "--group", GROUP,
             "--workers", str(WORKERS), "--connectors", str(CONNECTORS),
             "--tasks-per-connector", str(TASKS_PER_CONNECTOR), "--duration", "8",
             *chaos, "--rebalance-delay-ms", "1000", "--seed", "3", "--quiet"],
            cwd=ROOT, capture_output=True, text=True, timeout=120,
            env={**local_env(), "ADMIN_URL": coordinator.admin_url,
                 "DATA_DIR": str(coordinator.data_dir), "SCRAPE_INTERVAL": "0.5",
                 "CONNECT_COORDINATOR": str(cli)},
        )
        seconds["simulate and record"] = time.monotonic() - began
        assert recorded.returncode == 0, recorded.stdout + recorded.stderr
    finally:
        assert coordinator.stop() == 0, coordinator.log_path.read_text(errors="replace")

    began = time.monotonic()
    out = root / "report"
    # The shared session is active, so main() reuses it (and leaves it running).
    options = ["--metrics", str(root / "run" / "metrics"),
               "--snapshot", str(root / "run" / "snapshot.parquet"),
               "--simulation", str(root / "run" / "simulation.json"),
               "--out", str(out), "--master", "local[1]"]
    if min_steady_seconds is not None:
        options += ["--min-steady-seconds", str(min_steady_seconds)]
    assert job.main(options) == 0
    seconds["report"] = time.monotonic() - began
    yield Run(out=out, report=out / "index.html",
              simulation=json.loads((root / "run" / "simulation.json").read_text()),
              figures=json.loads((out / "figures.json").read_text()), seconds=seconds)
    print("end-to-end timings:", {k: round(v, 1) for k, v in seconds.items()})


# ---------------------------------------------------------------------------- the figures
def value(run: Run, figure: str) -> float:
    entry = run.figures["summary"][figure]
    assert entry["status"] == "ok", (figure, entry)
    return float(entry["value"])


def rows(run: Run, table: str) -> list[dict[str, Any]]:
    return list(run.figures["tables"][table]["rows"])


def test_the_simulation_kept_units_single(run: Run) -> None:
    simulation = run.simulation
    assert simulation["violations"] == [] and simulation["converged"] is True
    assert simulation["config"]["workers"] == WORKERS
    assert simulation["disruptions"], "the chaos did nothing"
    assert simulation["final"]["units_running"] == CONNECTORS * (TASKS_PER_CONNECTOR + 1)


def test_snapshot_figures_are_the_configured_cluster(run: Run) -> None:
    # The snapshot was taken as the run ended: every worker, connector and task.
    assert value(run, "groups (snapshot)") == 1
    assert value(run, "workers") == WORKERS
    assert value(run, "connectors") == CONNECTORS
    assert value(run, "tasks") == CONNECTORS * TASKS_PER_CONNECTOR
    assert value(run, "unassigned units (snapshot)") == 0
    workers = rows(run, "workers")
    assert len(workers) == WORKERS
    assert {row["group_id"] for row in workers} == {GROUP}
    assert sum(row["tasks"] for row in workers) == CONNECTORS * TASKS_PER_CONNECTOR
    assert sum(row["connectors"] for row in workers) == CONNECTORS
    assert value(run, "tasks per worker: max") >= value(run, "tasks per worker: min")
    (group,) = rows(run, "groups")
    assert group["group_id"] == GROUP and group["workers"] == WORKERS


def test_metric_figures_follow_from_the_run(run: Run) -> None:
    assert value(run, "heartbeats per second") > 0
    assert value(run, "rebalances") > 0
    assert 0 < value(run, "members (mean over recording)") <= WORKERS
    assert value(run, "CPU used (mean)") > 0
    assert value(run, "time to stable p50") >= 0
    # Recording started before the run: each connector created is one rebalance, and
    # each worker's first join (at least) another.
    triggers = {row["trigger"]: row["rebalances"] for row in rows(run, "rebalances_by_trigger")}
    assert triggers["connectors_changed"] == CONNECTORS
    assert triggers["member_joined"] >= 1
    # The coordinator counted the heartbeats the workers sent, plus each worker's leave.
    apis = {row["api"]: row for row in rows(run, "requests_by_api")}
    sent = run.simulation["heartbeats"]
    counted = apis["ConnectGroupHeartbeat"]["observations"]
    assert 0.9 * sent <= counted <= 1.1 * sent + WORKERS, (sent, counted)
    # The members gauge reached the configured cluster size.
    members = [row["value"] for row in rows(run, "members_groups_over_time")
               if row["metric"] == "connect_coordinator_members" and row["value"] is not None]
    assert max(members) == pytest.approx(WORKERS)


def test_the_headline_of_the_chaos_run_gives_no_capacity_figure(run: Run) -> None:
    headline = run.figures["headline"]
    assert headline["kind"] == "disturbed", headline
    assert headline["text"].startswith(f"{WORKERS} workers ran for ")
    assert "no capacity figure" in headline["text"]
    kinds = sorted({d["kind"] for d in run.simulation["disruptions"]})
    disrupted = next(r for r in headline["reasons"] if r.startswith("the simulator"))
    assert f"{len(run.simulation['disruptions'])} times" in disrupted
    for kind in kinds:
        assert kind in disrupted
    # no table says otherwise: the summary's capacity rows are withheld
    for name, entry in run.figures["summary"].items():
        if name.startswith("capacity:"):
            assert entry["status"] == "missing", (name, entry)
            assert "no capacity figure for this run (disturbed)" in entry["missing_reason"]
    # the simulator's results are in the report
    assert value(run, "disruptions (simulation)") == len(run.simulation["disruptions"])
    assert value(run, "units run on two workers (simulation)") == 0


def test_the_headline_of_a_steady_run_covers_what_ran(steady_run: Run) -> None:
    assert steady_run.simulation["disruptions"] == []
    headline = steady_run.figures["headline"]
    assert headline["kind"] in ("capacity", "over_budget"), headline
    assert headline["text"].startswith(f"{WORKERS} workers ran for ")
    assert headline["reasons"] == []
    capacity = steady_run.figures["capacity"]
    fit = int(capacity["max_members"])
    if headline["kind"] == "capacity" and fit > WORKERS:  # a CPU figure above what ran
        assert f"about {fit:,} workers fit ({fit - WORKERS:,} more than ran)" \
            in headline["text"]
        # never beyond what one coordinator was measured to answer
        assert fit * capacity["heartbeats_per_member_per_second"] <= 7_506 + 1e-6
    elif headline["kind"] == "capacity":  # within budget, but no figure beyond what ran
        assert "no figure beyond what ran" in headline["text"]
    else:
        assert "no headroom" in headline["text"] and " is above the " in headline["text"]


# ---------------------------------------------------------------------------- the page
class ImageSources(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.sources: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "img":
            source = dict(attrs).get("src")
            assert source, f"an <img> without src: {attrs}"
            self.sources.append(source)


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from the IHDR chunk, which a PNG must start with."""
    header = path.read_bytes()[:24]
    assert header[:8] == PNG_MAGIC, f"{path} is not a PNG"
    assert header[12:16] == b"IHDR", f"{path}: no IHDR chunk first"
    width, height = struct.unpack(">II", header[16:24])
    return int(width), int(height)


def assert_not_blank(path: Path, min_colours: int) -> None:
    pixels = matplotlib.image.imread(str(path))  # floats in [0, 1], RGB or RGBA
    assert pixels.ndim == 3 and pixels.shape[-1] in (3, 4), f"{path}: not an RGB(A) image"
    rgb = np.rint(pixels[..., :3] * 255).astype(np.uint32)
    packed = (rgb[..., 0] << 16) | (rgb[..., 1] << 8) | rgb[..., 2]
    colours = len(np.unique(packed))
    assert colours >= min_colours, f"{path}: only {colours} colours"
    # More than a stray pixel differs from the background (the top-left pixel).
    differs = (packed != packed[0, 0]).mean()
    assert differs > 0.01, f"{path}: {differs:.2%} of pixels differ from the background"


class _Quiet(SimpleHTTPRequestHandler):
    requested: list[tuple[str, int]]

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        self.requested.append((self.path.split("?")[0], int(code)))

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def served(run: Run) -> Iterator[tuple[str, list[tuple[str, int]]]]:
    """The report directory over HTTP on localhost, and every (path, status) fetched."""
    requested: list[tuple[str, int]] = []
    handler = type("Handler", (_Quiet,), {"requested": requested})
    factory = functools.partial(handler, directory=str(run.out))
    with ThreadingHTTPServer(("127.0.0.1", 0), factory) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}/index.html", requested
        finally:
            server.shutdown()
            thread.join(timeout=10)


def chromium(*arguments: str) -> subprocess.CompletedProcess[str]:
    binary = chromium_path()
    # Without the background-networking flags it waits on the network on an offline host.
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        finished = subprocess.run(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
             "--no-first-run", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-proxy-server",
             "--hide-scrollbars", f"--user-data-dir={profile}", *arguments],
            capture_output=True, text=True, timeout=CHROMIUM_TIMEOUT_S, env=local_env(),
        )
    assert finished.returncode == 0, finished.stderr[-3000:]
    return finished


def test_screenshot_of_the_page(run: Run, served: tuple[str, list[tuple[str, int]]],
                                tmp_path: Path) -> None:
    url, requested = served
    shot = tmp_path / "report.png"
    began = time.monotonic()
    chromium(f"--screenshot={shot}", f"--window-size={SCREEN[0]},{SCREEN[1]}", url)
    print(f"chromium screenshot: {time.monotonic() - began:.1f}s")
    assert png_size(shot) == SCREEN
    assert_not_blank(shot, min_colours=200)
    # The browser fetched the page and every chart on it, and each was there.
    parser = ImageSources()
    parser.feed(run.report.read_text())
    fetched = dict(requested)
    assert fetched.get("/index.html") == 200
    for source in parser.sources:
        assert fetched.get(f"/{source}") == 200, (source, requested)


def test_every_image_on_the_page_is_a_chart(run: Run) -> None:
    parser = ImageSources()
    parser.feed(run.report.read_text())
    assert sorted(parser.sources) == sorted(run.figures["charts"])
    for source in parser.sources:
        path = run.out / source
        assert path.is_file(), source
        width, height = png_size(path)
        assert width > 100 and height > 100, (source, width, height)
        assert_not_blank(path, min_colours=20)
    # With a snapshot of a running cluster and a recording, no chart is a placeholder.
    missing = {name: chart["missing_reason"] for name, chart in run.figures["charts"].items()
               if chart["missing_reason"]}
    assert missing == {}


def test_dom_has_the_title_and_tables(run: Run,
                                      served: tuple[str, list[tuple[str, int]]]) -> None:
    url, _ = served
    dom = chromium("--dump-dom", url).stdout
    assert f"<title>{TITLE}</title>" in dom
    assert f"<h1>{TITLE}</h1>" in dom
    assert dom.count("<table") >= len(run.figures["tables"])
    for name in ("summary", *run.figures["tables"]):
        assert f'id="{name}"' in dom, name
    # The summary row with the worker count, as the page shows it.
    assert f"<td>workers</td><td>{WORKERS}</td>" in dom
