"""The pure parts of `benchmarks.ray_serve`: fast, no server, no Ray."""

from __future__ import annotations

import pickle
from fractions import Fraction

import numpy as np
import pytest

from benchmarks.client import vaecast_serve_url
from benchmarks.ray_serve import (
    arms,
    markdown,
    pickled_overhead,
    segment_sizes,
    summarize_concurrent,
    summarize_single,
    traffic,
)
from vaecast.cluster.records import Segment
from vaecast.codecs.colour import from_rgb
from vaecast.codecs.stream import VideoStreamEncoder


def real_mp4(chunk_frames: list[int]) -> tuple[bytes, bytes, list[bytes]]:
    """A real H.264 fMP4 of noise: the stream, its init segment and each fragment."""
    encoder = VideoStreamEncoder(64, 48, Fraction(16))
    rng = np.random.default_rng(0)
    try:
        init = encoder.init_segment
        fragments = [
            encoder.encode_chunk(from_rgb(rng.integers(0, 256, (n, 48, 64, 3), dtype=np.uint8)))
            for n in chunk_frames
        ]
        tail = encoder.finish()
    finally:
        encoder.close()
    return init + b"".join(fragments) + tail, init, fragments


def test_announced_url_reads_the_serve_line() -> None:
    line = "vaecast serving tiny, taehv on http://127.0.0.1:40123/\n"
    assert vaecast_serve_url(line) == "http://127.0.0.1:40123"
    assert vaecast_serve_url("vaecast: warning: listening on all interfaces\n") is None
    assert vaecast_serve_url("2026-12-01 INFO ray: started on node x\n") is None


def test_both_arms_are_command_lines_vaecast_accepts() -> None:
    from vaecast.cli import _parser

    parsed = {
        arm.name: _parser().parse_args(["serve", "--port", "0", "--model", "tiny", *arm.options])
        for arm in arms(replicas=2, max_jobs=4)
    }
    assert parsed["plain"].ray is None and parsed["plain"].decode_slots == 4
    assert parsed["ray"].ray == "local"
    assert (parsed["ray"].replicas, parsed["ray"].replica_cpus) == (2, 1.0)


def test_segment_sizes_are_the_encoders_own() -> None:
    mp4, init, fragments = real_mp4([1, 4, 4, 4])
    assert segment_sizes(mp4) == (len(init), [len(f) for f in fragments])


def test_pickled_overhead_is_what_pickle_adds() -> None:
    overhead = pickled_overhead(50_000)
    assert overhead == len(pickle.dumps(Segment(b"x" * 50_000), protocol=5)) - 50_000
    assert 0 < overhead < 200


def test_summaries_take_medians_and_the_difference() -> None:
    single = summarize_single(
        {
            "plain": [
                {"first_fragment_s": t, "total_s": 10 * t, "job_first_fragment_s": t / 2}
                for t in (0.1, 0.3, 0.2)
            ],
            "ray": [
                {"first_fragment_s": t, "total_s": 10 * t, "job_first_fragment_s": t / 2}
                for t in (0.5, 0.4, 0.6)
            ],
        }
    )
    assert single["plain"] == {
        "first_fragment_s": 0.2,
        "total_s": 2.0,
        "job_first_fragment_s": 0.1,
    }
    assert single["ray_added"]["first_fragment_s"] == pytest.approx(0.3)
    assert single["ray_added"]["total_s"] == pytest.approx(3.0)
    rows = summarize_concurrent(
        [
            {
                "arm": "ray",
                "jobs": 2,
                "wall_s": w,
                "job_s": [w, w / 2],
                "first_fragment_s": [0.1, 0.2],
            }
            for w in (4.0, 2.0, 3.0)
        ]
    )
    assert rows == [
        {
            "arm": "ray",
            "jobs": 2,
            "wall_s": 3.0,
            "job_s": 2.25,
            "first_fragment_s": pytest.approx(0.15),
            "jobs_per_s": pytest.approx(2 / 3),
        }
    ]


def test_markdown_names_every_row() -> None:
    mp4, _, fragments = real_mp4([1, 4])
    result = {
        "model": "tiny",
        "frames": 5,
        "width": 64,
        "height": 48,
        "repeats": 1,
        "replicas": 2,
        "concurrency_repeats": 1,
        "single": summarize_single(
            {
                "plain": [{"first_fragment_s": 0.1, "total_s": 1.0, "job_first_fragment_s": 0.05}],
                "ray": [{"first_fragment_s": 0.3, "total_s": 1.5, "job_first_fragment_s": 0.1}],
            }
        ),
        "traffic": traffic(4096, mp4),
        "concurrent": summarize_concurrent(
            [
                {"arm": arm, "jobs": 4, "wall_s": 2.0, "job_s": [1.0], "first_fragment_s": [0.1]}
                for arm in ("plain", "ray")
            ]
        ),
    }
    table = markdown(result)
    assert "| ray | 0.30 s | 0.10 s | 1.50 s |" in table
    assert "| Ray adds | +0.20 s | | +0.50 s |" in table
    assert f"| fragment, median (max) | {np.median([len(f) for f in fragments]):,.0f}" in table
    assert "| 4 | plain | 2.00 s |" in table and "| 4 | ray | 2.00 s |" in table
