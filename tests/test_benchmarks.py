"""`python -m benchmarks` at a tiny size: the report's structure, and every arm's video.

No timing thresholds: the numbers live in the report. What is checked is what a
reader of the report relies on: every arm and reference ran, every response is a
video PyAV decodes to the planned frame count, the timeline has one point per chunk,
and the Markdown table and PNG were written.
"""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pytest
import torch
from safetensors.torch import save

from benchmarks.__main__ import main
from benchmarks.arms import ARMS, REFERENCES
from benchmarks.client import make_latents, tiny_weights_digest
from benchmarks.paired import PEERS, TARGETS, Verdict
from benchmarks.pipelines import ffmpeg_command
from benchmarks.profiling import summarize
from vaecast.codecs.h264 import EncoderSettings

FRAMES, CHUNKS, WIDTH, HEIGHT = 9, 3, 64, 48
REPEATS = 2
ROUNDS = 2
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_benchmark_smoke(tmp_path: Path) -> None:
    main(
        [
            "--frames", str(FRAMES), "--width", str(WIDTH), "--height", str(HEIGHT),
            "--repeats", str(REPEATS), "--rounds", str(ROUNDS), "--out", str(tmp_path),
            "--sections", "arms,fanout,memory,throughput",
            "--fanout", "1,3", "--fanout-repeats", "2",
            "--memory-frames", "5,9", "--memory-baseline-frames", "5",
            "--throughput-sizes", f"{WIDTH}x{HEIGHT}", "--throughput-frames", "5",
        ]
    )  # fmt: skip
    report = json.loads((tmp_path / "benchmarks.json").read_text())
    assert report["meta"]["frames"] == FRAMES

    runs = report["arms"]["runs"]
    assert sorted({r["arm"] for r in runs}) == sorted(ARMS + REFERENCES)
    rounds = [(repeat, round_) for repeat in range(REPEATS) for round_ in range(ROUNDS)]
    for arm in PEERS:
        assert [(r["repeat"], r["round"]) for r in runs if r["arm"] == arm] == rounds, arm
    for repeat, round_ in rounds:  # one vaecast run per peer and round, paired with it
        pairs = [
            r["pair"]
            for r in runs
            if r["arm"] == "vaecast" and (r["repeat"], r["round"]) == (repeat, round_)
        ]
        assert sorted(pairs) == sorted(PEERS)
    for run in (r for r in runs if r["arm"] in ARMS):
        assert run["status"] == 200
        assert run["frames_decoded"] == run["frames_planned"] == FRAMES, run["arm"]
        assert 0 < run["ttfb_s"] <= run["ttff_s"] <= run["last_byte_s"], run["arm"]
    for run in (r for r in runs if r["arm"] in REFERENCES):
        assert len(run["result"]["chunk_s"]) == CHUNKS

    summary = report["arms"]["summary"]
    assert set(summary["arms"]) == set(ARMS)
    for stats in summary["arms"].values():
        assert stats["frames_ok"] is True
        for key in ("ttff_over_first_chunk", "total_over_bound", "ttff_vs_vaecast"):
            assert stats[key] > 0
    assert summary["arms"]["vaecast"]["ttff_vs_vaecast"] == 1.0
    assert summary["references"]["pipeline_bound_s"] > 0
    paired_section = summary["paired"]
    assert len(paired_section["per_repeat"]) == len(paired_section["load"]) == REPEATS
    for name in TARGETS:
        entry = paired_section["summary"][name]
        assert entry["n"] == REPEATS and entry["median"] > 0
        assert entry["verdict"] == Verdict.TOO_FEW  # 2 repeats decide nothing
    for repeat in paired_section["load"]:
        assert repeat["wall_s"] > 0 and repeat["others_cores"] >= 0

    timelines = {t["arm"]: t for t in report["arms"]["timelines"]}
    assert set(timelines) == {"vaecast", "decode_then_encode"}
    for line in timelines.values():
        assert len(line["decoded_s"]) == len(line["encoded_s"]) == CHUNKS
        assert len(line["received_s"]) == CHUNKS
        assert None not in line["encoded_s"]

    memory = report["memory"]["runs"]
    assert [(r["arm"], r["frames"]) for r in memory] == [
        ("vaecast", 5),
        ("vaecast", 9),
        ("decode_then_encode", 5),
    ]
    for run in memory:
        assert run["frames_decoded"] == run["frames"]
        assert run["peak_rss_mb"] >= run["idle_rss_mb"] > 0
    assert "vaecast" in report["memory"]["per_100_frames"]

    fanout_runs = report["fanout"]["runs"]
    assert [(r["repeat"], r["viewers"]) for r in fanout_runs] == [
        (repeat, viewers) for repeat in range(2) for viewers in (0, 1, 3)
    ]
    for run in fanout_runs:
        if run["viewers"]:
            assert run["status"] == "completed"
            assert run["viewers_complete"] == run["viewers"]
            assert len(run["ttff_s"]["all"]) == run["viewers"]
            assert run["frames_decoded_first_viewer"] == FRAMES
            assert "server_cpu_s_per_viewer" in run
            # Few viewers are written by the loop; from THREAD_FROM_MEMBERS on, by the
            # fan-out thread (tests/server/test_broadcast.py checks which, deterministically).
            assert run["fanout_thread_cpu_s"] >= 0

    (throughput,) = report["throughput"]["runs"]
    for key in ("vaecast_path", "quantize_rgb", "swscale_rgb_to_yuv420", "ffmpeg_cli"):
        assert throughput[key]["fps"] > 0, key

    table = (tmp_path / "benchmarks.md").read_text()
    for title in (
        "Time to watch",
        "paired ratios",
        "Server memory",
        "Fan-out",
        "Encode throughput",
    ):
        assert title in table
    assert (tmp_path / "timeline.png").read_bytes().startswith(PNG_MAGIC)


def test_profile_summary_of_collapsed_stacks() -> None:
    collapsed = "\n".join(
        [
            "thread (11): vaecast-decode_0;run (vaecast/server/bridge.py:90);"
            "forward (vaecast/models/tiny.py:120) 30",
            "thread (11): vaecast-decode_0;run (vaecast/server/bridge.py:90);"
            "quantize_to_host (vaecast/codecs/quantize.py:50) 10",
            "thread (12): vaecast-encode_0;encode_chunk (vaecast/codecs/stream.py:110);"
            "from_rgb (vaecast/codecs/colour.py:100) 5",
            "thread (12): vaecast-encode_0;encode_chunk (vaecast/codecs/stream.py:110);"
            "encode (vaecast/codecs/h264.py:430) 5",
        ]
    )
    summary = summarize(collapsed, elapsed_s=1.0)
    assert summary["samples"] == 50
    assert summary["by_thread"] == {"vaecast-decode": 40, "vaecast-encode": 10}
    hot = summary["hot_path_samples"]
    assert hot["decoder forward (torch)"] == 30
    assert hot["quantize_to_host (float -> uint8 RGB)"] == 10
    assert hot["swscale RGB -> YUV (colour.from_rgb)"] == 5
    assert hot["x264 (self time of H264Encoder.encode)"] == 5
    assert hot["stream encode_chunk (all of the encode thread)"] == 10
    assert summary["top_self"][0] == ("forward (vaecast/models/tiny.py)", 30)


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("host_frames", ["yuv420", "rgb"])
def test_benchmark_arms_with_either_host_format(tmp_path: Path, host_frames: str) -> None:
    """Every arm, vaecast's own included, with YUV 4:2:0 made in torch (the bridge's way)
    or RGB converted by swscale on the encode thread."""
    main(
        [
            "--frames", str(FRAMES), "--width", str(WIDTH), "--height", str(HEIGHT),
            "--repeats", "1", "--out", str(tmp_path), "--sections", "arms",
            "--host-frames", host_frames, "--no-warmup",
        ]
    )  # fmt: skip
    report = json.loads((tmp_path / "benchmarks.json").read_text())
    assert report["meta"]["host_frames"] == host_frames
    arms = [r for r in report["arms"]["runs"] if r["arm"] in ARMS]
    assert sorted({r["arm"] for r in arms}) == sorted(ARMS)
    for run in arms:
        assert run["frames_decoded"] == run["frames_planned"] == FRAMES, run["arm"]


def test_cached_latents_are_named_after_the_encoder_that_made_them(tmp_path: Path) -> None:
    # Latents an older `tiny` encoder made are another video (another x264 load and
    # MP4 size): a file cached under a name without the weights' digest is not reused.
    stale = tmp_path / f"latents_showcase_5_{WIDTH}x{HEIGHT}.safetensors"
    stale.write_bytes(save({"latents": torch.zeros(1, 16, 2, HEIGHT // 8, WIDTH // 8)}))
    made = make_latents(5, WIDTH, HEIGHT, tmp_path)
    assert made.abs().sum() > 0
    fresh = {p.name for p in tmp_path.iterdir()} - {stale.name}
    assert fresh == {f"latents_showcase_5_{WIDTH}x{HEIGHT}_{tiny_weights_digest()}.safetensors"}
    assert torch.equal(make_latents(5, WIDTH, HEIGHT, tmp_path), made)  # read back


def test_the_ffmpeg_arm_encodes_at_vaecasts_quality():
    """The CLI pipe's x264 gets the rate control vaecast's encoder has: a constant QP, or CRF."""
    command = ffmpeg_command(832, 480, Fraction(16), EncoderSettings())
    assert command[command.index("-qp") + 1] == "21" and "-crf" not in command
    command = ffmpeg_command(832, 480, Fraction(16), EncoderSettings(crf=23))
    assert command[command.index("-crf") + 1] == "23" and "-qp" not in command
