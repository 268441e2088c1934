"""How busy the machine was with other work while we measured.

`/proc/stat` counts the CPU time of the whole machine; the benchmark's own processes
(the server, with the children it has reaped such as the ffmpeg CLI, and this client)
are subtracted, and what is left is the time other processes took: in cores, the
average number of CPUs they kept busy. Steal time (a VM's host running someone else)
counts as theirs. The 1-minute load average is recorded alongside; it lags by a
minute, so the CPU time is the number to judge a repeat by.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_TICKS_HZ = os.sysconf("SC_CLK_TCK")
# /proc/stat "cpu" fields: user nice system idle iowait irq softirq steal (guest and
# guest_nice are already inside user and nice).
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)
_STEAL_FIELD = 7


@dataclass(frozen=True, slots=True)
class CpuSample:
    at_s: float  # monotonic
    busy_s: float  # every CPU of the machine, not idle
    steal_s: float
    ours_s: float  # the measured processes (and the children they reaped)
    loadavg_1min: float


def busy_and_steal(proc_stat: str) -> tuple[float, float]:
    """Busy and steal seconds of all CPUs from the text of /proc/stat."""
    for line in proc_stat.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            ticks = [int(value) for value in fields[1:]]
            ticks += [0] * (8 - len(ticks))
            busy = sum(ticks[i] for i in _BUSY_FIELDS)
            return busy / _TICKS_HZ, ticks[_STEAL_FIELD] / _TICKS_HZ
    raise ValueError("no aggregate cpu line in /proc/stat")


def process_cpu_s(proc_pid_stat: str) -> float:
    """utime + stime + cutime + cstime (seconds) from the text of /proc/PID/stat."""
    fields = proc_pid_stat.rsplit(")", 1)[1].split()
    return sum(int(fields[i]) for i in (11, 12, 13, 14)) / _TICKS_HZ


def sample(pids: Sequence[int] = ()) -> CpuSample:
    """The machine's counters now; `pids`: the measured processes besides this one."""
    busy, steal = busy_and_steal(Path("/proc/stat").read_text())
    own = os.times()
    ours = own.user + own.system + own.children_user + own.children_system
    for pid in pids:
        # A process that is gone: its time is in its parent's children counters.
        with contextlib.suppress(OSError):
            ours += process_cpu_s(Path(f"/proc/{pid}/stat").read_text())
    return CpuSample(time.monotonic(), busy, steal, ours, os.getloadavg()[0])


def between(before: CpuSample, after: CpuSample) -> dict[str, Any]:
    """The load between two samples: other processes' CPU time, in seconds and cores."""
    wall = max(after.at_s - before.at_s, 1e-9)
    others = max(0.0, (after.busy_s - before.busy_s) - (after.ours_s - before.ours_s))
    return {
        "wall_s": wall,
        "others_cpu_s": others,
        "others_cores": others / wall,
        "steal_cores": max(0.0, after.steal_s - before.steal_s) / wall,
        "ours_cores": max(0.0, after.ours_s - before.ours_s) / wall,
        "loadavg_1min": [before.loadavg_1min, after.loadavg_1min],
    }
