"""Many viewers of one job: the server's CPU per viewer and each viewer's TTFF.

For each viewer count N the client creates one job (`POST /v1/videos`) and at once
opens N concurrent `GET .../content` streams. Viewers cost the server only on its
event-loop thread (the main thread: reading the log, writing sockets), so what one
more viewer costs is that thread's CPU time over the job, minus that of the same
job with no viewer (N = 0), divided by N. The whole process's CPU time is
reported too, but the decode's own run-to-run noise (~+-0.5 s here) hides viewers
in it. The figure the issue sets a goal for is the loop's CPU as a share of one core
over the job (`loop_cpu_pct`: loop CPU s / job wall s x 100), with N viewers and, for
what the viewers add, minus the N = 0 job's. The loop's time in the kernel is recorded
apart (`loop_kernel_s`, /proc's 10 ms ticks): the sockets' sends, which over loopback
also carry the client's side of TCP (the receive runs in the sender's context), a
cost no change to the server's Python can remove.

Live viewers are written to by the job's broadcast (vaecast/server/broadcast.py):
what one costs per fragment is one send, so the per-viewer figure is mostly the
kernel's part plus the viewer's own request (accept, routing, headers, init segment).

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

# The job's status is asked for at this pace only while no viewer stream says when it
# ends: every request is loop work, and this measures the loop.
POLL_S = 1.0
# Per viewer: its socket in the client and in the server, and some to spare.
FDS_PER_VIEWER = 2
SPARE_FDS = 256


async def run_fanout(
    server: ServerProcess, body: bytes, planned_frames: int, fps: int, viewer_counts: list[int]
) -> list[dict[str, Any]]:
    records = []
    raise_open_files(max([0, *viewer_counts]) * FDS_PER_VIEWER + SPARE_FDS, server.pid)
    async with client_session(connections=0) as session:
        for viewers in [0, *viewer_counts]:
            records.append(await _one_job(server, session, body, planned_frames, fps, viewers))
    idle = next(r for r in records if r["viewers"] == 0)
    for record in records:
        if record["viewers"]:
            extra = record["server_cpu_s"] - idle["server_cpu_s"]
            record["server_cpu_s_per_viewer"] = extra / record["viewers"]
            loop_extra = record["loop_cpu_s"] - idle["loop_cpu_s"]
            record["loop_cpu_s_per_viewer"] = loop_extra / record["viewers"]
            record["loop_cpu_pct_added"] = 100 * loop_extra / record["job_total_s"]
    return records


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
        "client_cpu_s": time.process_time() - client_cpu_before,
        "job_total_s": finished - started,
        "server_ttff_s": final["timings"]["time_to_first_fragment_s"],
    }
    record["loop_cpu_pct"] = 100 * record["loop_cpu_s"] / record["job_total_s"]
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
        "| event-loop CPU ms per viewer | of which in the kernel, s | job s "
        "| TTFF median s | TTFF max s | viewers complete | client CPU s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in section["runs"]:
        ttff = r.get("ttff_s", {})
        per_viewer = r.get("loop_cpu_s_per_viewer")
        added = r.get("loop_cpu_pct_added")
        lines.append(
            f"| {r['viewers']} | {r['loop_cpu_pct']:.2f} "
            f"| {'-' if added is None else f'{added:.2f}'} "
            f"| {'-' if per_viewer is None else f'{1000 * per_viewer:.2f}'} "
            f"| {_s(r.get('loop_kernel_s'), 2)} "
            f"| {r['job_total_s']:.2f} | {_s(ttff.get('median'))} | {_s(ttff.get('max'))} "
            f"| {r.get('viewers_complete', '-')}/{r['viewers']} | {r['client_cpu_s']:.2f} |"
        )
    lines += [
        "",
        "The event loop's CPU (its thread's time on CPU, from schedstat) over the job's wall "
        'time; "of which the viewers" subtracts the same job with no viewer. The viewers '
        "cost the server only on that thread (their requests, and one send per fragment "
        "each: caught-up viewers are written to by one broadcast loop). Its kernel time "
        "(10 ms ticks) is mostly those sends, which over loopback include the client's "
        "TCP receive.",
    ]
    return [*lines, ""]


def _s(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"
