"""The proxy's traffic counters: plain integers on the forwarding path, Prometheus counters
by API name when scraped."""

from __future__ import annotations

import subprocess

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from coordinator.metrics import ProxyMetrics
from tests.programs import require_binary

PRODUCE, FETCH, NOT_AN_API = 0, 1, 31_000


def samples(registry: CollectorRegistry) -> dict[tuple[str, str], float]:
    text = generate_latest(registry).decode()
    return {(sample.name, sample.labels.get("api", sample.labels.get("reason", ""))):
            sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def test_forwarded_requests_and_bytes_are_counted_by_api_name() -> None:
    registry = CollectorRegistry()
    metrics = ProxyMetrics(registry, {PRODUCE: "Produce", FETCH: "Fetch"})
    for size in (100, 200, 300):
        metrics.forwarded(PRODUCE, size)
        metrics.relayed(PRODUCE, 10)
    metrics.forwarded(FETCH, 50)
    metrics.relayed(FETCH, 1_000_000)
    metrics.forwarded(NOT_AN_API, 7)
    metrics.forwarded(NOT_AN_API + 1, 8)
    metrics.owned(FETCH)
    found = samples(registry)
    prefix = "connect_coordinator_proxy_forwarded_"
    assert found[prefix + "requests_total", "Produce"] == 3
    assert found[prefix + "request_bytes_total", "Produce"] == 600
    assert found[prefix + "response_bytes_total", "Produce"] == 30
    assert found[prefix + "requests_total", "Fetch"] == 1
    assert found[prefix + "response_bytes_total", "Fetch"] == 1_000_000
    # Keys with no name share the one label value.
    assert found[prefix + "requests_total", "unknown"] == 2
    assert found[prefix + "request_bytes_total", "unknown"] == 15
    assert found["connect_coordinator_proxy_owned_group_requests_total", "Fetch"] == 1


def test_every_api_series_exists_before_any_traffic_and_promtool_accepts_them() -> None:
    registry = CollectorRegistry()
    ProxyMetrics(registry, {PRODUCE: "Produce", FETCH: "Fetch"})
    found = samples(registry)
    for api in ("Produce", "Fetch", "unknown"):
        for name in ("requests", "request_bytes", "response_bytes"):
            assert found[f"connect_coordinator_proxy_forwarded_{name}_total", api] == 0
    linted = subprocess.run([require_binary("promtool"), "check", "metrics"],
                            input=generate_latest(registry).decode(), capture_output=True,
                            text=True, timeout=60, check=False)
    assert linted.returncode == 0, linted.stdout + linted.stderr
