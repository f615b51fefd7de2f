"""The runtime shell without sockets: timers on trio's clock, records before answers, rollback."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import trio
import trio.testing

from coordinator.assignors import load_assignors
from coordinator.config import ServerConfig
from coordinator.core.coordinator import GroupCoordinator
from coordinator.core.result import Record
from coordinator.server.runtime import MemorySink, NotDurable, Runtime, TrioEpochClock
from protocol.errors import ErrorCode
from protocol.messages import ConnectGroupHeartbeatRequest

CONFIG = ServerConfig(assignment_interval_ms=0, assignor_offload_enable=False)


def make_runtime(sink: MemorySink | None = None) -> Runtime:
    core = GroupCoordinator(CONFIG, load_assignors(CONFIG.server_assignors))
    return Runtime(core, CONFIG, sink or MemorySink(), TrioEpochClock(epoch_offset_ms=0))


def join(member: str) -> ConnectGroupHeartbeatRequest:
    return ConnectGroupHeartbeatRequest(group_id="g", member_id=member, member_epoch=0,
                                        worker_url=f"http://{member}", rebalance_timeout_ms=5_000)


async def test_records_are_written_before_the_answer(nursery: trio.Nursery) -> None:
    sink = MemorySink()
    runtime = make_runtime(sink)
    await nursery.start(runtime.run)
    await runtime.put_connector("g", "c", 2)
    written = len(sink.records)
    assert written > 0
    response = await runtime.heartbeat(join("m1"))
    assert response.error_code == 0
    assert len(sink.records) > written
    nursery.cancel_scope.cancel()


async def test_silent_member_is_removed_after_its_session_timeout(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    runtime = make_runtime()
    await nursery.start(runtime.run)
    await runtime.put_connector("g", "c", 2)
    response = await runtime.heartbeat(join("m1"))
    assert response.error_code == 0
    assert runtime.core.member_count() == 1
    await trio.sleep(CONFIG.session_timeout_ms / 1000 - 1)
    assert runtime.core.member_count() == 1
    await trio.sleep(2)
    assert runtime.core.member_count() == 0
    nursery.cancel_scope.cancel()


async def test_heartbeats_keep_a_member_alive(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    runtime = make_runtime()
    await nursery.start(runtime.run)
    response = await runtime.heartbeat(join("m1"))
    epoch = response.member_epoch
    for _ in range(10):
        await trio.sleep(CONFIG.heartbeat_interval_ms / 1000)
        response = await runtime.heartbeat(
            ConnectGroupHeartbeatRequest(group_id="g", member_id="m1", member_epoch=epoch))
        assert response.error_code == 0, response.error_message
        epoch = response.member_epoch
    assert runtime.core.member_count() == 1
    assert len(runtime.timers) >= 1
    nursery.cancel_scope.cancel()


class FailingSink(MemorySink):
    async def write(self, records: Sequence[Record]) -> None:
        await trio.lowlevel.checkpoint()
        raise OSError("disk full")


async def test_a_failed_write_rolls_the_change_back(nursery: trio.Nursery) -> None:
    runtime = make_runtime(FailingSink())
    await nursery.start(runtime.run)
    with pytest.raises(NotDurable) as raised:
        await runtime.put_connector("g", "c", 2)
    assert raised.value.code == ErrorCode.COORDINATOR_NOT_AVAILABLE
    assert "disk full" in raised.value.message
    assert runtime.core.group_ids() == []
    nursery.cancel_scope.cancel()
