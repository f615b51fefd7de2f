"""Scheduling that follows the durable state, over TCP against a real server: a leave
whose write failed leaves a member that still times out, a fenced member that rejoins
gets its units back, and a restart during a delayed-rebalance hold releases the held
units at the original deadline."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path

import pytest
import trio

from coordinator.client import KafkaClient
from coordinator.config import ServerConfig
from coordinator.log.faults import FaultyFileLayer
from coordinator.server.app import ServerHandle, run_server
from protocol.errors import ErrorCode
from protocol.messages import ConnectGroupHeartbeatRequest
from tests.core.context import wire_units

from .helpers import HEARTBEAT, ServerProcess, Worker, describe, http_call, settle

FAST = ServerConfig(assignment_interval_ms=0, session_timeout_ms=1_500,
                    heartbeat_interval_ms=300, shutdown_timeout_ms=2_000,
                    scheduled_rebalance_max_delay_ms=0,
                    server_assignors=("balanced",))


@pytest.fixture
async def faulty_server(tmp_path: Path, nursery: trio.Nursery
                        ) -> AsyncIterator[tuple[ServerHandle, FaultyFileLayer]]:
    layer = FaultyFileLayer()

    async def start(task_status: trio.TaskStatus[ServerHandle] = trio.TASK_STATUS_IGNORED
                    ) -> None:
        await run_server(FAST, ("127.0.0.1", 0), ("127.0.0.1", 0), tmp_path / "data",
                         file_layer=layer, task_status=task_status)

    handle: ServerHandle = await nursery.start(start)
    yield handle, layer
    handle.stop()


async def test_a_leave_whose_write_fails_leaves_a_member_that_still_times_out(
    faulty_server: tuple[ServerHandle, FaultyFileLayer]
) -> None:
    handle, layer = faulty_server
    url = f"http://127.0.0.1:{handle.admin_port}/groups/g/connectors/a"
    assert (await trio.to_thread.run_sync(http_call, "PUT", url, {"tasks": 4}))[0] == 200
    leaver, stayer = Worker("w1"), Worker("w2")
    async with await KafkaClient.connect("127.0.0.1", handle.kafka_port) as client:
        await settle(client, [leaver, stayer])
        layer.fail_next("write", times=1)
        response = await client.request(HEARTBEAT, leaver.leave_request())
        assert response.error_code == ErrorCode.COORDINATOR_NOT_AVAILABLE
        assert "w1" in handle.runtime.core.store.groups["g"].members
        # w1 goes silent; w2 heartbeats on. Within a session timeout (and some slack)
        # w1 must be removed and its units handed to w2.
        with trio.fail_after(10):
            while True:
                await stayer.heartbeat(client)
                group = await describe(client, "g")
                if [m.member_id for m in group.members] == ["w2"] and \
                        group.group_state == "STABLE" and len(stayer.owned) == 5:
                    break
                await trio.sleep(0.1)


def _server(tmp_path: Path, *settings: str) -> ServerProcess:
    return ServerProcess(tmp_path / "data", tmp_path,
                         ["group.connect.assignment.interval.ms=0",
                          "group.connect.server.assignors=balanced", *settings])


@pytest.mark.parametrize("offload", ["true", "false"])
async def test_a_fenced_member_that_rejoins_gets_its_units_back(tmp_path: Path,
                                                                offload: str) -> None:
    server = _server(tmp_path, f"group.connect.assignor.offload.enable={offload}")
    await server.start()
    try:
        assert (await server.http("PUT", "/groups/g/connectors/a", {"tasks": 4}))[0] == 200
        worker = Worker("w1")
        async with await server.client() as client:
            await settle(client, [worker])
            response = await client.request(HEARTBEAT, ConnectGroupHeartbeatRequest(
                group_id="g", member_id="w1", member_epoch=worker.epoch + 7))
            assert response.error_code == ErrorCode.FENCED_MEMBER_EPOCH
            worker.handle(response)
            group = await settle(client, [worker])
            assert len(wire_units(group.members[0].target)) == 5
            assert len(worker.owned) == 5
    finally:
        server.kill()
    # ... and the durable state says so too.
    await server.start()
    try:
        async with await server.client() as client:
            group = await describe(client, "g")
            assert len(wire_units(group.members[0].target)) == 5
    finally:
        server.kill()


async def test_a_restart_during_a_hold_releases_the_units_at_the_original_deadline(
    tmp_path: Path
) -> None:
    # Long enough that a restart on a busy machine still comes before the deadline.
    delay_ms = 10_000
    # The assignor runs on the loop: a pool process that starts slowly on a busy machine
    # would time the first run out, and the hold is the same either way.
    server = _server(tmp_path, f"scheduled.rebalance.max.delay.ms={delay_ms}",
                     "group.connect.session.timeout.ms=30000",
                     "group.connect.assignor.offload.enable=false")
    await server.start()
    stayer, leaver = Worker("w1"), Worker("w2")
    try:
        assert (await server.http("PUT", "/groups/g/connectors/a", {"tasks": 5}))[0] == 200
        async with await server.client() as client:
            await settle(client, [stayer, leaver])
            held = len(leaver.owned)
            assert held > 0
            left_at = time.time() * 1000
            response = await client.request(HEARTBEAT, leaver.leave_request())
            assert response.error_code == ErrorCode.NONE
            await stayer.heartbeat(client)
            await trio.sleep(1.0)
            await stayer.heartbeat(client)
            assert len(stayer.owned) == 6 - held  # the departed worker's units are held
    finally:
        server.kill()  # SIGKILL during the hold
    restarted_at = time.time() * 1000
    await server.start()
    try:
        async with await server.client() as client:
            with trio.fail_after(delay_ms / 1000 + 30):
                while len(stayer.owned) < 6:
                    await stayer.heartbeat(client)
                    await trio.sleep(0.05)
        # When the restarted server released the units, by its own log (the poll above
        # may see it late on a busy machine): a delayed rebalance that came due.
        released_at = _logged_ms(server, "group_epoch_bumped", trigger="delayed_rebalance")
        # Not before the original deadline (the delay counted from just before the leave),
        # and not a whole delay after the restarted server loaded its log: it kept the
        # recorded deadline rather than starting the hold again. (If the restart itself
        # outlasts the hold, as on a very busy machine, the units go as soon as the log is
        # loaded, still before this bound.)
        loaded_at = _logged_ms(server, "log_loaded")
        assert restarted_at <= loaded_at
        assert left_at + delay_ms - 50 <= released_at < loaded_at + delay_ms
    finally:
        server.kill()


def _logged_ms(server: ServerProcess, event: str, **fields: str) -> float:
    """The time of the one `event` line with these fields in the server's JSON log."""
    times = [datetime.fromisoformat(line["timestamp"]).timestamp() * 1000
             for line in server.events()
             if line.get("event") == event
             and all(line.get(key) == value for key, value in fields.items())]
    assert len(times) == 1, server.output()
    return times[0]


async def test_an_empty_group_without_connectors_goes_away_after_its_retention(
    tmp_path: Path
) -> None:
    server = _server(tmp_path, "group.connect.empty.group.retention.ms=1000")
    await server.start()
    try:
        worker = Worker("w1")
        async with await server.client() as client:
            await worker.join(client)
            response = await client.request(HEARTBEAT, worker.leave_request())
            assert response.error_code == ErrorCode.NONE
        assert (await server.http("GET", "/groups/g"))[0] == 200
        with trio.fail_after(10):
            while (await server.http("GET", "/groups/g"))[0] != 404:  # noqa: ASYNC110 - polls the server
                await trio.sleep(0.1)
    finally:
        server.kill()
    await server.start()  # gone for good: the deletion is in the log
    try:
        assert (await server.http("GET", "/groups/g"))[0] == 404
    finally:
        server.kill()
