"""The runtime's timer scheduler: lazy-deletion heap, re-arming, cancelling, trio's clock."""

from __future__ import annotations

import trio
import trio.testing

from coordinator.core.result import TimerCancel, TimerKey, TimerSet
from coordinator.server.runtime import TimerScheduler, TrioEpochClock

A: TimerKey = ("session", "g", "a")
B: TimerKey = ("session", "g", "b")


def test_rearming_later_keeps_one_heap_entry() -> None:
    timers = TimerScheduler()
    timers.set(A, 100)
    for deadline in range(200, 10_000, 100):  # a heartbeat stream moving the session timer
        timers.set(A, deadline)
    assert len(timers._heap) == 1
    assert timers.pop_due(5_000) == []  # the stale entry is re-pushed at the live deadline
    assert timers.next_deadline() == 9_900
    assert timers.pop_due(9_900) == [A]
    assert len(timers) == 0


def test_rearming_earlier_fires_at_the_earlier_deadline() -> None:
    timers = TimerScheduler()
    timers.set(A, 1_000)
    timers.set(A, 500)
    assert timers.pop_due(499) == []
    assert timers.pop_due(500) == [A]
    assert timers.pop_due(1_000) == []  # the old entry is dropped, not fired twice


def test_cancel_and_apply() -> None:
    timers = TimerScheduler()
    timers.apply([TimerSet(A, 10), TimerSet(B, 20), TimerCancel(A)])
    assert timers.deadline(A) is None
    assert timers.pop_due(100) == [B]


def test_due_keys_come_out_in_deadline_order() -> None:
    timers = TimerScheduler()
    timers.set(B, 30)
    timers.set(A, 20)
    assert timers.pop_due(30) == [A, B]


async def test_run_fires_on_trio_clock(autojump_clock: trio.testing.MockClock) -> None:
    clock = TrioEpochClock(epoch_offset_ms=0)
    timers = TimerScheduler()
    fired: list[tuple[TimerKey, int]] = []

    async def fire(key: TimerKey, now_ms: int) -> None:
        fired.append((key, now_ms))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(timers.run, clock, fire)
        start = clock.now_ms()
        timers.set(A, start + 10_000)
        await trio.sleep(5)
        timers.set(A, start + 20_000)  # moved later: must not fire at 10 s
        timers.set(B, start + 1_000)  # earlier than the sleeper planned: wakes it
        await trio.sleep(30)
        nursery.cancel_scope.cancel()
    assert [key for key, _ in fired] == [B, A]
    assert fired[0][1] - start == 5_000  # B was armed at 5 s for a deadline already past
    assert fired[1][1] - start == 20_000
