"""Sharing the CPU with the heartbeats: a short CPU slice for the event loop's thread
(Linux 6.12 and later), a lower priority for everything the coordinator does off the loop
(its threads and the assignor pool), and courtesy pauses for the pool (below).

Linux's EEVDF scheduler lets a running task finish its slice (1.4 ms by default on this
machine) before a task that wakes up gets the CPU, unless the one waking asks for a
shorter slice. While an assignor run is in flight the worker pool's process computes for
tens of milliseconds; a heartbeat arriving on the CPU it holds waited for the rest of its
slice. With a 0.1 ms slice requested for the event loop (`sched_setattr`, `sched_runtime`
of a normal task, which any user may set), a waking event loop may preempt the pool at
once. A short slice also ends sooner while the loop is busy, so whether it helps on the
whole is not settled by measurement yet (BENCHMARKS.md, the in-flight heartbeat
benchmark). Older kernels ignore the request.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
import signal
import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import structlog
import trio

log = structlog.get_logger("coordinator.scheduling")

EVENT_LOOP_SLICE_NS = 100_000  # the kernel's minimum custom slice
# Work moved off the event loop (assignor runs in the pool's processes; log flushes,
# compaction and install checks in threads) runs this much nicer than the loop, and in
# SCHED_BATCH (`make_background`), so the loop, which answers heartbeats, gets a CPU first.
BACKGROUND_NICENESS = 10

T = TypeVar("T")
_SCHED_ATTR = struct.Struct("IIQiIQQQII")  # struct sched_attr, SCHED_ATTR_SIZE_VER1 (56)
_SYSCALLS = {"x86_64": (314, 315), "aarch64": (274, 275)}  # sched_setattr, sched_getattr


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _syscalls() -> tuple[int, int] | None:
    if platform.system() != "Linux":
        return None
    return _SYSCALLS.get(platform.machine())


def current_slice_ns() -> int | None:
    """The calling thread's slice (`sched_runtime`), None where it cannot be read."""
    numbers = _syscalls()
    if numbers is None:
        return None
    buffer = ctypes.create_string_buffer(_SCHED_ATTR.size)
    if _libc().syscall(numbers[1], 0, buffer, _SCHED_ATTR.size, 0) != 0:
        return None
    runtime: int = _SCHED_ATTR.unpack(buffer.raw)[5]
    return runtime


def request_short_slice(slice_ns: int = EVENT_LOOP_SLICE_NS) -> bool:
    """Ask for a `slice_ns` slice for the calling thread (call it from the event loop's);
    False, with a debug line, where the system does not take it."""
    numbers = _syscalls()
    if numbers is None:
        log.debug("short_slice_unsupported", system=platform.system(),
                  machine=platform.machine())
        return False
    # SCHED_OTHER (0), no flags, the thread's niceness kept.
    attr = _SCHED_ATTR.pack(_SCHED_ATTR.size, 0, 0, os.nice(0), 0, slice_ns, 0, 0, 0, 0)
    if _libc().syscall(numbers[0], 0, ctypes.create_string_buffer(attr, len(attr)), 0) != 0:
        log.debug("short_slice_refused", errno=ctypes.get_errno())
        return False
    return True


_background = threading.local()


def make_background(base_niceness: int | None = None) -> None:
    """Give the calling thread a background priority: BACKGROUND_NICENESS nicer than
    `base_niceness` (default: its own), in SCHED_BATCH. A batch task that wakes up never
    preempts the running one (the kernel leaves it to the next tick), so it does not cut
    into the event loop's steps, which a woken fsync thread or pool process did even at
    niceness 10 (perf sched); over time it still gets its niceness's share, so unlike
    SCHED_IDLE it cannot starve. Nothing changes where threads have no priority of their
    own (only Linux's do) or the system refuses."""
    if platform.system() != "Linux":
        return
    thread = threading.get_native_id()
    try:
        niceness = os.getpriority(os.PRIO_PROCESS, thread) if base_niceness is None \
            else base_niceness
        os.setpriority(os.PRIO_PROCESS, thread, min(19, niceness + BACKGROUND_NICENESS))
        os.sched_setscheduler(thread, os.SCHED_BATCH, os.sched_param(0))
    except OSError:
        pass  # not permitted here: the thread keeps the priority it has


def lower_thread_priority() -> None:
    """`make_background`, tried once per thread (a second try could lower it twice)."""
    if not getattr(_background, "tried", False):
        _background.tried = True
        make_background()


async def to_background_thread(fn: Callable[..., T], *args: object) -> T:
    """`trio.to_thread.run_sync` in a thread of lower priority than the event loop's.

    Each fsync wakes its thread several times, and at the loop's priority a woken thread
    took the CPU from the loop in the middle of answering heartbeats (about 400 times and
    35 ms a second while assignor runs were in flight; perf sched, BENCHMARKS.md). trio
    reuses its threads, so every thread the coordinator hands work to ends up at this
    priority, which is what it wants for all of them.
    """
    def lowered() -> T:
        lower_thread_priority()
        return fn(*args)

    name = getattr(fn, "__name__", None) or getattr(getattr(fn, "func", None), "__name__", "")
    return await trio.to_thread.run_sync(lowered, thread_name=f"{name} (background)")


# Courtesy pauses for the assignor pool (BENCHMARKS.md, "Pool processes that pause").
# On a 2-vCPU machine, heartbeats sent while a pool process computed waited milliseconds
# for a CPU, at either end of the connection, whatever the pool's priority (niceness 10 or
# SCHED_IDLE alike); with the pool sleeping instead of computing they did not. The likely
# reason: a CPU that never goes idle does not pull tasks queued on the other one, which
# then wait for the kernel's next periodic balance. Sleeping 50 us every 0.5 ms lets the
# pool's CPU go idle that often; it halved the in-flight p99 there. It costs more than the
# 10% it sleeps: a warm run of 1,000 members took 36-41% longer (each sleep lasts longer
# than asked, and each signal costs its handler).
COURTESY_EVERY_S = 0.0005
COURTESY_PAUSE_S = 0.00005
courtesy_pauses_taken = 0  # in this process (for tests)


def _take_a_pause(_signum: int, _frame: object) -> None:
    global courtesy_pauses_taken
    courtesy_pauses_taken += 1
    time.sleep(COURTESY_PAUSE_S)


def _late_alarm(_signum: int, _frame: object) -> None:
    """An alarm of the stopped timer, taken late by another thread: nothing to do."""


@contextmanager
def courtesy_pauses() -> Iterator[bool]:
    """While the block runs, sleep COURTESY_PAUSE_S every COURTESY_EVERY_S of wall-clock
    time (a SIGALRM interval timer; Python runs the handler between bytecodes), then put
    back the SIGALRM handler it found, or a no-op one for its default action. Yields
    False, and pauses nothing, outside the main thread, where signals cannot be handled."""
    try:
        previous = signal.signal(signal.SIGALRM, _take_a_pause)
    except ValueError:
        yield False
        return
    signal.setitimer(signal.ITIMER_REAL, COURTESY_EVERY_S, COURTESY_EVERY_S)
    try:
        yield True
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        # The timer's last alarm may still be on its way: another thread of the process
        # can take it after the timer stopped. Under SIGALRM's default action Python would
        # then raise OSError ("ignored due to race condition") wherever the main thread
        # is (the test suite saw it about once in 40 runs), so a Python handler stays.
        signal.signal(signal.SIGALRM, previous if callable(previous) else _late_alarm)
