"""`bench classic` end to end on tiny configurations (figures are not judged here): a real
coordinator subprocess, load processes of classic and new-protocol members."""

from __future__ import annotations

import json
from typing import Any

import pytest

from coordinator import cli


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    code = cli.main(argv)
    captured = capsys.readouterr()
    assert code == 0, captured.err  # the bench's one-line reason, not a JSON error
    return code, json.loads(captured.out)


def test_classic_heartbeats_measure_every_kind(capsys: pytest.CaptureFixture[str]) -> None:
    code, report = run_cli(["bench", "classic", "heartbeats", "--rounds", "1",
                            "--processes", "1", "--groups", "1", "--workers-per-group", "3",
                            "--connectors", "1", "--tasks", "4", "--interval-ms", "10",
                            "--duration", "1", "--warmup", "0", "--json",
                            # heartbeats are measured, not assignor runs: on the loop, no
                            # pool process to start slowly on a busy machine
                            "--set", "group.connect.assignor.offload.enable=false"], capsys)
    assert code == 0
    kinds = report["kinds"]
    assert set(kinds) == {"connect", "bridged", "classic"}
    for kind, figures in kinds.items():
        assert figures["heartbeats_per_s"]["median"] > 0, kind
        assert figures["server_us_per_heartbeat"]["median"] > 0, kind
        assert figures["errors"] == [{}] and figures["unstable"] == 0, kind
        assert figures["worker_failures"] == [], kind
    for kind in ("bridged", "classic"):
        assert kinds[kind]["cpu_ratio"] > 0 and kinds[kind]["throughput_ratio"] > 0


def test_classic_join_times_joiners_in_both_group_types(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, report = run_cli(["bench", "classic", "join", "--rounds", "1", "--processes", "1",
                            "--members", "4", "--joiners", "1", "--heartbeat-ms", "200",
                            "--connectors", "1", "--tasks", "4", "--json"], capsys)
    assert code == 0
    for kind in ("bridged", "classic"):
        figures = report["kinds"][kind]
        assert figures["joiners"] == 1
        assert 0 < figures["join_ms"]["median"] <= figures["total_ms"]["median"]
