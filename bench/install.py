"""`connect-coordinator bench install`: what a large client-side Install costs, and how long
it holds the event loop with and without checking it in a thread first.

A group of W members (client-side assignor) and one connector with T tasks is prepared; the
chosen worker installs a round-robin assignment. Measured, each as the median of --rounds:

* `check_ms`: `check_install` alone (validation and conversion; runs in a thread);
* `core_inline_ms` / `core_checked_ms`: the core's `install_assignment` without / with that
  check done beforehand (what stays on the event loop);
* `stall_inline_ms` / `stall_offloaded_ms`: the longest gap a 1 ms ticker task sees in the
  event loop while the Runtime answers the Install (threshold 0 versus the default).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import trio

from coordinator.assignors import load_assignors
from coordinator.config import ServerConfig
from coordinator.core.coordinator import GroupCoordinator
from coordinator.core.group import units_to_wire
from coordinator.core.validation import check_install
from coordinator.server.runtime import INSTALL_OFFLOAD_UNITS, Runtime
from coordinator.units import CONNECTOR, Unit
from protocol.messages import (
    ConnectGroupHeartbeatRequest,
    ConnectGroupInstallAssignmentRequest,
    ConnectGroupPrepareAssignmentRequest,
)
from protocol.messages.connect_group_heartbeat_request import ClientAssignor
from protocol.messages.connect_group_install_assignment_request import MemberAssignment

GROUP = "bench"
NOW_MS = 1_000_000


def prepared_core(workers: int, tasks: int) -> tuple[GroupCoordinator, Any]:
    """A core whose chosen worker has called Prepare; and the Install it would send."""
    config = ServerConfig(assignment_interval_ms=0, assignor_offload_enable=False)
    core = GroupCoordinator(config, load_assignors(config.server_assignors))
    core.put_connector(GROUP, "big", tasks, NOW_MS)
    assignor = ClientAssignor(name="incremental-cooperative", minimum_version=1,
                              maximum_version=2, reason=0, version=2, metadata=b"")
    epochs = {}
    for index in range(workers):
        member = f"worker-{index}"
        response = core.heartbeat(ConnectGroupHeartbeatRequest(
            group_id=GROUP, member_id=member, member_epoch=0,
            worker_url=f"http://{member}:8083", rebalance_timeout_ms=60_000,
            client_assignors=(assignor,)), NOW_MS).response
        epochs[member] = response.member_epoch
    chosen = core.store.groups[GROUP].chosen_member
    assert chosen is not None, "no worker was chosen to compute the assignment"
    prepared = core.prepare_assignment(ConnectGroupPrepareAssignmentRequest(
        group_id=GROUP, member_id=chosen, member_epoch=epochs[chosen]), NOW_MS).response
    units: list[Unit] = [("big", CONNECTOR)] + [("big", task) for task in range(tasks)]
    members = sorted(epochs)
    parts: dict[str, list[Unit]] = {member: [] for member in members}
    for index, unit in enumerate(units):
        parts[members[index % len(members)]].append(unit)
    install = ConnectGroupInstallAssignmentRequest(
        group_id=GROUP, member_id=chosen, member_epoch=epochs[chosen],
        group_epoch=prepared.group_epoch, error=0,
        members=tuple(MemberAssignment(member_id=m, assigned=units_to_wire(u), version=2,
                                       metadata=b"") for m, u in parts.items()))
    return core, install


def timed_ms(action: Any) -> float:
    started = time.perf_counter()
    action()
    return (time.perf_counter() - started) * 1000


async def longest_stall_ms(runtime: Runtime, install: Any) -> float:
    """The longest the event loop went without running a 1 ms ticker during the Install."""
    longest = 0.0
    done = trio.Event()

    async def ticker() -> None:
        nonlocal longest
        last = time.perf_counter()
        while not done.is_set():
            await trio.sleep(0.001)
            now = time.perf_counter()
            longest = max(longest, now - last)
            last = now

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ticker)
        await trio.sleep(0.01)
        response = await runtime.install_assignment(install)
        assert response.error_code == 0, response.error_message
        done.set()
    return longest * 1000


def stall_ms(workers: int, tasks: int, threshold: int) -> float:
    core, install = prepared_core(workers, tasks)
    runtime = Runtime(core, ServerConfig(assignment_interval_ms=0,
                                         assignor_offload_enable=False))
    runtime.install_offload_units = threshold
    return float(trio.run(longest_stall_ms, runtime, install))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="connect-coordinator bench install",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=1_000)
    parser.add_argument("--tasks", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    check, inline, checked_core, stall_inline, stall_offloaded = [], [], [], [], []
    for _ in range(args.rounds):
        core, install = prepared_core(args.workers, args.tasks)
        check.append(timed_ms(lambda install=install: check_install(install)))
        inline.append(timed_ms(lambda core=core, install=install:
                               core.install_assignment(install, NOW_MS)))
        core, install = prepared_core(args.workers, args.tasks)
        done = check_install(install)
        checked_core.append(timed_ms(lambda core=core, install=install, done=done:
                                     core.install_assignment(install, NOW_MS, done)))
        stall_inline.append(stall_ms(args.workers, args.tasks, threshold=10**12))
        stall_offloaded.append(stall_ms(args.workers, args.tasks, INSTALL_OFFLOAD_UNITS))
    row = {
        "workers": args.workers, "tasks": args.tasks, "units": args.tasks + 1,
        "offload_threshold_units": INSTALL_OFFLOAD_UNITS,
        "check_ms": round(statistics.median(check), 2),
        "core_inline_ms": round(statistics.median(inline), 2),
        "core_checked_ms": round(statistics.median(checked_core), 2),
        "stall_inline_ms": round(statistics.median(stall_inline), 2),
        "stall_offloaded_ms": round(statistics.median(stall_offloaded), 2),
    }
    if args.json:
        print(json.dumps(row))
    else:
        print(f"Install of {row['units']:,} units over {args.workers:,} members "
              f"(median of {args.rounds}):")
        print(f"  check_install (validation, in a thread)   {row['check_ms']:8.2f} ms")
        print(f"  core install, unchecked (all on the loop)  {row['core_inline_ms']:8.2f} ms")
        print(f"  core install, checked beforehand           {row['core_checked_ms']:8.2f} ms")
        print(f"  longest event-loop stall, inline           {row['stall_inline_ms']:8.2f} ms")
        print(f"  longest event-loop stall, offloaded        {row['stall_offloaded_ms']:8.2f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
