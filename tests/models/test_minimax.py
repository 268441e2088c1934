"""The `minimax-h3` decoder: chunks bit-identical to diffusers' `vae.decode` (windowing, blend,
trim and spatial tiling included), MiniMax-H3's chunk sizes, and loading without the hub."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from diffusers import AutoencoderKLMiniMaxH3

from tests.helpers import one_torch_thread
from tests.helpers.models import MINIMAX_LATENT_CHANNELS as LATENT_CHANNELS
from tests.helpers.models import MINIMAX_TINY_CONFIG as TINY_CONFIG
from vaecast.errors import InvalidRequestError
from vaecast.models.base import ChunkedDecoder, DecodedChunk
from vaecast.models.minimax import MiniMaxH3Decoder
from vaecast.models.registry import get_decoder
from vaecast.models.weights_io import WeightsError

# The real temporal geometry (17-frame clips, 4x in time, 3 latents dropped), tiny widths.


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


def random_vae(seed: int) -> AutoencoderKLMiniMaxH3:
    torch.manual_seed(seed)
    vae = AutoencoderKLMiniMaxH3(**TINY_CONFIG).eval()
    # The residual scales start at zero (attention would add nothing); random ones
    # make every layer, and so every token's neighbours, count.
    with torch.no_grad():
        for parameter in vae.parameters():
            parameter.copy_(torch.randn_like(parameter) * 0.2)
    return vae


@pytest.fixture(scope="module")
def vae() -> AutoencoderKLMiniMaxH3:
    return random_vae(0)


@pytest.fixture(scope="module")
def decoder(vae: AutoencoderKLMiniMaxH3) -> MiniMaxH3Decoder:
    return MiniMaxH3Decoder(vae)


def latents(frames: int, height: int = 2, width: int = 3, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(1, LATENT_CHANNELS, frames, height, width, generator=generator)


def pipeline_decode(vae: AutoencoderKLMiniMaxH3, latents: torch.Tensor) -> torch.Tensor:
    """MiniMax-H3's decode step (modular_pipelines/minimax_h3/decoders.py), verbatim."""
    latents_mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    latents_std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
    latents = latents * latents_std + latents_mean
    with torch.no_grad():
        video = vae.decode(latents, return_dict=False)[0]
    pixel_mean = torch.tensor((0.485, 0.456, 0.406)).view(1, -1, 1, 1, 1)
    pixel_std = torch.tensor((0.229, 0.224, 0.225)).view(1, -1, 1, 1, 1)
    return (video.float() * pixel_std + pixel_mean).clamp(0, 1)


def collect(decoder: MiniMaxH3Decoder, z: torch.Tensor) -> list[DecodedChunk]:
    chunks: list[DecodedChunk] = []
    decoder.decode_chunks(
        z, lambda c: chunks.append(DecodedChunk(c.frames.clone(), c.index, c.total, c.frame_start))
    )
    return chunks


@pytest.mark.parametrize(
    ("frames", "chunk_frames"),
    [
        (3, (9,)),  # the shortest accepted: one padded window
        (4, (13,)),
        (7, (17, 5)),  # one full window: body and tail
        (8, (17, 9)),  # a padded second window
        (12, (17, 17, 5)),
        (13, (17, 17, 9)),
    ],
)
def test_chunks_are_diffusers_decode_bit_for_bit(
    vae: AutoencoderKLMiniMaxH3,
    decoder: MiniMaxH3Decoder,
    frames: int,
    chunk_frames: tuple[int, ...],
) -> None:
    z = latents(frames, seed=frames)
    chunks = collect(decoder, z)
    expected = pipeline_decode(vae, z)
    assert torch.equal(torch.cat([c.frames for c in chunks], dim=2), expected)
    assert tuple(c.frame_count for c in chunks) == chunk_frames
    assert [c.index for c in chunks] == list(range(len(chunk_frames)))
    assert {c.total for c in chunks} == {len(chunk_frames)}
    assert [c.frame_start for c in chunks] == list(decoder.plan(z.shape).chunk_starts)
    assert chunks[-1].is_final and not any(c.is_final for c in chunks[:-1])
    plan = decoder.plan(z.shape)
    assert (plan.chunk_frames, plan.height, plan.width) == (chunk_frames, 8, 12)
    assert expected.shape[3:] == (8, 12) and expected.std() > 0.01


@pytest.mark.parametrize(
    ("frames", "chunk_frames"),
    [
        (33, (17,) * 6 + (9,)),
        (34, (17,) * 6 + (13,)),
        (35, (17,) * 7),
        (36, (17,) * 7 + (1,)),
        (37, (17,) * 7 + (5,)),
    ],
)
def test_minimax_chunk_sizes(
    decoder: MiniMaxH3Decoder, frames: int, chunk_frames: tuple[int, ...]
) -> None:
    """The sizes MiniMax-H3's own chunk-callback test pins."""
    assert decoder.plan((1, LATENT_CHANNELS, frames, 1, 1)).chunk_frames == chunk_frames


def test_a_long_decode_matches_too(vae: AutoencoderKLMiniMaxH3, decoder: MiniMaxH3Decoder) -> None:
    z = latents(36, height=1, width=1, seed=36)
    chunks = collect(decoder, z)
    assert tuple(c.frame_count for c in chunks) == (17,) * 7 + (1,)
    assert torch.equal(torch.cat([c.frames for c in chunks], dim=2), pipeline_decode(vae, z))


def test_spatial_tiling_is_the_models_own() -> None:
    """With tiles smaller than the frame, windows go through the model's tiled decode."""
    vae = random_vae(1)
    z = latents(8, height=3, width=4, seed=2)
    untiled = pipeline_decode(vae, z)
    vae.enable_tiling(8, 8, 4, 4)
    decoded = MiniMaxH3Decoder(vae).decode(z)
    assert decoded.shape == (1, 3, 26, 12, 16)
    assert torch.equal(decoded, pipeline_decode(vae, z))
    assert not torch.equal(decoded, untiled)  # the tiles really were there


def test_too_few_latents_are_refused(decoder: MiniMaxH3Decoder) -> None:
    with pytest.raises(InvalidRequestError, match="need at least 3 frame"):
        decoder.plan((1, LATENT_CHANNELS, 2, 2, 2))


def test_is_a_chunked_decoder(decoder: MiniMaxH3Decoder) -> None:
    assert isinstance(decoder, ChunkedDecoder)
    assert (decoder.name, decoder.latent_channels, decoder.value_range) == ("minimax-h3", 4, (0, 1))


def test_the_diffusers_internals_we_drive_still_exist(vae: AutoencoderKLMiniMaxH3) -> None:
    """Fails loudly on a diffusers upgrade that changes the windowing we reproduce."""
    MiniMaxH3Decoder.check_internals(vae)
    assert list(inspect.signature(vae._decode_clip).parameters) == ["z"]
    assert (vae.tokens_chunk_size, vae.token_overlap) == (5, 2)
    assert (vae.frame_pre_padding, vae.frame_overlap, vae.temporal_compression_ratio) == (3, 5, 4)
    assert (vae.config.clip_length, vae.config.token_drop) == (17, 3)
    assert vae.use_tiling  # MiniMax-H3 ships with spatial tiling on


@pytest.mark.parametrize("layout", ["model folder", "vae folder"])
def test_loads_from_a_local_diffusers_folder(
    vae: AutoencoderKLMiniMaxH3, tmp_path: Path, layout: str
) -> None:
    vae.save_pretrained(tmp_path / "vae" if layout == "model folder" else tmp_path)
    loaded = get_decoder("minimax-h3", device="cpu", weights=tmp_path)
    z = latents(4)
    assert torch.equal(loaded.decode(z), pipeline_decode(vae, z))


def test_weights_must_be_a_local_folder(tmp_path: Path) -> None:
    with pytest.raises(WeightsError, match="the minimax-h3 decoder needs --weights"):
        MiniMaxH3Decoder.from_weights(None)
    with pytest.raises(WeightsError, match="is not a folder"):
        MiniMaxH3Decoder.from_weights(tmp_path / "model.safetensors")
    with pytest.raises(WeightsError, match=r"has neither config\.json nor vae/config\.json"):
        MiniMaxH3Decoder.from_weights(tmp_path)
