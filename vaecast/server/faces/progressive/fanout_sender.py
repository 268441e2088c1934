"""The sends of every broadcast, made on one thread of their own instead of the event loop.

A live job's broadcast (`broadcast.py`) writes each segment to every caught-up viewer's
socket. With a hundred viewers that was most of the event loop's CPU during a job
(`perf` on the loop thread: ~40 % of it in the kernel's send path, which over loopback
also runs the client's receive; the loop's cost now: benchmarks/results/benchmarks.md,
"Fan-out"). Sends release the GIL, so on a thread they run beside the loop instead of
in its turns; the loop keeps one queue put per segment and a few attribute updates per
viewer.

The thread writes with `os.write` to a duplicate of each member's socket descriptor,
made when it joins (`open_member_socket`). The loop may close a connection's own
descriptor at any moment (a reset closes it from inside uvloop), and the next accepted
connection may get the same number: a write to a number the loop owns could then go to
another client. A duplicate keeps the socket itself alive until it is closed, so a
write after a reset fails with EPIPE/ECONNRESET instead. The duplicate shares the
original's non-blocking flag (one open file description): a full socket makes
`os.write` return short or raise BlockingIOError, never wait.

Who writes what, so that a viewer's bytes stay in order, is `broadcast.py`'s to keep:
a member is written only by this thread while any batch that names it is queued, and
the thread stops writing to a member (`detached`) at its first short or failed write,
leaving the rest to the loop. Batches are sent in the order they are queued and
reported back to the loop in that order (`call_soon_threadsafe` keeps it).

The queue is bounded: a loop that finds it full does not wait, and the broadcast's
members catch up alone instead. The thread starts with the first batch and is joined by
`close` (the progressive face's, at shutdown: a broadcast whose sender closed
lets its members catch up alone, on the loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import math
import os
import queue
import resource
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

# One batch per appended segment of any job; each takes ~15 us a member to send.
MAX_QUEUED_BATCHES = 64
# Python's name for the thread, and the kernel's (`top -H`, /proc/PID/task/TID/comm).
THREAD_NAME = "vaecast-fanout"

PR_SET_NAME = 15  # prctl(2)

# What `send` reports for a target, besides the count of bytes written.
FAILED = -1  # the connection is gone (EPIPE, ECONNRESET, ...)
SKIPPED = -2  # detached by an earlier batch: not written


class Target(Protocol):
    """A member as the thread sees it (`broadcast._Member`)."""

    fd: int | None  # the duplicate descriptor; closed by the loop only when no batch names it
    detached: bool  # set by the thread at a short or failed write


@dataclass(slots=True)
class SendBatch:
    frame: bytes
    targets: Sequence[Target]


Done = Callable[[SendBatch, list[int]], None]


def open_member_socket(fd: int) -> int | None:
    """A duplicate of a connection's socket descriptor for the thread, or None (then the
    viewer is written by the loop, as before) when the socket would block or
    descriptors run short: each duplicate is one more open file, and past three
    quarters of the process's limit the rest is kept for accepting connections."""
    try:
        duplicate = os.dup(fd)
    except OSError:
        return None
    # The kernel hands out the lowest free number: this one says how many are open.
    if duplicate >= _descriptor_ceiling() or os.get_blocking(duplicate):
        os.close(duplicate)
        return None
    return duplicate


def _descriptor_ceiling() -> float:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return math.inf if soft == resource.RLIM_INFINITY else soft * 3 // 4


def send(frame: bytes, target: Target) -> int:
    """Write `frame` to one target: the bytes written (short when its socket is full),
    FAILED, or SKIPPED. A target that took less than all of it is detached."""
    if target.detached or target.fd is None:
        return SKIPPED
    try:
        written = os.write(target.fd, frame)
    except BlockingIOError:
        written = 0
    except OSError:
        target.detached = True
        return FAILED
    if written < len(frame):
        target.detached = True
    return written


class FanoutSender:
    """One thread that sends batches; shared by every broadcast of a server."""

    def __init__(self, max_batches: int = MAX_QUEUED_BATCHES) -> None:
        self._queue: queue.Queue[tuple[SendBatch, asyncio.AbstractEventLoop, Done] | None]
        self._queue = queue.Queue(max_batches)
        self._thread: threading.Thread | None = None
        self._closed = False
        self.batches_sent = 0  # written by the thread only

    def submit(self, batch: SendBatch, done: Done) -> bool:
        """Queue `batch` (call on the loop); `done(batch, results)` is called on the loop
        once it is sent. False, and nothing queued, when the queue is full or closed."""
        if self._closed:
            return False
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
            self._thread.start()
        try:
            self._queue.put_nowait((batch, asyncio.get_running_loop(), done))
        except queue.Full:
            return False
        return True

    def close(self) -> None:
        """Send what is queued, then stop the thread (blocks: call off the loop)."""
        self._closed = True
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        _name_os_thread(THREAD_NAME)
        while (item := self._queue.get()) is not None:
            batch, loop, done = item
            results = [send(batch.frame, target) for target in batch.targets]
            self.batches_sent += 1
            # A closed loop raises: nobody is left to tell.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(done, batch, results)


def _name_os_thread(name: str) -> None:
    """Give the calling thread `name` in the kernel too (Linux; elsewhere nothing):
    Python 3.11 names its threads for itself only, and an operator or a benchmark
    looking for this thread's CPU finds it by this name."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)
