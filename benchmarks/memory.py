"""Peak resident memory of the server against video length, and where the growth is.

One fresh server process per (arm, length), so each peak (VmHWM) belongs to one
request: idle RSS after the model loads, then the peak while serving the whole
video to one client. vaecast should grow only by the compressed MP4 it keeps for
late viewers and by the latents the request itself carries (which any arm holds):
the figure to watch is the growth per 100 frames *beyond* those two
(`beyond_latents_and_mp4_mb`). The decode-then-encode baseline holds the whole
decoded video.

To say where a peak happens, a sampler thread reads the server's VmRSS every
`SAMPLE_S` while the request runs and splits it at the first response byte: the
`upload` phase (body read, parse, checks, job start) and the `stream` phase (decode,
encode, sending). A peak in the upload phase that grows with length is the body
held more than once; one in the stream phase is per-chunk buffers, the segment log
or the allocator keeping what was freed.

Across lengths the peaks carry tens of MB of run-to-run noise in the decode's working
set, which a slope over 81..1281 frames turns into +-3 MB per 100 frames. So each run
also reports the growth *within* its own stream (`stream_growth_mb_per_100`): the
floor of RSS between fragments against the frames sent so far, fitted over the
second half of the stream, where the working set has settled. That is what
the server keeps per frame while it streams (the MP4 for late viewers, and anything
that leaks), without the noise of one process against another.
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.arms import arm_url
from benchmarks.client import (
    client_session,
    count_frames,
    latents_body,
    make_latents,
    peak_rss_bytes,
    receive,
    rss_bytes,
    server_process,
)

MB = 1e6
SAMPLE_S = 0.005
SLOPE_KEYS = ("peak_rss_mb", "upload_peak_mb", "stream_peak_mb", "mp4_mb", "latents_mb")


class RssSampler:
    """VmRSS of `pid` every `interval_s` on a thread, with the moment of each sample."""

    def __init__(self, pid: int, interval_s: float = SAMPLE_S) -> None:
        self.pid, self.interval_s = pid, interval_s
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def __enter__(self) -> RssSampler:
        # The first sample is taken here, not on the thread: a thread that a busy machine
        # starts late would otherwise miss whatever the caller allocates right after.
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._sample()
            except (OSError, KeyError):
                return

    def _sample(self) -> None:
        self.samples.append((time.monotonic(), rss_bytes(self.pid)))

    def peak_between(self, start: float, end: float) -> int:
        inside = [rss for at, rss in self.samples if start <= at <= end]
        return max(inside, default=0)


def run_memory(
    arm_lengths: dict[str, list[int]],
    width: int,
    height: int,
    fps: int,
    model: str,
    device: str,
    work_dir: Path,
    host_frames: str | None = None,
) -> list[dict[str, Any]]:
    records = []
    for arm, lengths in arm_lengths.items():
        for frames in lengths:
            latents = make_latents(frames, width, height, work_dir)
            body = latents_body(latents, fps)
            with server_process(model, device, work_dir / "server.log", host_frames) as server:
                idle = rss_bytes(server.pid)
                with RssSampler(server.pid) as sampler:
                    received = asyncio.run(_one(arm_url(server, arm, fps), body))
                peak = peak_rss_bytes(server.pid)
            first_byte = received.first_byte_at or received.last_byte_at
            within = stream_growth_per_100(sampler.samples, received, fps)
            upload_peak = sampler.peak_between(received.started, first_byte)
            stream_peak = sampler.peak_between(first_byte, received.last_byte_at)
            records.append(
                {
                    "arm": arm,
                    "frames": frames,
                    "width": width,
                    "height": height,
                    "idle_rss_mb": idle / MB,
                    "peak_rss_mb": peak / MB,
                    "growth_mb": (peak - idle) / MB,
                    "upload_peak_mb": upload_peak / MB,
                    "stream_peak_mb": stream_peak / MB,
                    "latents_mb": latents.numel() * latents.element_size() / MB,
                    "body_mb": len(body) / MB,
                    "mp4_mb": len(received.body) / MB,
                    "total_s": received.last_byte_at - received.started,
                    "first_byte_s": first_byte - received.started,
                    "frames_decoded": count_frames(received.body),
                    "rss_samples": len(sampler.samples),
                    "stream_growth_mb_per_100": None if within is None else within / MB,
                }
            )
    return records


def stream_growth_per_100(
    samples: list[tuple[float, int]], received: Any, fps: int
) -> float | None:
    """Bytes of RSS per 100 frames kept within one stream, or None for a stream too
    short to fit: the floor of RSS between two fragments' arrivals (what stays once a
    chunk's working set is freed) against the frames sent by then, fitted over the
    stream's second half. A high-water mark would hide it under the first chunks'
    working-set spike."""
    points = []
    start, index = 0.0, 0
    for at, media_s in zip(received.fragment_at, received.fragment_media_s, strict=False):
        floor = None
        while index < len(samples) and samples[index][0] <= at:
            if samples[index][0] >= start:
                floor = samples[index][1] if floor is None else min(floor, samples[index][1])
            index += 1
        if floor is not None:
            points.append((media_s * fps, floor))
        start = at
    if not points:
        return None
    half = [(f, rss) for f, rss in points if f >= points[-1][0] / 2]
    if len(half) < 4 or half[-1][0] == half[0][0]:
        return None
    return 100 * _slope([f for f, _ in half], [float(rss) for _, rss in half])


async def _one(url: str, body: bytes) -> Any:
    async with client_session() as session:
        received = await receive(session, "POST", url, body)
    if received.status != 200:
        raise RuntimeError(f"{url}: HTTP {received.status}")
    return received


def slopes(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Least-squares MB per 100 frames of peak RSS (whole request, upload phase, stream
    phase), MP4 and latents, per arm; and the peak's growth beyond latents and MP4."""
    result = {}
    for arm in sorted({r["arm"] for r in records}):
        mine = [r for r in records if r["arm"] == arm]
        if len(mine) < 2:
            continue
        frames = [r["frames"] for r in mine]
        per_100 = {
            key: 100 * _slope(frames, [r[key] for r in mine])
            for key in SLOPE_KEYS
            if all(key in r for r in mine)
        }
        per_100["beyond_latents_and_mp4_mb"] = (
            per_100["peak_rss_mb"] - per_100["latents_mb"] - per_100["mp4_mb"]
        )
        # Within-stream growth of the longest length (the median when it ran more
        # than once, with every run's figure: its spread is the figure's noise).
        most = max(frames)
        longest = [
            r for r in mine if r["frames"] == most and r.get("stream_growth_mb_per_100") is not None
        ]
        if longest:
            mp4_per_100 = statistics.median(100 * r["mp4_mb"] / most for r in longest)
            within = [r["stream_growth_mb_per_100"] for r in longest]
            per_100["within_stream_mb"] = statistics.median(within)
            per_100["within_stream_beyond_mp4_mb"] = statistics.median(within) - mp4_per_100
            per_100["within_stream_beyond_mp4_runs_mb"] = [w - mp4_per_100 for w in within]
        result[arm] = per_100
    return result


def table(section: dict[str, Any]) -> list[str]:
    """The memory section of benchmarks.md (report.py's `_memory_table` calls this)."""
    lines = [
        "## Server memory against video length (one fresh server process per row)",
        "",
        "| arm | frames | size | idle RSS MB | peak RSS MB | growth MB | peak in upload MB "
        "| peak in stream MB | latents MB | MP4 MB | total s | frames ok |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|:-:|",
    ]
    for r in section["runs"]:
        lines.append(
            f"| {r['arm']} | {r['frames']} | {r['width']}x{r['height']} | {r['idle_rss_mb']:.0f} "
            f"| {r['peak_rss_mb']:.0f} | {r['growth_mb']:.0f} "
            f"| {_mb(r.get('upload_peak_mb'))} | {_mb(r.get('stream_peak_mb'))} "
            f"| {r['latents_mb']:.1f} | {r['mp4_mb']:.2f} | {r['total_s']:.1f} "
            f"| {'yes' if r['frames_decoded'] == r['frames'] else 'NO'} |"
        )
    lines.append("")
    for arm, slope in section["per_100_frames"].items():
        beyond = slope.get(
            "beyond_latents_and_mp4_mb",
            slope["peak_rss_mb"] - slope["latents_mb"] - slope["mp4_mb"],
        )
        phases = ""
        if "upload_peak_mb" in slope and "stream_peak_mb" in slope:
            phases = (
                f"; the peak during the upload grows {slope['upload_peak_mb']:.1f}, "
                f"during the stream {slope['stream_peak_mb']:.1f}"
            )
        within = ""
        if "within_stream_beyond_mp4_mb" in slope:
            runs = slope.get("within_stream_beyond_mp4_runs_mb", [])
            spread = ""
            if len(runs) > 1:
                spread = f" (median of {len(runs)} runs: " + ", ".join(f"{r:.1f}" for r in runs)
                spread += ")"
            within = (
                f"; within the longest stream RSS grows {slope['within_stream_mb']:.1f} MB "
                f"per 100 frames, {slope['within_stream_beyond_mp4_mb']:.1f} beyond its MP4"
                f"{spread}"
            )
        lines.append(
            f"- {arm}: peak RSS grows {slope['peak_rss_mb']:.1f} MB per 100 frames, "
            f"**{beyond:.1f} MB beyond** the uploaded latents ({slope['latents_mb']:.2f}) "
            f"and the MP4 kept for late viewers ({slope['mp4_mb']:.2f}){phases}{within}"
        )
    return [*lines, ""]


def _mb(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _slope(xs: list[float], ys: list[float]) -> float:
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    num = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True))
    den = sum((x - mean_x) ** 2 for x in xs)
    return num / den
