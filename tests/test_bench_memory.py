"""benchmarks/memory.py's arithmetic and sampler: the figures the memory section reports.

The server runs are in test_benchmarks' smoke test; here, the functions that turn
samples and records into "MB per 100 frames beyond the latents and the MP4", on
numbers whose answer is known.
"""

from __future__ import annotations

import mmap
import os
import time
from types import SimpleNamespace

import numpy as np
import pytest

from benchmarks.memory import MB, RssSampler, slopes, stream_growth_per_100, table


def record(frames: int, peak: float, latents: float, mp4: float) -> dict:
    return {
        "arm": "vaecast",
        "frames": frames,
        "width": 64,
        "height": 48,
        "idle_rss_mb": 100.0,
        "peak_rss_mb": peak,
        "growth_mb": peak - 100.0,
        "upload_peak_mb": 100.0 + 2 * latents,
        "stream_peak_mb": peak,
        "latents_mb": latents,
        "mp4_mb": mp4,
        "total_s": 1.0,
        "frames_decoded": frames,
        "stream_growth_mb_per_100": None,
    }


def test_beyond_latents_and_mp4_is_what_is_left_of_the_peak_slope() -> None:
    # Per 100 frames: latents 10, MP4 1, and 3 more that nothing accounts for.
    records = [record(f, 300 + 0.14 * f, 0.10 * f, 0.01 * f) for f in (81, 321, 1281)]
    per_100 = slopes(records)["vaecast"]
    assert per_100["peak_rss_mb"] == pytest.approx(14.0)
    assert per_100["beyond_latents_and_mp4_mb"] == pytest.approx(3.0)
    assert per_100["upload_peak_mb"] == pytest.approx(20.0)
    lines = "\n".join(table({"runs": records, "per_100_frames": slopes(records)}))
    assert "**3.0 MB beyond**" in lines
    assert "during the upload grows 20.0" in lines


def test_the_longest_length_run_again_gives_a_median_and_each_run() -> None:
    records = [record(f, 300 + 0.14 * f, 0.10 * f, 0.01 * f) for f in (81, 1281, 1281, 1281)]
    for r, within in zip(records, (None, 2.0, 3.5, 2.5), strict=True):
        r["stream_growth_mb_per_100"] = within
    per_100 = slopes(records)["vaecast"]
    # The MP4 is 1 MB per 100 frames: what is left of each run's growth.
    assert per_100["within_stream_beyond_mp4_mb"] == pytest.approx(1.5)
    assert per_100["within_stream_beyond_mp4_runs_mb"] == pytest.approx([1.0, 2.5, 1.5])
    lines = "\n".join(table({"runs": records, "per_100_frames": slopes(records)}))
    assert "1.5 beyond its MP4 (median of 3 runs: 1.0, 2.5, 1.5)" in lines


def test_growth_within_a_stream_is_its_floor_fitted_on_its_second_half() -> None:
    fps = 16
    # A fragment every 4 frames, one a second. Between two, RSS rises by a chunk's
    # working set (200 MB) and falls back; the floor grows 2 MB per 100 frames. The
    # first half also holds a 300 MB plateau that the fit must not see.
    media_s = [4 * i / fps for i in range(40)]
    arrivals = [10.0 + i for i in range(40)]
    samples = []
    for i, at in enumerate(arrivals):
        floor = 500 * MB + 2 * MB * (4 * i) / 100 + (300 * MB if i < 10 else 0)
        samples += [(at - 0.9, int(floor)), (at - 0.5, int(floor + 200 * MB))]
    received = SimpleNamespace(fragment_at=arrivals, fragment_media_s=media_s)
    growth = stream_growth_per_100(samples, received, fps)
    assert growth == pytest.approx(2 * MB, rel=1e-3)


def test_a_stream_too_short_has_no_growth_figure() -> None:
    received = SimpleNamespace(fragment_at=[1.0, 2.0], fragment_media_s=[0.0, 0.25])
    assert stream_growth_per_100([(0.5, 1), (1.5, 2)], received, 16) is None


def test_the_sampler_sees_this_process_grow() -> None:
    with RssSampler(os.getpid(), interval_s=0.001) as sampler:
        # The first sample is taken on entry, before the block exists, however late the
        # sampler's thread runs on a busy machine.
        before = len(sampler.samples)
        # Fresh pages from the kernel: memory from malloc may be pages this process freed
        # earlier and still holds (the whole suite runs in it), which add nothing to RSS.
        block = np.frombuffer(mmap.mmap(-1, 64 * 2**20), np.uint8)  # 64 MiB
        deadline = time.monotonic() + 10.0
        while len(sampler.samples) < before + 20 and time.monotonic() < deadline:
            block[::4096] += 1  # touched: now it counts
    start, end = sampler.samples[0][0], sampler.samples[-1][0]
    assert sampler.peak_between(start, end) - sampler.samples[0][1] > 50 * MB
    del block
