"""`bench hostile` runs end to end (briefly): attackers send, healthy members are timed."""

from __future__ import annotations

import json

import pytest
import trio

from bench import hostile as bench_hostile
from coordinator.config import ServerConfig
from coordinator.server.limits import decode_limits
from protocol.framing import RequestOverLimit, decode_request


def test_every_attack_is_a_frame_within_the_limit() -> None:
    config = ServerConfig()
    for name, frame in bench_hostile.attacks(config).items():
        assert len(frame) - 4 <= config.max_frame_bytes, name
    # the legal ones decode (the limits let them through)
    frames = bench_hostile.attacks(config)
    limits = decode_limits(config)
    for name in ("describe-largest", "describe-max-ids", "heartbeat-max-owned",
                 "install-max", "unknown-tags-max-frame", "join-max-protocols",
                 "leave-max-members", "describe-groups-max", "find-coordinator-max"):
        decode_request(frames[name][4:], limits)
    with pytest.raises(RequestOverLimit, match="group.connect.max.leave.members"):
        decode_request(frames["leave-over-limit-max-frame"][4:], limits)


def test_a_short_run_reports_each_window() -> None:
    lines: list[str] = []
    bench_hostile.main(["--seconds", "1.5", "--warm-up", "1", "--healthy", "2",
                        "--attackers", "1", "--attack", "describe-max-ids",
                        "--attack", "leave-max-members", "--json"],
                       printer=lines.append)
    rows = json.loads(lines[-1])
    assert set(rows) == {"baseline", "describe-max-ids", "leave-max-members"}
    for name in ("describe-max-ids", "leave-max-members"):
        attacked = rows[name]
        assert attacked["attack"]["sent"] > 0 and attacked["count"] > 0
        assert attacked["errors"] == 0, attacked["first_errors"]
    assert rows["baseline"]["errors"] == 0
    # the coordinator's event loop was timed (bench/loopsteps.py), each window on its own
    for row in rows.values():
        assert row["loop_step_cpu_ms"] > 0 and row["loop_step_wall_ms"] > 0
        assert row["loop_step_cpu_task"]
        assert "window" not in row


def test_the_longest_loop_step_is_kept_per_bucket_and_told_per_window() -> None:
    from bench.loopsteps import LoopSteps, longest

    steps = LoopSteps(bucket_s=1.0)

    async def busy() -> None:
        for rounds in (10, 100_000, 10):
            sum(range(rounds))
            await trio.lowlevel.checkpoint()

    trio.run(busy, instruments=[steps])
    recorded = json.loads(json.dumps(steps.to_json()))
    assert recorded["buckets"]
    everything = longest(recorded, 0, 1e12)
    assert everything["loop_step_cpu_ms"] > 0
    assert everything["loop_step_cpu_task"].endswith("busy")
    assert everything["loop_step_gc_ms"] >= 0
    nothing = longest(recorded, 0, 1)  # a window long before the run
    assert nothing["loop_step_cpu_ms"] == 0 and nothing["loop_step_cpu_task"] == ""


def test_a_short_run_of_the_proxy_attacks() -> None:
    lines: list[str] = []
    bench_hostile.main(["--seconds", "1.5", "--warm-up", "1", "--healthy", "2",
                        "--attackers", "1", "--attack", "proxy-join-group-huge",
                        "--attack", "proxy-idle-beyond-cap", "--no-loop-steps", "--json"],
                       printer=lines.append)
    rows = json.loads(lines[-1])
    assert set(rows) == {"proxy-baseline", "proxy-join-group-huge", "proxy-idle-beyond-cap"}
    assert all(row["errors"] == 0 and row["count"] > 0 for row in rows.values())
    huge = rows["proxy-join-group-huge"]["attack"]
    assert huge["sent"] > 0 and huge["answered"] > 0  # refused with an answer, not a death
    idle = rows["proxy-idle-beyond-cap"]["attack"]
    # more connections than the cap were opened, and the proxy closed those beyond it
    assert idle["sent"] > bench_hostile.PROXY_CAP and idle["closed"] > 0
