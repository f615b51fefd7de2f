"""After a change whose records could not be written is rolled back, the coordinator's
timers and in-flight assignor runs are those of a coordinator that never saw the change;
deadlines that change what a group does survive a restart."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import trio
import trio.testing

from coordinator.assignors import load_assignors
from coordinator.config import ServerConfig
from coordinator.core.coordinator import GroupCoordinator
from coordinator.core.result import SESSION_TIMER, Record
from coordinator.server.runtime import MemorySink, NotDurable, Runtime, TrioEpochClock
from protocol.errors import ErrorCode
from protocol.messages import ConnectGroupHeartbeatRequest

G = "g"


class SwitchableSink(MemorySink):
    """Writes until `failing` is set; then every write fails as a full disk would."""

    def __init__(self) -> None:
        super().__init__()
        self.failing = False

    async def write(self, records: Sequence[Record]) -> None:
        await trio.lowlevel.checkpoint()
        if self.failing:
            raise OSError("disk full")
        await super().write(records)


def make_runtime(config: ServerConfig, sink: MemorySink) -> Runtime:
    core = GroupCoordinator(config, load_assignors(config.server_assignors))
    return Runtime(core, config, sink, TrioEpochClock(epoch_offset_ms=0))


def beat(member: str, epoch: int, **fields: object) -> ConnectGroupHeartbeatRequest:
    return ConnectGroupHeartbeatRequest(group_id=G, member_id=member, member_epoch=epoch,
                                        **fields)  # type: ignore[arg-type]


def join(member: str) -> ConnectGroupHeartbeatRequest:
    return beat(member, 0, worker_url=f"http://{member}:8083", rebalance_timeout_ms=5_000,
                server_assignor="balanced")


@pytest.mark.parametrize("offload", [False, True])
async def test_a_rolled_back_leave_leaves_a_member_that_still_times_out(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock, offload: bool
) -> None:
    config = ServerConfig(assignment_interval_ms=0, assignor_offload_enable=offload)
    sink = SwitchableSink()
    runtime = make_runtime(config, sink)
    await nursery.start(runtime.run)
    await runtime.put_connector(G, "c", 2)
    await runtime.heartbeat(join("m1"))
    await runtime.heartbeat(join("m2"))
    await trio.sleep(0.1)
    sink.failing = True
    with pytest.raises(NotDurable):
        await runtime.heartbeat(beat("m1", -1))
    sink.failing = False
    assert "m1" in runtime.core.store.groups[G].members
    assert runtime.timers.deadline((SESSION_TIMER, G, "m1")) is not None
    # m2 keeps heartbeating; m1 is silent and must be removed by its session timeout.
    epoch = runtime.core.store.groups[G].members["m2"].current.epoch
    for _ in range(int(config.session_timeout_ms / config.heartbeat_interval_ms) + 3):
        await trio.sleep(config.heartbeat_interval_ms / 1000)
        response = await runtime.heartbeat(beat("m2", epoch))
        assert response.error_code == ErrorCode.NONE, response.error_message
        epoch = response.member_epoch
    assert set(runtime.core.store.groups[G].members) == {"m2"}
    nursery.cancel_scope.cancel()


async def _wait_landed(runtime: Runtime, count: int) -> None:
    with trio.fail_after(20):  # real time: the run goes to a pool process
        while runtime.runs_landed < count:  # noqa: ASYNC110 - polls the runtime's counter
            await trio.sleep(0.01)


async def test_a_run_started_by_a_rolled_back_change_never_lands(nursery: trio.Nursery) -> None:
    config = ServerConfig(assignment_interval_ms=0, assignor_offload_enable=True)
    sink = SwitchableSink()
    runtime = make_runtime(config, sink)
    await nursery.start(runtime.run)
    await runtime.put_connector(G, "c", 3)
    await runtime.heartbeat(join("m1"))
    await _wait_landed(runtime, 1)
    group = runtime.core.store.groups[G]
    assert group.epoch == group.assignment_epoch
    epoch_before = group.epoch
    sink.failing = True
    with pytest.raises(NotDurable):
        await runtime.heartbeat(join("m2"))  # starts a run for the next group epoch
    sink.failing = False
    await _wait_landed(runtime, 2)  # the abandoned run comes back, and must change nothing
    await trio.sleep(0.2)
    assert group.epoch == epoch_before
    assert group.assignment_epoch <= group.epoch
    assert "m2" not in group.members and "m2" not in group.target
    nursery.cancel_scope.cancel()
