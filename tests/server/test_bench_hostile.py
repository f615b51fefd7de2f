"""`bench hostile` runs end to end (briefly): attackers send, healthy members are timed."""

from __future__ import annotations

import json

from bench import hostile as bench_hostile
from coordinator.config import ServerConfig
from protocol.framing import decode_request


def test_every_attack_is_a_frame_within_the_limit() -> None:
    config = ServerConfig()
    for name, frame in bench_hostile.attacks(config).items():
        assert len(frame) - 4 <= config.max_frame_bytes, name
    # the legal ones decode (the limits let them through)
    frames = bench_hostile.attacks(config)
    for name in ("describe-largest", "describe-max-ids", "heartbeat-max-owned",
                 "install-max", "unknown-tags-max-frame"):
        decode_request(frames[name][4:])


def test_a_short_run_reports_each_window() -> None:
    lines: list[str] = []
    bench_hostile.main(["--seconds", "1.5", "--warm-up", "1", "--healthy", "2",
                        "--attackers", "1", "--attack", "describe-max-ids", "--json"],
                       printer=lines.append)
    rows = json.loads(lines[-1])
    assert set(rows) == {"baseline", "describe-max-ids"}
    attacked = rows["describe-max-ids"]
    assert attacked["attack"]["sent"] > 0 and attacked["count"] > 0
    assert attacked["errors"] == 0 and rows["baseline"]["errors"] == 0
