"""Prometheus metrics of one coordinator process, in a registry of its own.

Naming follows Prometheus practice: one prefix, base units as suffixes (seconds, bytes),
``_total`` on counters (prometheus-client adds it to a Counter's name), and label values that
are bounded and created up front so every series exists from the first scrape.

Group and member gauges are read from the core at scrape time by a custom collector, so the
request path never touches them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from protocol.errors import ErrorCode

PREFIX = "connect_coordinator_"

# API key -> the label value used for it; other keys are counted as "unknown".
API_NAMES: dict[int, str] = {
    18: "ApiVersions",
    1000: "ConnectGroupHeartbeat",
    1001: "ConnectGroupPrepareAssignment",
    1002: "ConnectGroupInstallAssignment",
    1003: "ConnectGroupDescribe",
}
UNKNOWN_API = "unknown"

# Why a frame or connection was refused; one series each.
REJECT_REASONS = (
    "oversize",  # size prefix above server.max.frame.bytes: the connection is closed
    "malformed",  # bad size prefix, header or body: the connection is closed
    "truncated",  # the peer closed in the middle of a frame
)

GROUP_STATES = ("EMPTY", "ASSIGNING", "RECONCILING", "STABLE")

# Request latencies are expected well below a millisecond; the buckets reach into seconds
# only to show a slow disk (a response waits for its records to be flushed).
LATENCY_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0,
)


class CoreView(Protocol):
    """What the scrape-time collector reads from the core."""

    def groups_by_state(self) -> dict[str, int]: ...

    def member_count(self) -> int: ...

    def group_ids(self) -> list[str]: ...

    def unassigned_units(self, group_id: str) -> frozenset[Any]: ...


def api_name(api_key: int) -> str:
    """The `api` label value of an API key (bounded: unknown keys share one value)."""
    return API_NAMES.get(api_key, UNKNOWN_API)


def error_label(code: int) -> str:
    try:
        return ErrorCode(code).name
    except ValueError:
        return str(code)


class _CoreCollector(Collector):
    def __init__(self, core: Callable[[], CoreView | None]) -> None:
        self._core = core

    def collect(self) -> Iterator[GaugeMetricFamily]:
        core = self._core()
        groups = GaugeMetricFamily(
            PREFIX + "groups", "Connect groups by state.", labels=["state"]
        )
        counts = core.groups_by_state() if core is not None else {}
        for state in GROUP_STATES:
            groups.add_metric([state], counts.get(state, 0))
        yield groups
        yield GaugeMetricFamily(
            PREFIX + "members",
            "Members of all connect groups.",
            value=core.member_count() if core is not None else 0,
        )
        unassigned = 0
        if core is not None:
            unassigned = sum(len(core.unassigned_units(g)) for g in core.group_ids())
        yield GaugeMetricFamily(
            PREFIX + "unassigned_units",
            "Connectors and tasks of all groups that are in no member's target assignment.",
            value=unassigned,
        )


class Metrics:
    """Every metric the server exports; `render()` gives the Prometheus text format."""

    def __init__(self, core: Callable[[], CoreView | None] = lambda: None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        registry = self.registry
        self.requests = Counter(
            PREFIX + "requests",
            "KRPC requests answered, by API and error code.",
            ["api", "error"],
            registry=registry,
        )
        self.request_duration = Histogram(
            PREFIX + "request_duration_seconds",
            "Time from a decoded request to its encoded response, by API.",
            ["api"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.request_seconds = self.request_duration  # the name the KRPC listener uses
        self.connections = Gauge(
            PREFIX + "connections", "Open KRPC connections.", registry=registry
        )
        self.rejected_frames = Counter(
            PREFIX + "rejected_frames",
            "Frames refused, by reason (see REJECT_REASONS in coordinator/metrics.py).",
            ["reason"],
            registry=registry,
        )
        self.record_write_duration = Histogram(
            PREFIX + "record_write_duration_seconds",
            "Time to make the records of one state change durable.",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.records_written = Counter(
            PREFIX + "records_written", "Records handed to the log.", registry=registry
        )
        self.timers_fired = Counter(
            PREFIX + "timers_fired", "Expired timers handled, by kind.", ["kind"],
            registry=registry,
        )
        self.assignor_runs = Counter(
            PREFIX + "assignor_runs",
            "Offloaded server assignor runs, by outcome (ok, failed, timeout).",
            ["outcome"],
            registry=registry,
        )
        self.assignor_run_seconds = Histogram(
            PREFIX + "assignor_run_seconds",
            "Time an offloaded assignor run took in its worker process, by assignor.",
            ["assignor"],
            registry=registry,
        )
        self.assignor_queue_seconds = Histogram(
            PREFIX + "assignor_queue_seconds",
            "Time an assignor run waited for a free worker process.",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.assignor_runs_in_flight = Gauge(
            PREFIX + "assignor_runs_in_flight",
            "Assignor runs started and not finished (queued or running).",
            registry=registry,
        )
        self.assignor_pool_busy_ratio = Gauge(
            PREFIX + "assignor_pool_busy_ratio",
            "Share of the assignor worker processes busy right now.",
            registry=registry,
        )
        self.ready = Gauge(
            PREFIX + "ready", "1 once the log is loaded and requests are served.",
            registry=registry,
        )
        for api in [*API_NAMES.values(), UNKNOWN_API]:
            self.requests.labels(api, ErrorCode.NONE.name)
            self.request_duration.labels(api)
        for reason in REJECT_REASONS:
            self.rejected_frames.labels(reason)
        for kind in ("session", "revocation", "assignor", "assignment"):
            self.timers_fired.labels(kind)
        for outcome in ("ok", "failed", "timeout"):
            self.assignor_runs.labels(outcome)
        registry.register(_CoreCollector(core))
        # labels() takes a lock and builds a key each call; the hot path uses these caches.
        self._request_children: dict[tuple[int, int], Any] = {}
        self._duration_children: dict[int, Any] = {}

    def observe_request(self, api_key: int, error_code: int, seconds: float) -> None:
        key = (api_key, error_code)
        child = self._request_children.get(key)
        if child is None:
            child = self.requests.labels(
                API_NAMES.get(api_key, UNKNOWN_API), error_label(error_code)
            )
            self._request_children[key] = child
        child.inc()
        duration = self._duration_children.get(api_key)
        if duration is None:
            duration = self.request_duration.labels(API_NAMES.get(api_key, UNKNOWN_API))
            self._duration_children[api_key] = duration
        duration.observe(seconds)

    def reject(self, reason: str) -> None:
        self.rejected_frames.labels(reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
