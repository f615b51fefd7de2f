"""Benchmark a server assignor: a stable group, then one worker joins.

    connect-coordinator bench assignor --assignor balanced --workers 1000 \\
        --connectors 1000 --tasks 50000

The group is first settled by the assignor itself (so its state is what production would
hand back), then two runs are timed ``repeats`` times each: the stable group re-run, and the
run that sees one new worker. ``moved`` counts units whose owner changed in the join run;
``min_moved`` is the least any balanced assignment must move there (the new worker's floor
share of connectors plus of tasks).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import statistics
import time
from collections.abc import Mapping
from typing import Any

from coordinator.assignors import get_assignor
from coordinator.assignors.api import AssignmentResult, AssignmentSpec, MemberSpec, ServerAssignor
from coordinator.units import Unit

GROUP_ID = "bench"
NOW_MS = 1_000_000


def run(
    assignor_name: str, workers: int, connectors: int, tasks: int, repeats: int = 20
) -> dict[str, Any]:
    if workers < 1 or connectors < 1 or tasks < 0 or repeats < 1:
        raise ValueError("need workers >= 1, connectors >= 1, tasks >= 0 and repeats >= 1")
    assignor = get_assignor(assignor_name)
    task_counts = _spread(tasks, connectors)
    members = {_worker_id(i): _member(_worker_id(i)) for i in range(workers)}

    # settle the group: an initial run, then one on its own output
    settled = assignor.assign(_spec(members, task_counts, {}, b""))
    settled = assignor.assign(_spec(members, task_counts, settled.target, settled.state))

    stable_spec = _spec(members, task_counts, settled.target, settled.state)
    stable_ms, stable_result = _time(assignor, stable_spec, repeats)

    joined = dict(members)
    newcomer = _worker_id(workers)
    joined[newcomer] = _member(newcomer)
    join_spec = _spec(joined, task_counts, settled.target, settled.state)
    join_ms, join_result = _time(assignor, join_spec, repeats)

    return {
        "assignor": assignor_name,
        "workers": workers,
        "connectors": connectors,
        "tasks": tasks,
        "repeats": repeats,
        "median_ms": round(statistics.median(join_ms), 3),
        "p99_ms": round(_percentile(join_ms, 99), 3),
        "moved": _moved(settled.target, join_result.target),
        "min_moved": connectors // (workers + 1) + tasks // (workers + 1),
        "stable_median_ms": round(statistics.median(stable_ms), 3),
        "stable_p99_ms": round(_percentile(stable_ms, 99), 3),
        "stable_moved": _moved(settled.target, stable_result.target),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="connect-coordinator bench assignor",
        description="Time a server assignor on a stable group that one worker joins.",
    )
    parser.add_argument("--assignor", required=True, metavar="NAME",
                        help="server assignor to run, e.g. balanced or round-robin")
    parser.add_argument("--workers", type=int, required=True, metavar="W",
                        help="members of the stable group before the join")
    parser.add_argument("--connectors", type=int, required=True, metavar="C",
                        help="connectors in the group")
    parser.add_argument("--tasks", type=int, required=True, metavar="T",
                        help="tasks in all, spread as evenly as possible over the connectors")
    parser.add_argument("--repeats", type=int, default=20, metavar="N",
                        help="timed runs per scenario (default: 20)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    try:
        figures = run(args.assignor, args.workers, args.connectors, args.tasks, args.repeats)
    except ValueError as error:  # includes an unknown assignor name
        parser.error(str(error))
    if args.json:
        print(json.dumps(figures, sort_keys=True))
    else:
        print(
            f"{figures['assignor']}: {figures['workers']} workers, {figures['connectors']} "
            f"connectors, {figures['tasks']} tasks; one worker joins: median "
            f"{figures['median_ms']:.2f} ms, p99 {figures['p99_ms']:.2f} ms, moved "
            f"{figures['moved']} units (at least {figures['min_moved']} needed); stable re-run: "
            f"median {figures['stable_median_ms']:.2f} ms, moved {figures['stable_moved']}"
        )
    return 0


def _worker_id(index: int) -> str:
    return f"worker-{index:06d}"


def _member(member_id: str) -> MemberSpec:
    return MemberSpec(
        member_id=member_id,
        instance_id=None,
        worker_url=f"http://{member_id}:8083",
        current_target=frozenset(),
    )


def _spread(tasks: int, connectors: int) -> dict[str, int]:
    base, extra = divmod(tasks, connectors)
    return {f"connector-{i:06d}": base + (1 if i < extra else 0) for i in range(connectors)}


def _spec(
    members: Mapping[str, MemberSpec],
    task_counts: Mapping[str, int],
    previous_target: Mapping[str, frozenset[Unit]],
    previous_state: bytes,
) -> AssignmentSpec:
    # copy the parts, as the coordinator hands over its own frozensets, not the assignor's
    previous = {m: frozenset(part) for m, part in previous_target.items()}
    return AssignmentSpec(
        group_id=GROUP_ID,
        members={
            m: MemberSpec(spec.member_id, spec.instance_id, spec.worker_url,
                          previous.get(m, frozenset()))
            for m, spec in members.items()
        },
        connectors=dict(task_counts),
        previous_target=previous,
        previous_state=previous_state,
        now_ms=NOW_MS,
    )


def _time(
    assignor: ServerAssignor, spec: AssignmentSpec, repeats: int
) -> tuple[list[float], AssignmentResult]:
    timings: list[float] = []
    result: AssignmentResult | None = None
    for _ in range(repeats):
        gc.collect()  # start each run from the same heap, not mid-way through a collection
        started = time.perf_counter()
        result = assignor.assign(spec)
        timings.append((time.perf_counter() - started) * 1000)
    assert result is not None
    return timings, result


def _percentile(values: list[float], percent: float) -> float:
    ordered = sorted(values)
    rank = max(1, math.ceil(percent / 100 * len(ordered)))
    return ordered[rank - 1]


def _moved(before: Mapping[str, frozenset[Unit]], after: Mapping[str, frozenset[Unit]]) -> int:
    """Units whose owner differs between two targets (newly placed units count too)."""
    owner = {unit: member for member, part in before.items() for unit in part}
    return sum(1 for member, part in after.items() for unit in part if owner.get(unit) != member)
