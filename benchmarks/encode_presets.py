"""Encode throughput of libx264 presets at 832x480, as vaecast runs it.

Measures `H264Encoder.encode` (tune=zerolatency, RGB->yuv420p conversion by
`colour.from_rgb` included) on two stand-ins for decoded VAE frames, which
bracket real content: a drifting smooth gradient, and the same with fixed
per-pixel texture (Gaussian, sigma 4 levels) that costs x264 far more bits and
time. Prints frames/s and bitrate per content, preset and CRF; the numbers behind
the defaults in vaecast/codecs/h264.py (benchmarks/results/codecs_notes.md) come
from this script.

    python -m benchmarks.encode_presets [--frames 120] [--width 832] [--height 480]

With `--rate-control`, compares x264's rate control at the default preset instead:
CRF 23 against constant QPs, on the showcase as `tiny` decodes it and on each real
clip of `tools/real_clips.py` that is installed (the `fit` extra), 81 frames at
832x480: x264's CPU (the encoding thread's, median of `--rounds` alternating runs),
kB and PSNR over Y, U and V of the frames read back. For each clip it also gives the
size a constant QP needs for CRF 23's PSNR (interpolated between the two QPs around
it): the numbers behind the default QP in vaecast/codecs/h264.py.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

from vaecast.codecs.colour import Yuv420Frames, from_rgb
from vaecast.codecs.h264 import EncoderSettings, H264Encoder

PRESETS = ("ultrafast", "superfast", "veryfast")
CRFS = (20, 23, 26)
FPS = Fraction(16)


def clip(frames: int, width: int, height: int, texture_sigma: float) -> np.ndarray:
    t = np.arange(frames)[:, None, None]
    y, x = np.mgrid[0:height, 0:width]
    red = 128 + 90 * np.sin(2 * np.pi * (x / width + 0.02 * t))
    green = 128 + 90 * np.cos(2 * np.pi * (y / height + 0.015 * t))
    blue = np.broadcast_to(64 + 120 * (x + y) / (width + height), red.shape)
    texture = np.random.default_rng(0).normal(0, texture_sigma, size=(height, width, 3))
    rgb = np.stack([red, green, blue], axis=-1) + texture
    return rgb.clip(0, 255).round().astype(np.uint8)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=120)
    parser.add_argument("--width", type=int, default=832)
    parser.add_argument("--height", type=int, default=480)
    parser.add_argument("--rate-control", action="store_true", help="CRF against constant QPs")
    parser.add_argument("--rounds", type=int, default=5, help="runs per setting (--rate-control)")
    args = parser.parse_args()
    if args.rate_control:
        compare_rate_control(args.rounds)
        return
    print(f"{args.width}x{args.height}, {args.frames} frames, tune=zerolatency")
    print(f"{'content':8} {'preset':10} {'crf':>3} {'fps':>7} {'Mbit/s@16fps':>13}  codec")
    for content, sigma in (("smooth", 0.0), ("textured", 4.0)):
        frames = clip(args.frames, args.width, args.height, sigma)
        for preset in PRESETS:
            for crf in CRFS:
                report(content, frames, preset, crf)


def report(content: str, frames: np.ndarray, preset: str, crf: int) -> None:
    height, width = frames.shape[1:3]
    encoder = H264Encoder(width, height, FPS, EncoderSettings(preset, crf))
    encoder.encode(from_rgb(frames[:2]))  # the first frames pay one-off allocations
    start = time.perf_counter()
    samples = encoder.encode(from_rgb(frames))
    elapsed = time.perf_counter() - start
    encoder.close()
    mbps = 8 * sum(len(s.data) for s in samples) / (len(samples) / FPS) / 1e6
    print(
        f"{content:8} {preset:10} {crf:3d} {len(samples) / elapsed:7.1f} "
        f"{float(mbps):13.2f}  {encoder.codec_string}"
    )


RESULTS = Path(__file__).resolve().parent / "results"
RATE_CONTROLS = (("crf", 23), ("qp", 19), ("qp", 21), ("qp", 23), ("qp", 25), ("qp", 27))
CLIP_FRAMES, CLIP_WIDTH, CLIP_HEIGHT = 81, 832, 480


def compare_rate_control(rounds: int) -> None:
    print(
        f"x264 ultrafast zerolatency, one thread, {CLIP_WIDTH}x{CLIP_HEIGHT}, {CLIP_FRAMES} frames"
    )
    print(
        f"{'content':13} {'rate control':12} {'x264 ms':>8} {'vs crf':>6} {'kB':>7} {'PSNR dB':>7}"
    )
    for content, frames in rate_control_clips():
        runs: dict[tuple[str, int], list[tuple[float, int, float]]] = {r: [] for r in RATE_CONTROLS}
        for round_ in range(rounds):
            order = RATE_CONTROLS if round_ % 2 == 0 else RATE_CONTROLS[::-1]
            for rate_control in order:
                runs[rate_control].append(encode_and_measure(frames, *rate_control))
        baseline = statistics.median(cpu for cpu, _, _ in runs[RATE_CONTROLS[0]])
        points = []
        for (mode, value), measured in runs.items():
            cpu = statistics.median(c for c, _, _ in measured)
            _, size, psnr = measured[0]  # x264 is deterministic: every run is the same bytes
            points.append((mode, value, size, psnr))
            print(
                f"{content:13} {mode + ' ' + str(value):12} {1000 * cpu:8.1f} "
                f"{cpu / baseline:6.3f} {size / 1000:7.1f} {psnr:7.2f}"
            )
        _, _, crf_size, crf_psnr = points[0]
        matched = size_at_psnr(
            [(size, psnr) for mode, _, size, psnr in points if mode == "qp"], crf_psnr
        )
        if matched is not None:
            print(f"{content:13} a QP at CRF 23's PSNR: {matched / crf_size:.3f}x its size")


def rate_control_clips() -> list[tuple[str, Yuv420Frames]]:
    """The showcase as `tiny` decodes it, then each installed real clip, as YUV 4:2:0."""
    from benchmarks.client import make_latents
    from benchmarks.pipelines import decoded_pixels
    from vaecast.codecs.quantize import quantize_yuv420_to_host
    from vaecast.models.registry import get_decoder

    latents = make_latents(CLIP_FRAMES, CLIP_WIDTH, CLIP_HEIGHT, RESULTS / "tmp")  # cached
    chunks = decoded_pixels(get_decoder("tiny", device="cpu"), latents, quantize_yuv420_to_host)
    showcase = np.concatenate([chunk.planes for chunk in chunks])
    clips = [("showcase", Yuv420Frames(showcase, CLIP_HEIGHT, CLIP_WIDTH))]
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    import real_clips  # tools/ is not a package

    for clip in real_clips.CLIPS:
        if real_clips.clip_path(clip) is None:
            print(f"{clip.name}: skipped ({real_clips.missing_reason(clip.name)})")
            continue
        rgb = real_clips.scale_cover(real_clips.heldout_span(clip.name), CLIP_HEIGHT, CLIP_WIDTH)
        clips.append((clip.name, from_rgb(np.ascontiguousarray(rgb[:CLIP_FRAMES]))))
    return clips


def encode_and_measure(frames: Yuv420Frames, mode: str, value: int) -> tuple[float, int, float]:
    """(x264's CPU seconds on this thread, bytes, PSNR over the planes read back)."""
    settings = EncoderSettings(crf=value) if mode == "crf" else EncoderSettings(qp=value)
    encoder = H264Encoder(frames.width, frames.height, FPS, settings)
    start = time.thread_time()
    samples = encoder.encode(frames)
    cpu = time.thread_time() - start
    decoder = av.CodecContext.create("h264", "r")
    decoder.extradata = encoder.avcc  # the samples are avcC's length-prefixed NAL units
    encoder.close()
    pictures = [p for s in samples for p in decoder.decode(av.Packet(s.data))]
    pictures += decoder.decode(None)
    if len(pictures) != len(frames):
        raise RuntimeError(f"read back {len(pictures)} frames of {len(frames)}")
    squared_error = [
        np.mean((picture.to_ndarray(format="yuv420p").astype(np.float64) - planes) ** 2)
        for picture, planes in zip(pictures, frames.planes, strict=True)
    ]
    mse = max(float(np.mean(squared_error)), 1e-12)
    return cpu, sum(len(s.data) for s in samples), float(10 * np.log10(255**2 / mse))


def size_at_psnr(points: list[tuple[int, float]], psnr: float) -> float | None:
    """The size where the (size, PSNR) curve reaches `psnr`, linear between its neighbours."""
    points = sorted(points, key=lambda p: p[1])
    for (size_a, psnr_a), (size_b, psnr_b) in itertools.pairwise(points):
        if psnr_a <= psnr <= psnr_b:
            return size_a + (size_b - size_a) * (psnr - psnr_a) / (psnr_b - psnr_a)
    return None


if __name__ == "__main__":
    main()
