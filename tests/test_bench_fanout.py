"""benchmarks/fanout.py's process plumbing: file descriptors for 1,000 viewers, and the
loop thread's CPU time at a resolution finer than /proc's 10 ms ticks."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from benchmarks.fanout import (
    raise_open_files,
    table,
    thread_cpu_seconds,
    thread_kernel_seconds,
)


def test_open_files_are_raised_here_and_in_the_server_within_the_hard_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        resource.prlimit(child.pid, resource.RLIMIT_NOFILE, (256, hard))
        wanted = 2 * 1000 + 256
        now = raise_open_files(wanted, child.pid)
        expected = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        assert now >= expected
        assert resource.prlimit(child.pid, resource.RLIMIT_NOFILE)[0] >= expected
    finally:
        child.kill()
        child.wait()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_thread_cpu_time_counts_one_threads_work() -> None:
    pid = os.getpid()
    busy_for_s = 0.2
    tids: list[int] = []
    go, spun, leave = threading.Event(), threading.Event(), threading.Event()

    def spin() -> None:
        tids.append(threading.get_native_id())
        go.wait(10)
        end = time.thread_time() + busy_for_s
        while time.thread_time() < end:
            pass
        spun.set()
        leave.wait(10)

    thread = threading.Thread(target=spin)
    thread.start()
    try:
        while not tids:
            time.sleep(0.001)
        start = thread_cpu_seconds(pid, tids[0])
        mine = thread_cpu_seconds(pid, threading.get_native_id())
        go.set()
        assert spun.wait(30)
        spent = thread_cpu_seconds(pid, tids[0]) - start
        idle = thread_cpu_seconds(pid, threading.get_native_id()) - mine
    finally:
        go.set()
        leave.set()
        thread.join()
    assert busy_for_s - 0.02 < spent < busy_for_s + 0.1
    assert idle < 0.05


def test_the_table_gives_the_loops_share_of_a_core_and_the_viewers_part() -> None:
    runs = [
        {"viewers": 0, "loop_cpu_s": 0.06, "job_total_s": 3.0, "client_cpu_s": 0.0},
        {
            "viewers": 100,
            "loop_cpu_s": 0.18,
            "loop_kernel_s": 0.07,
            "job_total_s": 3.0,
            "client_cpu_s": 0.1,
        },
    ]
    for run in runs:
        run["loop_cpu_pct"] = 100 * run["loop_cpu_s"] / run["job_total_s"]
    runs[1] |= {
        "loop_cpu_s_per_viewer": 0.0012,
        "loop_cpu_pct_added": 4.0,
        "ttff_s": {"median": 0.2, "max": 0.3},
        "viewers_complete": 100,
    }
    runs[1] |= {"fanout_thread_cpu_pct": 1.5}
    lines = table({"runs": runs})
    assert "| 0 | 2.00 | - | - | - | - | 3.00 | - | - | -/0 | 0.00 |" in lines
    assert (
        "| 100 | 6.00 | 4.00 | 1.20 | 0.07 | 1.50 | 3.00 | 0.200 | 0.300 | 100/100 | 0.10 |"
        in lines
    )


def test_with_repeats_the_table_gives_each_figures_median_and_range() -> None:
    runs = []
    for repeat, (idle_s, busy_s, complete) in enumerate(
        [(0.03, 0.06, 10), (0.03, 0.09, 10), (0.03, 0.075, 9)]
    ):
        runs += [
            {"viewers": 0, "loop_cpu_s": idle_s, "job_total_s": 3.0, "client_cpu_s": 0.0},
            {
                "viewers": 10,
                "loop_cpu_s": busy_s,
                "loop_cpu_s_per_viewer": (busy_s - idle_s) / 10,
                "loop_cpu_pct_added": 100 * (busy_s - idle_s) / 3.0,
                "job_total_s": 3.0,
                "client_cpu_s": 0.1,
                "viewers_complete": complete,
                "ttff_s": {"median": 0.1 * (repeat + 1), "max": 0.5 + repeat},
            },
        ]
        for run in runs[-2:]:
            run["loop_cpu_pct"] = 100 * run["loop_cpu_s"] / run["job_total_s"]
            run["repeat"] = repeat
    lines = table({"runs": runs})
    assert "| 0 | 1.00 (1.00-1.00) | - | - | - | - | 3.00 | - | - | -/0 | 0.00 |" in lines
    assert (
        "| 10 | 2.50 (2.00-3.00) | 1.50 (1.00-2.00) | 4.50 | - | - | 3.00 | 0.200 | 2.500 "
        "| 29/30 | 0.10 |" in lines
    )
    assert any("median of 3 rounds" in line for line in lines)


def _kernel_seconds_over(pid: int, tid: int, work: Callable[[], object], cpu_s: float) -> float:
    """This thread's kernel time while it runs `work` for `cpu_s` of its own CPU time."""
    start = thread_kernel_seconds(pid, tid)
    end = time.thread_time() + cpu_s
    while time.thread_time() < end:  # the clock is a system call: call it rarely
        work()
    return thread_kernel_seconds(pid, tid) - start


def test_kernel_time_counts_a_threads_system_calls_not_its_python() -> None:
    """Reads of /dev/zero are kernel time; arithmetic in Python is not.

    The kernel splits a thread's CPU time into user and system by where its clock ticks
    fell. While other processes take the cores the samples are few and can fall badly
    (0.07 s of system time in 0.6 s of reads was seen under two CPU hogs), so the reads
    get three tries to show it; Python's arithmetic must show none in every one.
    """
    pid, tid = os.getpid(), threading.get_native_id()
    block = bytearray(1 << 20)
    with open("/dev/zero", "rb", buffering=0) as zero:
        for _ in range(3):
            python_only = _kernel_seconds_over(pid, tid, lambda: sum(range(200_000)), 0.3)
            assert python_only < 0.05
            syscalls = _kernel_seconds_over(pid, tid, lambda: zero.readinto(block), 0.3)
            if syscalls > 0.15:
                break
    assert syscalls > 0.15
