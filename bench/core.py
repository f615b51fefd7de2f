"""`connect-coordinator bench core`: the core's cost per stable heartbeat by group size.

Shows that a stable member's heartbeat costs the same whatever the group's size: the core
is called directly (no sockets), with groups of growing size brought to STABLE first.

`--epoch-bump` measures the other frequent heartbeat instead: after a new target epoch
(here one task added), each member's next heartbeat moves it to that epoch, writes its
current assignment and answers with the new epoch (its units only if they changed).
Timed per heartbeat: the core step, encoding its records for the log, and encoding the
answer, i.e. what the event loop spends on it before and after the group commit.

`--pool-run` times an offloaded `balanced` run of a stable group with a connector per member
(as the heartbeat benchmark's big group) after one task is added, step by step, in this
process and with the collector off, as in `serve` and its pool: the put itself (the core's
step, event loop), packing the spec (event loop), told against the group's previous run and
whole, the bytes that travel to the pool either way, the pool process's work (`run_packed`)
when it did the group's previous run and still holds its spec ("warm") and when it holds
nothing ("cold": the run packed whole), and the landing (`complete_assignor_run`, event
loop). Median over rounds.
"""

from __future__ import annotations

import argparse
import gc
import json
import pickle
import statistics
import time
from typing import Any

from coordinator.assignors import load_assignors, transport
from coordinator.config import ServerConfig
from coordinator.core.coordinator import GroupCoordinator
from coordinator.core.group import units_to_wire
from coordinator.core.result import Result
from coordinator.storage import encode_records
from protocol.fastpath import encode_heartbeat_response
from protocol.messages import ConnectGroupHeartbeatRequest

GROUP = "bench"


def stable_group(members: int, tasks_per_member: int = 2, offload: bool = False,
                 per_member_connectors: bool = False) -> tuple[GroupCoordinator, int]:
    """A STABLE group of `members` on `balanced`, running one connector "source" with all
    the tasks (or, with `per_member_connectors`, connector-0... with `tasks_per_member`
    tasks each); with `offload`, its runs are offloaded (and landed here, inline)."""
    # Joins within one assignment interval share one assignor run.
    config = ServerConfig(assignment_interval_ms=1_000, assignor_offload_enable=offload)
    core = GroupCoordinator(config, load_assignors(config.server_assignors))
    now = 1_000_000
    connectors = ({f"connector-{index}": tasks_per_member for index in range(members)}
                  if per_member_connectors else {"source": members * tasks_per_member})
    for name, tasks in connectors.items():
        _land_inline(core, core.put_connector(GROUP, name, tasks, now), now)
    for index in range(members):
        _land_inline(core, core.heartbeat(ConnectGroupHeartbeatRequest(
            group_id=GROUP, member_id=f"worker-{index}", member_epoch=0,
            worker_url=f"http://worker-{index}:8083", rebalance_timeout_ms=60_000,
            server_assignor="balanced"), now), now)
    now += 1_000
    _land_inline(core, core.on_timer(("assignment", GROUP, ""), now), now)
    group = core.store.groups[GROUP]
    for _ in range(3):
        for member in list(group.members.values()):
            current = member.current
            _land_inline(core, core.heartbeat(ConnectGroupHeartbeatRequest(
                group_id=GROUP, member_id=member.member_id, member_epoch=current.epoch,
                owned_connectors_and_tasks=units_to_wire(current.assigned)), now), now)
    if group.state != "STABLE":
        raise RuntimeError(f"the group did not reach STABLE ({group.state})")
    return core, now


def _land_inline(core: GroupCoordinator, result: Result[Any], now: int) -> None:
    for run in result.jobs:
        outcome = core.assignors[run.assignor].assign(run.spec)
        _land_inline(core, core.complete_assignor_run(run, outcome, now), now)


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


def measure_epoch_bump(members: int, tasks_per_member: int, rounds: int) -> dict[str, Any]:
    """Median over rounds of the mean cost per heartbeat, in us, of every member's first
    heartbeat after a new target epoch."""
    core, now = stable_group(members, tasks_per_member)
    group = core.store.groups[GROUP]
    tasks = members * tasks_per_member
    costs: dict[str, list[float]] = {"core_us": [], "records_us": [], "answer_us": []}
    for _ in range(rounds):
        tasks += 1  # one task more: a new target, and no member has to release anything
        epoch = group.assignment_epoch
        now += 1_000  # past the group's assignment interval: the run is not put off
        core.put_connector(GROUP, "source", tasks, now)
        if group.assignment_epoch == epoch:
            raise RuntimeError("the resize did not install a new target")
        spent = dict.fromkeys(costs, 0.0)
        for member in list(group.members.values()):
            request = ConnectGroupHeartbeatRequest(group_id=GROUP, member_id=member.member_id,
                                                   member_epoch=member.current.epoch)
            started = time.perf_counter()
            result = core.heartbeat(request, now)
            stepped = time.perf_counter()
            encode_records(result.records)
            encoded = time.perf_counter()
            encode_heartbeat_response(1, result.response)
            answered = time.perf_counter()
            if result.response.member_epoch != group.assignment_epoch or not result.records:
                raise RuntimeError(f"{member.member_id} did not move to the new epoch")
            spent["core_us"] += stepped - started
            spent["records_us"] += encoded - stepped
            spent["answer_us"] += answered - encoded
        for key, total in spent.items():
            costs[key].append(total / len(group.members) * 1e6)
    row: dict[str, Any] = {"members": members, "tasks_per_member": tasks_per_member}
    row.update({key: round(statistics.median(values), 1) for key, values in costs.items()})
    row["total_us"] = round(row["core_us"] + row["records_us"] + row["answer_us"], 1)
    return row


def measure_pool_run(members: int, tasks_per_member: int, rounds: int) -> dict[str, Any]:
    # As `bench heartbeats --assignor-load` sets its big group up: a connector per member.
    core, now = stable_group(members, tasks_per_member, offload=True,
                             per_member_connectors=True)
    # Neither `serve` nor its pool processes leave collections to allocation counts.
    gc.collect()
    gc.disable()
    try:
        return _measure_pool_run(core, now, tasks_per_member, rounds)
    finally:
        gc.enable()


def _measure_pool_run(core: GroupCoordinator, now: int, tasks_per_member: int, rounds: int
                      ) -> dict[str, Any]:
    members = len(core.store.groups[GROUP].members)
    tasks = tasks_per_member
    assignor = core.assignors["balanced"]
    packer = transport.SpecPacker()
    costs: dict[str, list[float]] = {key: [] for key in (
        "put_ms", "pack_ms", "pack_whole_ms", "sent_kb", "sent_cold_kb", "pool_warm_ms",
        "pool_cold_ms", "landing_ms")}
    for round_index in range(rounds + 1):  # the first one fills the packer: not counted
        tasks += 1
        now += 1_000
        started = time.perf_counter()
        (run,) = core.put_connector(GROUP, "connector-0", tasks, now).jobs
        putting = time.perf_counter() - started
        started = time.perf_counter()
        packed = packer.pack(assignor, run.spec, changes=run.changes)
        packing = time.perf_counter() - started
        sent = pickle.dumps(packed, transport.PROTOCOL)
        started = time.perf_counter()
        outcome = transport.run_packed(pickle.loads(sent))  # the worker of the last run
        warm = time.perf_counter() - started
        # The same run for a pool process that holds nothing of the group: packed whole.
        # (That worker is the one the next round's run is told against. Told the changes,
        # as `serve` tells them, so that the next told pack goes by versions as there.)
        started = time.perf_counter()
        whole = packer.pack(assignor, run.spec, whole=True, changes=run.changes)
        packing_whole = time.perf_counter() - started
        complete = pickle.dumps(whole, transport.PROTOCOL)
        transport._RESIDENT.pop(packer.token)
        started = time.perf_counter()
        cold_outcome = transport.run_packed(pickle.loads(complete))
        cold = time.perf_counter() - started
        if not (outcome.verified and cold_outcome == outcome):
            raise RuntimeError("the pool's check did not pass the balanced result")
        # What lands is what that worker returned: it keeps the state for the next round.
        packer.returned(whole, cold_outcome)
        outcome = cold_outcome
        started = time.perf_counter()
        landed = core.complete_assignor_run(run, outcome, now)  # as `serve` lands it
        landing = time.perf_counter() - started
        if landed.jobs or not any(record.value is not None for record in landed.records):
            raise RuntimeError("the run did not land as a new target")
        if round_index == 0:
            continue
        for key, value in (("put_ms", putting * 1e3), ("pack_ms", packing * 1e3),
                           ("pack_whole_ms", packing_whole * 1e3),
                           ("sent_kb", len(sent) / 1e3),
                           ("sent_cold_kb", len(complete) / 1e3),
                           ("pool_warm_ms", warm * 1e3), ("pool_cold_ms", cold * 1e3),
                           ("landing_ms", landing * 1e3)):
            costs[key].append(value)
    row: dict[str, Any] = {"members": members, "tasks_per_member": tasks_per_member}
    row.update({key: round(statistics.median(values), 2) for key, values in costs.items()})
    return row


def _stable_line(row: dict[str, Any]) -> str:
    return (f"{row['members']:>6} members: {row['median_us']:>6} µs per stable heartbeat "
            f"({row['heartbeats_per_s']:,}/s on one core)")


def _epoch_bump_line(row: dict[str, Any]) -> str:
    return (f"{row['members']:>6} members x {row['tasks_per_member']} tasks: "
            f"{row['total_us']:>7} us per heartbeat to a new epoch (core {row['core_us']}, "
            f"records {row['records_us']}, answer {row['answer_us']})")


def _pool_run_line(row: dict[str, Any]) -> str:
    return (f"{row['members']:>6} members x {row['tasks_per_member']} tasks: put "
            f"{row['put_ms']} ms, pack {row['pack_ms']} ms ({row['pack_whole_ms']} ms whole), "
            f"{row['sent_kb']} kB sent "
            f"({row['sent_cold_kb']} kB whole), "
            f"pool {row['pool_warm_ms']} ms ({row['pool_cold_ms']} ms cold), landing "
            f"{row['landing_ms']} ms")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="connect-coordinator bench core",
                                     description=__doc__)
    parser.add_argument("--members", default=None,
                        help="comma-separated group sizes (default 10,100,1000,10000; "
                             "100,1000 with --epoch-bump)")
    parser.add_argument("--heartbeats", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--epoch-bump", action="store_true",
                        help="time each member's heartbeat after a new target epoch instead")
    parser.add_argument("--pool-run", action="store_true",
                        help="time an offloaded run of the group step by step instead")
    parser.add_argument("--tasks-per-member", type=int, default=50,
                        help="with --epoch-bump or --pool-run (default %(default)s)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.tasks_per_member < 1:
        parser.error("--rounds and --tasks-per-member must be at least 1")
    if args.epoch_bump and args.pool_run:
        parser.error("--epoch-bump and --pool-run are two different measurements")
    special = args.epoch_bump or args.pool_run
    sizes = [int(size) for size in
             (args.members or ("100,1000" if special else "10,100,1000,10000")).split(",")]
    if args.epoch_bump:
        rows = [measure_epoch_bump(size, args.tasks_per_member, args.rounds) for size in sizes]
        line = _epoch_bump_line
    elif args.pool_run:
        rows = [measure_pool_run(size, args.tasks_per_member, args.rounds) for size in sizes]
        line = _pool_run_line
    else:
        rows = [measure(size, args.heartbeats, args.rounds) for size in sizes]
        line = _stable_line
    if args.json:
        print(json.dumps(rows))
    else:
        for row in rows:
            print(line(row))
    return 0
