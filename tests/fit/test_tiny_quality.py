"""`benchmarks/tiny_quality.py`'s real-footage path: a held-out real clip through
`vaecast latents --video` and `vaecast decode` (subprocesses, real x264), read back and
scored, for the shipped weights and for a weights file given on the command line."""

from __future__ import annotations

import pytest

from benchmarks import tiny_quality
from vaecast.models.tiny import default_weights

# carphone's first 9 frames at their own 176x144: the shipped weights give ~23 dB
# there (small frames pack the most detail into each 8x8 block); untrained ~10 dB.
FLOOR_DB = 20.0


@pytest.mark.slow
@pytest.mark.usefixtures("need_clips")
def test_geometries() -> None:
    scaled = tiny_quality.real_source("city", "832x480", 5)
    native = tiny_quality.real_source("city", "native", 5)
    assert scaled.shape == (5, 480, 832, 3)
    assert native.shape == (5, 400, 720, 3)  # 405 rows cropped to a multiple of 8


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.usefixtures("need_clips")
def test_real_path_scores_a_held_out_clip() -> None:
    cli = tiny_quality.measure_real(None, "native", ("carphone",), 9)
    clip = cli["clips"]["carphone"]
    assert (clip["height"], clip["width"]) == (144, 176)
    assert clip["psnr_db"] > FLOOR_DB and clip["vae_psnr_db"] > FLOOR_DB
    # x264 adds a little loss on top of the VAE's, never a lot.
    assert abs(clip["vae_psnr_db"] - clip["psnr_db"]) < 3
    assert cli["frames"] == 9 and cli["worst_psnr_db"] == clip["psnr_db"]
    assert "vaecast latents --video" in cli["path"]
    # A weights file given by path takes the in-process encode; with the shipped file
    # it must score exactly what the CLI path scored (same pixels, same x264 input).
    given = tiny_quality.measure_real(default_weights(), "native", ("carphone",), 9)
    assert "in-process" in given["path"]
    assert given["clips"]["carphone"] == clip
