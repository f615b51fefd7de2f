"""The recorder against tiny local HTTP servers: a /metrics page and a Prometheus API."""

from __future__ import annotations

import json
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyarrow", reason="pyarrow is not installed")

import pyarrow.parquet as pq  # noqa: E402

from coordinator.report import recorder  # noqa: E402

EXPOSITION = """\
# HELP connect_coordinator_requests_total KRPC requests answered, by API and error code.
# TYPE connect_coordinator_requests_total counter
connect_coordinator_requests_total{api="ConnectGroupHeartbeat",error="NONE"} 42.0
connect_coordinator_requests_created{api="ConnectGroupHeartbeat",error="NONE"} 1.7e9
# HELP connect_coordinator_request_duration_seconds Time per request.
# TYPE connect_coordinator_request_duration_seconds histogram
connect_coordinator_request_duration_seconds_bucket{api="ConnectGroupHeartbeat",le="0.001"} 40.0
connect_coordinator_request_duration_seconds_bucket{api="ConnectGroupHeartbeat",le="+Inf"} 42.0
connect_coordinator_request_duration_seconds_count{api="ConnectGroupHeartbeat"} 42.0
connect_coordinator_request_duration_seconds_sum{api="ConnectGroupHeartbeat"} 0.021
# HELP connect_coordinator_members Members of all connect groups.
# TYPE connect_coordinator_members gauge
connect_coordinator_members 6.0
# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total 1.5
"""
SAMPLES_PER_SCRAPE = 7

Handler = Callable[[BaseHTTPRequestHandler], None]


@pytest.fixture
def serve() -> Iterator[Callable[[Handler], str]]:
    """Start a server on 127.0.0.1:0 answering GETs with ``handler``; yields its base URL."""
    servers: list[ThreadingHTTPServer] = []

    def start(handler: Handler) -> str:
        class Answer(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
                handler(self)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass  # keep the test output clean

        server = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
        servers.append(server)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def reply(request: BaseHTTPRequestHandler, status: int, body: str,
          content_type: str = "text/plain; version=0.0.4") -> None:
    payload = body.encode()
    request.send_response(status)
    request.send_header("Content-Type", content_type)
    request.send_header("Content-Length", str(len(payload)))
    request.end_headers()
    request.wfile.write(payload)


def test_scrapes_into_parquet_and_survives_an_outage(
        serve: Callable[[Handler], str], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    hits: list[str] = []

    def metrics(request: BaseHTTPRequestHandler) -> None:
        hits.append(request.path)
        # The second scrape finds the endpoint down for a moment.
        if len(hits) == 2:
            reply(request, 503, "restarting")
        else:
            reply(request, 200, EXPOSITION)

    base = serve(metrics)
    # Scrapes at 0, 0.2, 0.4, 0.6 s (4 in all), a file every scrape or so.
    status = recorder.main(["record", "--url", base, "--interval", "0.2", "--duration", "0.6",
                            "--flush-every", "0.1", "--out", str(tmp_path)])
    assert status == 0
    assert hits == ["/metrics"] * 4  # the path defaults to /metrics
    assert "failed" in capsys.readouterr().err
    files = sorted(tmp_path.glob("*.parquet"))
    assert len(files) >= 2  # one per flush
    assert not list(tmp_path.glob(".*"))  # no temporary files left behind
    table = pq.read_table(tmp_path).to_pylist()
    assert len(table) == 3 * SAMPLES_PER_SCRAPE
    assert len({row["timestamp"] for row in table}) == 3
    bucket = next(row for row in table if row["metric"].endswith("_bucket")
                  and dict(row["labels"])["le"] == "+Inf")
    assert dict(bucket["labels"]) == {"api": "ConnectGroupHeartbeat", "le": "+Inf"}
    assert bucket["value"] == 42.0
    members = next(row for row in table if row["metric"] == "connect_coordinator_members")
    assert members["labels"] == [] and members["value"] == 6.0
    assert not any(row["metric"].endswith("_created") for row in table)
    assert {row["metric"] for row in table} >= {
        "connect_coordinator_requests_total", "process_cpu_seconds_total",
        "connect_coordinator_request_duration_seconds_sum",
    }


def test_nothing_recorded_when_the_endpoint_never_answers(tmp_path: Path) -> None:
    # Port 9 on loopback: nothing listens there, every scrape is refused.
    status = recorder.main(["--url", "127.0.0.1:9", "--interval", "0.05", "--duration", "0.1",
                            "--out", str(tmp_path), "--timeout", "1"])
    assert status == 1
    assert not list(tmp_path.glob("*.parquet"))


def test_prometheus_range_mode(serve: Callable[[Handler], str], tmp_path: Path,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    queries: list[dict[str, str]] = []

    def api(request: BaseHTTPRequestHandler) -> None:
        parsed = urllib.parse.urlsplit(request.path)
        params = dict(urllib.parse.parse_qsl(parsed.query))
        if parsed.path == "/api/v1/label/__name__/values":
            assert params["match[]"] == '{job="connect-coordinator"}'
            data: Any = ["connect_coordinator_members", "process_cpu_seconds_total", "up"]
        elif parsed.path == "/api/v1/query_range":
            queries.append(params)
            name = params["query"].split('"')[1]
            start, end, step = (float(params[key]) for key in ("start", "end", "step"))
            points = []
            moment = start
            while moment <= end:
                points.append([moment, "NaN" if moment == 120.0 else str(moment / 10)])
                moment += step
            data = {"resultType": "matrix", "result": [{
                "metric": {"__name__": name, "job": "connect-coordinator",
                           "instance": "coordinator:19093"},
                "values": points,
            }]}
        else:
            reply(request, 404, "{}", "application/json")
            return
        reply(request, 200, json.dumps({"status": "success", "data": data}),
              "application/json")

    base = serve(api)
    # Three points per request, so the 0..150 s range at 30 s (6 points) takes two.
    monkeypatch.setattr(recorder, "MAX_POINTS_PER_QUERY", 3)
    status = recorder.main(["--prometheus", base, "--query-range", "0", "150", "30s",
                            "--out", str(tmp_path)])
    assert status == 0
    # "up" is not a coordinator series; the others are queried with the job matcher.
    assert {query["query"] for query in queries} == {
        '{__name__="connect_coordinator_members", job="connect-coordinator"}',
        '{__name__="process_cpu_seconds_total", job="connect-coordinator"}',
    }
    assert len(queries) == 4
    rows = pq.read_table(tmp_path).to_pylist()
    members = sorted(row["timestamp"] for row in rows
                     if row["metric"] == "connect_coordinator_members")
    # Every step once, no overlap between the two chunks, the NaN at 120 s dropped.
    assert members == [0.0, 30.0, 60.0, 90.0, 150.0]
    sample = next(row for row in rows if row["timestamp"] == 90.0)
    assert sample["value"] == 9.0
    assert dict(sample["labels"]) == {"job": "connect-coordinator",
                                      "instance": "coordinator:19093"}


def test_prometheus_errors_are_clear(serve: Callable[[Handler], str], tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    def refuse(request: BaseHTTPRequestHandler) -> None:
        reply(request, 400, json.dumps({"status": "error", "errorType": "bad_data",
                                        "error": "parse error at char 3"}),
              "application/json")

    base = serve(refuse)
    status = recorder.main(["--prometheus", base, "--query-range", "now-1h", "now", "1m",
                            "--query", "rate(x[", "--out", str(tmp_path)])
    assert status == 2
    assert "parse error at char 3" in capsys.readouterr().err
    status = recorder.main(["--prometheus", "http://127.0.0.1:9", "--query-range", "0", "60",
                            "15", "--out", str(tmp_path), "--timeout", "1"])
    assert status == 2
    assert "cannot reach Prometheus" in capsys.readouterr().err


def test_argument_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exit_info:
        recorder.main(["--prometheus", "http://x", "--out", str(tmp_path)])
    assert exit_info.value.code == 2
    assert "--query-range" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        recorder.main(["--url", "http://x", "--interval", "soon", "--out", str(tmp_path)])
    assert "not a duration" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        recorder.main(["--help"])
    assert exit_info.value.code == 0
    assert "--query-range" in capsys.readouterr().out


def test_time_and_duration_parsing() -> None:
    assert recorder.parse_duration("1m30s") == 90.0
    assert recorder.parse_duration("500ms") == 0.5
    assert recorder.parse_duration("15") == 15.0
    assert recorder.parse_time("now-1h", now=10_000.0) == 6_400.0
    assert recorder.parse_time("-30m", now=10_000.0) == 8_200.0
    assert recorder.parse_time("2024-01-01T00:00:00Z", now=0.0) == 1_704_067_200.0
    with pytest.raises(recorder.RecorderError):
        recorder.parse_time("2024-01-01T00:00:00", now=0.0)  # no time zone
    with pytest.raises(recorder.RecorderError):
        recorder.parse_duration("1x")
    assert recorder.metrics_url("127.0.0.1:19093") == "http://127.0.0.1:19093/metrics"
    assert recorder.metrics_url("http://h:1/custom") == "http://h:1/custom"
