"""Hostile classic joiners against a real `serve`: members only told MEMBER_ID_REQUIRED
cost neither memory nor disk for their protocols and are bounded; classic groups obey
`group.coordinator.max.groups`, expire when empty and can be deleted, across restarts."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import trio

from coordinator.client import KafkaClient
from coordinator.connect_protocol import WorkerMetadata, encode_worker_metadata
from protocol import classic as wire
from protocol.errors import ErrorCode
from tests.server.test_classic_tcp import join, request

from .helpers import ROOT, ServerProcess

E = ErrorCode
SETTINGS = ["group.initial.rebalance.delay.ms=0", "group.min.session.timeout.ms=1000"]
WORKER = (("sessioned", encode_worker_metadata(WorkerMetadata(2, "http://w1", 0))),)
WAIT_S = 30.0


def rss_bytes(server: ServerProcess) -> int:
    assert server.process is not None
    for line in Path(f"/proc/{server.process.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def disk_bytes(path: Path) -> int:
    return sum(item.stat().st_size for item in path.rglob("*") if item.is_file())


async def leave(client: KafkaClient, member_id: str, group: str = "g") -> None:
    body = request(wire.LEAVE_GROUP, 5, group_id=group, members=(
        request(wire.LEAVE_GROUP, 5, "MemberIdentity", member_id=member_id),))
    left = await client.request(wire.LEAVE_GROUP, body, 5)
    assert [m.error_code.value for m in left.members] == [E.NONE]


async def joined_member(client: KafkaClient, group: str = "g") -> str:
    first = await join(client, group=group, protocols=WORKER)
    assert first.error_code.value == E.MEMBER_ID_REQUIRED
    answer = await join(client, first.member_id, group=group, protocols=WORKER)
    assert answer.error_code.value == E.NONE, answer
    return str(first.member_id)


async def until_gone(server: ServerProcess, group: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        status, _ = await server.http("GET", f"/groups/{group}")
        if status == 404:
            return
        await trio.sleep(0.1)
    raise AssertionError(f"group {group} is still there after {WAIT_S} s")


async def test_member_id_required_joins_with_big_protocols_stay_small_and_bounded(
        tmp_path: Path) -> None:
    """Each join carries 20 protocols of 200 KB: before, each was written and kept whole
    (4 MB apiece), and every one was taken."""
    server = ServerProcess(tmp_path / "data", tmp_path, [*SETTINGS, "group.connect.max.size=5"])
    await server.start()
    try:
        big = tuple((f"p{index}", bytes([index]) * 200_000) for index in range(20))
        rss_before, disk_before = rss_bytes(server), disk_bytes(server.data_dir)
        codes: list[int] = []
        async with await server.client() as client:
            for _ in range(20):
                answer = await join(client, group="g", protocols=big)
                codes.append(answer.error_code.value)
        assert codes == [E.MEMBER_ID_REQUIRED] * 5 + [E.GROUP_MAX_SIZE_REACHED] * 15
        grown_disk = disk_bytes(server.data_dir) - disk_before
        grown_rss = rss_bytes(server) - rss_before
        assert grown_disk < 1_000_000, grown_disk  # before: 20 MB (5 × 4 MB), and more
        assert grown_rss < 40_000_000, grown_rss  # before: about 80 MB for 20 joins
        view = await server.group("g")
        assert len(view["pending_members"]) == 5 and view["members"] == []
        status, metrics = await server.http("GET", "/metrics")
        assert "connect_coordinator_classic_pending_members 5.0" in metrics, metrics
        assert "connect_coordinator_classic_members 0.0" in metrics
        described = await trio.run_process(
            [sys.executable, "-m", "coordinator.cli", "describe", "--bootstrap",
             f"127.0.0.1:{server.kafka_port}", "g"], capture_stdout=True, cwd=ROOT)
        rows = [line.split() for line in described.stdout.decode().splitlines()]
        pending = sorted(row[0] for row in rows if row[4:5] == ["PENDING"])  # (STATE)
        assert pending == sorted(m["member_id"] for m in view["pending_members"]), rows
    finally:
        server.kill()


async def test_pending_members_are_bounded_in_all_groups(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "data", tmp_path,
                           [*SETTINGS, "group.connect.classic.max.pending.members=3"])
    await server.start()
    try:
        async with await server.client() as client:
            codes = [(await join(client, group=f"o{index % 2}", protocols=WORKER)
                      ).error_code.value for index in range(5)]
        # Past the bound, whatever the group: told to retry (a retriable error).
        assert codes == [E.MEMBER_ID_REQUIRED] * 3 + [E.COORDINATOR_NOT_AVAILABLE] * 2
        refused = [event for event in server.events()
                   if event.get("event") == "classic_join_refused"]
        assert refused and "group.connect.classic.max.pending.members" in refused[0]["reason"]
    finally:
        server.kill()


async def test_pending_members_expire_after_the_rebalance_timeout(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "data", tmp_path, SETTINGS)
    await server.start()
    try:
        async with await server.client() as client:
            entries = tuple(request(wire.JOIN_GROUP, 9, "JoinGroupRequestProtocol",
                                    name=name, metadata=metadata) for name, metadata in WORKER)
            body = request(wire.JOIN_GROUP, 9, group_id="g", session_timeout=1_800_000,
                           rebalance_timeout=1_000, member_id="", protocol_type="connect",
                           protocols=entries, group_instance_id=None)
            told = await client.request(wire.JOIN_GROUP, body, 9)
            assert told.error_code.value == E.MEMBER_ID_REQUIRED
            assert [m["member_id"] for m in (await server.group("g"))["pending_members"]] \
                == [told.member_id]
        # It goes after its rebalance timeout, and the group with it (no member ever
        # joined it), not after its session of 30 minutes.
        await until_gone(server, "g")
    finally:
        server.kill()


async def test_classic_groups_obey_the_group_limit(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "data", tmp_path,
                           [*SETTINGS, "group.coordinator.max.groups=3"])
    await server.start()
    try:
        async with await server.client() as client:
            codes = [(await join(client, group=f"c{index}", protocols=WORKER)).error_code.value
                     for index in range(5)]
        assert codes == [E.MEMBER_ID_REQUIRED] * 3 + [E.INVALID_REQUEST] * 2
        status, answer = await server.http("PUT", "/groups/x/config",
                                           {"connect.classic.group.type": "classic"})
        assert status == 400 and "group.coordinator.max.groups" in answer["message"], answer
        status, answer = await server.http("PUT", "/groups/y/connectors/c", {"tasks": 1})
        assert status == 400, answer  # the same refusal as a connect group's
        status, listed = await server.http("GET", "/groups")
        assert sorted(g["group_id"] for g in listed["groups"]) == ["c0", "c1", "c2"]
    finally:
        server.kill()


async def test_an_empty_classic_group_expires_and_stays_gone_after_a_restart(
        tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "data", tmp_path,
                           [*SETTINGS, "group.connect.empty.group.retention.ms=1000"])
    await server.start()
    try:
        async with await server.client() as client:
            member = await joined_member(client)
            assert (await server.group("g"))["type"] == "classic"
            await leave(client, member)
            told = await join(client, group="h", protocols=WORKER)  # only MEMBER_ID_REQUIRED
            assert told.error_code.value == E.MEMBER_ID_REQUIRED
        await until_gone(server, "g")
        await until_gone(server, "h")
    finally:
        server.kill()
    await server.start()
    try:
        for group in ("g", "h"):
            status, _ = await server.http("GET", f"/groups/{group}")
            assert status == 404
    finally:
        server.kill()


async def test_delete_a_classic_group_through_the_admin_api(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "data", tmp_path, SETTINGS)
    await server.start()
    try:
        async with await server.client() as client:
            member = await joined_member(client)
            status, answer = await server.http("DELETE", "/groups/g")
            assert status == 409 and answer["error"] == "NON_EMPTY_GROUP", answer
            await leave(client, member)
        status, answer = await server.http("DELETE", "/groups/g")
        assert status == 200 and answer == {"group": "g", "deleted": True}, answer
        status, _ = await server.http("GET", "/groups/g")
        assert status == 404
    finally:
        server.kill()
    await server.start()
    try:
        status, _ = await server.http("GET", "/groups/g")
        assert status == 404
        status, answer = await server.http("DELETE", "/groups/g")
        assert status == 404, answer
    finally:
        server.kill()

