"""Procedural scenes: deterministic by seed, the right shape and range, and moving."""

from __future__ import annotations

import pytest
import torch

from vaecast.demo.font import text_mask
from vaecast.demo.scenes import SCENE_NAMES, random_clip, render_scene, scene_reel
from vaecast.errors import InvalidRequestError


@pytest.mark.parametrize("name", SCENE_NAMES)
def test_scene_shape_range_and_determinism(name: str) -> None:
    video = render_scene(name, 6, 40, 72, seed=3)
    assert video.shape == (1, 3, 6, 40, 72)
    assert video.dtype == torch.float32
    assert video.min() >= 0.0 and video.max() <= 1.0
    assert torch.equal(video, render_scene(name, 6, 40, 72, seed=3))
    assert not torch.equal(video, render_scene(name, 6, 40, 72, seed=4))


@pytest.mark.parametrize("name", SCENE_NAMES)
def test_scene_moves(name: str) -> None:
    video = render_scene(name, 9, 48, 64, seed=0)
    assert not torch.equal(video[:, :, 0], video[:, :, 8])


def test_odd_sizes_and_a_single_frame() -> None:
    assert render_scene("showcase", 1, 37, 53).shape == (1, 3, 1, 37, 53)
    assert render_scene("text", 2, 1, 1).shape == (1, 3, 2, 1, 1)


def test_unknown_scene_lists_the_known_ones() -> None:
    with pytest.raises(InvalidRequestError) as caught:
        render_scene("sunset", 5, 32, 32)
    assert caught.value.message == (
        "unknown scene 'sunset'; known scenes: "
        "showcase, shapes, gradient, texture, text, landscape, fade, noise"
    )


def test_empty_or_huge_sizes_are_refused() -> None:
    with pytest.raises(InvalidRequestError, match="at least 1 frame of 1x1 pixels, got 0 frames"):
        render_scene("shapes", 0, 32, 32)
    with pytest.raises(InvalidRequestError, match="pixel limit"):
        render_scene("shapes", 10_000, 1080, 1920)


def test_random_clip_is_determined_by_its_generator() -> None:
    a = random_clip(torch.Generator().manual_seed(11), 5, 48, 80)
    b = random_clip(torch.Generator().manual_seed(11), 5, 48, 80)
    c = random_clip(torch.Generator().manual_seed(12), 5, 48, 80)
    assert a.shape == (1, 3, 5, 48, 80)
    assert a.min() >= 0.0 and a.max() <= 1.0
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_random_clips_vary() -> None:
    g = torch.Generator().manual_seed(0)
    clips = [random_clip(g, 3, 32, 32) for _ in range(8)]
    means = torch.stack([clip.mean() for clip in clips])
    assert means.std() > 0.02


def test_text_uses_the_built_in_font() -> None:
    t = text_mask("T")
    assert t.shape == (7, 5)
    assert t[0].tolist() == [1, 1, 1, 1, 1] and t[1:, 2].tolist() == [1] * 6
    assert t[1:].sum() == 6
    # Glyphs are 5 wide with 1 column between them; unknown characters draw as "?".
    assert torch.equal(text_mask("T?")[:, 6:], text_mask("~"))
    assert text_mask("ab").shape == (7, 11)
    assert torch.equal(text_mask("ab"), text_mask("AB"))


@pytest.mark.parametrize("name", SCENE_NAMES)
def test_a_reel_draws_the_scene_a_range_at_a_time(name: str) -> None:
    # Film grain draws from the scene's generator frame after frame: ranges in order
    # must draw the very same noise as the whole render.
    whole = render_scene(name, 13, 24, 40, seed=5)
    reel = scene_reel(name, 13, 24, 40, seed=5)
    parts = [reel.render(count) for count in (1, 4, 0, 3, 5)]
    assert torch.equal(torch.cat(parts, dim=2), whole)
    assert reel.next_frame == 13
    with pytest.raises(ValueError, match="cannot draw 1 frames from frame 13 of 13"):
        reel.render(1)
