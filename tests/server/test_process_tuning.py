"""How `serve` tunes its process: timed garbage collection, lower-priority assignor workers."""

from __future__ import annotations

import gc
import weakref

import trio

from coordinator.server.memory import collect_periodically


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


async def test_assignor_worker_processes_run_at_a_lower_priority() -> None:
    import os

    import trio_parallel

    from coordinator.server.runtime import ASSIGNOR_NICENESS, lower_priority

    async with trio_parallel.open_worker_context(init=lower_priority) as context:
        niceness = await context.run_sync(os.nice, 0)
    assert niceness == min(19, os.nice(0) + ASSIGNOR_NICENESS)
