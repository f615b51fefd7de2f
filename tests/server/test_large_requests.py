"""What a large request costs the event loop: it is decoded and checked in the listener's
thread, and freed there too, a piece at a time; a describe of many groups is taken a few
groups at a time."""

from __future__ import annotations

import sys
import threading
from typing import Any

import pytest
import trio

from coordinator.client import KafkaClient
from coordinator.config import ServerConfig
from coordinator.server import kafka
from coordinator.server.app import ServerHandle, run_server
from protocol.framing import DecodedRequest
from protocol.messages import (
    ConnectGroupDescribeRequest,
    ConnectGroupHeartbeatRequest,
    ConnectorsAndTasks,
)
from protocol.messages.common import ConnectorTaskId
from protocol.messages.connect_group_install_assignment_request import (
    ConnectGroupInstallAssignmentRequest,
    MemberAssignment,
)

HEARTBEAT, DESCRIBE = 1000, 1003
CONFIG = ServerConfig(assignment_interval_ms=0, assignor_offload_enable=False,
                      shutdown_timeout_ms=500)


class StepCounter(trio.abc.Instrument):
    """How many steps each task has taken."""

    def __init__(self) -> None:
        self.steps: dict[trio.lowlevel.Task, int] = {}

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.steps[task] = self.steps.get(task, 0) + 1


def owned(tasks: int, name: str = "c") -> ConnectorsAndTasks:
    return ConnectorsAndTasks(connectors=(name,), tasks=tuple(
        ConnectorTaskId(connector=name, task=index) for index in range(tasks)))


def test_a_released_request_leaves_nothing_holding_its_elements() -> None:
    install = ConnectGroupInstallAssignmentRequest(
        group_id="g", member_id="m", member_epoch=1, group_epoch=1, error=0,
        members=tuple(MemberAssignment(member_id=f"m{index}", assigned=owned(3), version=1,
                                       metadata=b"") for index in range(5)))
    heartbeat = ConnectGroupHeartbeatRequest(group_id="g", member_id="m", member_epoch=1,
                                             owned_connectors_and_tasks=owned(4))
    kept_member = install.members[2]
    kept_task = heartbeat.owned_connectors_and_tasks.tasks[1]
    assert sys.getrefcount(kept_member) > 2  # the members tuple holds it too
    held: list[Any] = [DecodedRequest(1002, 0, 1, "c", install),
                       DecodedRequest(HEARTBEAT, 0, 2, "c", heartbeat)]
    pieces = kafka._elements(install) + kafka._elements(heartbeat)
    assert len(pieces) == 5 + 1 + 4  # the members; the owned connector and tasks
    del install, heartbeat, pieces
    kafka.release_gradually(held)
    assert held == []
    # only this test's name and getrefcount's argument are left
    assert sys.getrefcount(kept_member) == 2
    assert sys.getrefcount(kept_task) == 2


async def test_a_large_heartbeat_is_checked_and_released_in_the_listeners_thread(
        nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch) -> None:
    released: list[tuple[str, list[str]]] = []
    real_release = kafka.release_gradually

    def spying_release(held: list[Any]) -> None:
        released.append((threading.current_thread().name,
                         [type(getattr(item, "body", item)).__name__ for item in held]))
        real_release(held)

    monkeypatch.setattr(kafka, "release_gradually", spying_release)
    checked_in: list[str] = []
    real_check = kafka.check_heartbeat

    def spying_check(request: Any) -> Any:
        checked_in.append(threading.current_thread().name)
        return real_check(request)

    monkeypatch.setattr(kafka, "check_heartbeat", spying_check)
    handle: ServerHandle = await nursery.start(run_server, CONFIG, ("127.0.0.1", 0),
                                               ("127.0.0.1", 0))
    name = "connector-" + "x" * 40
    tasks = kafka.OFFLOAD_DECODE_BYTES // len(name)  # a frame above OFFLOAD_DECODE_BYTES
    async with await KafkaClient.connect("127.0.0.1", handle.kafka_port) as client:
        small = await client.request(HEARTBEAT, ConnectGroupHeartbeatRequest(
            group_id="g", member_id="nobody", member_epoch=3,
            owned_connectors_and_tasks=owned(10)))
        large = await client.request(HEARTBEAT, ConnectGroupHeartbeatRequest(
            group_id="g", member_id="nobody", member_epoch=3,
            owned_connectors_and_tasks=owned(tasks, name)))
        with trio.fail_after(10):
            while not released:  # noqa: ASYNC110 - the thread reports when it is done
                await trio.sleep(0.01)
    # both answered alike (no such member); only the large one was released in the thread
    assert small.error_code == large.error_code != 0
    # checked there first, its owned list made into units
    assert released == [("krpc-decode_0", ["ConnectGroupHeartbeatRequest",
                                           "CheckedHeartbeat"])]
    assert checked_in == ["krpc-decode_0"]
    handle.stop()


async def test_a_describe_of_many_groups_gives_the_same_answer_a_few_groups_per_step(
        nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch) -> None:
    handle: ServerHandle = await nursery.start(run_server, CONFIG, ("127.0.0.1", 0),
                                               ("127.0.0.1", 0))
    for index in range(7):
        await handle.runtime.put_connector(f"g{index}", f"connector-{index}", index + 1)
    # existing groups, missing ones, an empty id and a repeat, in no particular order
    asked = ("g3", "missing", "g0", "", "g6", "g3", "g1", "nope", "g2", "g5", "g4")
    request = ConnectGroupDescribeRequest(group_ids=asked)
    core = handle.runtime.core
    snapshotted: list[tuple[str, int]] = []  # (group, steps of its task so far)
    counter = StepCounter()
    real_snapshot = core.describe_snapshot

    def spying_snapshot(group_id: str, version: int) -> Any:
        snapshotted.append((group_id, counter.steps[trio.lowlevel.current_task()]))
        return real_snapshot(group_id, version)

    monkeypatch.setattr(core, "describe_snapshot", spying_snapshot)
    trio.lowlevel.add_instrument(counter)
    answers = []
    async with await KafkaClient.connect("127.0.0.1", handle.kafka_port) as client:
        for per_step in (len(asked), 3, 1):
            monkeypatch.setattr(kafka, "DESCRIBE_GROUPS_PER_STEP", per_step)
            snapshotted.clear()
            answers.append(await client.request(DESCRIBE, request))
            assert [group for group, _ in snapshotted] == list(asked)
            # a new step of the loop every `per_step` groups
            steps = [step for _, step in snapshotted]
            assert [steps[index] - steps[index - 1] for index in range(1, len(steps))] == [
                int(index % per_step == 0) for index in range(1, len(steps))]
    assert [group.group_id for group in answers[0].groups] == list(asked)
    assert answers[0].groups[0].error_code == 0
    assert answers[0] == answers[1] == answers[2]
    handle.stop()


async def test_a_large_install_from_a_caller_that_may_not_install_is_refused_undecoded(
        nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch) -> None:
    decoded: list[int] = []
    real_decode = kafka.decode_request

    def spying_decode(frame: bytes, *args: Any) -> Any:
        decoded.append(len(frame))
        return real_decode(frame, *args)

    monkeypatch.setattr(kafka, "decode_request", spying_decode)
    handle: ServerHandle = await nursery.start(run_server, CONFIG, ("127.0.0.1", 0),
                                               ("127.0.0.1", 0))
    await handle.runtime.put_connector("g", "connector", 1)
    members = kafka.OFFLOAD_DECODE_BYTES // 16  # a frame above OFFLOAD_DECODE_BYTES

    def install(group_id: str, member_id: str) -> ConnectGroupInstallAssignmentRequest:
        return ConnectGroupInstallAssignmentRequest(
            group_id=group_id, member_id=member_id, member_epoch=1, group_epoch=2, error=0,
            members=tuple(MemberAssignment(member_id=f"member-{index:08d}",
                                           assigned=owned(1), version=1, metadata=b"")
                          for index in range(members)))

    async with await KafkaClient.connect("127.0.0.1", handle.kafka_port) as client:
        no_member = await client.request(1002, install("g", "nobody"))
        no_group = await client.request(1002, install("missing", "nobody"))
        small = await client.request(1002, ConnectGroupInstallAssignmentRequest(
            group_id="g", member_id="nobody", member_epoch=1, group_epoch=2, error=0,
            members=()))
    # the same answers as a decoded request gets, without decoding the large ones
    assert no_member.error_code == small.error_code == 25  # UNKNOWN_MEMBER_ID
    assert no_member.error_message == small.error_message
    assert no_group.error_code == 69  # GROUP_ID_NOT_FOUND
    assert decoded and all(size <= kafka.OFFLOAD_DECODE_BYTES for size in decoded), decoded
    handle.stop()
