"""`connect-coordinator bench core`: the core's cost per stable heartbeat by group size.

Shows that a stable member's heartbeat costs the same whatever the group's size: the core
is called directly (no sockets), with groups of growing size brought to STABLE first.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from coordinator.assignors import load_assignors
from coordinator.config import ServerConfig
from coordinator.core.coordinator import GroupCoordinator
from coordinator.core.group import units_to_wire
from protocol.messages import ConnectGroupHeartbeatRequest

GROUP = "bench"


def stable_group(members: int, tasks_per_member: int = 2) -> tuple[GroupCoordinator, int]:
    # Joins within one assignment interval share one assignor run (seed 004's batching).
    config = ServerConfig(assignment_interval_ms=1_000, assignor_offload_enable=False)
    core = GroupCoordinator(config, load_assignors(config.server_assignors))
    now = 1_000_000
    core.put_connector(GROUP, "source", members * tasks_per_member, now)
    for index in range(members):
        core.heartbeat(ConnectGroupHeartbeatRequest(
            group_id=GROUP, member_id=f"worker-{index}", member_epoch=0,
            worker_url=f"http://worker-{index}:8083", rebalance_timeout_ms=60_000,
            server_assignor="balanced"), now)
    now += 1_000
    core.on_timer(("assignment", GROUP, ""), now)
    group = core.store.groups[GROUP]
    for _ in range(3):
        for member in list(group.members.values()):
            current = member.current
            core.heartbeat(ConnectGroupHeartbeatRequest(
                group_id=GROUP, member_id=member.member_id, member_epoch=current.epoch,
                owned_connectors_and_tasks=units_to_wire(current.assigned)), now)
    if group.state != "STABLE":
        raise RuntimeError(f"the group did not reach STABLE ({group.state})")
    return core, now


def measure(members: int, heartbeats: int, rounds: int) -> dict[str, Any]:
    core, now = stable_group(members)
    group = core.store.groups[GROUP]
    requests = [ConnectGroupHeartbeatRequest(group_id=GROUP, member_id=m.member_id,
                                             member_epoch=m.current.epoch)
                for m in list(group.members.values())[:1000]]
    per_round = []
    for _ in range(rounds):
        started = time.perf_counter()
        for index in range(heartbeats):
            result = core.heartbeat(requests[index % len(requests)], now)
        per_round.append((time.perf_counter() - started) / heartbeats * 1e6)
        assert not result.records
    return {"members": members, "median_us": round(statistics.median(per_round), 2),
            "heartbeats_per_s": round(1e6 / statistics.median(per_round))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="connect-coordinator bench core",
                                     description=__doc__)
    parser.add_argument("--members", default="10,100,1000,10000",
                        help="comma-separated group sizes (default %(default)s)")
    parser.add_argument("--heartbeats", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    rows = [measure(int(size), args.heartbeats, args.rounds)
            for size in args.members.split(",")]
    if args.json:
        print(json.dumps(rows))
    else:
        for row in rows:
            print(f"{row['members']:>6} members: {row['median_us']:>6} µs per stable heartbeat "
                  f"({row['heartbeats_per_s']:,}/s on one core)")
    return 0
