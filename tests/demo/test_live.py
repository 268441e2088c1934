"""The live demo: latent blocks rendered and encoded one at a time, and their sound."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch

from vaecast.demo.live import latent_block_frames, scene_latent_blocks
from vaecast.demo.sources import SceneSpec, scene_audio, scene_audio_span, scene_latents
from vaecast.errors import InvalidRequestError
from vaecast.models.tiny import TinyEncoder

# 9 latent frames: blocks of 2, 4 and 5 end with a shorter one.
SPEC = SceneSpec("showcase", frames=33, width=64, height=48, seed=1)


@pytest.fixture(scope="module")
def whole() -> torch.Tensor:
    return scene_latents(SPEC)


@pytest.mark.parametrize("block", [4, 8, 9])
def test_blocks_of_whole_passes_are_the_whole_clip_encode_bit_for_bit(whole, block):
    blocks = list(scene_latent_blocks(SPEC, block))
    sizes = [b.shape[2] for b in blocks]
    assert sizes == [block] * (9 // block) + ([9 % block] if 9 % block else [])
    assert torch.equal(torch.cat(blocks, dim=2), whole)


@pytest.mark.parametrize("block", [1, 2, 3, 5])
def test_other_blocks_match_it_to_float32_rounding(whole, block):
    # Fewer steps per encoder pass: oneDNN may block the step convs differently for the
    # smaller batch and round differently; a wrong causal state would be off by ~0.1.
    blocks = list(scene_latent_blocks(SPEC, block))
    assert {(b.shape[:2], b.shape[3:]) for b in blocks} == {(whole.shape[:2], whole.shape[3:])}
    torch.testing.assert_close(torch.cat(blocks, dim=2), whole, rtol=0, atol=1e-6)


def test_the_first_block_renders_only_its_own_frames():
    live = scene_latent_blocks(SPEC, block_latent_frames=1)
    assert live.latent_frames == 9 and live.frames_rendered == 0
    first = next(live)
    assert first.shape == (1, 16, 1, 6, 8)
    assert live.frames_rendered == 1  # frame 0 alone, not the 33 of the clip
    next(live)
    assert live.frames_rendered == 5 and live.latents_produced == 2
    three = scene_latent_blocks(SPEC, block_latent_frames=3)
    next(three)
    assert three.frames_rendered == 9


def test_latent_frames_map_to_their_video_frames():
    assert latent_block_frames(0, 1) == (0, 1)
    assert latent_block_frames(1, 1) == (1, 4)
    assert latent_block_frames(0, 3) == (0, 9)
    assert latent_block_frames(3, 2) == (9, 8)
    with pytest.raises(ValueError):
        latent_block_frames(2, 0)


def test_unchecked_specs_and_empty_blocks_are_refused():
    with pytest.raises(InvalidRequestError, match="frames must be 1 \\+ 4k"):
        scene_latent_blocks(SceneSpec("shapes", frames=6, width=64, height=48))
    with pytest.raises(ValueError, match="at least 1"):
        scene_latent_blocks(SPEC, block_latent_frames=0)


def test_the_encoder_stream_checks_each_block():
    stream = TinyEncoder().open_stream()
    with pytest.raises(InvalidRequestError, match="1 \\+ 4k"):
        stream.encode_block(torch.zeros(1, 3, 4, 16, 16))
    assert stream.encode_block(torch.zeros(1, 3, 1, 16, 16)).shape == (1, 16, 1, 2, 2)
    with pytest.raises(InvalidRequestError, match="4k frames, got 3"):
        stream.encode_block(torch.zeros(1, 3, 3, 16, 16))
    with pytest.raises(InvalidRequestError, match="like the first"):
        stream.encode_block(torch.zeros(1, 3, 4, 16, 24))
    assert stream.encode_block(torch.zeros(1, 3, 8, 16, 16)).shape == (1, 16, 2, 2, 2)
    assert stream.latent_frames == 3


@pytest.mark.parametrize("fps", [Fraction(16), Fraction(24000, 1001), Fraction(7)])
def test_audio_spans_concatenate_to_the_whole_soundtrack(fps):
    rate = 16_000
    whole = scene_audio(SPEC, fps, sample_rate=rate)
    # Spans of one latent frame each (clicks straddle their edges), then uneven ones.
    for blocks in ([(k, 1) for k in range(9)], [(0, 2), (2, 5), (7, 2)]):
        spans = [scene_audio_span(SPEC, fps, *latent_block_frames(*b), rate) for b in blocks]
        assert np.array_equal(np.concatenate(spans, axis=1), whole)
    assert np.abs(whole).max() > 0.3  # clicks are in there, not just the tone
    assert scene_audio_span(SPEC, fps, 5, 0, rate).shape == (2, 0)
    with pytest.raises(ValueError, match="not within the 33 frames"):
        scene_audio_span(SPEC, fps, 30, 4, rate)
