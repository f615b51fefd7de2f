"""``connect-coordinator metrics record``: metric samples into Parquet for the report.

Two sources, one output format (columns timestamp, metric, labels, value; one file per
flush, written to a hidden temporary name and renamed so readers never see half a file):

* scrape mode (``--url``) polls a Prometheus text endpoint every ``--interval`` seconds for
  ``--duration`` seconds; a failed scrape is logged and the next one is tried;
* Prometheus mode (``--prometheus``) reads a past time range from a Prometheus server's
  HTTP API, by discovering the series names or for the ``--query`` expressions given.
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from coordinator.urls import open_url

Sample = tuple[float, str, dict[str, str], float]

DEFAULT_JOB = "connect-coordinator"
# Prometheus refuses query_range answers above 11,000 points per series.
MAX_POINTS_PER_QUERY = 10_000
# Flush a file at least this often in Prometheus mode so memory stays bounded.
ROWS_PER_FILE = 200_000


class RecorderError(Exception):
    """A problem worth a one-line message and exit status 2 (bad input, server refused)."""

    status = 2


class NothingThere(RecorderError):
    """The first scrape found no coordinator: nothing was recorded (exit status 1)."""

    status = 1


def log(message: str) -> None:
    print(f"[metrics record] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------
# Output


@dataclass
class ParquetSink:
    """Buffers samples and writes one Parquet file per flush into ``directory``."""

    directory: Path
    prefix: str = "metrics"
    buffered: list[Sample] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)
    rows_written: int = 0

    def add(self, samples: Iterable[Sample]) -> None:
        self.buffered.extend(samples)

    def flush(self) -> Path | None:
        if not self.buffered:
            return None
        import pyarrow as pa
        import pyarrow.parquet as pq

        rows = self.buffered
        table = pa.table({
            "timestamp": pa.array([row[0] for row in rows], pa.float64()),
            "metric": pa.array([row[1] for row in rows], pa.string()),
            "labels": pa.array([sorted(row[2].items()) for row in rows],
                               pa.map_(pa.string(), pa.string())),
            "value": pa.array([row[3] for row in rows], pa.float64()),
        })
        self.directory.mkdir(parents=True, exist_ok=True)
        name = f"{self.prefix}-{int(rows[0][0] * 1000)}-{len(self.files):05d}.parquet"
        final = self.directory / name
        partial = self.directory / f".{name}.partial"
        pq.write_table(table, partial)
        partial.replace(final)
        self.files.append(final)
        self.rows_written += len(rows)
        self.buffered = []
        return final


# ---------------------------------------------------------------------------------------
# Scrape mode


def parse_exposition(text: str, timestamp: float) -> list[Sample]:
    """Samples of a Prometheus text page, all stamped with the scrape time; NaN and
    ``_created`` samples dropped."""
    from prometheus_client.parser import text_string_to_metric_families

    samples: list[Sample] = []
    families = list(text_string_to_metric_families(text))
    # `<name>_created` holds a counter's or histogram's creation time, not a measurement;
    # the text format lists it as a gauge family of its own.
    created = {
        family.name + "_created"
        for family in families
        if family.type in ("counter", "histogram", "summary", "gaugehistogram")
    }
    for family in families:
        for sample in family.samples:
            if math.isnan(sample.value) or sample.name in created:
                continue
            samples.append((timestamp, sample.name, dict(sample.labels), float(sample.value)))
    return samples


def metrics_url(url: str) -> str:
    """Accept ``host:port``, ``http://host:port`` or a full URL; the path defaults to /metrics."""
    if "://" not in url:
        url = "http://" + url
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise RecorderError(f"--url must be an http(s) URL, got {url!r}")
    if parts.path in ("", "/"):
        parts = parts._replace(path="/metrics")
    return urllib.parse.urlunsplit(parts)


def fetch_text(url: str, timeout: float) -> str:
    request = urllib.request.Request(url, headers={"Accept": "text/plain;version=0.0.4"})
    with open_url(request, timeout) as response:
        charset = response.headers.get_content_charset() or "utf-8"
        body: bytes = response.read()
        return body.decode(charset)


def _first_scrape_failed(url: str, error: Exception) -> str:
    hint = ("--url takes the coordinator's admin HTTP listener (serve --admin-listen, "
            "default http://127.0.0.1:19093)")
    if isinstance(error, urllib.error.HTTPError):
        error.close()  # it holds the response open
        return f"{url} answered HTTP {error.code}: is it a coordinator? {hint}"
    if isinstance(error, (http.client.BadStatusLine, ConnectionResetError)):
        return (f"{url} did not answer in HTTP: that looks like the Kafka port, not the "
                f"admin port; {hint}")
    if isinstance(error, ValueError):
        return f"{url} did not answer Prometheus text ({error}): is it a coordinator? {hint}"
    reason = getattr(error, "reason", None) or error
    reason = getattr(reason, "strerror", None) or reason
    return f"cannot reach {url} ({reason}): is the coordinator running there? {hint}"


def record_scrapes(url: str, interval: float, duration: float, sink: ParquetSink,
                   flush_every: float, timeout: float) -> tuple[int, int]:
    """Scrape until ``duration`` has passed; returns (successful, failed) scrape counts."""
    started = time.monotonic()
    last_flush = started
    succeeded = failed = 0
    scrape_index = 0
    while True:
        # Deadlines from the start keep the interval from drifting with scrape time.
        due = started + scrape_index * interval
        if due - started > duration + 1e-9:
            break
        pause = due - time.monotonic()
        if pause > 0:
            try:
                time.sleep(pause)
            except KeyboardInterrupt:
                log("interrupted; writing what was recorded")
                break
        scrape_index += 1
        try:
            text = fetch_text(url, timeout)
            samples = parse_exposition(text, time.time())
        except KeyboardInterrupt:
            log("interrupted; writing what was recorded")
            break
        except (OSError, http.client.HTTPException) as error:
            if scrape_index == 1:
                # Nothing recorded yet: a wrong --url, not a coordinator restarting.
                raise NothingThere(_first_scrape_failed(url, error)) from None
            failed += 1
            if isinstance(error, urllib.error.HTTPError):
                error.close()  # it holds the response open
            reason = getattr(error, "reason", None) or error
            log(f"scrape {scrape_index} of {url} failed: {reason}; continuing")
            continue
        except ValueError as error:
            if scrape_index == 1:
                raise NothingThere(_first_scrape_failed(url, error)) from None
            failed += 1
            log(f"scrape {scrape_index}: {url} did not answer Prometheus text: {error}")
            continue
        succeeded += 1
        sink.add(samples)
        if time.monotonic() - last_flush >= flush_every:
            written = sink.flush()
            last_flush = time.monotonic()
            if written is not None:
                log(f"wrote {written}")
    return succeeded, failed


# ---------------------------------------------------------------------------------------
# Prometheus mode

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


def parse_duration(text: str) -> float:
    """Seconds from ``"15"``, ``"15s"``, ``"1m30s"``, ``"500ms"``, ``"2h"``."""
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    position = 0
    total = 0.0
    for match in _DURATION_PART.finditer(text):
        if match.start() != position:
            break
        total += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        position = match.end()
    if position != len(text) or not text:
        raise RecorderError(f"not a duration: {text!r} (use e.g. 15s, 1m, 1h30m or seconds)")
    return total


def parse_time(text: str, now: float) -> float:
    """Unix seconds from ``now``, ``now-1h``, ``-30m``, unix seconds or RFC 3339."""
    text = text.strip()
    if text == "now":
        return now
    for prefix in ("now-", "-"):
        if text.startswith(prefix):
            return now - parse_duration(text[len(prefix):])
    try:
        return float(text)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise RecorderError(
            f"not a time: {text!r} (use unix seconds, RFC 3339, now or now-1h)"
        ) from None
    if moment.tzinfo is None:
        raise RecorderError(f"time {text!r} needs a time zone (e.g. a trailing Z)")
    return moment.timestamp()


class PrometheusClient:
    def __init__(self, base_url: str, timeout: float) -> None:
        if "://" not in base_url:
            base_url = "http://" + base_url
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout

    def get(self, path: str, params: Sequence[tuple[str, str]]) -> Any:
        url = f"{self.base_url}{path}?{urllib.parse.urlencode(params)}"
        try:
            with open_url(url, self.timeout) as response:
                document = json.loads(response.read())
        except urllib.error.HTTPError as error:
            # Prometheus explains a 400/422 in the JSON body; show that, not just the code.
            with error:
                try:
                    document = json.loads(error.read())
                except (ValueError, OSError):
                    raise RecorderError(f"{url}: HTTP {error.code} {error.reason}") from None
        except (urllib.error.URLError, OSError, TimeoutError) as error:
            reason = getattr(error, "reason", None) or error
            raise RecorderError(f"cannot reach Prometheus at {self.base_url}: {reason}") from None
        except ValueError:
            raise RecorderError(f"{url} did not answer JSON; is this a Prometheus server?") \
                from None
        if not isinstance(document, dict) or document.get("status") != "success":
            detail = document.get("error", document) if isinstance(document, dict) else document
            raise RecorderError(f"Prometheus refused {path}: {detail}")
        return document.get("data")

    def metric_names(self, match: str | None) -> list[str]:
        params = [("match[]", match)] if match else []
        names = self.get("/api/v1/label/__name__/values", params)
        return sorted(str(name) for name in names or [])

    def query_range(self, query: str, start: float, end: float, step: float) -> list[Sample]:
        samples: list[Sample] = []
        chunk = step * MAX_POINTS_PER_QUERY
        chunk_start = start
        while chunk_start <= end:
            chunk_end = min(end, chunk_start + chunk - step)
            data = self.get("/api/v1/query_range", [
                ("query", query), ("start", repr(chunk_start)), ("end", repr(chunk_end)),
                ("step", repr(step)),
            ])
            samples.extend(matrix_samples(data, query))
            chunk_start = chunk_end + step
        return samples


def matrix_samples(data: Any, query: str) -> list[Sample]:
    """Samples of a query_range answer; a result without ``__name__`` is named by its query."""
    if not isinstance(data, dict) or data.get("resultType") != "matrix":
        kind = data.get("resultType") if isinstance(data, dict) else type(data).__name__
        raise RecorderError(f"query {query!r} answered {kind}, expected a range (matrix)")
    samples: list[Sample] = []
    for series in data.get("result", []):
        labels = {str(key): str(value) for key, value in series.get("metric", {}).items()}
        name = labels.pop("__name__", query)
        for timestamp, value in series.get("values", []):
            number = float(value)
            if not math.isnan(number):
                samples.append((float(timestamp), name, labels, number))
    return samples


def discovery_selector(job: str) -> str | None:
    return f'{{job="{job}"}}' if job else None


def default_queries(client: PrometheusClient, job: str) -> list[str]:
    """One selector per coordinator and process series name the server knows for the job."""
    names = client.metric_names(discovery_selector(job))
    wanted = [
        name for name in names
        if name.startswith("connect_coordinator_") or name.startswith("process_")
    ]
    if not wanted:
        where = f" for job {job!r}" if job else ""
        raise RecorderError(f"Prometheus knows no connect_coordinator_* series{where}")
    job_matcher = f', job="{job}"' if job else ""
    return [f'{{__name__="{name}"{job_matcher}}}' for name in wanted]


def record_range(client: PrometheusClient, queries: Sequence[str], start: float, end: float,
                 step: float, sink: ParquetSink) -> int:
    total = 0
    for number, query in enumerate(queries, start=1):
        samples = client.query_range(query, start, end, step)
        total += len(samples)
        log(f"query {number}/{len(queries)} {query}: {len(samples)} samples")
        sink.add(samples)
        if len(sink.buffered) >= ROWS_PER_FILE:
            sink.flush()
    return total


# ---------------------------------------------------------------------------------------
# Command line


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="connect-coordinator metrics record",
        description=(
            "Record coordinator metrics as Parquet (columns timestamp, metric, labels, value) "
            "for `connect-coordinator report`. Either scrape the coordinator's /metrics "
            "endpoint live (--url) or copy a past range out of a Prometheus server "
            "(--prometheus with --query-range)."
        ),
        epilog=(
            "examples:\n"
            "  connect-coordinator metrics record --url http://127.0.0.1:19093/metrics \\\n"
            "      --interval 5 --duration 600 --out metrics/\n"
            "  connect-coordinator metrics record --prometheus http://prometheus:9090 \\\n"
            "      --query-range now-1h now 15s --out metrics/"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--url", help="coordinator metrics URL (path defaults to /metrics)")
    source.add_argument("--prometheus", metavar="URL", help="Prometheus server base URL")
    parser.add_argument("--out", required=True, type=Path, metavar="DIR",
                        help="directory for the Parquet files (created if needed)")
    scrape = parser.add_argument_group("scrape mode (--url)")
    scrape.add_argument("--interval", type=parse_duration_arg, default=5.0, metavar="S",
                        help="seconds between scrapes (default: %(default)s)")
    scrape.add_argument("--duration", type=parse_duration_arg, default=60.0, metavar="S",
                        help="seconds to record for (default: %(default)s)")
    scrape.add_argument("--flush-every", type=parse_duration_arg, default=60.0, metavar="S",
                        help="write a file at least this often (default: %(default)s)")
    prometheus = parser.add_argument_group("Prometheus mode (--prometheus)")
    prometheus.add_argument(
        "--query-range", nargs=3, metavar=("START", "END", "STEP"),
        help="time range and resolution: START/END as unix seconds, RFC 3339, now or "
             "now-1h; STEP as seconds or 15s/1m",
    )
    prometheus.add_argument(
        "--query", action="append", default=[], metavar="PROMQL",
        help="a PromQL expression to record (repeatable); without it every "
             "connect_coordinator_* and process_* series of --job is discovered and recorded",
    )
    prometheus.add_argument("--job", default=DEFAULT_JOB,
                            help="Prometheus job label of the coordinator, used for discovery "
                                 "('' for any job; default: %(default)s)")
    parser.add_argument("--timeout", type=parse_duration_arg, default=10.0, metavar="S",
                        help="HTTP timeout per request (default: %(default)s)")
    return parser


def parse_duration_arg(text: str) -> float:
    try:
        value = parse_duration(text)
    except RecorderError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative: {text!r}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns 0 on success, 1 when nothing was recorded, 2 on bad input."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    # `connect-coordinator metrics record ...` forwards everything after "metrics".
    if arguments[:1] == ["record"]:
        arguments = arguments[1:]
    parser = build_parser()
    args = parser.parse_args(arguments)
    # Needed for the first write: its absence is told now, not after the first scrapes.
    import pyarrow  # noqa: F401
    sink = ParquetSink(args.out)
    try:
        if args.url is not None:
            if args.query_range or args.query:
                parser.error("--query-range and --query belong to --prometheus mode")
            if args.interval <= 0:
                parser.error("--interval must be positive")
            url = metrics_url(args.url)
            log(f"scraping {url} every {args.interval:g}s for {args.duration:g}s into {args.out}")
            succeeded, failed = record_scrapes(
                url, args.interval, args.duration, sink, args.flush_every, args.timeout
            )
            sink.flush()
            if succeeded == 0:
                log(f"no scrape of {url} succeeded ({failed} failed); nothing written")
                return 1
            log(f"done: {sink.rows_written} samples in {len(sink.files)} file(s)"
                + (f", {failed} failed scrape(s)" if failed else ""))
            return 0
        if args.query_range is None:
            parser.error("--prometheus needs --query-range START END STEP")
        now = time.time()
        start, end = (parse_time(text, now) for text in args.query_range[:2])
        step = parse_duration(args.query_range[2])
        if step <= 0:
            parser.error("STEP must be positive")
        if end < start:
            parser.error("END is before START")
        client = PrometheusClient(args.prometheus, args.timeout)
        queries = args.query or default_queries(client, args.job)
        total = record_range(client, queries, start, end, step, sink)
        sink.flush()
        if total == 0:
            log("the queries returned no samples in that range; nothing written")
            return 1
        log(f"done: {total} samples in {len(sink.files)} file(s) under {args.out}")
        return 0
    except RecorderError as error:
        sink.flush()
        print(f"connect-coordinator metrics record: error: {error}", file=sys.stderr)
        return error.status


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
