"""Disk full and I/O errors under a running server: the change that could not be made
durable is answered COORDINATOR_NOT_AVAILABLE (503 on the admin API) and undone, every
change queued behind the failed flush with it, and the server keeps serving."""

from __future__ import annotations

import errno
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from coordinator.client import KafkaClient
from coordinator.config import ServerConfig
from coordinator.log.faults import FaultyFileLayer
from coordinator.server.app import ServerHandle, run_server
from coordinator.snapshot import load_core
from coordinator.storage import snapshot_rows
from protocol.errors import ErrorCode

from .helpers import HEARTBEAT, Worker, http_call, settle

CONFIG = ServerConfig(assignment_interval_ms=0, assignor_offload_enable=False,
                      shutdown_timeout_ms=2_000, session_timeout_ms=600_000,
                      server_assignors=("balanced",))


@pytest.fixture
async def layer() -> FaultyFileLayer:
    return FaultyFileLayer()


@pytest.fixture
async def server(tmp_path: Path, layer: FaultyFileLayer,
                 nursery: trio.Nursery) -> AsyncIterator[ServerHandle]:
    handle: ServerHandle = await nursery.start(
        partial_server(tmp_path / "data", layer))
    yield handle
    handle.stop()


def partial_server(data_dir: Path, layer: FaultyFileLayer) -> Any:
    async def start(task_status: trio.TaskStatus[ServerHandle] = trio.TASK_STATUS_IGNORED
                    ) -> None:
        await run_server(CONFIG, ("127.0.0.1", 0), ("127.0.0.1", 0), data_dir,
                         file_layer=layer, task_status=task_status)
    return start


async def admin(handle: ServerHandle, method: str, path: str, body: Any = None
                ) -> tuple[int, Any]:
    url = f"http://127.0.0.1:{handle.admin_port}{path}"
    return await trio.to_thread.run_sync(http_call, method, url, body)


def rows(core: Any) -> list[dict[str, Any]]:
    # Sorted: a rolled-back removal puts the member back last in its group's dict.
    return sorted(snapshot_rows(core, 0), key=lambda row: repr(sorted(row.items())))


def state(handle: ServerHandle) -> list[Any]:
    core = handle.runtime.core
    return [core.describe_group(g) for g in core.group_ids()] + [
        core.group_config(g) for g in core.group_ids()] + rows(core)


async def stable_group(handle: ServerHandle) -> list[Worker]:
    assert (await admin(handle, "PUT", "/groups/g/connectors/a", {"tasks": 3}))[0] == 200
    workers = [Worker("w1"), Worker("w2")]

    async with await KafkaClient.connect("127.0.0.1", handle.kafka_port) as client:
        await settle(client, workers)
    return workers


@pytest.mark.parametrize("error", [errno.ENOSPC, errno.EIO])
async def test_a_failed_fsync_undoes_the_change_and_the_server_carries_on(
    server: ServerHandle, layer: FaultyFileLayer, tmp_path: Path, error: int
) -> None:


    workers = await stable_group(server)
    before = state(server)

    layer.fail_next_fsync(error)
    status, body = await admin(server, "PUT", "/groups/g/connectors/b", {"tasks": 2})
    assert status == 503 and body["error"] == "COORDINATOR_NOT_AVAILABLE"
    assert state(server) == before

    layer.fail_next("write", times=1)  # ENOSPC-like on the append itself (EIO default)
    async with await KafkaClient.connect("127.0.0.1", server.kafka_port) as client:
        response = await client.request(HEARTBEAT, workers[1].leave_request())
        assert response.error_code == ErrorCode.COORDINATOR_NOT_AVAILABLE
        assert state(server) == before
        assert layer.pending_faults() == 0

        # The fault is gone: the same changes now succeed and are durable.
        response = await client.request(HEARTBEAT, workers[1].leave_request())
        assert response.error_code == ErrorCode.NONE
    status, body = await admin(server, "PUT", "/groups/g/connectors/b", {"tasks": 2})
    assert status == 200, body
    assert state(server) != before
    assert rows(load_core(tmp_path / "data", CONFIG)) == rows(server.runtime.core)


async def test_changes_caught_by_one_failing_flush_are_all_rolled_back(
    server: ServerHandle, layer: FaultyFileLayer
) -> None:


    workers = await stable_group(server)
    before = state(server)
    core = server.runtime.core

    # Hold the next fsync until three changes are in memory, then fail it.
    in_fsync, release = threading.Event(), threading.Event()
    armed = [True]

    def hold(path: Path) -> None:
        if armed[0]:
            armed[0] = False
            in_fsync.set()
            release.wait(10)

    layer.before_fsync = hold
    layer.fail_next_fsync(errno.ENOSPC)
    results: dict[str, Any] = {}

    async def put(name: str) -> None:
        results[name] = await admin(server, "PUT", f"/groups/g/connectors/{name}",
                                    {"tasks": 1})

    async def leave() -> None:
        async with await KafkaClient.connect("127.0.0.1", server.kafka_port) as client:
            results["leave"] = await client.request(HEARTBEAT, workers[0].leave_request())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(put, "first")
        await trio.to_thread.run_sync(in_fsync.wait, 10)  # "first" is being flushed
        nursery.start_soon(put, "second")
        nursery.start_soon(leave)
        for _ in range(1000):  # until all three changes are applied in memory
            group = core.store.groups["g"]
            if {"first", "second"} <= group.connectors.keys() and "w1" not in group.members:
                break
            await trio.sleep(0.01)
        release.set()

    assert results["first"][0] == 503 and results["second"][0] == 503
    assert results["leave"].error_code == ErrorCode.COORDINATOR_NOT_AVAILABLE
    assert state(server) == before
    status, _ = await admin(server, "PUT", "/groups/g/connectors/third", {"tasks": 1})
    assert status == 200
