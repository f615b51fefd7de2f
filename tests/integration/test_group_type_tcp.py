"""The type an empty group takes for a classic worker, against a real `serve` on its data
dir, killed and restarted between the steps: a group's settings set through the admin API
do not keep it connect (they are kept while it runs classic), and an emptied classic group
becomes a connect group, bridged from its first member, once the server's
`group.connect.classic.group.type` is `connect`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from coordinator.client import KafkaClient
from coordinator.connect_protocol import WorkerMetadata, encode_worker_metadata
from protocol import classic as wire
from protocol.errors import ErrorCode
from tests.server.test_classic_tcp import join, request

from .helpers import ServerProcess, Worker

SETTINGS = ["group.connect.assignment.interval.ms=0", "group.initial.rebalance.delay.ms=0",
            "group.min.session.timeout.ms=1000"]
PROTOCOLS = (("sessioned", encode_worker_metadata(WorkerMetadata(2, "http://w1", 0))),)
SESSION = "connect.session.timeout.ms"


async def classic_worker_joins(client: KafkaClient) -> tuple[str, Any]:
    first = await join(client, protocols=PROTOCOLS)
    assert first.error_code.value == ErrorCode.MEMBER_ID_REQUIRED
    answer = await join(client, first.member_id, protocols=PROTOCOLS)
    assert answer.error_code.value == ErrorCode.NONE, answer
    return first.member_id, answer


async def classic_worker_leaves(client: KafkaClient, member_id: str) -> None:
    body = request(wire.LEAVE_GROUP, 5, group_id="g", members=(
        request(wire.LEAVE_GROUP, 5, "MemberIdentity", member_id=member_id),))
    left = await client.request(wire.LEAVE_GROUP, body, 5)
    assert [m.error_code.value for m in left.members] == [ErrorCode.NONE]


async def test_the_type_an_empty_group_takes_across_restarts(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "data", tmp_path, SETTINGS)
    await server.start()
    try:
        status, answer = await server.http("PUT", "/groups/g/config", {SESSION: 20_000})
        assert status == 200, answer
        assert (await server.group("g"))["type"] == "connect"
        worker = Worker("n1")
        async with await server.client() as client:
            assert await worker.join(client) == ErrorCode.NONE
            left = await client.request(1000, worker.leave_request())
            assert left.error_code == ErrorCode.NONE
    finally:
        server.kill()

    await server.start()  # the log replayed: an empty connect group with a setting
    try:
        async with await server.client() as client:
            member, answer = await classic_worker_joins(client)
            assert answer.leader == member and int(answer.generation_id) == 1  # a broker's
            assert (await server.group("g"))["type"] == "classic"
            status, config = await server.http("GET", "/groups/g/config")
            assert status == 200, config
            assert config["config"][SESSION] == 20_000  # kept for when it is connect again
            assert config["config"]["connect.classic.group.type"] is None
            await classic_worker_leaves(client, member)
    finally:
        server.kill()

    server.settings = [*SETTINGS, "group.connect.classic.group.type=connect"]
    await server.start()  # an empty classic group, on a server whose type is connect
    try:
        assert (await server.group("g"))["type"] == "classic"
        async with await server.client() as client:
            member, answer = await classic_worker_joins(client)
        view = await server.group("g")
        assert view["type"] == "connect"  # bridged from its first member
        assert [m["member_id"] for m in view["members"]] == [member]
        status, config = await server.http("GET", "/groups/g/config")
        assert config["effective"][SESSION] == 20_000
    finally:
        server.kill()

    await server.start()
    try:
        view = await server.group("g")
        assert view["type"] == "connect" and [m["member_id"] for m in view["members"]] == [
            member]
    finally:
        server.kill()
