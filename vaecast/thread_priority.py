"""Encode in the decode's idle time: a thread pool whose threads run at idle priority.

On a machine whose cores the decode fills, the encoder's CPU has to come from
somewhere. At the same priority, the scheduler gives the encode thread a core
whenever it has a chunk, preempting whichever decode thread held it; a chunked
decode is several threads that wait for each other (`tiny` on a CPU: the decode
thread's step-to-step chain and two pool threads), so a preempted one stalls the
others, and the whole video takes longer than the encoder's CPU alone explains.
At idle priority (Linux `SCHED_IDLE`) the encoder runs only when a core would
otherwise be idle: in the decode's own gaps (it keeps two cores ~95 % busy) and after
it. The pipeline's bounded queue keeps that safe: an encoder that falls behind fills
the queue, the decode then waits, and its cores are the encoder's.

Measured (the bench server, 81 frames at 832x480, `tiny`, 2 cores). 30 alternating
runs against a server encoding at normal priority: the whole video's last byte
0.955x (IQR 0.89-1.00) with the chunks after the first at idle priority, 0.966x at
nice 19; with every chunk at idle priority the first fragment came 1.11x later (its
encode waited for a gap in the second chunk's decode), so the first chunk is
encoded at normal priority (`vaecast.pipeline.Workers.encode`). Every arm against
the tree before, in one run (`python -m benchmarks.before_after`, 8 repeats, 22:38
UTC): vaecast's last byte 0.938x per repeat (0.86-1.13), its first fragment 0.936x;
last byte / decode alone 1.104 -> 1.061, / the best other arm 1.058 -> 1.002.

Linux only: `SCHED_IDLE` is per thread there. Where it is refused (a seccomp
filter, say), nice 19 is the fallback, also per thread on Linux. Elsewhere nothing
is changed: `setpriority` would lower the whole process.
"""

from __future__ import annotations

import logging
import os
import sys
from concurrent.futures import ThreadPoolExecutor

log = logging.getLogger(__name__)

# The fallback's nice value: the lowest priority a thread can ask for without privileges.
LOWEST_NICE = 19


def lower_this_thread() -> str:
    """Put the calling thread at idle priority; returns what it got ("idle", "nice 19",
    or "unchanged"). A thread cannot raise its priority again without privileges, so
    only threads that keep it for life (an idle pool's) should call this."""
    if not sys.platform.startswith("linux"):
        return "unchanged"
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # 0: this thread
        return "idle"
    except (OSError, AttributeError) as error:
        log.debug("SCHED_IDLE refused (%s); trying nice %d", error, LOWEST_NICE)
    try:
        os.setpriority(os.PRIO_PROCESS, 0, LOWEST_NICE)  # Linux: this thread only
        return f"nice {LOWEST_NICE}"
    except OSError as error:
        log.debug("nice %d refused (%s); the encode thread keeps its priority", LOWEST_NICE, error)
        return "unchanged"


def idle_pool(threads: int, name: str) -> ThreadPoolExecutor:
    """A pool whose every thread runs at idle priority (`lower_this_thread`)."""
    return ThreadPoolExecutor(threads, thread_name_prefix=name, initializer=lower_this_thread)
