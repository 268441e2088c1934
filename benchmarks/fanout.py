"""Many viewers of one job: the server's CPU per viewer and each viewer's TTFF.

For each viewer count N the client creates one job (`POST /v1/videos`) and at once
opens N concurrent `GET .../content` streams. Viewers cost the server only on its
event-loop thread (the main thread: reading the log, writing sockets), so what one
more viewer costs is that thread's CPU time over the job, minus that of the same
job with no viewer (N = 0), divided by N. The whole process's CPU time is
reported too, but the decode's own run-to-run noise (~+-0.5 s here) hides viewers
in it. The client runs on the same 2 cores, so viewers' TTFF here include the
client's own work of reading N streams.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

from benchmarks.client import (
    ServerProcess,
    client_session,
    count_frames,
    cpu_seconds,
    receive,
)

POLL_S = 0.25


async def run_fanout(
    server: ServerProcess, body: bytes, planned_frames: int, fps: int, viewer_counts: list[int]
) -> list[dict[str, Any]]:
    records = []
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
    return records


async def _one_job(
    server: ServerProcess, session: Any, body: bytes, planned_frames: int, fps: int, viewers: int
) -> dict[str, Any]:
    cpu_before = cpu_seconds(server.pid)
    loop_cpu_before = cpu_seconds(server.pid, tid=server.pid)
    client_cpu_before = time.process_time()
    started = time.monotonic()
    async with session.post(f"{server.url}/v1/videos?fps={fps}", data=body) as response:
        if response.status != 201:
            raise RuntimeError(f"POST /v1/videos: HTTP {response.status}")
        job = await response.json()
    content = f"{server.url}{job['urls']['content']}"
    received = await asyncio.gather(
        *(
            receive(session, "GET", content, started=started, keep_body=index == 0)
            for index in range(viewers)
        )
    )
    final = await _poll(session, f"{server.url}{job['urls']['self']}")
    finished = time.monotonic()
    record: dict[str, Any] = {
        "viewers": viewers,
        "status": final["status"],
        "server_cpu_s": cpu_seconds(server.pid) - cpu_before,
        "loop_cpu_s": cpu_seconds(server.pid, tid=server.pid) - loop_cpu_before,
        "client_cpu_s": time.process_time() - client_cpu_before,
        "job_total_s": finished - started,
        "server_ttff_s": final["timings"]["time_to_first_fragment_s"],
    }
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


async def _poll(session: Any, url: str) -> Any:
    while True:
        async with session.get(url) as response:
            job = await response.json()
        if job["status"] in ("completed", "failed", "cancelled"):
            return job
        await asyncio.sleep(POLL_S)
