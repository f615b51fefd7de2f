"""The first two case studies of the Connect rebalance design over real TCP against a
running server.

Two workers join with a client-side assignor; the one the coordinator chooses computes
the assignment (Prepare, Install); revocation comes before assignment. Checked through
ConnectGroupDescribe and the admin API, as a user would.
"""

from __future__ import annotations

from typing import Any

from coordinator.client import KafkaClient
from coordinator.core.group import units_to_wire
from coordinator.server.app import ServerHandle
from protocol.errors import ErrorCode
from protocol.messages import (
    ConnectGroupDescribeRequest,
    ConnectGroupHeartbeatRequest,
    ConnectGroupInstallAssignmentRequest,
    ConnectGroupPrepareAssignmentRequest,
)
from protocol.messages.connect_group_heartbeat_request import ClientAssignor
from protocol.messages.connect_group_install_assignment_request import MemberAssignment
from tests.core.context import units, wire_units

from .conftest import http

G = "connect-cluster"
ALL = units("A", "A-0", "A-1", "B", "B-0")
HEARTBEAT, PREPARE, INSTALL, DESCRIBE = 1000, 1001, 1002, 1003
ICA = ClientAssignor(name="incremental-cooperative", minimum_version=1, maximum_version=2,
                     reason=0, version=2, metadata=b"")


async def join(client: KafkaClient, member: str) -> Any:
    return await client.request(HEARTBEAT, ConnectGroupHeartbeatRequest(
        group_id=G, member_id=member, member_epoch=0, worker_url=f"http://{member}:8083",
        rebalance_timeout_ms=30_000, client_assignors=(ICA,)))


async def heartbeat(client: KafkaClient, member: str, epoch: int,
                    owned: frozenset[tuple[str, int]] | None = None) -> Any:
    return await client.request(HEARTBEAT, ConnectGroupHeartbeatRequest(
        group_id=G, member_id=member, member_epoch=epoch,
        owned_connectors_and_tasks=None if owned is None else units_to_wire(owned)))


async def compute(client: KafkaClient, member: str, epoch: int,
                  assignment: dict[str, frozenset[tuple[str, int]]],
                  known: frozenset[tuple[str, int]] = ALL) -> int:
    prepared = await client.request(PREPARE, ConnectGroupPrepareAssignmentRequest(
        group_id=G, member_id=member, member_epoch=epoch))
    assert prepared.error_code == ErrorCode.NONE, prepared.error_message
    assert wire_units(prepared.connectors_and_tasks) == known
    installed = await client.request(INSTALL, ConnectGroupInstallAssignmentRequest(
        group_id=G, member_id=member, member_epoch=epoch, group_epoch=prepared.group_epoch,
        error=0, members=tuple(MemberAssignment(member_id=m, assigned=units_to_wire(u),
                                                version=1, metadata=b"")
                               for m, u in assignment.items())))
    assert installed.error_code == ErrorCode.NONE, installed.error_message
    return int(prepared.group_epoch)


async def describe(client: KafkaClient) -> Any:
    response = await client.request(DESCRIBE, ConnectGroupDescribeRequest(group_ids=(G,)))
    return response.groups[0]


async def test_w1_then_w2_join_over_tcp(server: ServerHandle) -> None:
    for name, tasks in (("A", 2), ("B", 1)):
        status, _ = await http(server, "PUT", f"/groups/{G}/connectors/{name}", {"tasks": tasks})
        assert status == 200
    w1 = await KafkaClient.connect("127.0.0.1", server.kafka_port)
    w2 = await KafkaClient.connect("127.0.0.1", server.kafka_port)
    async with w1, w2:
        # W1 joins: the reserved epoch 1, then it is asked to compute the assignment.
        response = await join(w1, "W1")
        assert (response.error_code, response.member_epoch) == (ErrorCode.COMPUTE_ASSIGNMENT, 1)
        epoch = await compute(w1, "W1", 1, {"W1": ALL})
        response = await heartbeat(w1, "W1", 1, owned=frozenset())
        assert response.member_epoch == epoch
        assert wire_units(response.assignment.assigned) == ALL
        assert (await describe(w1)).group_state == "STABLE"

        # W2 joins; W1 is still the chosen worker and splits the work.
        response = await join(w2, "W2")
        assert response.member_epoch == epoch
        response = await heartbeat(w1, "W1", epoch, owned=ALL)
        assert response.error_code == ErrorCode.COMPUTE_ASSIGNMENT
        new_epoch = await compute(w1, "W1", epoch, {"W1": units("A", "A-0", "A-1"),
                                                   "W2": units("B", "B-0")})
        # W2 reaches the new epoch but waits for B and B-0.
        response = await heartbeat(w2, "W2", epoch, owned=frozenset())
        assert response.member_epoch == new_epoch
        assert wire_units(response.assignment.assigned) == frozenset()
        # W1 must release them first: same epoch, only what it keeps.
        response = await heartbeat(w1, "W1", epoch, owned=ALL)
        assert response.member_epoch == epoch
        assert wire_units(response.assignment.assigned) == units("A", "A-0", "A-1")
        response = await heartbeat(w1, "W1", epoch, owned=units("A", "A-0", "A-1"))
        assert response.member_epoch == new_epoch
        response = await heartbeat(w2, "W2", new_epoch, owned=frozenset())
        assert wire_units(response.assignment.assigned) == units("B", "B-0")

        described = await describe(w2)
        assert described.group_state == "STABLE"
        assert {m.member_id: (m.member_epoch, wire_units(m.assigned))
                for m in described.members} == {
            "W1": (new_epoch, units("A", "A-0", "A-1")), "W2": (new_epoch, units("B", "B-0"))}
        status, view = await http(server, "GET", f"/groups/{G}")
        assert status == 200 and view["state"] == "STABLE"
        assert view["unassigned"]["names"] == []
