"""One spelling of group states in the admin API (README, "Admin HTTP API"): upper case
with underscores for both group types, as ConnectGroupDescribe and the CLI show them;
Kafka's own APIs keep Kafka's spelling (`Empty`, `Stable`, ...)."""

from __future__ import annotations

from coordinator.client import KafkaClient
from coordinator.server.app import ServerHandle
from protocol import classic as wire
from protocol.messages import ConnectGroupDescribeRequest
from tests.server.conftest import http
from tests.server.test_classic_tcp import request


async def test_connect_and_classic_groups_spell_their_states_alike(
        server: ServerHandle) -> None:
    status, _ = await http(server, "PUT", "/groups/a-connect/connectors/c", body={"tasks": 1})
    assert status == 200
    status, answer = await http(server, "PUT", "/groups/b-classic/config",
                                body={"connect.classic.group.type": "classic"})
    assert status == 200, answer
    status, listed = await http(server, "GET", "/groups")
    assert status == 200
    assert [(g["group_id"], g["type"], g["state"]) for g in listed["groups"]] == [
        ("a-connect", "connect", "EMPTY"), ("b-classic", "classic", "EMPTY")]
    status, view = await http(server, "GET", "/groups/b-classic")
    assert status == 200 and view["state"] == "EMPTY"
    async with await KafkaClient.connect("127.0.0.1", server.kafka_port) as client:
        described = await client.request(1003, ConnectGroupDescribeRequest(
            group_ids=("a-connect", "b-classic")), api_version=1)
        assert [g.group_state for g in described.groups] == ["EMPTY", "EMPTY"]
        # Kafka's ListGroups: Kafka's spelling, which its clients parse.
        listed_wire = await client.request(
            wire.LIST_GROUPS, request(wire.LIST_GROUPS, 5), 5)
        assert {g.group_id: g.group_state for g in listed_wire.groups} == {
            "a-connect": "Empty", "b-classic": "Empty"}
