"""Measure the `tiny` model against issue 3's bars; writes benchmarks/results/tiny_quality.json.

    nice -n 10 python benchmarks/tiny_quality.py [--clips 8] [--speed-runs 3]

- Quality: PSNR of encode -> streaming decode on held-out procedural clips
  (`random_clip` with generators seeded 1_000_000 + i; fitting draws its clips from
  one generator seeded 0 and never uses these), 81 frames at 832x480, first frame
  included, decoded output clamped to [0, 1]. Bar: mean >= 30 dB.
- Speed: `TinyDecoder.decode_chunks` on real latents of a 81-frame 832x480 clip,
  torch threads = 2, wall time from the call to the last chunk's callback (the
  callback does nothing). fps = 81 / that time; also per-chunk times. Several runs:
  the machine is shared, so the load average is recorded and the median run is the
  reported number. Bar: >= 24 fps.
- Size: the shipped weights file. Bar: <= 8 MB (8 * 2**20 bytes).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from vaecast.demo.scenes import random_clip
from vaecast.models.base import DecodedChunk
from vaecast.models.tiny import TinyDecoder, TinyEncoder, default_weights

RESULTS = Path(__file__).resolve().parent / "results" / "tiny_quality.json"
HELDOUT_SEED_BASE = 1_000_000
FRAMES, HEIGHT, WIDTH = 81, 480, 832
THREADS = 2
PSNR_BAR_DB, FPS_BAR, SIZE_BAR_BYTES = 30.0, 24.0, 8 * 2**20


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    return 10 * math.log10(1.0 / torch.mean((a - b) ** 2).item())


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def measure_quality(encoder: TinyEncoder, decoder: TinyDecoder, clips: int) -> dict[str, object]:
    per_clip = {}
    for i in range(clips):
        seed = HELDOUT_SEED_BASE + i
        clip = random_clip(torch.Generator().manual_seed(seed), FRAMES, HEIGHT, WIDTH)
        video = decoder.decode(encoder.encode(clip))
        per_clip[str(seed)] = {
            "psnr_db": round(psnr(video, clip), 3),
            "first_frame_psnr_db": round(psnr(video[:, :, :1], clip[:, :, :1]), 3),
        }
        print(f"clip {seed}: {per_clip[str(seed)]}", flush=True)
    mean = statistics.fmean(c["psnr_db"] for c in per_clip.values())
    return {
        "clips": per_clip,
        "mean_psnr_db": round(mean, 3),
        "bar_db": PSNR_BAR_DB,
        "passes": mean >= PSNR_BAR_DB,
    }


def _stamp_into(marks: list[float]) -> Callable[[DecodedChunk], None]:
    def on_chunk(chunk: DecodedChunk) -> None:
        marks.append(time.perf_counter())

    return on_chunk


def measure_speed(encoder: TinyEncoder, decoder: TinyDecoder, runs: int) -> dict[str, object]:
    clip = random_clip(torch.Generator().manual_seed(HELDOUT_SEED_BASE), FRAMES, HEIGHT, WIDTH)
    latents = encoder.encode(clip)
    decoder.decode(latents[:, :, :3])  # warm-up: first-call allocations and kernel selection
    results = []
    for _ in range(runs):
        marks: list[float] = []
        on_chunk = _stamp_into(marks)
        load = os.getloadavg()[0]
        start = time.perf_counter()
        decoder.decode_chunks(latents, on_chunk)
        total = marks[-1] - start
        chunk_ms = [1e3 * (b - a) for a, b in zip([start, *marks[:-1]], marks, strict=True)]
        results.append(
            {
                "seconds": round(total, 3),
                "fps": round(FRAMES / total, 2),
                "first_chunk_ms": round(chunk_ms[0], 1),
                "chunk_ms_median": round(statistics.median(chunk_ms[1:]), 1),
                "chunk_ms_max": round(max(chunk_ms[1:]), 1),
                "load_average_1min_before": round(load, 2),
            }
        )
        print(f"speed run: {results[-1]}", flush=True)
    fps = statistics.median(r["fps"] for r in results)
    return {
        "runs": results,
        "fps_median": fps,
        "fps_best": max(r["fps"] for r in results),
        "bar_fps": FPS_BAR,
        "passes": fps >= FPS_BAR,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clips", type=int, default=8)
    parser.add_argument("--speed-runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    torch.set_num_threads(THREADS)
    encoder, decoder = TinyEncoder(), TinyDecoder()
    weights = default_weights()
    size = weights.stat().st_size
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": {
            "cpu": cpu_name(),
            "cores": os.cpu_count(),
            "torch_threads": THREADS,
            "torch": torch.__version__,
        },
        "video": {"frames": FRAMES, "height": HEIGHT, "width": WIDTH},
        "speed": measure_speed(encoder, decoder, args.speed_runs),
        "quality": measure_quality(encoder, decoder, args.clips),
        "weights": {"bytes": size, "bar_bytes": SIZE_BAR_BYTES, "passes": size <= SIZE_BAR_BYTES},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(
        json.dumps(
            {k: report[k] for k in ("speed", "weights")}
            | {"mean_psnr_db": report["quality"]["mean_psnr_db"]},
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
