"""Encode mostly in the decode's gaps: a thread pool whose threads run at a lower priority.

On a machine whose cores the decode fills, the encoder's CPU has to come from
somewhere. At the same priority, the scheduler gives the encode thread a core
whenever it has a chunk, preempting whichever decode thread held it; a chunked
decode is several threads that wait for each other (`tiny` on a CPU: the decode
thread's step-to-step chain and two pool threads), so a preempted one stalls the
others, and the whole video takes longer than the encoder's CPU alone explains.
Ten nice levels below the rest of the process (Linux's per-thread nice: at nice 10
a weight of 110 against a normal thread's 1024) the encoder rarely preempts a
decode thread and runs in the decode's gaps and after it, yet still gets about a
tenth of a core's share when everything else is busy. The pipeline's bounded queue
keeps the decode from running away from it, and a chunk taken while another already
waits goes to a normal-priority thread (`vaecast.pipeline.run.run_pipeline`).

Why not Linux's idle class (`SCHED_IDLE`, which this module used first): an idle
thread gets next to nothing (a weight of 3) whenever other processes keep the cores
busy, and every chunk handed to it while the encoder had caught up then waited
seconds for it; on an idle machine the two are alike. With every chunk lowered, the
first fragment's encode waits for a gap in the second chunk's decode, so the first
chunk is encoded at normal priority (`vaecast.pipeline.run.Workers.encode`). The
measurements are in benchmarks/results/design_notes.md ("The encoder's thread
priority").

Linux only: nice is per thread there. Where it is refused (a seccomp filter, say)
the thread keeps its priority. Elsewhere nothing is changed: `setpriority` would
lower the whole process.
"""

from __future__ import annotations

import logging
import os
import sys
from concurrent.futures import ThreadPoolExecutor

log = logging.getLogger(__name__)

# How many nice levels a lowered thread goes below the thread that started it: about a
# tenth of its share when the two compete.
LOWERED_BY = 10
MAX_NICE = 19


def lowered_nice(nice: int) -> int:
    """The nice value a thread at `nice` is lowered to."""
    return min(MAX_NICE, nice + LOWERED_BY)


def lower_this_thread() -> str:
    """Lower the calling thread by `LOWERED_BY` nice levels (to 19 at most); returns
    what it got ("nice N" or "unchanged"). A thread cannot raise its priority again
    without privileges, so only threads that keep it for life (a lowered pool's)
    should call this."""
    if not sys.platform.startswith("linux"):
        return "unchanged"
    target = lowered_nice(os.getpriority(os.PRIO_PROCESS, 0))  # Linux: this thread's
    try:
        os.setpriority(os.PRIO_PROCESS, 0, target)  # Linux: this thread only
        return f"nice {target}"
    except OSError as error:
        log.debug("nice %d refused (%s); the encode thread keeps its priority", target, error)
        return "unchanged"


def lowered_pool(threads: int, name: str) -> ThreadPoolExecutor:
    """A pool whose every thread runs at a lowered priority (`lower_this_thread`),
    its threads started now (one at least; a pool starts threads as work comes), not
    at the first chunk that happens to find the encoder caught up."""
    pool = ThreadPoolExecutor(threads, thread_name_prefix=name, initializer=lower_this_thread)
    for _ in range(threads):
        pool.submit(int)
    return pool
