"""Prometheus metrics of one coordinator process, in a registry of its own.

Naming follows Prometheus practice: one prefix, base units as suffixes (seconds, bytes),
``_total`` on counters (prometheus-client adds it to a Counter's name), and label values that
are bounded and created up front so every series exists from the first scrape. README.md
("Metrics") lists every metric.

Group and member gauges (totals by state, and per-group gauges for at most
``metrics.per_group.max`` groups) are read from the core at scrape time by a custom
collector, so the request path never touches them. Counters of rebalances and target
installs are fed by the runtime from the core's events (see ``Runtime.complete``).
"""

from __future__ import annotations

import heapq
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from coordinator.core.classic.conversion import CONVERSION_DIRECTIONS
from coordinator.core.classic.engine import CLASSIC_REBALANCE_REASONS
from coordinator.core.classic.state import ClassicState
from coordinator.core.result import ASSIGNMENT_MODES, REBALANCE_TRIGGERS
from protocol.errors import ErrorCode, error_name

CLASSIC_STATE_LABELS = tuple(state.label for state in ClassicState)


if TYPE_CHECKING:
    from coordinator.core.coordinator import GroupCoordinator
    from coordinator.core.group import Group, Member

PREFIX = "connect_coordinator_"

# API key -> the label value used for it; other keys are counted as "unknown".
API_NAMES: dict[int, str] = {
    18: "ApiVersions",
    1000: "ConnectGroupHeartbeat",
    1001: "ConnectGroupPrepareAssignment",
    1002: "ConnectGroupInstallAssignment",
    1003: "ConnectGroupDescribe",
    3: "Metadata",
    10: "FindCoordinator",
    11: "JoinGroup",
    12: "Heartbeat",
    13: "LeaveGroup",
    14: "SyncGroup",
    15: "DescribeGroups",
    16: "ListGroups",
}
UNKNOWN_API = "unknown"

# Why a frame or connection was refused; one series each.
REJECT_REASONS = (
    "oversize",  # size prefix above server.max.frame.bytes: the connection is closed
    "malformed",  # bad size prefix, header or body: the connection is closed
    "truncated",  # the peer closed in the middle of a frame
    "invalid",  # a body that does not have its schema's shape: answered INVALID_REQUEST
    "over_limit",  # a request over a configured limit: answered INVALID_REQUEST
    "read_timeout",  # a frame not finished within server.connection.read.timeout.ms
    "idle_timeout",  # nothing received within server.connection.idle.timeout.ms
    "connection_limit",  # a connection over server.max.connections: closed at once
)

GROUP_STATES = ("EMPTY", "ASSIGNING", "RECONCILING", "STABLE")
# Member states as Describe reports them (docs/protocol.md): the core's MemberState names, and
# UNKNOWN for a member whose metadata is not known.
MEMBER_STATES = ("STABLE", "UNREVOKED", "UNRELEASED", "UNKNOWN")
TIMER_KINDS = ("session", "revocation", "assignor", "assignment")
ASSIGNOR_OUTCOMES = ("ok", "failed", "timeout")
# A periodic compaction: done, failed (logged, retried next interval), or skipped because
# the log writer is not usable (not loaded yet, or stopped after a failed rollback).
COMPACTION_OUTCOMES = ("ok", "failed", "skipped")
DEFAULT_PER_GROUP_MAX = 100  # ServerConfig.metrics_per_group_max

# Request latencies are expected well below a millisecond; the buckets reach into seconds
# only to show a slow disk (a response waits for its records to be flushed).
LATENCY_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0,
)
# From a group epoch bump to STABLE: a rebalance takes a few heartbeat intervals (3 s by
# default), longer when workers must stop tasks first or an assignor runs long.
TIME_TO_STABLE_BUCKETS = (
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0,
)
# From a JoinGroup's (or SyncGroup's) arrival to its answer: a bridged call is answered
# once durable (milliseconds), a classic group's waits at its barrier, up to the rebalance
# timeout (minutes).
CLASSIC_CALL_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    30.0, 60.0, 120.0, 300.0,
)
GROUP_TYPES = ("classic", "connect")
SEGMENT_SUFFIX = ".log"  # coordinator.log.segments.SEGMENT_SUFFIX


def api_name(api_key: int) -> str:
    """The `api` label value of an API key (bounded: unknown keys share one value)."""
    return API_NAMES.get(api_key, UNKNOWN_API)


def member_state(member: Member) -> str:
    """A member's state label: what Describe reports for it."""
    return member.current.state.name if member.metadata is not None else "UNKNOWN"


def log_bytes_on_disk(data_dir: Path) -> int:
    """Bytes of the segment files in `data_dir` (0 when it does not exist)."""
    total = 0
    try:
        with os.scandir(data_dir) as entries:
            for entry in entries:
                if entry.name.endswith(SEGMENT_SUFFIX):
                    try:
                        total += entry.stat().st_size
                    except FileNotFoundError:  # removed by compaction meanwhile
                        pass
    except FileNotFoundError:
        return 0
    return total


# The per-group gauges: (name after the prefix, help). Label: `group`.
_PER_GROUP: tuple[tuple[str, str], ...] = (
    ("group_epoch", "Group epoch of the group."),
    ("group_assignment_epoch", "Epoch of the group's current target assignment."),
    ("group_members", "Members of the group."),
    ("group_units", "Connectors and tasks the group runs."),
    ("group_unassigned_units", "Connectors and tasks of the group in no member's target."),
)


class _CoreCollector(Collector):
    """Group and member gauges, computed from the core's state at scrape time."""

    def __init__(self, core: Callable[[], GroupCoordinator | None], per_group_max: int) -> None:
        self._core = core
        self.per_group_max = per_group_max
        # Group id -> (the group, its connectors record value, its target_changes, its
        # unassigned unit count): what the count was computed from, so a scrape counts
        # again only the groups whose connectors or target changed since the last one.
        self._unassigned: dict[str, tuple[Group, object, int, int]] = {}

    def _unassigned_count(self, core: GroupCoordinator, group_id: str, group: Group) -> int:
        """len(core.unassigned_units(group_id)), which builds the union of every target
        part, unless neither input changed since the last scrape (a scrape of a STABLE
        group of 1,000 members and 50,000 tasks held the event loop 14.5 ms with it, 3.0
        without).
        Both change only by records: connectors by a new record value object, the target
        with a bump of `target_changes`."""
        cached = self._unassigned.get(group_id)
        if cached is not None and cached[0] is group and cached[1] is group.connectors_value \
                and cached[2] == group.target_changes:
            return cached[3]
        count = len(core.unassigned_units(group_id))
        self._unassigned[group_id] = (group, group.connectors_value, group.target_changes,
                                      count)
        return count

    def collect(self) -> Iterator[GaugeMetricFamily]:
        core = self._core()
        groups_by_state = dict.fromkeys(GROUP_STATES, 0)
        members_by_state = dict.fromkeys(MEMBER_STATES, 0)
        unassigned: dict[str, int] = {}
        all_groups = core.store.groups if core is not None else {}
        for group_id, group in all_groups.items():
            groups_by_state[group.state] = groups_by_state.get(group.state, 0) + 1
            for member in group.members.values():
                members_by_state[member_state(member)] += 1
            if core is not None:
                unassigned[group_id] = self._unassigned_count(core, group_id, group)
        if len(self._unassigned) > len(unassigned):  # forget deleted groups
            self._unassigned = {group_id: cached for group_id, cached
                                in self._unassigned.items() if group_id in unassigned}

        groups = GaugeMetricFamily(
            PREFIX + "groups", "Connect groups by state.", labels=["state"]
        )
        for state, count in groups_by_state.items():
            groups.add_metric([state], count)
        yield groups
        members = GaugeMetricFamily(
            PREFIX + "members",
            "Members of all connect groups, by member state (as Describe reports it).",
            labels=["state"],
        )
        for state, count in members_by_state.items():
            members.add_metric([state], count)
        yield members
        classic_store = core.store.classic if core is not None else None
        classic_groups = GaugeMetricFamily(
            PREFIX + "classic_groups", "Classic groups by state.", labels=["state"])
        by_state = dict.fromkeys(CLASSIC_STATE_LABELS, 0)
        for classic_group in (classic_store.groups.values() if classic_store else ()):
            by_state[classic_group.state.label] += 1
        for state, count in by_state.items():
            classic_groups.add_metric([state], count)
        yield classic_groups
        yield GaugeMetricFamily(
            PREFIX + "classic_members",
            "Members speaking the classic protocol: of classic groups, and bridged into "
            "connect groups.",
            value=(classic_store.member_count() - classic_store.pending_total + sum(
                1 for group_id, member_id in classic_store.bridged
                if group_id in all_groups and member_id in all_groups[group_id].members))
            if classic_store else 0,
        )
        yield GaugeMetricFamily(
            PREFIX + "classic_pending_members",
            "Classic members told MEMBER_ID_REQUIRED that have not joined yet (bounded by "
            "group.connect.classic.max.pending.members).",
            value=classic_store.pending_total if classic_store else 0,
        )
        yield GaugeMetricFamily(
            PREFIX + "unassigned_units",
            "Connectors and tasks of all groups that are in no member's target assignment.",
            value=sum(unassigned.values()),
        )

        # Per-group series for the first `per_group_max` group ids in sorted order, so the
        # same groups keep their series from scrape to scrape.
        limit = self.per_group_max
        if len(all_groups) > limit:
            shown = heapq.nsmallest(limit, all_groups)
        else:
            shown = sorted(all_groups)
        families = [
            GaugeMetricFamily(PREFIX + name, text, labels=["group"]) for name, text in _PER_GROUP
        ]
        epoch, assignment_epoch, member_count, units, unassigned_units = families
        for group_id in shown:
            group = all_groups[group_id]
            epoch.add_metric([group_id], group.epoch)
            assignment_epoch.add_metric([group_id], group.assignment_epoch)
            member_count.add_metric([group_id], len(group.members))
            units.add_metric([group_id], group.known_unit_count())
            unassigned_units.add_metric([group_id], unassigned.get(group_id, 0))
        yield from families
        yield GaugeMetricFamily(
            PREFIX + "per_group_omitted_groups",
            "Groups left out of the per-group gauges (beyond metrics.per_group.max; the "
            "first group ids in sorted order are shown).",
            value=len(all_groups) - len(shown),
        )


PROXY_UPSTREAM_FAILURES = (
    "connect",  # no upstream address accepted a connection within the timeout
    "closed",  # the upstream connection closed or broke with requests in flight
)


_PROXY_TRAFFIC = (
    ("proxy_forwarded_requests",
     "Requests forwarded to the upstream Kafka cluster, by API."),
    ("proxy_forwarded_request_bytes",
     "Bytes of requests forwarded upstream (size prefix included), by API."),
    ("proxy_forwarded_response_bytes",
     "Bytes of upstream responses relayed to clients (after rewriting), by API."),
)


class _ProxyTraffic(Collector):
    """The forwarded requests and bytes by API, kept as plain integers and read at scrape
    time. The forwarding path adds to them once or twice per request; a labelled Counter
    would cost a label look-up, two checks and a lock per addition, a tenth of what the
    proxy spends on a small forwarded request."""

    def __init__(self, api_names: dict[int, str], labels: list[str]) -> None:
        self._names = api_names
        self._labels = labels
        self.by_key: dict[int, list[int]] = {}  # API key -> [requests, bytes in, bytes out]

    def counts(self, api_key: int) -> list[int]:
        counts = self.by_key.get(api_key)
        if counts is None:
            counts = self.by_key[api_key] = [0, 0, 0]
        return counts

    def collect(self) -> Iterator[CounterMetricFamily]:
        totals = {label: [0, 0, 0] for label in self._labels}
        for api_key, counts in list(self.by_key.items()):
            total = totals[self._names.get(api_key, UNKNOWN_API)]
            for index, value in enumerate(counts):
                total[index] += value
        for index, (name, text) in enumerate(_PROXY_TRAFFIC):
            family = CounterMetricFamily(PREFIX + name, text, labels=["api"])
            for label, total in totals.items():
                family.add_metric([label], total[index])
            yield family


class ProxyMetrics:
    """Proxy mode's metrics (registered only in proxy mode), by Kafka API name."""

    def __init__(self, registry: CollectorRegistry, api_names: dict[int, str]) -> None:
        self._names = api_names
        labels = [*sorted(set(api_names.values())), UNKNOWN_API]
        self.traffic = _ProxyTraffic(api_names, labels)
        registry.register(self.traffic)
        self.owned_requests = Counter(
            PREFIX + "proxy_owned_group_requests",
            "Requests for the groups this coordinator owns (proxy.groups), answered "
            "locally, by API.",
            ["api"], registry=registry)
        self.upstream_failures = Counter(
            PREFIX + "proxy_upstream_failures",
            "Client connections closed because of the upstream, by reason (connect, "
            "closed).",
            ["reason"], registry=registry)
        self.connections = Gauge(
            PREFIX + "proxy_connections", "Open client connections of the proxy.",
            registry=registry)
        self._owned: dict[int, Any] = {}
        for api in labels:
            self.owned_requests.labels(api)
        for reason in PROXY_UPSTREAM_FAILURES:
            self.upstream_failures.labels(reason)

    def forwarded(self, api_key: int, size: int) -> None:
        counts = self.traffic.counts(api_key)
        counts[0] += 1
        counts[1] += size

    def relayed(self, api_key: int, size: int) -> None:
        self.traffic.counts(api_key)[2] += size

    def owned(self, api_key: int) -> None:
        child = self._owned.get(api_key)
        if child is None:
            child = self._owned[api_key] = self.owned_requests.labels(
                self._names.get(api_key, UNKNOWN_API))
        child.inc()

    def upstream_failure(self, reason: str) -> None:
        self.upstream_failures.labels(reason).inc()


class Metrics:
    """Every metric the server exports; `render()` gives the Prometheus text format."""

    def __init__(
        self,
        core: Callable[[], GroupCoordinator | None] = lambda: None,
        *,
        per_group_max: int = DEFAULT_PER_GROUP_MAX,
        data_dir: Path | None = None,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        registry = self.registry
        self.data_dir = data_dir
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
        self.classic_rebalances = Counter(
            PREFIX + "classic_rebalances",
            "Join phases of classic groups (each starts a classic rebalance), by reason.",
            ["reason"],
            registry=registry,
        )
        self.classic_join_seconds = Histogram(
            PREFIX + "classic_join_seconds",
            "Time from a JoinGroup's arrival to its answer (for a classic group, the wait "
            "at the join barrier included), by the type of the group that answered it.",
            ["group_type"],
            buckets=CLASSIC_CALL_BUCKETS,
            registry=registry,
        )
        self.classic_sync_seconds = Histogram(
            PREFIX + "classic_sync_seconds",
            "Time from a SyncGroup's arrival to its answer (for a classic group, the wait "
            "for the leader's assignment included), by the type of the group that answered "
            "it.",
            ["group_type"],
            buckets=CLASSIC_CALL_BUCKETS,
            registry=registry,
        )
        self.group_conversions = Counter(
            PREFIX + "group_conversions",
            "Live conversions of a group between the classic and the connect type, by "
            "direction (upgrade: classic to connect; downgrade: connect to classic).",
            ["direction"],
            registry=registry,
        )
        self.rebalances = Counter(
            PREFIX + "rebalances",
            "Group epoch bumps (each starts a rebalance), by trigger.",
            ["trigger"],
            registry=registry,
        )
        self.target_assignments = Counter(
            PREFIX + "target_assignments_installed",
            "Target assignments installed, by mode (server: a server assignor; client: a "
            "worker through Prepare/Install).",
            ["mode"],
            registry=registry,
        )
        self.time_to_stable = Histogram(
            PREFIX + "time_to_stable_seconds",
            "Time from the group epoch bump that started a rebalance to the group being "
            "STABLE (bumps meanwhile extend the same rebalance).",
            buckets=TIME_TO_STABLE_BUCKETS,
            registry=registry,
        )
        self.log_append_seconds = Histogram(
            PREFIX + "log_append_seconds",
            "Time to write one flush (one batch per change) to the active log segment, "
            "before its fsync.",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.log_fsync_seconds = Histogram(
            PREFIX + "log_fsync_seconds",
            "Time of one fsync of the active log segment (one per flush).",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.log_bytes = Gauge(
            PREFIX + "log_bytes",
            "Bytes of the record log's segment files in the data directory.",
            registry=registry,
        )
        self.log_bytes.set_function(self._log_bytes)
        self.compactions = Counter(
            PREFIX + "log_compactions",
            "Periodic log compactions, by outcome (ok, failed, skipped).",
            ["outcome"],
            registry=registry,
        )
        for api in [*API_NAMES.values(), UNKNOWN_API]:
            self.requests.labels(api, ErrorCode.NONE.name)
            self.request_duration.labels(api)
        for reason in REJECT_REASONS:
            self.rejected_frames.labels(reason)
        for kind in TIMER_KINDS:
            self.timers_fired.labels(kind)
        for outcome in ASSIGNOR_OUTCOMES:
            self.assignor_runs.labels(outcome)
        for trigger in REBALANCE_TRIGGERS:
            self.rebalances.labels(trigger)
        for reason in CLASSIC_REBALANCE_REASONS:
            self.classic_rebalances.labels(reason)
        for direction in CONVERSION_DIRECTIONS:
            self.group_conversions.labels(direction)
        for group_type in GROUP_TYPES:
            self.classic_join_seconds.labels(group_type)
            self.classic_sync_seconds.labels(group_type)
        for mode in ASSIGNMENT_MODES:
            self.target_assignments.labels(mode)
        for outcome in COMPACTION_OUTCOMES:
            self.compactions.labels(outcome)
        self.core_collector = _CoreCollector(core, per_group_max)
        registry.register(self.core_collector)
        # CPU, memory, file descriptors (process_*) and the Python version (python_info).
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        # labels() takes a lock and builds a key each call; the hot path uses these caches.
        self._request_children: dict[tuple[int, int], Any] = {}
        self._duration_children: dict[int, Any] = {}

    def observe_request(self, api_key: int, error_code: int, seconds: float) -> None:
        key = (api_key, error_code)
        child = self._request_children.get(key)
        if child is None:
            child = self.requests.labels(
                API_NAMES.get(api_key, UNKNOWN_API), error_name(error_code)
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

    def classic_rebalance(self, reason: str) -> None:
        """A classic group's join phase started (one of CLASSIC_REBALANCE_REASONS)."""
        if reason in CLASSIC_REBALANCE_REASONS:
            self.classic_rebalances.labels(reason).inc()

    def classic_join(self, group_type: str, seconds: float) -> None:
        """A JoinGroup answered after `seconds`, by a group of `group_type`."""
        if group_type in GROUP_TYPES:
            self.classic_join_seconds.labels(group_type).observe(seconds)

    def classic_sync(self, group_type: str, seconds: float) -> None:
        """A SyncGroup answered after `seconds`, by a group of `group_type`."""
        if group_type in GROUP_TYPES:
            self.classic_sync_seconds.labels(group_type).observe(seconds)

    def group_converted(self, direction: str) -> None:
        """A group changed type (one of CONVERSION_DIRECTIONS)."""
        if direction in CONVERSION_DIRECTIONS:
            self.group_conversions.labels(direction).inc()

    def rebalance(self, trigger: str) -> None:
        """A group epoch bump (one of coordinator.core.result.REBALANCE_TRIGGERS)."""
        self.rebalances.labels(trigger).inc()

    def target_installed(self, mode: str) -> None:
        """A target assignment installed (one of ASSIGNMENT_MODES)."""
        self.target_assignments.labels(mode).inc()

    def _log_bytes(self) -> float:
        return float(log_bytes_on_disk(self.data_dir)) if self.data_dir is not None else 0.0

    def render(self) -> bytes:
        return generate_latest(self.registry)
