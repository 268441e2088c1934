"""Many viewers of one job: the server's CPU per viewer and each viewer's TTFF.

For each viewer count N the client creates one job (`POST /v1/videos`) and at once
opens N concurrent `GET .../content` streams. Viewers cost the server on two threads:
the event loop (the main thread: their requests, the init segment each is written
alone, the end, and a few attribute updates per fragment) and the fan-out thread
(the progressive face's `fanout_sender.py`: one send per caught-up viewer per
fragment). What one more viewer costs the loop is that thread's CPU time over the job, minus that of
the same job with no viewer (N = 0) in the same round, divided by N. The figure the
issue sets a goal for is the loop's CPU as a share of one core over the job
(`loop_cpu_pct`: loop CPU s / job wall s x 100), with N viewers and, for what the
viewers add, minus the N = 0 job's. The fan-out thread's CPU is reported beside it
(`fanout_thread_cpu_pct`, the thread found by its kernel name): those sends are real
work, moved off the loop, not gone; over loopback they also carry the client's side
of TCP (the receive runs in the sender's context). The loop's time in the kernel is
recorded apart (`loop_kernel_s`, /proc's 10 ms ticks). The whole process's CPU time
is reported too, but the decode's own run-to-run noise (~+-0.5 s here) hides viewers
in it. With `repeats`, the rounds (N = 0 first, then each N) run one after another
and the table gives each figure's median and range.

The client runs on the same 2 cores, so viewers' TTFF here include the client's own
work of reading N streams; to keep that work small, only the first viewer keeps and
parses its whole body (frames are counted from it), the others split boxes only up
to their first fragment and then just count bytes. A thousand viewers need more
file descriptors than a default soft limit of 1024: the client raises its own, and
the server's with prlimit, to the hard limit.
"""

from __future__ import annotations

import asyncio
import os
import resource
import statistics
import time
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks.client import (
    Received,
    ServerProcess,
    client_session,
    count_frames,
    cpu_seconds,
    receive,
)
from vaecast.codecs.fmp4_reader import TopLevelBoxSplitter
from vaecast.embed import FANOUT_THREAD_NAME as FANOUT_THREAD

# The job's status is asked for at this pace only while no viewer stream says when it
# ends: every request is loop work, and this measures the loop.
POLL_S = 1.0
# Per viewer: its socket in the client and in the server, and some to spare.
FDS_PER_VIEWER = 2
SPARE_FDS = 256


async def run_fanout(
    server: ServerProcess,
    body: bytes,
    planned_frames: int,
    fps: int,
    viewer_counts: list[int],
    repeats: int = 1,
) -> list[dict[str, Any]]:
    """`repeats` rounds of one job per viewer count (0 first in each round: what the
    others add is measured against the job with no viewer of the same round)."""
    records = []
    raise_open_files(max([0, *viewer_counts]) * FDS_PER_VIEWER + SPARE_FDS, server.pid)
    async with client_session(connections=0) as session:
        for repeat in range(repeats):
            round_ = []
            for viewers in [0, *viewer_counts]:
                record = await _one_job(server, session, body, planned_frames, fps, viewers)
                round_.append(record | {"repeat": repeat})
            idle = round_[0]
            for record in round_[1:]:
                extra = record["server_cpu_s"] - idle["server_cpu_s"]
                record["server_cpu_s_per_viewer"] = extra / record["viewers"]
                loop_extra = record["loop_cpu_s"] - idle["loop_cpu_s"]
                record["loop_cpu_s_per_viewer"] = loop_extra / record["viewers"]
                record["loop_cpu_pct_added"] = 100 * loop_extra / record["job_total_s"]
            records += round_
    return records


def thread_named(pid: int, name: str) -> int | None:
    """The id of `pid`'s thread that the kernel knows by `name`, if it has one."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            if (task / "comm").read_text().strip() == name:
                return int(task.name)
        except OSError:  # ended since the listing
            continue
    return None


def _fanout_thread_cpu_s(pid: int) -> float:
    """The server's fan-out thread's CPU so far (0 before its first send)."""
    tid = thread_named(pid, FANOUT_THREAD)
    return 0.0 if tid is None else thread_cpu_seconds(pid, tid)


def thread_cpu_seconds(pid: int, tid: int) -> float:
    """CPU time of one thread in ns resolution (schedstat's time on CPU), where /proc's
    utime + stime count 10 ms ticks: too coarse for the loop's ~0.1 s over a job."""
    try:
        on_cpu_ns = int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
    except (OSError, ValueError, IndexError):  # a kernel without schedstats
        return cpu_seconds(pid, tid=tid)
    return on_cpu_ns / 1e9


def thread_kernel_seconds(pid: int, tid: int) -> float:
    """System (kernel) CPU time of one thread, in /proc's clock ticks (10 ms)."""
    fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[12]) / os.sysconf("SC_CLK_TCK")  # stime


def raise_open_files(needed: int, server_pid: int | None = None) -> int:
    """Raise the soft RLIMIT_NOFILE of this process (and of `server_pid`) to at least
    `needed`, within the hard limit; return the soft limit now in force here."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    if server_pid is not None:
        theirs, their_hard = resource.prlimit(server_pid, resource.RLIMIT_NOFILE)
        limit = target if their_hard == resource.RLIM_INFINITY else min(target, their_hard)
        if theirs != resource.RLIM_INFINITY and theirs < limit:
            resource.prlimit(server_pid, resource.RLIMIT_NOFILE, (limit, their_hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


async def _one_job(
    server: ServerProcess, session: Any, body: bytes, planned_frames: int, fps: int, viewers: int
) -> dict[str, Any]:
    cpu_before = cpu_seconds(server.pid)
    sends_cpu_before = _fanout_thread_cpu_s(server.pid)
    loop_cpu_before = thread_cpu_seconds(server.pid, server.pid)
    loop_kernel_before = thread_kernel_seconds(server.pid, server.pid)
    client_cpu_before = time.process_time()
    started = time.monotonic()
    async with session.post(f"{server.url}/v1/videos?fps={fps}", data=body) as response:
        if response.status != 201:
            raise RuntimeError(f"POST /v1/videos: HTTP {response.status}")
        job = await response.json()
    content = f"{server.url}{job['urls']['content']}"
    received = await asyncio.gather(
        *(
            receive(session, "GET", content, started=started)
            if index == 0
            else _count(session, content, started)
            for index in range(viewers)
        )
    )
    final = await _poll(session, f"{server.url}{job['urls']['self']}")
    finished = time.monotonic()
    record: dict[str, Any] = {
        "viewers": viewers,
        "status": final["status"],
        "server_cpu_s": cpu_seconds(server.pid) - cpu_before,
        "loop_cpu_s": thread_cpu_seconds(server.pid, server.pid) - loop_cpu_before,
        "loop_kernel_s": thread_kernel_seconds(server.pid, server.pid) - loop_kernel_before,
        "fanout_thread_cpu_s": _fanout_thread_cpu_s(server.pid) - sends_cpu_before,
        "client_cpu_s": time.process_time() - client_cpu_before,
        "job_total_s": finished - started,
        "server_ttff_s": final["timings"]["time_to_first_fragment_s"],
    }
    record["loop_cpu_pct"] = 100 * record["loop_cpu_s"] / record["job_total_s"]
    record["fanout_thread_cpu_pct"] = 100 * record["fanout_thread_cpu_s"] / record["job_total_s"]
    if received:
        ttffs = [r.first_fragment_at - started for r in received if r.first_fragment_at]
        record |= {
            "ttff_s": {
                "median": statistics.median(ttffs),
                "min": min(ttffs),
                "max": max(ttffs),
                "all": ttffs,
            },
            "last_byte_s_max": max(r.last_byte_at - started for r in received),
            "viewers_complete": sum(
                r.status == 200 and r.size == received[0].size for r in received
            ),
            "bytes_per_viewer": received[0].size,
            "frames_decoded_first_viewer": count_frames(received[0].body),
            "frames_planned": planned_frames,
        }
    return record


async def _count(session: aiohttp.ClientSession, url: str, started: float) -> Received:
    """One more viewer, read cheaply: boxes split only up to its first fragment."""
    result = Received(started=started)
    splitter: TopLevelBoxSplitter | None = TopLevelBoxSplitter()
    init_seen = False
    async with session.get(url) as response:
        result.headers_at = time.monotonic()
        result.status = response.status
        async for data in response.content.iter_any():
            now = time.monotonic()
            if result.first_byte_at is None:
                result.first_byte_at = now
            result.size += len(data)
            for box in splitter.feed(data) if splitter is not None else ():
                kind = box[4:8]
                init_seen = init_seen or kind == b"moov"
                if kind == b"mdat" and init_seen:
                    result.first_fragment_at = now
                    splitter = None  # the rest is only counted
                    break
        result.last_byte_at = time.monotonic()
    return result


async def _poll(session: Any, url: str) -> Any:
    while True:
        async with session.get(url) as response:
            job = await response.json()
        if job["status"] in ("completed", "failed", "cancelled"):
            return job
        await asyncio.sleep(POLL_S)


def table(section: dict[str, Any]) -> list[str]:
    """The fan-out section of benchmarks.md (report.py's `_fanout_table` calls this)."""
    lines = [
        "## Fan-out: N concurrent viewers of one job",
        "",
        "| viewers | event-loop CPU, % of a core over the job | of which the viewers "
        "| event-loop CPU ms per viewer | of which in the kernel, s "
        "| fan-out thread CPU, % of a core | job s "
        "| TTFF median s | TTFF max s | viewers complete | client CPU s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    groups: dict[int, list[dict[str, Any]]] = {}
    for r in section["runs"]:
        groups.setdefault(r["viewers"], []).append(r)
    for viewers, runs in groups.items():
        per_viewer = _values(runs, "loop_cpu_s_per_viewer")
        ttff_medians = [r["ttff_s"]["median"] for r in runs if "ttff_s" in r]
        ttff_maxes = [r["ttff_s"]["max"] for r in runs if "ttff_s" in r]
        complete = _values(runs, "viewers_complete")
        lines.append(
            f"| {viewers} | {_spread(_values(runs, 'loop_cpu_pct'))} "
            f"| {_spread(_values(runs, 'loop_cpu_pct_added'))} "
            f"| {_s(_median([1000 * v for v in per_viewer]), 2)} "
            f"| {_s(_median(_values(runs, 'loop_kernel_s')), 2)} "
            f"| {_s(_median(_values(runs, 'fanout_thread_cpu_pct')), 2)} "
            f"| {_s(_median(_values(runs, 'job_total_s')), 2)} "
            f"| {_s(_median(ttff_medians))} | {_s(max(ttff_maxes, default=None))} "
            f"| {f'{sum(complete):g}' if complete else '-'}/{viewers * len(runs)} "
            f"| {_s(_median(_values(runs, 'client_cpu_s')), 2)} |"
        )
    repeats = len(next(iter(groups.values()), []))
    lines += [
        "",
        "The event loop's CPU (its thread's time on CPU, from schedstat) over the job's wall "
        'time; "of which the viewers" subtracts the same job with no viewer, in the same '
        "round. "
        + (
            f"Each figure is the median of {repeats} rounds, the range after it. "
            if repeats > 1
            else ""
        )
        + "On the loop, a viewer costs its request (accept, routing, headers, the init "
        "segment alone, the end) and a few attribute updates per fragment; the sends to "
        "caught-up viewers are made on the server's fan-out thread (its own column), "
        "which over loopback includes the client's TCP receive. The "
        "loop's kernel time (10 ms ticks) is mostly the upload's receive and the requests.",
    ]
    return [*lines, ""]


def _values(runs: list[dict[str, Any]], key: str) -> list[float]:
    return [r[key] for r in runs if r.get(key) is not None]


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _spread(values: list[float]) -> str:
    """The median; with more than one repeat, the range after it."""
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def _s(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"
