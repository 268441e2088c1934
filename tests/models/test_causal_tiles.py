"""The shared temporal-tile scheme (`vaecast/models/causal_tiles.py`) against diffusers' own
`_temporal_tiled_decode`, run on a stand-in VAE whose decoder is a cheap function of its whole
tile: chunks bit-identical to it at every length, the plan known before decoding, every split of
a stream equal to the whole decode, and each tile decoded as soon as its latents have arrived."""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from diffusers import AutoencoderKLHunyuanVideo, AutoencoderKLLTXVideo

import vaecast.models.causal_tiles
import vaecast.models.hunyuan
import vaecast.models.ltx
from vaecast.errors import InvalidRequestError, WeightsError
from vaecast.models.base import DecodedChunk
from vaecast.models.causal_tiles import CausalTiles, CausalTileStream, Drop, TileChunking
from vaecast.models.diffusers_family import DiffusersDecoder, DiffusersFamily
from vaecast.models.streaming import Prepare

CHANNELS = 3


def tile_decode(z: torch.Tensor, r: int) -> torch.Tensor:
    """(B, C, L, h, w) -> (B, C, (L-1)*r + 1, h, w), every frame depending on the whole tile
    and on its place in it, so that a wrong tile boundary, drop or blend shows."""
    frames = torch.cat([z[:, :, :1], z[:, :, 1:].repeat_interleave(r, dim=2)], dim=2)
    place = torch.arange(frames.shape[2], dtype=z.dtype).view(1, 1, -1, 1, 1)
    return torch.tanh(frames + 0.5 * z.mean(dim=2, keepdim=True) + 0.1 * place)


class StandIn:
    """What `_temporal_tiled_decode` reads of a VAE, with `tile_decode` as its decoder."""

    blend_t = AutoencoderKLHunyuanVideo.blend_t

    def __init__(self, r: int, tile: int, stride: int) -> None:
        self.temporal_compression_ratio = r
        self.spatial_compression_ratio = 1
        self.tile_sample_min_num_frames = tile
        self.tile_sample_stride_num_frames = stride
        self.tile_sample_min_height = self.tile_sample_min_width = 1 << 20
        self.use_tiling = False
        self.decoded: list[int] = []  # latent frames per decoder call

    def to(self, device: torch.device) -> StandIn:
        return self

    def eval(self) -> StandIn:
        return self

    def requires_grad_(self, requires_grad: bool) -> StandIn:
        return self

    def post_quant_conv(self, z: torch.Tensor) -> torch.Tensor:
        return z

    def decoder(self, z: torch.Tensor, temb: Any = None) -> torch.Tensor:
        self.decoded.append(int(z.shape[2]))
        return tile_decode(z, self.temporal_compression_ratio)

    def decode(self, z: torch.Tensor, drop: Drop) -> torch.Tensor:
        """diffusers' `_decode`: its temporal tiling for more than m latents, else one call."""
        if z.shape[2] <= self.tile_sample_min_num_frames // self.temporal_compression_ratio:
            return self.decoder(z)
        if drop == "first":
            return AutoencoderKLHunyuanVideo._temporal_tiled_decode(self, z, return_dict=False)[0]
        return AutoencoderKLLTXVideo._temporal_tiled_decode(self, z, None, return_dict=False)[0]


def stand_in_chunking(
    vae: StandIn, device: torch.device, prepare: Prepare, drop: Drop
) -> TileChunking:
    tiles = CausalTiles.of(vae, drop, "stand-in")
    return TileChunking(tiles, CHANNELS, 1, prepare, vae.decoder, vae.blend_t)


class StandInDecoder(DiffusersDecoder):
    """The stand-in as a family: `DiffusersDecoder` with `TileChunking`, as HunyuanVideo
    and LTX are."""

    family = DiffusersFamily(
        "stand-in",
        "StandIn",
        "any",
        decode_step=lambda vae, device: lambda latents: latents.to(torch.float32),
        chunking=stand_in_chunking,
    )


# (r, tile frames, stride frames, drop): HunyuanVideo's and LTX's defaults, a blend longer
# than half a tile (a tile's own blend then overwrites what the next one reads), no blend.
GEOMETRIES = [
    pytest.param(4, 16, 12, "first", id="hunyuan"),
    pytest.param(8, 16, 8, "last", id="ltx"),
    pytest.param(2, 8, 2, "last", id="long-blend"),
    pytest.param(2, 8, 2, "first", id="long-blend-first"),
    pytest.param(4, 8, 8, "first", id="no-blend"),
]


def latents(frames: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(1, CHANNELS, frames, 2, 3, generator=torch.Generator().manual_seed(seed))


def collect(chunks: list[DecodedChunk]) -> Any:
    return lambda c: chunks.append(DecodedChunk(c.frames.clone(), c.index, c.total, c.frame_start))


@pytest.mark.parametrize(("r", "tile", "stride", "drop"), GEOMETRIES)
def test_chunks_are_diffusers_temporal_tiling_bit_for_bit(
    r: int, tile: int, stride: int, drop: Drop
) -> None:
    vae = StandIn(r, tile, stride)
    decoder = StandInDecoder(vae, drop=drop)
    for frames in range(1, 16):
        z = latents(frames, seed=frames)
        expected = vae.decode(z, drop)
        chunks: list[DecodedChunk] = []
        decoder.decode_chunks(z, collect(chunks))
        assert torch.equal(torch.cat([c.frames for c in chunks], dim=2), expected), frames
        plan = decoder.plan(z.shape)
        assert plan.chunk_frames == tuple(c.frame_count for c in chunks)
        assert plan.frames == (frames - 1) * r + 1 == expected.shape[2]
        assert [c.frame_start for c in chunks] == list(plan.chunk_starts)
        assert [c.index for c in chunks] == list(range(plan.chunks))
        assert {c.total for c in chunks} == {plan.chunks}


def test_chunk_sizes() -> None:
    hunyuan = CausalTiles(
        temporal_scale=4, tile_latents=4, stride_latents=3, blend_frames=4, drop="first"
    )
    assert [hunyuan.chunk_frames(t) for t in (1, 4, 5, 8, 13)] == [
        (1,),
        (13,),
        (13, 4),
        (13, 12, 4),
        (13, 12, 12, 12),
    ]
    ltx = CausalTiles(
        temporal_scale=8, tile_latents=2, stride_latents=1, blend_frames=8, drop="last"
    )
    assert ltx.chunk_frames(13) == (9,) + (8,) * 11
    assert (ltx.tiled(2), ltx.tiled(3)) == (False, True)


@pytest.mark.parametrize(("r", "tile", "stride", "drop"), GEOMETRIES)
def test_streams_of_any_split_are_the_whole_decode(
    r: int, tile: int, stride: int, drop: Drop
) -> None:
    decoder = StandInDecoder(StandIn(r, tile, stride), drop=drop)
    for frames in (3, 7, 11):
        z = latents(frames, seed=frames)
        whole = decoder.decode(z)
        for sizes in ([1] * frames, [2, frames - 2], [frames - 1, 1], [frames]):
            chunks: list[DecodedChunk] = []
            plan = decoder.decode_stream(list(z.split(sizes, dim=2)), collect(chunks))
            assert torch.equal(torch.cat([c.frames for c in chunks], dim=2), whole), sizes
            assert plan == decoder.plan(z.shape)
            assert [c.frame_start for c in chunks] == list(plan.chunk_starts)
            # The length is known only at the end: chunks published before carry no total.
            assert {c.total for c in chunks} <= {None, plan.chunks}


def test_a_tile_is_decoded_and_published_once_its_latents_have_arrived() -> None:
    """HunyuanVideo's tiles: 5 latents every 3, the chunk out before the next block is read."""
    vae = StandIn(4, 16, 12)
    decoder = StandInDecoder(vae, drop="first")
    published: list[int] = []
    seen: list[tuple[int, list[int]]] = []

    def blocks() -> Iterator[torch.Tensor]:
        for t, frame in enumerate(latents(13).split(1, dim=2)):
            seen.append((t, list(published)))
            yield frame

    decoder.decode_stream(blocks(), lambda c: published.append(c.frame_count))
    # Tile i needs latents [3i, 3i + 5): chunk i is out before latent 3i + 5 is asked for.
    assert [count for t, count in seen if t in (4, 5, 7, 8, 10, 11, 12)] == [
        [],
        [13],
        [13],
        [13, 12],
        [13, 12],
        [13, 12, 12],
        [13, 12, 12],
    ]
    assert published == [13, 12, 12, 12]
    # Tiles of 5 latents while they were whole, then the 4 left; none of the last latent alone.
    assert vae.decoded == [5, 5, 5, 4]


def test_short_latents_are_one_plain_decode_published_in_the_same_chunks() -> None:
    vae = StandIn(8, 32, 8)  # tiles of 4 latents every 1: 3 latents are one decode
    decoder = StandInDecoder(vae, drop="last")
    chunks: list[DecodedChunk] = []
    decoder.decode_stream(list(latents(3).split(1, dim=2)), collect(chunks))
    assert vae.decoded == [3]
    assert [c.frame_count for c in chunks] == [9, 8]
    assert torch.equal(torch.cat([c.frames for c in chunks], dim=2), vae.decode(latents(3), "last"))
    plan = decoder.plan_stream(latents(1).shape)
    assert (plan.first_chunk_frames, plan.chunk_frames) == (9, 8)
    assert [plan.frames_for(n) for n in (1, 2, 5)] == [1, 9, 33]


@pytest.mark.parametrize(
    ("r", "tile", "stride"),
    [(4, 16, 10), (4, 8, 12), (4, 2, 2), (0, 16, 8)],
    ids=["stride-not-a-multiple", "stride-over-tile", "stride-under-r", "no-r"],
)
def test_a_tiling_the_scheme_cannot_stream_is_refused(r: int, tile: int, stride: int) -> None:
    with pytest.raises(WeightsError, match="the stand-in decoder streams its VAE's temporal"):
        CausalTiles.of(StandIn(r, tile, stride), "first", "stand-in")
    with pytest.raises(ValueError, match="unsupported temporal tiling"):
        CausalTiles(temporal_scale=4, tile_latents=2, stride_latents=3, blend_frames=0, drop="last")


def test_a_tile_of_the_wrong_length_fails_loudly() -> None:
    tiles = CausalTiles(
        temporal_scale=4, tile_latents=4, stride_latents=3, blend_frames=4, drop="first"
    )
    stream = CausalTileStream(tiles, lambda z: z, lambda z: z, AutoencoderKLHunyuanVideo.blend_t)
    stream.push(latents(2), lambda frames, yuv420=None: None)
    with pytest.raises(RuntimeError, match="2 latent frames decoded to 2 frames, expected 5"):
        stream.finish(2, lambda frames, yuv420=None: None)


def test_bad_latents_are_refused() -> None:
    decoder = StandInDecoder(StandIn(4, 16, 12), drop="first")
    with pytest.raises(InvalidRequestError, match="this model takes 3 latent channels, got 4"):
        decoder.plan((1, 4, 5, 2, 2))
    with pytest.raises(InvalidRequestError, match="at least 1 frame"):
        decoder.plan((1, 3, 0, 2, 2))


def test_vaecast_imports_these_models_without_diffusers(monkeypatch: pytest.MonkeyPatch) -> None:
    """diffusers is needed to load these models, never to import vaecast or list them."""
    for module in (vaecast.models.causal_tiles, vaecast.models.hunyuan, vaecast.models.ltx):
        tree = ast.parse(Path(str(module.__file__)).read_text())
        modules = [
            alias.name for node in tree.body if isinstance(node, ast.Import) for alias in node.names
        ]
        modules += [str(node.module) for node in tree.body if isinstance(node, ast.ImportFrom)]
        assert "torch" in modules  # the scan sees the imports
        assert not [m for m in modules if m.split(".")[0] == "diffusers"], module.__name__
    monkeypatch.setitem(sys.modules, "diffusers", None)  # what an absent package looks like
    for decoder, name in (
        (vaecast.models.hunyuan.HunyuanVideoDecoder, "hunyuan-video"),
        (vaecast.models.ltx.LTXVideoDecoder, "ltx-video"),
        (vaecast.models.ltx.LTX2VideoDecoder, "ltx-2"),
    ):
        with pytest.raises(WeightsError) as error:
            decoder.from_weights("x")
        assert str(error.value) == (
            f"the {name} decoder needs diffusers>=0.42,<0.43: pip install 'vaecast[real]'"
        )
