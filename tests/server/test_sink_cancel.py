"""A change whose waiter is cancelled while its records are being written is still rolled
back if that write then fails: the state never holds a change the log does not."""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path

import trio

from coordinator.assignors import load_assignors
from coordinator.config import ServerConfig
from coordinator.core.coordinator import GroupCoordinator
from coordinator.log import LogWriter
from coordinator.log.faults import FaultyFileLayer
from coordinator.server.runtime import NotDurable, Runtime, TrioEpochClock
from coordinator.storage import LogSink

CONFIG = ServerConfig(assignment_interval_ms=0, assignor_offload_enable=False)


async def test_a_cancelled_waiter_whose_flush_fails_is_rolled_back(tmp_path: Path) -> None:
    layer = FaultyFileLayer()
    core = GroupCoordinator(CONFIG, load_assignors(CONFIG.server_assignors))
    sink = LogSink(LogWriter.open(tmp_path, file_layer=layer), lambda: 0)
    runtime = Runtime(core, CONFIG, sink, TrioEpochClock(epoch_offset_ms=0))
    sink.on_failure = runtime.roll_back_writes
    in_fsync, release = threading.Event(), threading.Event()

    def hold(path: Path) -> None:
        in_fsync.set()
        release.wait(10)

    async with trio.open_nursery() as nursery:
        await nursery.start(sink.run)
        await nursery.start(runtime.run)
        layer.before_fsync = hold
        layer.fail_next_fsync()
        with trio.CancelScope() as waiter:
            async def cancel_once_in_fsync() -> None:
                await trio.to_thread.run_sync(in_fsync.wait)
                waiter.cancel()  # the caller gives up (its client went away, say)
            nursery.start_soon(cancel_once_in_fsync)
            release_later = trio.to_thread.run_sync
            nursery.start_soon(release_later, lambda: (in_fsync.wait(), time.sleep(0.2),
                                                       release.set()))
            with contextlib.suppress(NotDurable):  # told, or cancelled: either way undone
                await runtime.put_connector("g", "c", 2)
        with trio.fail_after(5):
            while core.group_ids():  # noqa: ASYNC110 - waits for the flush thread
                await trio.sleep(0.01)
        assert core.group_ids() == []
        nursery.cancel_scope.cancel()
