"""Encode throughput of libx264 presets at 832x480, as vaecast runs it.

Measures `H264Encoder.encode` (tune=zerolatency, RGB->yuv420p conversion by
`colour.from_rgb` included) on two stand-ins for decoded VAE frames, which
bracket real content: a drifting smooth gradient, and the same with fixed
per-pixel texture (Gaussian, sigma 4 levels) that costs x264 far more bits and
time. Prints frames/s and bitrate per content, preset and CRF; the numbers behind
the defaults in vaecast/codecs/h264.py (benchmarks/results/codecs_notes.md) come
from this script.

    python benchmarks/encode_presets.py [--frames 120] [--width 832] [--height 480]
"""

from __future__ import annotations

import argparse
import time
from fractions import Fraction

import numpy as np

from vaecast.codecs.colour import from_rgb
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
    args = parser.parse_args()
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


if __name__ == "__main__":
    main()
