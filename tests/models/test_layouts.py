"""Latent layouts: each pipeline's own, converted exactly as its pipeline does, and every
refusal a clear 422 however hostile the parameters."""

from __future__ import annotations

import time

import pytest
import torch
from diffusers import LTXPipeline

from tests.helpers import safetensors_bytes
from vaecast.errors import InvalidRequestError
from vaecast.latent_files import load_latents
from vaecast.models.layouts import BCTHW, BTCHW, PackedTokens

LTX = PackedTokens(spatial_scale=32, temporal_scale=8)
LTX_PARAMS = {"num_frames": "25", "height": "64", "width": "96"}  # a 4x2x3 latent grid


def test_bcthw_takes_cthw_and_bcthw_unchanged() -> None:
    z = torch.randn(1, 4, 3, 2, 5)
    bound = BCTHW.bind({})
    assert bound.bcthw_shape((4, 3, 2, 5)) == (1, 4, 3, 2, 5)
    assert torch.equal(bound.to_bcthw(z[0]), z)
    assert bound.to_bcthw(z) is not None and torch.equal(bound.to_bcthw(z), z)


def test_btchw_is_cogvideox_frames_first() -> None:
    z = torch.randn(1, 3, 4, 2, 5)  # B, T, C, H, W
    bound = BTCHW.bind({})
    assert bound.bcthw_shape((1, 3, 4, 2, 5)) == (1, 4, 3, 2, 5)
    assert bound.bcthw_shape((3, 4, 2, 5)) == (1, 4, 3, 2, 5)
    assert torch.equal(bound.to_bcthw(z), z.permute(0, 2, 1, 3, 4))
    with pytest.raises(InvalidRequestError, match=r"latents must be TCHW or BTCHW, got 3"):
        bound.bcthw_shape((3, 4, 2))


@pytest.mark.parametrize(("patch", "patch_t"), [(1, 1), (2, 1), (1, 2)])
def test_packed_tokens_unpack_what_the_ltx_pipeline_packs(patch: int, patch_t: int) -> None:
    layout = PackedTokens(
        spatial_scale=32, temporal_scale=8, patch_size=patch, patch_size_t=patch_t
    )
    params = {"num_frames": "25", "height": str(64 * patch), "width": str(96 * patch)}
    grid = (4 * patch_t, 2 * patch, 3 * patch)
    z = torch.randn(1, 5, *grid)
    packed = LTXPipeline._pack_latents(z, patch, patch_t)
    bound = layout.bind(params | {"num_frames": str(8 * (grid[0] - 1) + 1)})
    assert bound.bcthw_shape(tuple(packed.shape)) == tuple(z.shape)
    assert torch.equal(bound.to_bcthw(packed), z)  # the inverse of the pipeline's packing


def test_packed_tokens_unpack_as_the_ltx_pipeline_unpacks() -> None:
    z = torch.randn(1, 8, 4, 2, 3)
    packed = LTXPipeline._pack_latents(z)
    unpacked = LTXPipeline._unpack_latents(packed, 4, 2, 3)
    assert torch.equal(LTX.bind(LTX_PARAMS).to_bcthw(packed), unpacked)


@pytest.mark.parametrize(
    ("params", "shape", "message"),
    [
        ({}, (1, 24, 8), "give num_frames, height, width as the pipeline call had them"),
        ({"num_frames": "25"}, (1, 24, 8), "give height, width as the pipeline call had them"),
        (
            LTX_PARAMS,
            (1, 25, 8),
            "latents of 25 tokens do not fit num_frames, height and "
            "width: their latent grid is 4x2x3 = 24 tokens",
        ),
        (LTX_PARAMS, (1, 2, 24, 8), "packed tokens (B, F*H*W, C), got 4 dimensions"),
        ({**LTX_PARAMS, "height": "16"}, (1, 24, 8), "height and width must be at least 32"),
        ({**LTX_PARAMS, "num_frames": "-3"}, (1, 24, 8), "num_frames"),
        ({**LTX_PARAMS, "width": "9" * 10_000}, (1, 24, 8), "width"),
        ({**LTX_PARAMS, "height": "1e9"}, (1, 24, 8), "height"),
    ],
)
def test_packed_tokens_refuse_what_does_not_fit(
    params: dict[str, str], shape: tuple[int, ...], message: str
) -> None:
    started = time.perf_counter()
    with pytest.raises(InvalidRequestError) as raised:
        LTX.bind(params).bcthw_shape(shape)
    assert message in raised.value.message
    assert time.perf_counter() - started < 1.0  # a 10,000-digit number costs nothing


def test_an_upload_in_packed_tokens_reads_its_geometry_from_metadata_or_the_request() -> None:
    z = torch.randn(1, 8, 4, 2, 3)
    packed = LTXPipeline._pack_latents(z, 1, 1).contiguous()
    from_metadata = safetensors_bytes(metadata=LTX_PARAMS, latents=packed)
    loaded = load_latents(from_metadata, layout=lambda metadata: LTX.bind(metadata))
    assert torch.equal(loaded.latents, z)
    seen: list[tuple[int, ...]] = []
    request = {"num_frames": "25", "height": "64", "width": "96"}
    loaded = load_latents(
        safetensors_bytes(latents=packed[0].contiguous()),
        check_shape=seen.append,
        layout=lambda metadata: LTX.bind({**metadata, **request}),
    )
    assert seen == [(1, 8, 4, 2, 3)]  # the limits see the BCTHW shape, before any data
    assert torch.equal(loaded.latents, z)
