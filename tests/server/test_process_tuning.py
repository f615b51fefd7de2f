"""What `serve` sets for its own processes: the collector paused while the log loads and
the loaded state frozen; assignor worker processes without the cyclic collector and with
courtesy pauses while a run computes; the pool and the log's flush thread at background
priority."""

from __future__ import annotations

import gc
import os
import sys
import threading
import weakref
from functools import partial
from pathlib import Path

import pytest
import trio

from bench.replay import build_log
from coordinator.assignors import load_assignors
from coordinator.config import ServerConfig
from coordinator.core.coordinator import GroupCoordinator
from coordinator.storage import LogReplayer


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


async def test_assignor_worker_processes_run_without_the_collector(
        ) -> None:
    import trio_parallel

    from coordinator.server.runtime import init_pool_process

    async with trio_parallel.open_worker_context(init=init_pool_process) as context:
        collecting = await context.run_sync(gc.isenabled)
    assert not collecting

def _pauses_taken() -> int:
    from coordinator.server import runtime
    return runtime.courtesy_pauses_taken


def _a_long_packed_run() -> object:
    """A balanced run of 200 members over 40,000 tasks, none assigned yet: tens of
    milliseconds of computing, so many times the courtesy interval."""
    from coordinator.assignors.api import AssignmentSpec, MemberSpec
    from coordinator.assignors.balanced import BalancedAssignor
    from coordinator.assignors.transport import SpecPacker

    members = {f"w{i}": MemberSpec(f"w{i}", None, f"http://w{i}:8083", frozenset())
               for i in range(200)}
    spec = AssignmentSpec(group_id="g", members=members,
                          connectors={f"c{i}": 400 for i in range(100)},
                          previous_target={}, previous_state=b"", now_ms=1_000)
    return SpecPacker().pack(BalancedAssignor(), spec, whole=True)


async def test_assignor_worker_processes_pause_while_a_run_computes() -> None:
    import trio_parallel

    from coordinator.server.runtime import init_pool_process, run_in_pool

    packed = _a_long_packed_run()
    async with trio_parallel.open_worker_context(init=init_pool_process) as context:
        assert await context.run_sync(_pauses_taken) == 0
        started = trio.current_time()
        result = await context.run_sync(run_in_pool, packed)
        computed_ms = (trio.current_time() - started) * 1000
        pauses = await context.run_sync(_pauses_taken)
    assert result.assigned == 40_100  # the tasks and the connectors
    # One pause per half millisecond of the run, give or take the ones a busy machine drops.
    assert 0 < pauses <= computed_ms / 0.5 + 1


def test_a_run_outside_a_pool_process_takes_no_pause() -> None:
    import signal

    from coordinator.server import runtime

    handler = signal.getsignal(signal.SIGALRM)
    before = runtime.courtesy_pauses_taken
    runtime.run_in_pool(_a_long_packed_run())  # type: ignore[arg-type]
    assert runtime.courtesy_pauses_taken == before
    assert signal.getsignal(signal.SIGALRM) is handler
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_a_pool_process_collects_cycles_every_so_many_runs(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from coordinator.assignors.balanced import BalancedAssignor
    from coordinator.assignors.transport import SpecPacker
    from coordinator.server import runtime
    from tests.assignors.test_transport import spec_with, split

    monkeypatch.setattr(runtime, "POOL_COLLECTION_EVERY", 3)
    monkeypatch.setattr(runtime, "_pool_runs", 0)
    packer = SpecPacker()
    gc.disable()  # as in a pool process
    try:
        first, second = Node(), Node()
        first.other, second.other = second, first
        alive = weakref.ref(first)
        del first, second
        for runs in range(1, 4):
            runtime.run_in_pool(packer.pack(BalancedAssignor(), spec_with(split(2)),
                                            whole=True))
            assert (alive() is None) == (runs == 3)
    finally:
        gc.enable()

@pytest.mark.parametrize("freeze_loaded", [True, False])
def test_serve_freezes_what_the_log_load_allocated(tmp_path: Path, freeze_loaded: bool) -> None:
    # Loaded with the collector off, the state would sit in the youngest generation and
    # the first collection after the load would walk all of it. `serve` freezes it
    # instead; a test process (freeze_loaded=False) keeps it in the collector's sight.
    data_dir = tmp_path / "log"
    build_log(data_dir, 2_000)
    config = ServerConfig()
    core = GroupCoordinator(config, load_assignors(config.server_assignors))
    loader = LogReplayer(data_dir, config, freeze_loaded=freeze_loaded)
    assert gc.get_freeze_count() == 0
    try:
        trio.run(loader.load, core)
        assert gc.isenabled()
        member = next(iter(core.store.groups.values())).members["worker-0"]
        in_sight = any(tracked is member for tracked in gc.get_objects())
        assert in_sight is not freeze_loaded
        if freeze_loaded:
            assert gc.get_freeze_count() >= core.member_count()
    finally:
        gc.unfreeze()
        assert loader.writer is not None
        loader.writer.close()


@pytest.mark.parametrize("tune_process", [True, False])
def test_serve_tunes_its_own_process_once_ready(tune_process: bool) -> None:
    # A full collection walks every tracked object holding the GIL; `serve`'s own process
    # makes them rare, leaves what start-up made out of their sight, and has threads hand
    # the GIL over sooner. Anyone else's process is left as it was.
    from coordinator.server.app import (
        FULL_COLLECTION_EVERY,
        SWITCH_INTERVAL_S,
        ServerHandle,
        run_server,
    )

    before = gc.get_threshold()
    switch_before = sys.getswitchinterval()
    assert switch_before != SWITCH_INTERVAL_S
    seen: dict[str, object] = {}

    async def serve_and_look() -> None:
        async with trio.open_nursery() as nursery:
            handle: ServerHandle = await nursery.start(
                partial(run_server, ServerConfig(assignor_offload_enable=False),
                        ("127.0.0.1", 0), ("127.0.0.1", 0), tune_process=tune_process))
            seen["threshold"] = gc.get_threshold()
            seen["frozen"] = gc.get_freeze_count()
            seen["switch"] = sys.getswitchinterval()
            handle.stop()

    assert gc.get_freeze_count() == 0
    try:
        trio.run(serve_and_look)
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
        sys.setswitchinterval(switch_before)
    young, middle, full = seen["threshold"]  # type: ignore[misc]
    assert (young, middle) == before[:2]
    if tune_process:
        assert full == FULL_COLLECTION_EVERY
        assert seen["frozen"] > 0
        assert seen["switch"] == SWITCH_INTERVAL_S
    else:
        assert full == before[2]
        assert seen["frozen"] == 0
        assert seen["switch"] == switch_before


def _priority_of(thread: int) -> tuple[int, int]:
    """A thread's scheduling policy and niceness, by its native id."""
    return os.sched_getscheduler(thread), os.getpriority(os.PRIO_PROCESS, thread)


def _own_priority() -> tuple[int, int]:
    """The calling thread's (run in a pool process too)."""
    return _priority_of(threading.get_native_id())


@pytest.mark.skipif(sys.platform != "linux", reason="per-thread priorities are Linux's")
@pytest.mark.parametrize("tune_process", [True, False])
def test_serve_runs_its_pool_and_log_flushes_at_background_priority(
        tmp_path: Path, tune_process: bool) -> None:
    # What `serve` computes off the event loop (assignor runs, log flushes) yields the CPU
    # to the loop; the loop itself, trio's shared worker threads and anyone else's process
    # keep their priority.
    from coordinator.server.app import ServerHandle, run_server
    from coordinator.server.priority import BACKGROUND_NICENESS

    normal = (os.SCHED_OTHER, os.getpriority(os.PRIO_PROCESS, 0))
    background = (os.SCHED_BATCH, min(19, normal[1] + BACKGROUND_NICENESS))
    threshold, switch_interval = gc.get_threshold(), sys.getswitchinterval()
    seen: dict[str, object] = {}

    async def serve_and_look() -> None:
        async with trio.open_nursery() as nursery:
            handle: ServerHandle = await nursery.start(
                partial(run_server, ServerConfig(), ("127.0.0.1", 0), ("127.0.0.1", 0),
                        tmp_path / "log", tune_process=tune_process))
            runtime = handle.runtime
            await runtime.put_connector("g", "c", 2)  # a change, so a flush
            sink = runtime.sink
            assert sink.flushes >= 1  # type: ignore[attr-defined]
            seen["flush"] = _priority_of(sink.flush_thread.native_id)  # type: ignore[attr-defined]
            assert runtime._pool is not None
            seen["pool"] = await runtime._pool._contexts[0].run_sync(_own_priority)
            seen["loop"] = _own_priority()
            seen["worker"] = await trio.to_thread.run_sync(_own_priority)
            handle.stop()

    try:
        trio.run(serve_and_look)
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)
        sys.setswitchinterval(switch_interval)
    assert seen["loop"] == normal
    assert seen["worker"] == normal
    expected = background if tune_process else normal
    assert seen["flush"] == expected
    assert seen["pool"] == expected
