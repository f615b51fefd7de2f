"""Background priority for what `serve` computes off its event loop: the assignor pool's
processes and the log's flush thread.

On a machine with few CPUs, a pool process computing a run and a flush thread woken by its
fsync compete with the event loop, which answers heartbeats. At niceness 10 in SCHED_BATCH
they still get their share over time (unlike SCHED_IDLE they cannot starve), but a batch
task that wakes up never preempts a running one, so it does not cut into the loop's steps.
BENCHMARKS.md ("Tuning mechanisms: measured") has the figures: either one alone was
inside the spread between runs, the two together were not.
"""

from __future__ import annotations

import os
import threading

BACKGROUND_NICENESS = 10  # added to the niceness the thread had


def lower_this_thread() -> bool:
    """Put the calling thread (and the threads it starts later) at background priority;
    False where the system has no per-thread priorities or refuses (it keeps its own).
    Niceness cannot be raised back without privileges: call it only in a thread or process
    that does nothing but background work."""
    if not hasattr(os, "sched_setscheduler") or not hasattr(os, "SCHED_BATCH"):
        return False
    thread = threading.get_native_id()
    try:
        niceness = os.getpriority(os.PRIO_PROCESS, thread)
        os.setpriority(os.PRIO_PROCESS, thread, min(19, niceness + BACKGROUND_NICENESS))
        os.sched_setscheduler(thread, os.SCHED_BATCH, os.sched_param(0))
    except OSError:
        return False
    return True
