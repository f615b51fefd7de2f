"""The log's flush thread (`FlushThread`): one thread of its own for every flush, set up
once by `thread_init`, with `trio.to_thread.run_sync`'s rules for cancellation."""

from __future__ import annotations

import threading

import pytest
import trio

from coordinator.storage import FlushThread


async def test_every_call_runs_in_the_one_thread_set_up_once() -> None:
    set_up: list[int] = []
    flush_thread = FlushThread(lambda: set_up.append(threading.get_native_id()))
    try:
        seen = {await flush_thread.run_sync(threading.get_native_id) for _ in range(5)}
        shared = await trio.to_thread.run_sync(threading.get_native_id)
    finally:
        flush_thread.close()
    assert seen == {flush_thread.native_id} == set(set_up)
    assert shared not in seen and threading.get_native_id() not in seen


async def test_the_call_raises_what_the_function_raised() -> None:
    def fails() -> None:
        raise OSError("disk full")

    flush_thread = FlushThread()
    try:
        with pytest.raises(OSError, match="disk full"):
            await flush_thread.run_sync(fails)
        assert await flush_thread.run_sync(lambda: 7) == 7  # the thread is still there
    finally:
        flush_thread.close()


async def test_a_call_cancelled_before_it_starts_never_runs() -> None:
    ran: list[str] = []
    flush_thread = FlushThread()
    try:
        with trio.CancelScope() as scope:
            scope.cancel()
            await flush_thread.run_sync(ran.append, "ran")
        assert scope.cancelled_caught
        assert ran == []
    finally:
        flush_thread.close()


async def test_a_call_cancelled_while_it_runs_still_reports_its_outcome() -> None:
    started, release = threading.Event(), threading.Event()

    def held() -> str:
        started.set()
        release.wait(10)
        return "written"

    flush_thread = FlushThread()
    outcome: list[str] = []
    try:
        with trio.fail_after(10):
            with trio.CancelScope() as scope:
                async def cancel_once_running() -> None:
                    await trio.to_thread.run_sync(started.wait, 10)
                    scope.cancel()
                    release.set()

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(cancel_once_running)
                    outcome.append(await flush_thread.run_sync(held))
    finally:
        flush_thread.close()
    assert outcome == ["written"]
