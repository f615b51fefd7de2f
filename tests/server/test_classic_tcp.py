"""Kafka's classic APIs over real TCP: finding the coordinator, and the classic group
conformance scenarios against the running server (one connection per member, since a
parked JoinGroup holds its connection's later answers, as a broker's does)."""

from __future__ import annotations

import importlib
import re
from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio

from coordinator.client import KafkaClient
from coordinator.config import ServerConfig
from coordinator.server.app import ServerHandle, run_server
from protocol import classic as wire
from protocol.errors import ErrorCode
from tests.server.conftest import http

E = ErrorCode
CONFIG = ServerConfig(assignment_interval_ms=0, assignor_offload_enable=False,
                      shutdown_timeout_ms=2_000, initial_rebalance_delay_ms=0,
                      classic_min_session_timeout_ms=1_000)
PROTOCOLS = (("sessioned", b"m2"), ("compatible", b"m1"))


@pytest.fixture
async def server(nursery: trio.Nursery) -> AsyncIterator[ServerHandle]:
    handle: ServerHandle = await nursery.start(run_server, CONFIG, ("127.0.0.1", 0),
                                               ("127.0.0.1", 0))
    yield handle
    handle.stop()


async def connect(server: ServerHandle, client_id: str = "worker") -> KafkaClient:
    return await KafkaClient.connect("127.0.0.1", server.kafka_port, client_id)


def request(api_key: int, version: int, struct: str = "", /, **values: Any) -> Any:
    kind = wire.REQUEST_CLASSES[api_key, version]
    if struct:
        module = importlib.import_module(kind.__module__)
        return wire.build(getattr(module, struct), **values)
    return wire.build(kind, **values)


async def join(client: KafkaClient, member_id: str = "", *, version: int = 9,
               protocol_type: str = "connect", instance_id: str | None = None,
               group: str = "g", protocols: tuple[tuple[str, bytes], ...] = PROTOCOLS) -> Any:
    entries = tuple(request(wire.JOIN_GROUP, version, "JoinGroupRequestProtocol", name=name,
                            metadata=metadata) for name, metadata in protocols)
    body = request(wire.JOIN_GROUP, version, group_id=group, session_timeout=10_000,
                   rebalance_timeout=20_000, member_id=member_id, protocol_type=protocol_type,
                   protocols=entries, group_instance_id=instance_id)
    return await client.request(wire.JOIN_GROUP, body, version)


async def sync(client: KafkaClient, member_id: str, generation: int, *, version: int = 5,
               assignments: dict[str, bytes] | None = None, group: str = "g",
               instance_id: str | None = None) -> Any:
    items = tuple(request(wire.SYNC_GROUP, version, "SyncGroupRequestAssignment",
                          member_id=m, assignment=a) for m, a in (assignments or {}).items())
    body = request(wire.SYNC_GROUP, version, group_id=group, generation_id=generation,
                   member_id=member_id, assignments=items, protocol_type="connect",
                   protocol_name="sessioned", group_instance_id=instance_id)
    return await client.request(wire.SYNC_GROUP, body, version)


async def heartbeat(client: KafkaClient, member_id: str, generation: int, *,
                    version: int = 4, instance_id: str | None = None) -> int:
    body = request(wire.HEARTBEAT, version, group_id="g", generation_id=generation,
                   member_id=member_id, group_instance_id=instance_id)
    return int((await client.request(wire.HEARTBEAT, body, version)).error_code.value)


async def test_api_versions_lists_the_classic_apis(server: ServerHandle) -> None:
    from kio.schema.api_versions.v3.request import ApiVersionsRequest
    async with await connect(server) as client:
        response = await client.request(18, ApiVersionsRequest(
            client_software_name="t", client_software_version="1"), 3)
    served = {int(entry.api_key): (int(entry.min_version), int(entry.max_version))
              for entry in response.api_keys}
    assert served[11] == (0, 9) and served[14] == (0, 5) and served[12] == (0, 4)
    assert served[13] == (0, 5) and served[15] == (0, 5) and served[16] == (0, 5)
    assert served[10] == (0, 6) and served[3] == (0, 12)
    assert served[1000] == (0, 0)


@pytest.mark.parametrize("version", [0, 1, 3, 4, 6])
async def test_find_coordinator_answers_itself_for_groups(server: ServerHandle,
                                                          version: int) -> None:
    async with await connect(server) as client:
        if version < 4:
            body = request(wire.FIND_COORDINATOR, version, key="connect-cluster", key_type=0)
            response = await client.request(wire.FIND_COORDINATOR, body, version)
            assert response.error_code.value == 0
            assert (response.host, int(response.port)) == ("127.0.0.1", server.kafka_port)
        else:
            body = request(wire.FIND_COORDINATOR, version, key_type=0,
                           coordinator_keys=("a", "b"))
            response = await client.request(wire.FIND_COORDINATOR, body, version)
            assert [c.key for c in response.coordinators] == ["a", "b"]
            assert {(c.host, int(c.port), c.error_code.value)
                    for c in response.coordinators} == {("127.0.0.1", server.kafka_port, 0)}
        if version >= 1:  # a transaction coordinator is not served here
            other = request(wire.FIND_COORDINATOR, version, key="t", key_type=1,
                            coordinator_keys=("t",))
            answer = await client.request(wire.FIND_COORDINATOR, other, version)
            codes = [c.error_code.value for c in answer.coordinators] if version >= 4 \
                else [answer.error_code.value]
            assert codes == [E.COORDINATOR_NOT_AVAILABLE]


@pytest.mark.parametrize("version", [0, 1, 4, 9, 12])
async def test_metadata_shows_the_coordinator_as_the_only_broker(server: ServerHandle,
                                                                 version: int) -> None:
    topic = request(wire.METADATA, version, "MetadataRequestTopic", name="connect-configs",
                    topic_id=None)
    async with await connect(server) as client:
        response = await client.request(
            wire.METADATA, request(wire.METADATA, version, topics=(topic,)), version)
        everything = await client.request(
            wire.METADATA, request(wire.METADATA, version,
                                   topics=None if version >= 1 else ()), version)
    assert [(b.host, int(b.port)) for b in response.brokers] == [("127.0.0.1",
                                                                  server.kafka_port)]
    assert [(t.name, t.error_code.value) for t in response.topics] == [
        ("connect-configs", E.UNKNOWN_TOPIC_OR_PARTITION)]
    assert everything.topics == ()


@pytest.mark.parametrize("version", [0, 5, 9])
async def test_join_with_another_protocol_type_is_inconsistent(server: ServerHandle,
                                                               version: int) -> None:
    async with await connect(server) as client:
        response = await join(client, version=version, protocol_type="consumer")
    assert response.error_code.value == E.INCONSISTENT_GROUP_PROTOCOL


async def _member(server: ServerHandle) -> tuple[KafkaClient, str]:
    client = await connect(server)
    first = await join(client)
    assert first.error_code.value == E.MEMBER_ID_REQUIRED and first.member_id
    return client, first.member_id


async def test_join_barrier_sync_heartbeat_and_leave_over_tcp(server: ServerHandle) -> None:
    one, a = await _member(server)
    two, b = await _member(server)
    answer_a = await join(one, a)  # alone: generation 1 at once
    assert answer_a.error_code.value == 0 and int(answer_a.generation_id) == 1
    answers: dict[str, Any] = {}

    async def joined(client: KafkaClient, member: str) -> None:
        answers[member] = await join(client, member)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(joined, two, b)  # parked: a must rejoin
        await trio.sleep(0.1)
        assert b not in answers
        # a heartbeats from a third connection while its JoinGroup is not sent yet
        async with await connect(server) as side:
            assert await heartbeat(side, a, 1) == E.REBALANCE_IN_PROGRESS
        nursery.start_soon(joined, one, a)
    generation = int(answers[a].generation_id)
    assert generation == int(answers[b].generation_id) == 2
    leader = answers[a].leader
    assert leader == a and len(answers[a].members) == 2 and answers[b].members == ()
    assert answers[a].protocol_name == "sessioned"
    synced: dict[str, Any] = {}

    async def synced_by(client: KafkaClient, member: str, given: dict[str, bytes]) -> None:
        synced[member] = await sync(client, member, generation, assignments=given)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(synced_by, two, b, {})  # parked until the leader syncs
        await trio.sleep(0.1)
        async with await connect(server) as side:  # heartbeat in CompletingRebalance
            assert await heartbeat(side, b, generation) == E.NONE
        nursery.start_soon(synced_by, one, a, {a: b"for-a", b: b"for-b"})
    assert synced[a].assignment == b"for-a" and synced[b].assignment == b"for-b"
    # DescribeGroups and ListGroups show it.
    async with await connect(server) as side:
        described = await side.request(wire.DESCRIBE_GROUPS, request(
            wire.DESCRIBE_GROUPS, 5, groups=("g", "nope")), 5)
        listed = await side.request(wire.LIST_GROUPS, request(wire.LIST_GROUPS, 5), 5)
    group, missing = described.groups
    assert (group.group_state, group.protocol_type, group.protocol_data) == (
        "Stable", "connect", "sessioned")
    assert {m.member_id: m.member_assignment for m in group.members} == {
        a: b"for-a", b: b"for-b"}
    assert missing.group_state == "Dead"
    assert [(g.group_id, g.group_state, g.group_type) for g in listed.groups] == [
        ("g", "Stable", "classic")]
    # The admin API and the metrics show it as a classic group.
    status, view = await http(server, "GET", "/groups/g")
    assert status == 200 and view["type"] == "classic" and view["state"] == "STABLE"
    assert view["generation"] == generation and view["protocol"] == "sessioned"
    assert {m["member_id"]: m["protocol"] for m in view["members"]} == {
        a: "classic", b: "classic"}
    status, listing = await http(server, "GET", "/groups")
    assert [(g["group_id"], g["type"]) for g in listing["groups"]] == [("g", "classic")]
    status, text = await http(server, "GET", "/metrics")
    assert 'connect_coordinator_classic_groups{state="Stable"} 1.0' in text
    joined = re.search(
        r'connect_coordinator_classic_rebalances_total\{reason="member_joined"\} (\S+)', text)
    assert joined is not None and float(joined.group(1)) >= 1
    assert "connect_coordinator_classic_members 2.0" in text
    # A classic group with members is not turned into a connect group by the admin API.
    status, refused = await http(server, "PUT", "/groups/g/connectors/A", {"tasks": 1})
    assert status == 409 and refused["error"] == "INCONSISTENT_GROUP_PROTOCOL"
    assert "g" not in server.runtime.core.store.groups
    # LeaveGroup v5 batch: one known, one unknown.
    body = request(wire.LEAVE_GROUP, 5, group_id="g", members=(
        request(wire.LEAVE_GROUP, 5, "MemberIdentity", member_id=b),
        request(wire.LEAVE_GROUP, 5, "MemberIdentity", member_id="ghost")))
    left = await one.request(wire.LEAVE_GROUP, body, 5)
    assert [(m.member_id, m.error_code.value) for m in left.members] == [
        (b, 0), ("ghost", E.UNKNOWN_MEMBER_ID)]
    assert await heartbeat(one, a, generation) == E.REBALANCE_IN_PROGRESS
    rejoined = await join(one, a)
    assert int(rejoined.generation_id) == generation + 1 and len(rejoined.members) == 1
    await one.aclose()
    await two.aclose()


async def test_static_member_replacement_over_tcp(server: ServerHandle) -> None:
    async with await connect(server) as first, await connect(server) as second:
        joined = await join(first, instance_id="w-1", version=5)
        assert joined.error_code.value == 0  # a static member needs no MEMBER_ID_REQUIRED
        old = joined.member_id
        generation = int(joined.generation_id)
        done = await sync(first, old, generation, assignments={old: b"A"}, instance_id="w-1")
        assert done.assignment == b"A"
        again = await join(second, instance_id="w-1", version=9)
        assert again.error_code.value == 0 and again.member_id != old
        assert int(again.generation_id) == generation and again.skip_assignment
        assert await heartbeat(first, old, generation, instance_id="w-1") == \
            E.FENCED_INSTANCE_ID
        taken = await sync(second, again.member_id, generation, instance_id="w-1")
        assert taken.assignment == b"A"


async def test_restart_mid_rebalance_over_tcp(tmp_path: Any) -> None:
    a = b = ""
    async with trio.open_nursery() as nursery:  # the first life of the coordinator
        handle: ServerHandle = await nursery.start(run_server, CONFIG, ("127.0.0.1", 0),
                                                   ("127.0.0.1", 0), tmp_path)
        async with await connect(handle) as one, await connect(handle) as two:
            a = (await join(one)).member_id
            first = await join(one, a)
            assert int(first.generation_id) == 1
            b = (await join(two)).member_id
            with trio.move_on_after(0.2):
                await join(two, b)  # parked: the group waits for a
        handle.stop()
    async with trio.open_nursery() as nursery:  # restarted on the same data dir
        handle = await nursery.start(run_server, CONFIG, ("127.0.0.1", 0),
                                     ("127.0.0.1", 0), tmp_path)
        async with await connect(handle) as one, await connect(handle) as two:
            assert await heartbeat(one, a, 1) == E.REBALANCE_IN_PROGRESS
            rejoined = await join(one, a)  # b joined before the restart: barrier complete
            assert int(rejoined.generation_id) == 2 and len(rejoined.members) == 2
            again = await join(two, b)  # b's answer was lost with the restart: again
            assert int(again.generation_id) == 2 and again.leader == a
        handle.stop()


async def test_join_and_sync_latency_and_classic_rebalance_metrics(nursery: trio.Nursery
                                                                   ) -> None:
    """JoinGroup and SyncGroup latency by group type, from the real exposition: a classic
    group's parked calls count their wait at the barrier; every label value exists at 0
    before any traffic."""
    from coordinator.core.classic.conversion import CONVERSION_DIRECTIONS
    from coordinator.core.classic.engine import CLASSIC_REBALANCE_REASONS
    from coordinator.metrics import GROUP_TYPES
    from tests.server.test_metrics_catalogue import P, scrape

    handle: ServerHandle = await nursery.start(run_server, CONFIG, ("127.0.0.1", 0),
                                               ("127.0.0.1", 0))
    before = await scrape(handle)
    for kind in ("join", "sync"):
        assert before.by_label(P + f"classic_{kind}_seconds_count", "group_type") == \
            dict.fromkeys(GROUP_TYPES, 0.0)
    assert before.by_label(P + "classic_rebalances_total", "reason") == dict.fromkeys(
        CLASSIC_REBALANCE_REASONS, 0.0)
    assert before.by_label(P + "group_conversions_total", "direction") == dict.fromkeys(
        CONVERSION_DIRECTIONS, 0.0)
    one, a = await _member(handle)  # one JoinGroup: MEMBER_ID_REQUIRED
    two, b = await _member(handle)
    first = await join(one, a)
    await sync(one, a, int(first.generation_id), assignments={a: b"x"})
    answers: dict[str, Any] = {}
    waited_s = 0.3

    async def joined(client: KafkaClient, member: str) -> None:
        answers[member] = await join(client, member)

    async with trio.open_nursery() as inner:
        inner.start_soon(joined, two, b)  # parked until a rejoins
        await trio.sleep(waited_s)
        inner.start_soon(joined, one, a)
    generation = int(answers[a].generation_id)

    async def synced(client: KafkaClient, member: str, given: dict[str, bytes]) -> None:
        await sync(client, member, generation, assignments=given)

    async with trio.open_nursery() as inner:
        inner.start_soon(synced, two, b, {})  # parked until the leader syncs
        await trio.sleep(waited_s)
        inner.start_soon(synced, one, a, {a: b"x", b: b"y"})
    after = await scrape(handle)
    joins = after.by_label(P + "classic_join_seconds_count", "group_type")
    assert joins == {"classic": 5.0, "connect": 0.0}  # 2 MEMBER_ID_REQUIRED + 3 joins
    syncs = after.by_label(P + "classic_sync_seconds_count", "group_type")
    assert syncs == {"classic": 3.0, "connect": 0.0}
    # b's JoinGroup and SyncGroup each waited at least `waited_s`: above the 0.25 s bucket.
    for kind, count in (("join", 5.0), ("sync", 3.0)):
        quick = after.value(P + f"classic_{kind}_seconds_bucket", group_type="classic",
                            le="0.25")
        assert quick <= count - 1
        assert after.value(P + f"classic_{kind}_seconds_sum", group_type="classic") >= waited_s
    assert after.value(P + "classic_rebalances_total", reason="member_joined") >= 2
    await one.aclose()
    await two.aclose()
    handle.stop()


async def test_bridged_join_and_sync_count_as_connect(nursery: trio.Nursery) -> None:
    from coordinator.connect_protocol import WorkerMetadata, encode_worker_metadata
    from tests.server.test_metrics_catalogue import P, scrape

    config = ServerConfig(assignment_interval_ms=0, assignor_offload_enable=False,
                          shutdown_timeout_ms=2_000, classic_group_type="connect",
                          classic_min_session_timeout_ms=1_000)
    handle: ServerHandle = await nursery.start(run_server, config, ("127.0.0.1", 0),
                                               ("127.0.0.1", 0))
    metadata = encode_worker_metadata(WorkerMetadata(2, "http://w1", 0))
    async with await connect(handle) as client:
        member = (await join(client, protocols=(("sessioned", metadata),))).member_id
        answer = await join(client, member, protocols=(("sessioned", metadata),))
        assert answer.error_code.value == 0
        await sync(client, member, int(answer.generation_id))
    assert "g" in handle.runtime.core.store.groups  # a connect group, bridged
    after = await scrape(handle)
    assert after.by_label(P + "classic_join_seconds_count", "group_type") == {
        "classic": 0.0, "connect": 2.0}
    assert after.value(P + "classic_sync_seconds_count", group_type="connect") == 1.0
    handle.stop()


async def test_connect_group_describe_v1_finds_a_classic_group_and_v0_does_not(
        server: ServerHandle) -> None:
    from protocol.messages import ConnectGroupDescribeRequest

    one, a = await _member(server)
    joined = await join(one, a)
    await sync(one, a, int(joined.generation_id), assignments={a: b""})
    request = ConnectGroupDescribeRequest(group_ids=("g",))
    async with await connect(server) as side:
        newer = await side.request(1003, request, 1)
        older = await side.request(1003, request, 0)
    (group,) = newer.groups
    assert (group.error_code, group.group_type, group.group_state) == (0, "classic", "STABLE")
    assert [(m.member_id, m.protocol, m.classic_protocol) for m in group.members] == [
        (a, "classic", "sessioned")]
    assert older.groups[0].error_code == E.GROUP_ID_NOT_FOUND
    assert not hasattr(older.groups[0], "group_type")
    await one.aclose()


def _worker_metadata(name: str) -> tuple[tuple[str, bytes], ...]:
    from coordinator.connect_protocol import WorkerMetadata, encode_worker_metadata
    return (("sessioned", encode_worker_metadata(WorkerMetadata(2, f"http://{name}", 0))),)


def _nothing() -> bytes:
    from coordinator.connect_protocol import ConnectAssignment, encode_assignment
    return encode_assignment(ConnectAssignment(2))


async def _connect_group_server(nursery: trio.Nursery) -> ServerHandle:
    config = ServerConfig(assignment_interval_ms=0, assignor_offload_enable=False,
                          shutdown_timeout_ms=2_000, classic_group_type="connect",
                          classic_min_session_timeout_ms=1_000)
    handle: ServerHandle = await nursery.start(run_server, config, ("127.0.0.1", 0),
                                               ("127.0.0.1", 0))
    return handle


async def _classic_member(handle: ServerHandle, name: str) -> tuple[KafkaClient, str]:
    client = await connect(handle)
    asked = await join(client, protocols=_worker_metadata(name))
    assert asked.error_code.value == E.MEMBER_ID_REQUIRED
    return client, asked.member_id


class _Calls:
    """Requests sent in the background: their answers, and an event per name."""

    def __init__(self) -> None:
        self.answers: dict[str, Any] = {}
        self.events: dict[str, trio.Event] = {}

    def event(self, name: str) -> trio.Event:
        return self.events.setdefault(name, trio.Event())

    async def call(self, name: str, request: Any) -> None:
        self.answers[name] = await request
        self.event(name).set()

    async def answer(self, name: str) -> Any:
        with trio.fail_after(5):
            await self.event(name).wait()
        return self.answers[name]


async def test_a_bridged_followers_join_and_sync_are_answered_with_the_leaders(
        nursery: trio.Nursery) -> None:
    """Over TCP, in a connect group of classic workers: a second worker joins; its
    JoinGroup is held until the worker that assigns has rejoined (both are answered
    together), and its SyncGroup until that worker's SyncGroup installs, then answered
    with its part of that assignment."""
    from coordinator.connect_protocol import (
        ConnectAssignment,
        decode_assignment,
        encode_assignment,
    )

    handle = await _connect_group_server(nursery)
    leader_client, a = await _classic_member(handle, "a")
    follower_client, b = await _classic_member(handle, "b")
    first = await join(leader_client, a, protocols=_worker_metadata("a"))
    assert first.leader == a
    await sync(leader_client, a, int(first.generation_id), assignments={a: _nothing()})
    calls = _Calls()

    async def follower() -> None:
        await calls.call("b-join", join(follower_client, b, protocols=_worker_metadata("b")))
        joined = calls.answers["b-join"]
        await calls.call("b-sync", sync(follower_client, b, int(joined.generation_id)))

    given = frozenset({("c", -1), ("c", 0)})
    async with trio.open_nursery() as inner:
        inner.start_soon(follower)
        await trio.sleep(0.3)
        assert "b-join" not in calls.answers  # held: the worker that assigns must rejoin
        assert await heartbeat(leader_client, a, int(first.generation_id)) == \
            E.REBALANCE_IN_PROGRESS
        again = await join(leader_client, a, protocols=_worker_metadata("a"))
        assert again.leader == a and len(again.members) == 2
        joined = await calls.answer("b-join")  # answered with the leader's
        assert joined.error_code.value == 0 and joined.leader == ""
        await trio.sleep(0.3)
        assert "b-sync" not in calls.answers  # held: the assignment is being computed
        installed = await sync(leader_client, a, int(again.generation_id), assignments={
            a: encode_assignment(ConnectAssignment(2, leader=a)),
            b: encode_assignment(ConnectAssignment(2, leader=a, assigned=given))})
        assert installed.error_code.value == 0
        answer = await calls.answer("b-sync")
    assert answer.error_code.value == 0
    assert decode_assignment(answer.assignment).assigned == given
    await leader_client.aclose()
    await follower_client.aclose()
    handle.stop()


async def test_every_join_group_of_a_bridged_round_is_answered_once_all_rejoined(
        nursery: trio.Nursery) -> None:
    """Over TCP: a third worker joins a settled connect group of two classic workers;
    its JoinGroup and that of the worker that assigns are held until the other worker
    has rejoined too, then all three are answered, the assigning one with every
    member's metadata."""
    handle = await _connect_group_server(nursery)
    (a_client, a), (b_client, b), (c_client, c) = \
        [await _classic_member(handle, name) for name in "abc"]
    first = await join(a_client, a, protocols=_worker_metadata("a"))
    await sync(a_client, a, int(first.generation_id), assignments={a: _nothing()})
    calls = _Calls()
    async with trio.open_nursery() as inner:
        inner.start_soon(calls.call, "b-join", join(b_client, b, protocols=_worker_metadata("b")))
        await trio.sleep(0.2)
        assert await heartbeat(a_client, a, int(first.generation_id)) == \
            E.REBALANCE_IN_PROGRESS
        second = await join(a_client, a, protocols=_worker_metadata("a"))
        joined_b = await calls.answer("b-join")
        inner.start_soon(calls.call, "b-sync",
                         sync(b_client, b, int(joined_b.generation_id)))
        await sync(a_client, a, int(second.generation_id),
                   assignments={a: _nothing(), b: _nothing()})
        assert (await calls.answer("b-sync")).error_code.value == 0
    # Settled: a and b. c joins, and a hears of it first.
    async with trio.open_nursery() as inner:
        inner.start_soon(calls.call, "c-join", join(c_client, c, protocols=_worker_metadata("c")))
        await trio.sleep(0.2)
        assert await heartbeat(a_client, a, int(second.generation_id)) == \
            E.REBALANCE_IN_PROGRESS
        inner.start_soon(calls.call, "a-join", join(a_client, a, protocols=_worker_metadata("a")))
        await trio.sleep(0.3)
        assert "a-join" not in calls.answers and "c-join" not in calls.answers  # b to come
        assert await heartbeat(b_client, b, int(joined_b.generation_id)) == \
            E.REBALANCE_IN_PROGRESS
        rejoined = await join(b_client, b, protocols=_worker_metadata("b"))
        assert rejoined.error_code.value == 0 and rejoined.leader == ""
        third = await calls.answer("a-join")
        assert third.leader == a and {m.member_id for m in third.members} == {a, b, c}
        joined_c = await calls.answer("c-join")
        assert joined_c.error_code.value == 0 and joined_c.leader == ""
        inner.start_soon(calls.call, "c-sync", sync(c_client, c, int(joined_c.generation_id)))
        inner.start_soon(calls.call, "b-sync2", sync(b_client, b, int(rejoined.generation_id)))
        await sync(a_client, a, int(third.generation_id),
                   assignments={a: _nothing(), b: _nothing(), c: _nothing()})
        assert (await calls.answer("c-sync")).error_code.value == 0
        assert (await calls.answer("b-sync2")).error_code.value == 0
    for client in (a_client, b_client, c_client):
        await client.aclose()
    handle.stop()
