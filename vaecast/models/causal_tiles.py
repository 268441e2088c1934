"""Streaming a causal video VAE's own temporal tiling, tile by tile.

HunyuanVideo's, LTX-Video's and LTX-2's VAEs in diffusers (Apache-2.0) share one
`_temporal_tiled_decode` (`autoencoder_kl_hunyuan_video.py`, `autoencoder_kl_ltx.py`,
`autoencoder_kl_ltx2.py`), stated here for temporal compression r, tile length
m = `tile_sample_min_num_frames // r` and stride s = `tile_sample_stride_num_frames // r`
(in latent frames), and blend B = `tile_sample_min_num_frames -
tile_sample_stride_num_frames` (in video frames):

- tile i decodes latents [i*s, i*s + m + 1) (fewer at the end) through the VAE's
  per-tile path (its spatial `tiled_decode` where that applies, else its decoder),
  giving (L - 1) * r + 1 frames for L latents;
- for i > 0 one frame is dropped: HunyuanVideo drops its first, LTX its last;
- tile i > 0 is blended with tile i-1 by the VAE's own `blend_t`, which overwrites
  the head of tile i in place and reads the tail of tile i-1 as that tile stands
  after its own blend;
- tile 0 keeps its first s*r + 1 frames, every later tile its first s*r, and the
  whole is cut to (T - 1) * r + 1 frames.

No later tile touches what tile i keeps, so chunk i is final as soon as tile i is
decoded: with s*r kept per tile the kept frames add up to exactly (T - 1) * r + 1,
the cut never shortens a chunk, and a tile that would keep nothing (one latent, at
i*s = T - 1) is not decoded at all. A stream decodes tile i once latents up to
i*s + m + 1 have arrived, or when the latents end. Latents of T <= m frames are one
plain decode (the VAE's `_decode` tiles only longer ones), published in pieces of the
same sizes, so that every length has the chunking [s*r + 1, s*r, ..., rest].

Each tile is decoded from a fresh contiguous copy of its latents, whatever blocks
they came in, so a stream and a whole decode hand the model the same tensors; the
chunks concatenate to `vae.decode` bit for bit where the model's kernels do not
depend on the input's strides (tested per model).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from vaecast.errors import WeightsError
from vaecast.models.base import DecodePlan, StreamPlan, check_latent_shape
from vaecast.models.streaming import Emit, Prepare

Drop = Literal["first", "last"]
# What the scheme reads of a VAE (its family adds the rest of what it drives).
SCHEME_ATTRIBUTES = (
    "_temporal_tiled_decode",
    "tiled_decode",
    "blend_t",
    "decoder",
    "use_tiling",
    "use_framewise_decoding",
    "tile_sample_min_height",
    "tile_sample_min_width",
    "tile_sample_min_num_frames",
    "tile_sample_stride_num_frames",
    "spatial_compression_ratio",
    "temporal_compression_ratio",
)
# (B, C, L, h, w) latents, as the VAE's decode takes them, to (B, 3, (L-1)*r + 1, H, W).
TileDecoder = Callable[[torch.Tensor], torch.Tensor]
# The VAE's `blend_t(a, b, blend_extent)`: blends `a`'s tail into `b`'s head in place.
Blend = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]


@dataclass(frozen=True, slots=True)
class CausalTiles:
    """A VAE's temporal tiling, known before decoding."""

    temporal_scale: int  # r
    tile_latents: int  # m: a tile holds m + 1 latents
    stride_latents: int  # s
    blend_frames: int  # B, in video frames
    drop: Drop  # which frame tiles after the first drop

    def __post_init__(self) -> None:
        r, m, s = self.temporal_scale, self.tile_latents, self.stride_latents
        # Only then do the kept frames add up to (T - 1) * r + 1 with no latent
        # skipped and no chunk cut short (diffusers' own defaults all qualify).
        if r < 1 or not 1 <= s <= m:
            raise ValueError(f"unsupported temporal tiling: r {r}, tile {m}, stride {s} latents")
        if self.blend_frames < 0:
            raise ValueError(f"unsupported temporal tiling: blend {self.blend_frames} frames")

    @classmethod
    def of(cls, vae: Any, drop: Drop, model: str) -> CausalTiles:
        """The tiling `vae` is set to now (diffusers' `tile_sample_*_num_frames`)."""
        r = int(vae.temporal_compression_ratio)
        tile, stride = int(vae.tile_sample_min_num_frames), int(vae.tile_sample_stride_num_frames)
        if r < 1 or stride % r or not r <= stride <= tile:
            raise WeightsError(
                f"the {model} decoder streams its VAE's temporal tiling, which needs "
                f"tile_sample_stride_num_frames a multiple of the temporal compression ({r}) "
                f"and at most tile_sample_min_num_frames; got stride {stride}, tile {tile}"
            )
        return cls(r, tile // r, stride // r, tile - stride, drop)

    @property
    def stride_frames(self) -> int:
        return self.stride_latents * self.temporal_scale

    def frames(self, latent_frames: int) -> int:
        """The frames that `latent_frames` latents decode to, tiled or not."""
        return (latent_frames - 1) * self.temporal_scale + 1

    def tiled(self, latent_frames: int) -> bool:
        """Whether the VAE's decode tiles latents of this length (else: one plain decode)."""
        return latent_frames > self.tile_latents

    def chunk_frames(self, latent_frames: int) -> tuple[int, ...]:
        """Frames per chunk: s*r + 1 for the first, s*r for each later one, the rest last."""
        left = self.frames(latent_frames)
        chunks = [min(left, self.stride_frames + 1)]
        left -= chunks[0]
        while left > 0:
            chunks.append(min(left, self.stride_frames))
            left -= chunks[-1]
        return tuple(chunks)

    def stream_plan(self, height: int, width: int) -> StreamPlan:
        return StreamPlan(
            height=height,
            width=width,
            first_chunk_frames=self.stride_frames + 1,
            chunk_frames=self.stride_frames,
            frames_per_latent=self.temporal_scale,
            group_opening_frames=1,
            latents_per_group=None,
        )


class CausalTileStream:
    """One decode through `CausalTiles`: latents that arrive in BCTHW blocks, each
    chunk emitted as soon as its tile is decoded. A `LatentStream`."""

    def __init__(
        self, tiles: CausalTiles, prepare: Prepare, decode_tile: TileDecoder, blend: Blend
    ) -> None:
        self._tiles = tiles
        self._prepare = prepare
        self._decode_tile = decode_tile
        self._blend = blend
        # Latent frames from absolute index `_first` on, one tensor each: those some
        # tile not yet decoded still needs.
        self._latents: list[torch.Tensor] = []
        self._first = 0
        self._received = 0
        self._decoded = 0  # tiles so far
        # The last `blend_frames` frames of the last tile, as its own blend left them:
        # all the next tile's blend reads of it.
        self._tail: torch.Tensor | None = None

    def push(self, block: torch.Tensor, emit: Emit) -> None:
        frames = list(self._prepare(block).split(1, dim=2))
        self._latents += frames
        self._received += len(frames)
        tiles = self._tiles
        while self._start(self._decoded) + tiles.tile_latents + 1 <= self._received:
            self._decode(emit, self._received)

    def finish(self, latent_frames: int, emit: Emit) -> None:
        tiles = self._tiles
        if not tiles.tiled(latent_frames):
            # The VAE's `_decode` takes it whole; chunked as a tiled decode would be.
            frames = self._decode_checked(torch.cat(self._latents, dim=2))
            self._latents = []
            start = 0
            for count in tiles.chunk_frames(latent_frames):
                emit(frames[:, :, start : start + count])
                start += count
            return
        # A tile starting at the last latent decodes to one frame, which it drops.
        while self._start(self._decoded) < latent_frames - 1:
            self._decode(emit, latent_frames)

    def close(self) -> None:
        self._latents, self._tail = [], None

    def _start(self, index: int) -> int:
        return index * self._tiles.stride_latents

    def _decode(self, emit: Emit, available: int) -> None:
        tiles = self._tiles
        index, start = self._decoded, self._start(self._decoded)
        stop = min(start + tiles.tile_latents + 1, available)
        offset = start - self._first
        tile = self._decode_checked(torch.cat(self._latents[offset : offset + stop - start], dim=2))
        self._decoded += 1
        # The next tile starts `stride` latents on: the ones before it are done with.
        del self._latents[: offset + tiles.stride_latents]
        self._first = self._start(self._decoded)
        if index > 0:
            tile = tile[:, :, 1:] if tiles.drop == "first" else tile[:, :, :-1]
            if self._tail is not None:
                # In place, as diffusers blends, so the tail taken below is the one
                # diffusers' next blend reads.
                tile = self._blend(self._tail, tile, tiles.blend_frames)
        keep = tiles.stride_frames + (1 if index == 0 else 0)
        # A copy, so that the tile's other frames are freed while a stream waits.
        self._tail = tile[:, :, -tiles.blend_frames :].clone() if tiles.blend_frames else None
        emit(tile[:, :, :keep])

    def _decode_checked(self, latents: torch.Tensor) -> torch.Tensor:
        frames = self._decode_tile(latents)
        expected = self._tiles.frames(int(latents.shape[2]))
        if frames.shape[2] != expected:
            raise RuntimeError(
                f"{latents.shape[2]} latent frames decoded to {frames.shape[2]} frames, "
                f"expected {expected}"
            )
        return frames


def missing_scheme_lines(vae: Any, scheme_lines: Sequence[str]) -> list[str]:
    """The lines of the VAE's `_temporal_tiled_decode` (whitespace aside) that fix the
    scheme, such as which frame a later tile drops, that it no longer has (nothing
    when it has no such method: its family's check names that)."""
    method = getattr(type(vae), "_temporal_tiled_decode", None)
    if method is None:
        return []
    source = " ".join(inspect.getsource(method).split())
    return [f"`{line}` in _temporal_tiled_decode" for line in scheme_lines if line not in source]


def per_tile_decoder(vae: Any, tiled: TileDecoder, untiled: TileDecoder) -> TileDecoder:
    """The per-tile branch of `_temporal_tiled_decode` (and `_decode`'s below the tile
    length): the VAE's spatial `tiled` decode where its `use_tiling` applies to the
    tile, else `untiled`. Read at each call, as the VAE reads it."""

    def decode_tile(latents: torch.Tensor) -> torch.Tensor:
        return tiled(latents) if spatially_tiled(vae, latents.shape) else untiled(latents)

    return decode_tile


def spatially_tiled(vae: Any, latent_shape: Sequence[int]) -> bool:
    """Whether the VAE's decode of latents of `latent_shape` (BCTHW) takes its spatial
    tiles: its `use_tiling` is on and they are wider or taller than one tile."""
    min_height = vae.tile_sample_min_height // vae.spatial_compression_ratio
    min_width = vae.tile_sample_min_width // vae.spatial_compression_ratio
    return bool(vae.use_tiling) and (latent_shape[-1] > min_width or latent_shape[-2] > min_height)


@dataclass(frozen=True, slots=True)
class TileChunking:
    """A family's `Chunking` through `CausalTiles`: a chunk per temporal tile."""

    tiles: CausalTiles
    latent_channels: int
    spatial_scale: int
    prepare: Prepare
    decode_tile: TileDecoder
    blend: Blend

    def plan(self, latent_shape: Sequence[int]) -> DecodePlan:
        _, _, t, h, w = check_latent_shape(latent_shape, self.latent_channels)
        scale = self.spatial_scale
        return DecodePlan(h * scale, w * scale, self.tiles.chunk_frames(t))

    def plan_stream(self, first_block_shape: Sequence[int]) -> StreamPlan:
        _, _, _, h, w = check_latent_shape(first_block_shape, self.latent_channels)
        return self.tiles.stream_plan(h * self.spatial_scale, w * self.spatial_scale)

    def open_stream(
        self, first_block_shape: tuple[int, ...], latent_frames: int | None
    ) -> CausalTileStream:
        return CausalTileStream(self.tiles, self.prepare, self.decode_tile, self.blend)
