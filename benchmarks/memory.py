"""Peak resident memory of the server against video length.

One fresh server process per (arm, length), so each peak (VmHWM) belongs to one
request: idle RSS after the model loads, then the peak while serving the whole
video to one client. vaecast should grow only by the compressed MP4 it keeps for
late viewers (and by the latents the request itself carries, which any arm holds);
the decode-then-encode baseline holds the whole decoded video.
"""

from __future__ import annotations

import asyncio
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


def run_memory(
    arm_lengths: dict[str, list[int]],
    width: int,
    height: int,
    fps: int,
    model: str,
    device: str,
    work_dir: Path,
    host_frames: str = "rgb",
) -> list[dict[str, Any]]:
    records = []
    for arm, lengths in arm_lengths.items():
        for frames in lengths:
            latents = make_latents(frames, width, height, work_dir)
            body = latents_body(latents, fps)
            with server_process(model, device, work_dir / "server.log", host_frames) as server:
                idle = rss_bytes(server.pid)
                received = asyncio.run(_one(arm_url(server, arm, fps), body))
                peak = peak_rss_bytes(server.pid)
            records.append(
                {
                    "arm": arm,
                    "frames": frames,
                    "width": width,
                    "height": height,
                    "idle_rss_mb": idle / MB,
                    "peak_rss_mb": peak / MB,
                    "growth_mb": (peak - idle) / MB,
                    "latents_mb": latents.numel() * latents.element_size() / MB,
                    "mp4_mb": len(received.body) / MB,
                    "total_s": received.last_byte_at - received.started,
                    "frames_decoded": count_frames(received.body),
                }
            )
    return records


async def _one(url: str, body: bytes) -> Any:
    async with client_session() as session:
        received = await receive(session, "POST", url, body)
    if received.status != 200:
        raise RuntimeError(f"{url}: HTTP {received.status}")
    return received


def slopes(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Least-squares MB per 100 frames of peak RSS, MP4 and latents, per arm."""
    result = {}
    for arm in sorted({r["arm"] for r in records}):
        mine = [r for r in records if r["arm"] == arm]
        if len(mine) < 2:
            continue
        result[arm] = {
            key: 100 * _slope([r["frames"] for r in mine], [r[key] for r in mine])
            for key in ("peak_rss_mb", "mp4_mb", "latents_mb")
        }
    return result


def _slope(xs: list[float], ys: list[float]) -> float:
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    num = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True))
    den = sum((x - mean_x) ** 2 for x in xs)
    return num / den
