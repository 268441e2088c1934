"""`python -m benchmarks.push`: a producer pushing at real-time pace, and a viewer.

A generator of 16 fps video makes 4 latent frames a second. This benchmark plays one:
it creates a push session on a benchmark server (a subprocess, `benchmarks.server`),
pushes one latent frame every 1/4 s over HTTP, and watches `/content` from the start.
The `frames` arm is a producer that decodes on its own: the same video, decoded here
beforehand, pushed as uint8 RGB in blocks of 4 frames every 1/4 s (`kind: frames`); its
latency is the encode and the delivery alone, next to the latents' decode as well.
It reports, per chunk, the block-to-viewer latency (from the push of the block that
completes the chunk to the chunk's fragment at the viewer) against that chunk's own
decode + encode time measured alone, and whether playback that starts at the first
fragment, after the wait the producer itself imposes, ever stalls (a fragment arriving
after its media time).

    python -m benchmarks.push [--frames 81] [--width 832] [--height 480] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save as save_safetensors

from benchmarks.client import client_session, make_latents, receive, server_process
from vaecast.codecs.quantize import quantize_to_host, quantize_yuv420_to_host
from vaecast.codecs.stream import VideoStreamEncoder
from vaecast.models.base import DecodedChunk
from vaecast.models.tiny import TinyDecoder
from vaecast.pipeline.bridge import chunk_to_host

RESULTS = Path(__file__).resolve().parent / "results"
FPS = 16
LATENT_FPS = 4.0  # 16 fps video: latent frame 0 is 1 frame, each later one 4
BLOCK_FRAMES = 4  # the frames producer's block: a quarter second of video


def reference_chunk_seconds(latents: torch.Tensor) -> list[float]:
    """Each chunk's decode + quantize + encode time, alone, in this process."""
    decoder = TinyDecoder()
    plan = decoder.plan(latents.shape)
    encoder = VideoStreamEncoder(plan.width, plan.height, Fraction(FPS))
    seconds: list[float] = []
    since = time.perf_counter()

    def on_chunk(chunk: DecodedChunk) -> None:
        nonlocal since
        encoder.encode_chunk(chunk_to_host(chunk, quantize_yuv420_to_host, decoder.value_range))
        now = time.perf_counter()
        seconds.append(now - since)
        since = time.perf_counter()

    try:
        decoder.decode_chunks(latents, on_chunk)
    finally:
        encoder.close()
    return seconds


def decoded_blocks(latents: torch.Tensor) -> list[torch.Tensor]:
    """The video as the frames producer has it: uint8 (T, H, W, 3) blocks of 4 frames
    (the first latent frame's 1 frame joins the next block: chunks of one size)."""
    frames = quantize_to_host(TinyDecoder().decode(latents), TinyDecoder.value_range)
    video = torch.from_numpy(frames)
    return [video[start : start + BLOCK_FRAMES] for start in range(0, len(video), BLOCK_FRAMES)]


async def one_run(url: str, latents: torch.Tensor, kind: str = "latents") -> dict[str, Any]:
    create = {"input": "push", "fps": FPS, **({"kind": "frames"} if kind == "frames" else {})}
    if kind == "frames":
        blocks_in = decoded_blocks(latents)
        bodies = [save_safetensors({"frames": block.contiguous()}) for block in blocks_in]
    else:
        bodies = [
            save_safetensors({"latents": latents[:, :, index : index + 1].contiguous()})
            for index in range(latents.shape[2])
        ]
    async with client_session() as session:
        async with session.post(f"{url}/v1/videos", json=create) as r:
            job = await r.json()
        push_url, token = job["push"]["url"], job["push"]["token"]
        started = time.monotonic()
        viewer = asyncio.create_task(
            receive(session, "GET", f"{url}{job['urls']['content']}", started=started)
        )
        events = asyncio.create_task(chunk_latencies(session, f"{url}{job['urls']['events']}"))
        pushed_at: list[float] = []
        blocks = len(bodies)
        for index, body in enumerate(bodies):
            due = started + index / LATENT_FPS
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            pushed_at.append(time.monotonic())
            params = {"final": "1"} if index == blocks - 1 else {}
            async with session.post(
                f"{url}{push_url}", data=body, headers={"X-Push-Token": token}, params=params
            ) as r:
                assert r.status == 202, await r.text()
        received = await viewer
        server_latency = await events
    # Causal `tiny`, and frames in blocks of one size: chunk i is completed by block i.
    latency = [at - pushed for at, pushed in zip(received.fragment_at, pushed_at, strict=True)]
    # A real-time generator whose first block is one frame long (the rest 4) makes any
    # viewer wait: the second block comes a block period after the first, which covers
    # only 1/FPS. Playback that starts that much after the first fragment is what the
    # producer allows; a stall past that would be ours.
    producer_wait_s = 1 / LATENT_FPS - 1 / FPS if kind == "latents" else 0.0
    play_from = received.fragment_at[0] + producer_wait_s
    late = [
        at - (play_from + media)
        for at, media in zip(received.fragment_at, received.fragment_media_s, strict=True)
    ]
    first = received.fragment_at[0]
    return {
        "kind": kind,
        "latency_s": latency,
        "server_latency_s": server_latency,
        "producer_wait_s": producer_wait_s,
        "stalls": sum(1 for lateness in late if lateness > 0),
        "worst_lateness_s": max(late),
        "smooth_start_after_first_fragment_s": received.smooth_start_s() + started - first,
        "first_fragment_s": first - started,
        "last_byte_s": received.last_byte_at - started,
        "producer_s": pushed_at[-1] - started,
    }


async def chunk_latencies(session: Any, events_url: str) -> list[float]:
    """Each `chunk` event's `latency_s` (the server's block-to-fragment time), read from
    the job's creation on: a finished job's events no longer list its chunks."""
    latencies: list[float] = []
    async with session.get(events_url) as response:
        event = ""
        async for line in response.content:
            text = line.decode().rstrip("\n")
            if text.startswith("event: "):
                event = text.removeprefix("event: ")
            elif text.startswith("data: ") and event == "chunk":
                latencies.append(float(json.loads(text.removeprefix("data: "))["latency_s"]))
            elif text.startswith("data: ") and event in ("done", "error"):
                break
    return latencies


def _p99(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    latents = make_latents(args.frames, args.width, args.height, RESULTS / "tmp")
    reference = reference_chunk_seconds(latents)
    runs, frames_runs = [], []
    with server_process("tiny", "cpu", RESULTS / "tmp" / "push_server.log", "yuv420") as server:
        for _ in range(args.repeats):  # the two producers alternate
            runs.append(await one_run(server.url, latents))
            frames_runs.append(await one_run(server.url, latents, kind="frames"))
    ratios = [
        latency / ref
        for run in runs
        for latency, ref in zip(run["latency_s"], reference, strict=True)
    ]
    latencies = [latency for run in runs for latency in run["latency_s"]]

    def spread(values: list[float]) -> dict[str, float]:
        return {"median": statistics.median(values), "p99": _p99(values)}

    arms = {
        name: {
            "viewer_latency_s": spread([v for run in arm for v in run["latency_s"]]),
            "server_latency_s": spread([v for run in arm for v in run["server_latency_s"]]),
            "stalls": [run["stalls"] for run in arm],
        }
        for name, arm in (("latents", runs), ("frames", frames_runs))
    }
    return {
        "arms": arms,
        "frames_runs": frames_runs,
        "frames": args.frames,
        "size": f"{args.width}x{args.height}",
        "latent_fps": LATENT_FPS,
        "repeats": args.repeats,
        "reference_chunk_s": {"median": statistics.median(reference), "p99": _p99(reference)},
        "latency_s": {"median": statistics.median(latencies), "p99": _p99(latencies)},
        "latency_over_reference": {"median": statistics.median(ratios), "p99": _p99(ratios)},
        "stalls": [run["stalls"] for run in runs],
        "runs": runs,
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--frames", type=int, default=81)
    parser.add_argument("--width", type=int, default=832)
    parser.add_argument("--height", type=int, default=480)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS / "push.json")
    args = parser.parse_args(argv)
    result = asyncio.run(main_async(args))
    args.out.write_text(json.dumps(result, indent=1))
    ref, lat, ratio = (
        result["reference_chunk_s"],
        result["latency_s"],
        result["latency_over_reference"],
    )
    print(
        f"| push at {LATENT_FPS:g} latent frames/s, {args.frames} frames {result['size']} "
        f"| {lat['median'] * 1000:.0f} / {lat['p99'] * 1000:.0f} ms "
        f"| {ref['median'] * 1000:.0f} / {ref['p99'] * 1000:.0f} ms "
        f"| {ratio['median']:.2f}x / {ratio['p99']:.2f}x | {result['stalls']} |"
    )
    for name, arm in result["arms"].items():
        viewer, server_side = arm["viewer_latency_s"], arm["server_latency_s"]
        print(
            f"| {name} push, 16 frames/s | latency_s {server_side['median'] * 1000:.0f} / "
            f"{server_side['p99'] * 1000:.0f} ms | at the viewer {viewer['median'] * 1000:.0f}"
            f" / {viewer['p99'] * 1000:.0f} ms | stalls {arm['stalls']} |"
        )
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
