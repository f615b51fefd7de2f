"""Codec micro-benchmark: encode and decode time of every Connect message body.

Called by ``connect-coordinator bench codec``; also ``python -m bench.codec``.
Each figure is the median over ``--rounds`` rounds of the mean time per operation over
``--iterations`` operations, in microseconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from protocol._codec import entity_bytes, read_entity
from protocol.messages import (
    ConnectGroupDescribeRequest,
    ConnectGroupDescribeResponse,
    ConnectGroupHeartbeatRequest,
    ConnectGroupHeartbeatResponse,
    ConnectGroupInstallAssignmentRequest,
    ConnectGroupInstallAssignmentResponse,
    ConnectGroupPrepareAssignmentRequest,
    ConnectGroupPrepareAssignmentResponse,
    ConnectorsAndTasks,
    ConnectorTaskId,
)
from protocol.messages.connect_group_describe_response import DescribedGroup, DescribedMember
from protocol.messages.connect_group_heartbeat_request import ClientAssignor
from protocol.messages.connect_group_heartbeat_response import Assignment
from protocol.messages.connect_group_install_assignment_request import MemberAssignment
from protocol.messages.connect_group_prepare_assignment_response import Member, MemberAssignor

MEMBERS = 100


def _units(connector_count: int, tasks_per_connector: int, offset: int = 0) -> ConnectorsAndTasks:
    names = tuple(f"connector-{offset + index:04d}" for index in range(connector_count))
    return ConnectorsAndTasks(
        connectors=names,
        tasks=tuple(
            ConnectorTaskId(connector=name, task=task)
            for name in names
            for task in range(tasks_per_connector)
        ),
    )


def _member_id(index: int) -> str:
    return f"3f2a9c1e-5b7d-4e8f-9a0b-{index:012d}"


def _url(index: int) -> str:
    return f"http://worker-{index}.connect.svc:8083"


def sample_messages() -> list[tuple[str, Any]]:
    """(label, instance) for every Connect request and response, sized like a busy group."""
    owned = _units(2, 5)  # 10 tasks
    heartbeat_request = ConnectGroupHeartbeatRequest(
        group_id="connect-cluster",
        member_id=_member_id(1),
        member_epoch=42,
        instance_id="worker-1",
        worker_url=_url(1),
        rebalance_timeout_ms=60_000,
        client_assignors=(
            ClientAssignor(
                name="sessioned",
                minimum_version=1,
                maximum_version=2,
                reason=0,
                version=2,
                metadata=b"\x00" * 32,
            ),
        ),
        owned_connectors_and_tasks=owned,
    )
    heartbeat_response = ConnectGroupHeartbeatResponse(
        throttle_time_ms=0,
        error_code=0,
        member_epoch=43,
        heartbeat_interval_ms=3000,
        assignment=Assignment(error=0, assigned=owned, version=2, metadata=b"\x00" * 16),
    )
    prepare_response = ConnectGroupPrepareAssignmentResponse(
        throttle_time_ms=0,
        error_code=0,
        group_epoch=44,
        assignor_name="sessioned",
        connectors_and_tasks=_units(MEMBERS, 4),
        members=tuple(
            Member(
                member_id=_member_id(index),
                member_epoch=43,
                instance_id=f"worker-{index}",
                worker_url=_url(index),
                assignor=MemberAssignor(version=2, reason=0, metadata=b"\x00" * 32),
                target=_units(1, 4, offset=index),
            )
            for index in range(MEMBERS)
        ),
    )
    install_request = ConnectGroupInstallAssignmentRequest(
        group_id="connect-cluster",
        member_id=_member_id(0),
        member_epoch=43,
        group_epoch=44,
        error=0,
        members=tuple(
            MemberAssignment(
                member_id=_member_id(index),
                assigned=_units(1, 4, offset=index),
                version=2,
                metadata=b"\x00" * 16,
            )
            for index in range(MEMBERS)
        ),
    )
    describe_response = ConnectGroupDescribeResponse(
        throttle_time_ms=0,
        groups=(
            DescribedGroup(
                error_code=0,
                group_id="connect-cluster",
                group_state="STABLE",
                group_type="connect",
                units_source="admin",
                group_epoch=44,
                assignment_epoch=44,
                assignor_name="sessioned",
                connectors_and_tasks=_units(MEMBERS, 4),
                members=tuple(
                    DescribedMember(
                        member_id=_member_id(index),
                        instance_id=f"worker-{index}",
                        worker_url=_url(index),
                        protocol="connect",
                        member_epoch=44,
                        member_state="STABLE",
                        assigned=_units(1, 4, offset=index),
                        pending_revocation=ConnectorsAndTasks(connectors=(), tasks=()),
                        target=_units(1, 4, offset=index),
                    )
                    for index in range(MEMBERS)
                ),
            ),
        ),
    )
    return [
        ("ConnectGroupHeartbeatRequest (10 owned tasks)", heartbeat_request),
        ("ConnectGroupHeartbeatResponse (10 assigned tasks)", heartbeat_response),
        (
            "ConnectGroupPrepareAssignmentRequest",
            ConnectGroupPrepareAssignmentRequest(
                group_id="connect-cluster", member_id=_member_id(0), member_epoch=43
            ),
        ),
        (f"ConnectGroupPrepareAssignmentResponse ({MEMBERS} members)", prepare_response),
        (f"ConnectGroupInstallAssignmentRequest ({MEMBERS} members)", install_request),
        (
            "ConnectGroupInstallAssignmentResponse",
            ConnectGroupInstallAssignmentResponse(throttle_time_ms=0, error_code=0),
        ),
        (
            "ConnectGroupDescribeRequest (1 group)",
            ConnectGroupDescribeRequest(group_ids=("connect-cluster",)),
        ),
        (f"ConnectGroupDescribeResponse ({MEMBERS} members)", describe_response),
    ]


def _median_microseconds(operation: Callable[[], object], iterations: int, rounds: int) -> float:
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(iterations):
            operation()
        samples.append((time.perf_counter() - started) / iterations * 1e6)
    return statistics.median(samples)


def run(iterations: int, rounds: int) -> list[dict[str, Any]]:
    results = []
    for label, message in sample_messages():
        message_type = type(message)
        encoded = entity_bytes(message_type, message)
        decoded, end = read_entity(message_type, encoded, 0)
        # A benchmark of a broken codec would be meaningless.
        assert decoded == message and end == len(encoded), label
        results.append(
            {
                "message": label,
                "bytes": len(encoded),
                "encode_us": round(
                    _median_microseconds(
                        partial(entity_bytes, message_type, message), iterations, rounds
                    ),
                    2,
                ),
                "decode_us": round(
                    _median_microseconds(
                        partial(read_entity, message_type, encoded, 0), iterations, rounds
                    ),
                    2,
                ),
            }
        )
    return results


def _table(results: list[dict[str, Any]]) -> str:
    width = max(len(row["message"]) for row in results)
    lines = [f"{'message':<{width}}  {'bytes':>7}  {'encode µs':>10}  {'decode µs':>10}"]
    lines += [
        f"{row['message']:<{width}}  {row['bytes']:>7}  "
        f"{row['encode_us']:>10.2f}  {row['decode_us']:>10.2f}"
        for row in results
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="connect-coordinator bench codec",
        description="Time encoding and decoding of every Connect message (median µs per op).",
    )
    parser.add_argument(
        "--iterations", type=int, default=200, help="operations per round (default 200)"
    )
    parser.add_argument("--rounds", type=int, default=5, help="rounds; the median is reported")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    if args.iterations < 1 or args.rounds < 1:
        parser.error("--iterations and --rounds must be at least 1")
    results = run(args.iterations, args.rounds)
    if args.json:
        print(json.dumps({"iterations": args.iterations, "rounds": args.rounds,
                          "results": results}, indent=2))
    else:
        print(_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
