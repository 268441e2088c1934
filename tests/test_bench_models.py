"""`python -m benchmarks.models` on one tiny model, one repeat: a real `vaecast serve`, the
in-process arms, and the results files' structure (no timing is asserted)."""

from __future__ import annotations

import dataclasses
import json
import math
import mmap
from pathlib import Path

import pytest

from benchmarks import models
from tests.helpers.models import WAN_TINY_CONFIG

# diffusers' tiny Wan test architecture with the benchmark's latent statistics: 2x2 latents
# of 3 frames, 16x16 pixels in 3 chunks.
TINY_WAN = dataclasses.replace(
    models.SPECS["wan2.1"],
    config={**WAN_TINY_CONFIG, **models.SPECS["wan2.1"].config},
    latent_shape=(16, 3, 2, 2),
)


def positive(value: object) -> bool:
    return isinstance(value, float) and math.isfinite(value) and value > 0


@pytest.mark.slow
def test_one_model_one_repeat_writes_its_row(tmp_path: Path) -> None:
    models.run([TINY_WAN], repeats=1, out=tmp_path)
    result = json.loads((tmp_path / "models.json").read_text())
    meta = result["meta"]
    for key in ("commit", "machine", "started_utc", "finished_utc", "torch_threads", "encoder"):
        assert meta[key], key
    assert meta["repeats"] == 1

    entry = result["models"]["wan2.1"]
    geometry = entry["geometry"]
    assert geometry["latent_channels"] == 16
    assert (geometry["spatial_compression"], geometry["temporal_compression"]) == (8, 4)
    assert geometry["chunk_frames"] == [1, 4, 4]
    assert (geometry["frames"], geometry["width"], geometry["height"]) == (9, 16, 16)
    # Wan's chunks are vae.decode's to rounding (bit for bit with one thread), compared
    # with the pipeline arm's own frames.
    exactness = entry["exactness"]
    assert exactness["vs_path"]["max_abs_diff"] <= 1e-5
    assert "vs_loaded" not in exactness  # the decoder keeps the pipeline's path
    assert 0 < exactness["first_chunk_s"] <= exactness["decode_s"]
    assert entry["commit"] and entry["measured_utc"]
    assert positive(entry["server_warmup"]["ttff_s"])

    summary = entry["summary"]
    assert summary["frames_ok"]
    for name in ("ttff_over_first_chunk", "total_over_pipeline", "ttff_over_pipeline"):
        spread = summary["ratios"][name]
        assert spread["n"] == 1
        assert all(positive(spread[key]) for key in ("median", "q1", "q3", "low", "high")), name
    assert all(positive(seconds) for seconds in summary["seconds"].values())
    arms = sorted((run["arm"], run["pair"]) for run in entry["runs"])
    assert arms == [
        ("first_chunk", "first_chunk"),
        ("pipeline", "pipeline"),
        ("vaecast", "first_chunk"),
        ("vaecast", "pipeline"),
    ]

    table = (tmp_path / "models.md").read_text()
    assert "| wan2.1 | AutoencoderKLWan |" in table
    assert "| 1, 4, 4 |" in table
    assert table.count("| wan2.1 |") == 3  # a row in each table
    # Whether the targets are met, said in words: the ratios decide.
    ratios = summary["ratios"]
    met = (
        "yes" if ratios["ttff_over_pipeline"]["median"] <= 0.5 else "no",
        "yes" if ratios["total_over_pipeline"]["median"] <= 1.0 else "no",
    )
    assert f"| {met[0]}, {met[1]} |" in table
    assert "- wan2.1: commit " in table


def run_with_memory_for_one_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    """The tiny model measured on a machine with memory for one private copy of its
    weights, not two: its entry in models.json."""
    weights = models.weights_bytes(TINY_WAN)
    monkeypatch.setattr(models, "available_memory_bytes", lambda: 2 * weights)
    models.run([TINY_WAN], repeats=1, out=tmp_path)
    return json.loads((tmp_path / "models.json").read_text())["models"]["wan2.1"]


@pytest.mark.slow
def test_weights_that_fit_once_but_not_twice_are_measured_one_copy_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(models, "mapped_bytes", lambda folder: 0)  # weights read, not mapped
    entry = run_with_memory_for_one_copy(tmp_path, monkeypatch)
    assert entry["one_copy"] and not entry["weights_shared"]
    # vaecast's arms ran before the in-process ones, every pair still complete.
    arms = [run["arm"] for run in entry["runs"]]
    assert arms == ["vaecast", "vaecast", *sorted(arms[2:])] and len(arms) == 4
    assert entry["exactness"]["vs_path"]["max_abs_diff"] <= 1e-5
    assert entry["summary"]["frames_ok"]
    assert "| wan2.1 (one copy at a time) |" in (tmp_path / "models.md").read_text()


@pytest.mark.slow
def test_mapped_weights_are_shared_with_the_server_so_pairs_stay_back_to_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    entry = run_with_memory_for_one_copy(tmp_path, monkeypatch)
    # diffusers maps the safetensors files: the page cache holds one copy for both.
    assert entry["weights_shared"] and not entry["one_copy"]
    # Each pair back to back, as `paired.schedule` orders the first repeat.
    arms = [(run["arm"], run["pair"]) for run in entry["runs"]]
    assert arms == [
        ("vaecast", "first_chunk"),
        ("first_chunk", "first_chunk"),
        ("pipeline", "pipeline"),
        ("vaecast", "pipeline"),
    ]
    assert "(one copy at a time)" not in (tmp_path / "models.md").read_text()


def test_mapped_bytes_counts_this_process_s_mappings_of_a_folder_s_files(tmp_path: Path) -> None:
    inside, outside = tmp_path / "weights", tmp_path / "other"
    inside.mkdir()
    outside.mkdir()
    (inside / "a.bin").write_bytes(b"x" * 3 * 4096)
    (outside / "b.bin").write_bytes(b"y" * 5 * 4096)
    assert models.mapped_bytes(inside) == 0
    with (
        (inside / "a.bin").open("rb") as a,
        (outside / "b.bin").open("rb") as b,
        mmap.mmap(a.fileno(), 0, access=mmap.ACCESS_READ),
        mmap.mmap(b.fileno(), 0, access=mmap.ACCESS_READ),
    ):
        assert models.mapped_bytes(inside) == 3 * 4096
        assert models.mapped_bytes(outside) == 5 * 4096
    assert models.mapped_bytes(inside) == 0


def test_a_run_of_some_models_keeps_the_others_rows_when_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    earlier = {"meta": {}, "models": {"mochi": {"skipped": "measured before"}}}
    (tmp_path / "models.json").write_text(json.dumps(earlier))
    monkeypatch.setattr(models, "available_memory_bytes", lambda: 1)
    models.run([TINY_WAN], repeats=1, out=tmp_path, keep_others=True)
    kept = json.loads((tmp_path / "models.json").read_text())["models"]
    assert list(kept) == ["wan2.1", "mochi"]  # the models' own order
    assert kept["mochi"] == {"skipped": "measured before"}
    models.run([TINY_WAN], repeats=1, out=tmp_path)
    assert list(json.loads((tmp_path / "models.json").read_text())["models"]) == ["wan2.1"]


def test_a_model_too_big_for_the_memory_is_skipped_with_its_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(models, "available_memory_bytes", lambda: 1)
    models.run([TINY_WAN], repeats=1, out=tmp_path)
    entry = json.loads((tmp_path / "models.json").read_text())["models"]["wan2.1"]
    assert "available" in entry["skipped"]
    assert "- wan2.1: its" in (tmp_path / "models.md").read_text()


def test_unknown_models_and_no_repeats_are_usage_errors() -> None:
    for argv in (["--models", "wan2.1,nope"], ["--repeats", "0"]):
        with pytest.raises(SystemExit):
            models.main(argv)


def test_ltx_is_measured_at_its_pipelines_default_lengths_too() -> None:
    """Rows of their own (`--models ltx-video-161,ltx-2-121`), served as the model itself,
    from the same weights."""
    for key, name, frames in (("ltx-video-161", "ltx-video", 161), ("ltx-2-121", "ltx-2", 121)):
        spec = models.SPECS[key]
        assert (spec.key, spec.name, spec.frames) == (key, name, frames)
        assert models.SPECS[name].frames == 33 and models.SPECS[name].config == spec.config
        assert spec.params().get("num_frames", str(frames)) == str(frames)


def test_minimax_h3_is_measured_at_its_pipelines_default_length_too() -> None:
    """`--models minimax-h3-124`: the modular pipeline's default `num_frames` (124), as
    many latents as its before-denoise step makes for it, served as the model itself."""
    from diffusers.modular_pipelines.minimax_h3.before_denoise import MiniMaxH3PrepareLayoutStep
    from diffusers.modular_pipelines.minimax_h3.modular_pipeline import (
        align_num_frames,
        video_latent_num_frames,
    )

    (default,) = [p.default for p in MiniMaxH3PrepareLayoutStep().inputs if p.name == "num_frames"]
    frames = align_num_frames(default, 17, 5)  # (the VAE's clip_length, latents per clip)
    spec, short = models.SPECS["minimax-h3-124"], models.SPECS["minimax-h3"]
    assert (default, frames) == (124, 124)
    assert spec.latent_shape[1] == video_latent_num_frames(frames, 17, 5)
    assert (spec.name, spec.config, spec.latent_shape[2:]) == ("minimax-h3", short.config, (16, 16))
