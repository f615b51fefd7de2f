"""deploy/ and the Dockerfile: they parse, promtool accepts them, they say what they must."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.programs import require_binary

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "connect-coordinator.json"
YAML_FILES = sorted([*DEPLOY.rglob("*.yml"), *DEPLOY.rglob("*.yaml")])


def load_yaml_documents(path: Path) -> list[Any]:
    yaml = pytest.importorskip("yaml", reason="PyYAML is not installed; YAML not parsed")
    return list(yaml.safe_load_all(path.read_text()))


def test_promtool_accepts_the_prometheus_config(tmp_path: Path) -> None:
    promtool = require_binary("promtool")
    # The config names its rules where docker-compose mounts them (/etc/prometheus); point
    # a copy at deploy/alerts.yml so promtool checks the rules it references as well.
    config = (DEPLOY / "prometheus.yml").read_text()
    assert "/etc/prometheus/alerts.yml" in config
    copy = tmp_path / "prometheus.yml"
    copy.write_text(config.replace("/etc/prometheus/alerts.yml", str(DEPLOY / "alerts.yml")))
    result = subprocess.run(
        [promtool, "check", "config", str(copy)],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_accepts_the_alert_rules() -> None:
    promtool = require_binary("promtool")
    result = subprocess.run(
        [promtool, "check", "rules", str(DEPLOY / "alerts.yml")],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("path", YAML_FILES, ids=lambda path: str(path.relative_to(DEPLOY)))
def test_yaml_parses(path: Path) -> None:
    documents = load_yaml_documents(path)
    assert documents and all(document is not None for document in documents)


def test_compose_services() -> None:
    (compose,) = load_yaml_documents(DEPLOY / "docker-compose.yml")
    services = compose["services"]
    assert set(services) >= {"coordinator", "prometheus", "grafana", "simulator"}
    assert services["coordinator"]["build"]["dockerfile"] == "Dockerfile"
    assert any(volume.endswith(":/data") for volume in services["coordinator"]["volumes"])
    assert services["simulator"]["command"][0] == "simulate"
    assert_simulate_args(services["simulator"]["command"][1:])


def assert_simulate_args(argv: list[str]) -> None:
    """The deploy files' simulator arguments are ones `simulate` accepts."""
    from coordinator.workers.simulate import build_parser, options_from
    options = options_from(build_parser().parse_args(argv))
    assert options.workers >= 1


def test_kubernetes_probes() -> None:
    documents = load_yaml_documents(DEPLOY / "kubernetes" / "connect-worker-with-coordinator.yaml")
    (deployment,) = [doc for doc in documents if doc["kind"] == "Deployment"]
    containers = {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}
    assert set(containers) == {"connect-worker", "coordinator"}
    assert containers["connect-worker"]["args"][0] == "simulate"
    assert_simulate_args(containers["connect-worker"]["args"][1:])
    coordinator = containers["coordinator"]
    assert coordinator["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert coordinator["readinessProbe"]["httpGet"]["path"] == "/readyz"


def test_alert_rules_cover_the_required_conditions() -> None:
    # Read as text so this runs without PyYAML.
    text = (DEPLOY / "alerts.yml").read_text()
    alerts = set(re.findall(r"^\s*- alert: (\S+)", text, re.MULTILINE))
    assert alerts >= {
        "ConnectCoordinatorDown", "ConnectCoordinatorHeartbeatLatencyHigh",
        "ConnectCoordinatorGroupsNotStable", "ConnectCoordinatorUnassignedUnits",
    }


def test_dashboard_json() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "connect-coordinator"
    expressions = " ".join(
        target["expr"] for panel in dashboard["panels"] for target in panel["targets"]
    )
    for metric in (
        "connect_coordinator_requests_total", "connect_coordinator_request_duration_seconds",
        "connect_coordinator_groups", "connect_coordinator_members",
        "connect_coordinator_rebalances_total", "connect_coordinator_time_to_stable_seconds",
        "connect_coordinator_unassigned_units", "connect_coordinator_log_bytes",
        "connect_coordinator_records_written_total", "process_cpu_seconds_total",
        "process_resident_memory_bytes",
    ):
        assert metric in expressions, metric
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    # Every panel uses the provisioned datasource.
    datasource = load_datasource_uid()
    if datasource is not None:
        assert {panel["datasource"]["uid"] for panel in dashboard["panels"]} == {datasource}


def load_datasource_uid() -> str | None:
    text = (DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text()
    match = re.search(r"^\s*uid:\s*(\S+)", text, re.MULTILINE)
    return match.group(1) if match else None


def test_dockerfile() -> None:
    text = (ROOT / "Dockerfile").read_text()
    stages = re.findall(r"^FROM\s+\S+\s+AS\s+(\S+)", text, re.MULTILINE | re.IGNORECASE)
    assert len(stages) >= 2  # build and runtime
    assert re.search(r"^USER\s+(?!root\b|0\b)\S+", text, re.MULTILINE)
    assert re.search(r"^VOLUME\s+/data\s*$", text, re.MULTILINE)
    # HEALTHCHECK [options, maybe continued with a backslash] CMD [...]
    healthcheck = re.search(r"^HEALTHCHECK(?:.*\\\n)*.*?CMD\s+(.*)$", text, re.MULTILINE)
    assert healthcheck is not None
    command = healthcheck.group(1)
    assert "/healthz" in command and "urllib" in command and "curl" not in command
    entrypoint = re.search(r"^ENTRYPOINT\s+(\[.*\])\s*$", text, re.MULTILINE)
    assert entrypoint is not None
    assert json.loads(entrypoint.group(1)) == [
        "connect-coordinator", "serve", "--listen", "0.0.0.0:19092",
        "--admin-listen", "0.0.0.0:19093", "--data-dir", "/data",
    ]
