"""Encode throughput on identical frames: vaecast's encoder path against the ffmpeg CLI.

The frames are a rendered demo scene (float BCTHW in [0, 1], what a decoder hands
over), so no VAE time is in these numbers. vaecast's path, per 4-frame chunk as the
server runs it: `quantize_to_host` (float -> uint8 RGB, THWC), then `colour.from_rgb`
(swscale RGB -> yuv420p) and `VideoStreamEncoder.encode_chunk` (x264, fMP4 boxes). Its
stages are also timed alone, so the colour conversion's share is visible. Where
`vaecast.codecs.quantize` offers `quantize_yuv420_to_host` (RGB -> YUV 4:2:0 in torch
on the decoder's device), that path is measured as well. The ffmpeg CLI gets the
same frames as raw uint8 RGB on stdin (quantized beforehand, untimed) and the same
x264 settings; its time includes starting the process, reported apart.
"""

from __future__ import annotations

import statistics
import subprocess
import threading
import time
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import numpy as np
import torch

from benchmarks.pipelines import ffmpeg_command
from vaecast.codecs import quantize
from vaecast.codecs.colour import from_rgb
from vaecast.codecs.h264 import EncoderSettings
from vaecast.codecs.stream import VideoStreamEncoder
from vaecast.demo.scenes import render_scene

CHUNK_FRAMES = 4


def run_throughput(
    sizes: list[tuple[int, int]], frames: int, fps: int, repeats: int, settings: EncoderSettings
) -> list[dict[str, Any]]:
    records = []
    for width, height in sizes:
        video = render_scene("showcase", frames, height, width, seed=0)
        chunks = [video[:, :, s : s + CHUNK_FRAMES] for s in range(0, frames, CHUNK_FRAMES)]
        rgb = quantize.quantize_to_host(video, (0.0, 1.0))
        measures = _measures(chunks, rgb, Fraction(fps), settings)
        samples: dict[str, list[float]] = {name: [] for name in measures}
        for measure in measures.values():  # first calls pay one-off allocations
            measure()
        for _ in range(repeats):  # interleaved: every measure once per round
            for name, measure in measures.items():
                samples[name].append(measure())
        record: dict[str, Any] = {"width": width, "height": height, "frames": frames}
        for name, seconds in samples.items():
            median = statistics.median(seconds)
            count = 1 if name == "ffmpeg_cli_startup" else frames
            record[name] = {
                "seconds": median,
                "ms_per_frame": 1000 * median / count,
                "fps": count / median,
                "all_s": seconds,
            }
        records.append(record)
    return records


def _measures(
    chunks: list[torch.Tensor], rgb: np.ndarray, rate: Fraction, settings: EncoderSettings
) -> dict[str, Callable[[], float]]:
    measures: dict[str, Callable[[], float]] = {
        "quantize_rgb": lambda: _time(lambda: [_q_rgb(c) for c in chunks]),
        "quantize_rgb_before": lambda: _time(lambda: [_quantize_before(c) for c in chunks]),
        "swscale_rgb_to_yuv420": lambda: _time(lambda: from_rgb(rgb)),
        "encode_chunk_rgb": lambda: _encode_rgb(rgb, rate, settings),
        "vaecast_path": lambda: _vaecast_path(chunks, rate, settings),
        "ffmpeg_cli": lambda: _ffmpeg(rgb, rate, settings),
        "ffmpeg_cli_startup": lambda: _ffmpeg(rgb[:1], rate, settings),
    }
    if hasattr(quantize, "quantize_yuv420_to_host"):
        measures["quantize_yuv420_torch"] = lambda: _time(lambda: [_q_yuv(c) for c in chunks])
        measures["vaecast_path_yuv420"] = lambda: _vaecast_path_yuv(chunks, rate, settings)
    return measures


def _time(work: Callable[[], object]) -> float:
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def _q_rgb(chunk: torch.Tensor) -> np.ndarray:
    return quantize.quantize_to_host(chunk, (0.0, 1.0))


def _quantize_before(frames: torch.Tensor) -> np.ndarray:
    """`quantize_to_host` before the profile-driven rewrite (same bytes out), to time
    both in one run: separate temporaries per step, then permute + contiguous."""
    with torch.no_grad():
        x = frames[0].to(torch.promote_types(frames.dtype, torch.float32))
        scaled = (x - 0.0) * (255.0 / 1.0)
        pixels = torch.floor(scaled + 0.5).clamp_(0.0, 255.0).to(torch.uint8)
        return pixels.permute(1, 2, 3, 0).contiguous().cpu().numpy()


def _q_yuv(chunk: torch.Tensor) -> Any:
    return quantize.quantize_yuv420_to_host(chunk, (0.0, 1.0))  # type: ignore[attr-defined]


def _encode_rgb(rgb: np.ndarray, fps: Fraction, settings: EncoderSettings) -> float:
    stream = VideoStreamEncoder(rgb.shape[2], rgb.shape[1], fps, settings)
    seconds = _time(
        lambda: [
            stream.encode_chunk(from_rgb(rgb[s : s + CHUNK_FRAMES])) for s in range(0, len(rgb), 4)
        ]
    )
    stream.close()
    return seconds


def _vaecast_path(chunks: list[torch.Tensor], fps: Fraction, settings: EncoderSettings) -> float:
    height, width = chunks[0].shape[-2:]
    stream = VideoStreamEncoder(width, height, fps, settings)
    seconds = _time(lambda: [stream.encode_chunk(from_rgb(_q_rgb(chunk))) for chunk in chunks])
    stream.close()
    return seconds


def _vaecast_path_yuv(
    chunks: list[torch.Tensor], fps: Fraction, settings: EncoderSettings
) -> float:
    height, width = chunks[0].shape[-2:]
    stream = VideoStreamEncoder(width, height, fps, settings)
    seconds = _time(lambda: [stream.encode_chunk(_q_yuv(chunk)) for chunk in chunks])
    stream.close()
    return seconds


def _ffmpeg(rgb: np.ndarray, fps: Fraction, settings: EncoderSettings) -> float:
    command = ffmpeg_command(rgb.shape[2], rgb.shape[1], fps, settings)
    start = time.perf_counter()
    with subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE) as process:
        assert process.stdin is not None and process.stdout is not None
        stdout = process.stdout
        output: list[bytes] = []
        reader = threading.Thread(target=lambda: output.append(stdout.read()))
        reader.start()
        process.stdin.write(memoryview(np.ascontiguousarray(rgb)).cast("B"))
        process.stdin.close()
        reader.join()
        status = process.wait()
    seconds = time.perf_counter() - start
    if status != 0 or not output or not output[0]:
        raise RuntimeError(f"ffmpeg failed with {status}")
    return seconds
