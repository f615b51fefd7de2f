"""How `serve` tunes its process: timed garbage collection, lower-priority assignor workers."""

from __future__ import annotations

import functools
import gc
import os
import threading
import weakref
from pathlib import Path

import pytest
import trio
import trio.testing

from bench.replay import build_log
from coordinator.assignors import load_assignors
from coordinator.config import ServerConfig
from coordinator.core.coordinator import GroupCoordinator
from coordinator.server.memory import collect_periodically
from coordinator.storage import LogReplayer


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


async def test_cycles_are_collected_on_the_timer_and_gc_is_back_on_after() -> None:
    gc.disable()
    try:
        first, second = Node(), Node()
        first.other, second.other = second, first  # a cycle: reference counts never reach 0
        alive = weakref.ref(first)
        del first, second
        assert alive() is not None  # nothing collects it with the collector off
        async with trio.open_nursery() as nursery:
            nursery.start_soon(collect_periodically, 0.01)
            with trio.fail_after(5):
                while alive() is not None:  # noqa: ASYNC110 - waits on the collector
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
        assert gc.isenabled()
    finally:
        gc.enable()


async def test_young_objects_past_the_limit_are_frozen_without_a_walk(
        autojump_clock: trio.testing.MockClock) -> None:
    # Once `young_limit` objects allocated since the last collection are alive, the next
    # check freezes them as they are: no collection walks them (a cycle dropped among them
    # is not found), and none later does either, until the full pass.
    gc.disable()
    try:
        gc.collect()
        gc.freeze()
        first, second = Node(), Node()
        first.other, second.other = second, first
        alive = weakref.ref(first)
        del first, second
        frozen_before = gc.get_freeze_count()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(collect_periodically, 60.0, 30, 5_000, 0.5)
            burst = [Node() for _ in range(6_000)]
            await trio.sleep(0.75)  # one check
            assert gc.get_freeze_count() >= frozen_before + 6_000  # the burst, frozen
            assert gc.get_count()[0] < 5_000
            assert alive() is not None  # not walked: the cycle is still there
            few = [Node() for _ in range(30)]  # a little cyclic garbage, as a server makes
            for one, other in zip(few[::2], few[1::2], strict=True):
                one.other, other.other = other, one
            del few, one, other
            # The timed collection, at 60 s, walks only what came since the freeze and
            # finds those 30: too few a second to look among the frozen (a full pass).
            await trio.sleep(60)
            assert alive() is not None
            nursery.cancel_scope.cancel()
        assert len(burst) == 6_000
    finally:
        gc.unfreeze()
        gc.enable()


async def test_once_a_collection_finds_garbage_the_limit_collects_and_a_full_pass_follows(
        autojump_clock: trio.testing.MockClock) -> None:
    # A client whose requests leave cycles behind: freezing them would keep them until the
    # half-hourly full pass. When a collection finds more than GARBAGE_PER_S unreachable
    # objects a second, what was frozen unwalked gets a full pass at the next check,
    # and young objects past the limit are collected from then on, not frozen.
    def cycles(count: int) -> weakref.ref[Node]:
        nodes = [Node() for _ in range(2 * count)]
        for one, other in zip(nodes[::2], nodes[1::2], strict=True):
            one.other, other.other = other, one
        return weakref.ref(nodes[0])

    gc.disable()
    try:
        gc.collect()
        gc.freeze()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(collect_periodically, 10.0, 1_000, 5_000, 0.5)
            frozen_cycle = cycles(1)
            burst = [Node() for _ in range(6_000)]
            await trio.sleep(0.75)  # frozen with the burst, unwalked
            assert frozen_cycle() is not None
            young_cycles = cycles(1_000)  # garbage: 2,000 objects in 9.5 s, over 100 a second
            await trio.sleep(9.5)  # the timed collection, at 10 s, finds them
            assert young_cycles() is None
            assert frozen_cycle() is not None
            await trio.sleep(0.5)  # the next check is a full pass
            assert frozen_cycle() is None
            many_cycles = cycles(3_000)  # 6,000 young objects, garbage
            await trio.sleep(0.5)  # past the limit: collected, not frozen
            assert many_cycles() is None
            nursery.cancel_scope.cancel()
        assert len(burst) == 6_000
    finally:
        gc.unfreeze()
        gc.enable()


async def test_assignor_worker_processes_run_at_a_lower_priority_without_the_collector(
        ) -> None:
    import trio_parallel

    from coordinator.server.runtime import init_pool_process
    from coordinator.server.scheduling import BACKGROUND_NICENESS

    async with trio_parallel.open_worker_context(
            init=functools.partial(init_pool_process, os.nice(0))) as context:
        niceness = await context.run_sync(os.nice, 0)
        policy = await context.run_sync(os.sched_getscheduler, 0)
        collecting = await context.run_sync(gc.isenabled)
    assert niceness == min(19, os.nice(0) + BACKGROUND_NICENESS)
    assert policy == os.SCHED_BATCH  # woken, it waits for the next tick to preempt anyone
    assert not collecting


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


async def test_cycles_that_outlived_a_collection_wait_for_the_full_pass(
        autojump_clock: trio.testing.MockClock) -> None:
    # A timed collection freezes what survives it; a cycle dropped later is among frozen
    # objects, which only the full pass (every `full_every`-th collection) looks at again.
    # The clock is virtual: collections at 0.05, 0.10, 0.15 and (full) 0.20 s.
    gc.disable()
    try:
        first, second = Node(), Node()
        first.other, second.other = second, first
        alive = weakref.ref(first)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(collect_periodically, 0.05, 4)
            await trio.sleep(0.075)  # one collection has run: the cycle survived, frozen
            assert gc.get_freeze_count() > 0
            del first, second
            await trio.sleep(0.1)  # the second and third: young collections only
            assert alive() is not None
            await trio.sleep(0.05)  # the fourth, a full pass
            assert alive() is None
            nursery.cancel_scope.cancel()
        assert gc.isenabled() and gc.get_freeze_count() == 0
    finally:
        gc.unfreeze()
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


def test_the_event_loop_thread_asks_for_a_short_cpu_slice() -> None:
    # On a thread of its own, so the test process keeps its own slice.
    from coordinator.server.scheduling import (
        EVENT_LOOP_SLICE_NS,
        current_slice_ns,
        request_short_slice,
    )

    seen: list[tuple[int | None, bool, int | None]] = []

    def ask() -> None:
        before = current_slice_ns()
        seen.append((before, request_short_slice(), current_slice_ns()))

    thread = threading.Thread(target=ask)
    thread.start()
    thread.join()
    before, taken, after = seen[0]
    assert before is not None and before > EVENT_LOOP_SLICE_NS  # Linux's default slice
    assert taken and after == EVENT_LOOP_SLICE_NS


async def test_work_handed_to_a_thread_runs_nicer_than_the_event_loop() -> None:
    from coordinator.server.scheduling import BACKGROUND_NICENESS, to_background_thread

    def priority() -> tuple[int, int]:
        thread = threading.get_native_id()
        return os.getpriority(os.PRIO_PROCESS, thread), os.sched_getscheduler(thread)

    loop = priority()
    background = (min(19, loop[0] + BACKGROUND_NICENESS), os.SCHED_BATCH)
    assert await to_background_thread(priority) == background
    # once per thread: trio reuses it, and a second job does not lower it again
    assert await to_background_thread(priority) == background
    assert priority() == loop


def test_a_pool_process_started_by_a_background_thread_is_as_nice_as_meant() -> None:
    # A process inherits the niceness of the thread that starts it (trio-parallel may start
    # one from a thread the log flush lowered): the pool's own step starts from the loop's.
    from coordinator.server.scheduling import BACKGROUND_NICENESS, make_background

    loop = os.nice(0)
    seen: list[int] = []

    def started_by_a_background_thread() -> None:
        thread = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, thread, min(19, loop + BACKGROUND_NICENESS))
        make_background(loop)
        seen.append(os.getpriority(os.PRIO_PROCESS, thread))

    worker = threading.Thread(target=started_by_a_background_thread)
    worker.start()
    worker.join()
    assert seen == [min(19, loop + BACKGROUND_NICENESS)]  # not twice as nice


def _spin_with_courtesy_pauses(seconds: float) -> tuple[bool, int]:
    """Compute for `seconds` inside courtesy_pauses; how many pauses were taken."""
    import time

    from coordinator.server import scheduling

    before = scheduling.courtesy_pauses_taken
    with scheduling.courtesy_pauses() as active:
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            pass
    return active, scheduling.courtesy_pauses_taken - before


def test_courtesy_pauses_interrupt_a_computation_and_leave_nothing_behind() -> None:
    import signal
    import time

    from coordinator.server import scheduling

    def handler(_signum: int, _frame: object) -> None:
        raised.append(True)

    raised: list[bool] = []
    previous = signal.signal(signal.SIGALRM, handler)
    try:
        active, taken = _spin_with_courtesy_pauses(0.05)
        assert active
        assert taken >= 20  # one every 0.5 ms: about 90 in 50 ms
        assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
        assert signal.getsignal(signal.SIGALRM) is handler  # put back
        after = scheduling.courtesy_pauses_taken
        time.sleep(0.01)
        assert scheduling.courtesy_pauses_taken == after  # the timer is off
        assert raised == []
    finally:
        signal.signal(signal.SIGALRM, previous)


def test_a_late_alarm_after_courtesy_pauses_does_nothing_where_it_would_kill() -> None:
    # The timer's last alarm can reach the process after the block ended (another thread
    # takes it). Under SIGALRM's default action Python raises OSError in the main thread
    # then, so the block leaves a no-op handler in place of the default.
    import signal

    from coordinator.server import scheduling

    previous = signal.signal(signal.SIGALRM, signal.SIG_DFL)
    try:
        _spin_with_courtesy_pauses(0.01)
        after = scheduling.courtesy_pauses_taken
        signal.raise_signal(signal.SIGALRM)  # as late as can be: the process lives on
        assert scheduling.courtesy_pauses_taken == after
    finally:
        signal.signal(signal.SIGALRM, previous)


def test_courtesy_pauses_need_the_main_thread() -> None:
    outcome: list[tuple[bool, int]] = []
    thread = threading.Thread(target=lambda: outcome.append(_spin_with_courtesy_pauses(0.01)))
    thread.start()
    thread.join()
    assert outcome == [(False, 0)]


async def test_courtesy_pauses_work_in_a_pool_process() -> None:
    import trio_parallel

    from coordinator.server.runtime import init_pool_process

    async with trio_parallel.open_worker_context(
            init=functools.partial(init_pool_process, os.nice(0))) as context:
        active, taken = await context.run_sync(_spin_with_courtesy_pauses, 0.05)
    assert active and taken >= 20


def test_a_pool_run_pauses_while_it_computes(monkeypatch: pytest.MonkeyPatch) -> None:
    # `run_in_pool` (what a pool process is given) wraps the run in the pauses.
    import time

    from coordinator.assignors.transport import CompactResult, PackedRun
    from coordinator.server import runtime, scheduling

    def computing(_packed: PackedRun) -> CompactResult:
        deadline = time.perf_counter() + 0.05
        while time.perf_counter() < deadline:
            pass
        return CompactResult({}, None)

    monkeypatch.setattr(runtime, "run_packed", computing)
    before = scheduling.courtesy_pauses_taken
    runtime.run_in_pool(PackedRun(b"", ()))
    assert scheduling.courtesy_pauses_taken - before >= 20  # one every 0.5 ms
