"""The contract's shared rules: the full decode, the video geometry check, and the registry's
way of telling models that read weights from those that take none."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

from vaecast.errors import InvalidRequestError, UnknownModelError, WeightsError
from vaecast.models.base import (
    ChunkCallback,
    ChunkedDecoder,
    DecodedChunk,
    DecodePlan,
    check_video_geometry,
)
from vaecast.models.linear import LinearDecoder
from vaecast.models.registry import available_decoders, get_decoder, takes_weights
from vaecast.models.tiny import TinyDecoder


class CountingDecoder(ChunkedDecoder):
    """Chunk i is i + 1 frames of value i, in a buffer it reuses (chunks are borrowed)."""

    name = "counting"
    latent_channels = 1
    value_range = (0.0, 1.0)
    device = torch.device("cpu")

    def plan(self, latent_shape: Sequence[int]) -> DecodePlan:
        return DecodePlan(1, 1, tuple(range(1, int(latent_shape[2]) + 1)))

    def decode_chunks(self, latents: torch.Tensor, on_chunk: ChunkCallback) -> None:
        plan = self.plan(latents.shape)
        buffer = torch.empty(1, 1, plan.chunks, 1, 1)
        for index, start in enumerate(plan.chunk_starts):
            frames = buffer[:, :, : index + 1].fill_(index)
            on_chunk(DecodedChunk(frames, index, plan.chunks, start))


def test_decode_is_the_concatenation_of_the_chunks() -> None:
    decoder = CountingDecoder()
    assert isinstance(decoder, ChunkedDecoder)
    expected = torch.tensor([0, 1, 1, 2, 2, 2], dtype=torch.float32).view(1, 1, 6, 1, 1)
    assert torch.equal(decoder.decode(torch.zeros(1, 1, 3, 1, 1)), expected)


@pytest.mark.parametrize(("frames", "width", "height"), [(1, 8, 8), (5, 64, 48), (81, 832, 480)])
def test_video_geometry_takes_1_plus_4k_frames_and_sides_of_multiples_of_8(
    frames: int, width: int, height: int
) -> None:
    check_video_geometry(frames, width, height, spatial_scale=8, temporal_scale=4)


@pytest.mark.parametrize(
    ("frames", "width", "height", "message"),
    [
        (6, 64, 48, "frames must be 1 + 4k (1, 5, 9, ..., 81), got 6"),
        (0, 64, 48, "frames must be 1 + 4k (1, 5, 9, ..., 81), got 0"),
        (5, 60, 48, "width and height must be positive multiples of 8, got 60x48"),
        (5, 64, 0, "width and height must be positive multiples of 8, got 64x0"),
        (5, -8, 48, "width and height must be positive multiples of 8, got -8x48"),
    ],
)
def test_video_geometry_says_what_is_wrong(frames: int, width: int, height: int, message: str):
    with pytest.raises(InvalidRequestError) as caught:
        check_video_geometry(frames, width, height, spatial_scale=8, temporal_scale=4)
    assert caught.value.message == message


def test_video_geometry_follows_the_scales() -> None:
    check_video_geometry(3, 32, 16, spatial_scale=16, temporal_scale=2)
    with pytest.raises(InvalidRequestError, match=r"^frames must be 1 \+ 2k \(1, 3, 5, ..., 41\)"):
        check_video_geometry(4, 32, 16, spatial_scale=16, temporal_scale=2)
    with pytest.raises(InvalidRequestError, match="positive multiples of 16, got 24x16"):
        check_video_geometry(3, 24, 16, spatial_scale=16, temporal_scale=2)


def test_a_model_takes_weights_when_its_class_loads_them() -> None:
    assert set(available_decoders()) >= {"linear", "tiny", "taehv", "wan2.1", "minimax-h3"}
    assert {name: takes_weights(name) for name in available_decoders()} == {
        "linear": False,
        "tiny": True,
        "diffusers": True,
        **{name: True for name in available_decoders() if name not in ("linear", "tiny")},
    }
    with pytest.raises(UnknownModelError, match="unknown model 'moon'"):
        takes_weights("moon")


def test_get_decoder_builds_through_from_weights_or_the_constructor() -> None:
    assert isinstance(get_decoder("linear", device="cpu"), LinearDecoder)
    assert isinstance(get_decoder("tiny"), TinyDecoder)
    with pytest.raises(WeightsError, match=r"^model 'linear' takes no weights file$"):
        get_decoder("linear", weights="w.safetensors")
    with pytest.raises(WeightsError, match="the taehv decoder needs a weights file"):
        get_decoder("taehv")
