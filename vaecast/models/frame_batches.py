"""The decode loop that CogVideoX's and Mochi's VAEs share: latent frames in batches, a conv
cache carried from batch to batch, and optionally overlapping spatial tiles.

Both diffusers VAEs (`AutoencoderKLCogVideoX._decode`, and `AutoencoderKLMochi._decode`
with `use_framewise_decoding`) cut the latents into consecutive batches along time and
feed each through `frames, cache = vae.decoder(batch, conv_cache=cache)`; with spatial
tiling on (`tiled_decode`), they run that loop once per overlapping latent tile, each
tile with its own cache, and blend the decoded tiles with the VAE's own `blend_v` and
`blend_h`. The blend mixes pixels within a frame only, so a batch's frames are final as
soon as the batch (every tile of it) is decoded: each batch is a chunk.

What differs between the two VAEs is where the batches fall (`FrameBatches`) and what
one batch decodes to (a decoder's `TileDecode`); the rest is here:

- `FrameBatches`: the batch sizes of T latent frames;
- `CachedBatches`: one decode's batches, whole or tile by tile, each tile's cache kept
  from one batch to the next, blended exactly as `tiled_decode` does;
- `BatchStream`: the `LatentStream` that decodes each batch as soon as its latents have
  arrived, and at the end those the end completes;
- `BatchChunking`: a family's chunking through them, a chunk per batch.

A batch is decoded from a fresh contiguous copy of its latents, whatever blocks they
came in, so a stream and a whole decode hand the model the same tensors.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from vaecast.models.base import DecodePlan, StreamPlan, check_latent_shape
from vaecast.models.streaming import Emit, Prepare

# (latents of one batch or tile of it, its cache from the batch before (None for the
# first), batch index) -> (its frames, the cache for the next batch).
TileDecode = Callable[[torch.Tensor, Any, int], tuple[torch.Tensor, Any]]
# (latents of one batch, batch index) -> its frames.
BatchDecode = Callable[[torch.Tensor, int], torch.Tensor]
Blend = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]


@dataclass(frozen=True, slots=True)
class FrameBatches:
    """How a VAE's decode loop cuts latent frames into batches of `size`.

    With `remainder_first` (CogVideoX) the first batch takes the `T % size` frames left
    over, as `frame_batch_size * i + (0 if i == 0 else remaining_frames)` writes it;
    otherwise (Mochi) the last batch is the short one. A stream does not know T until
    it ends: until then it takes the first batch to hold `size + stream_remainder`.
    `first` (Mochi's causal pass) makes the first batch that many latent frames, and the
    rest follow in batches of `size`: a first chunk as early as one latent allows.
    """

    size: int
    remainder_first: bool
    stream_remainder: int = 0
    first: int | None = None

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"a batch holds at least 1 latent frame, got {self.size}")
        if not 0 <= self.stream_remainder < self.size:
            raise ValueError(f"stream_remainder must be in [0, {self.size})")
        if self.first is not None and (self.first < 1 or self.remainder_first):
            raise ValueError("a first batch of its own is at least 1 frame, the rest after it")

    def sizes(self, latent_frames: int) -> tuple[int, ...]:
        """The batch sizes of `latent_frames` latent frames, in order."""
        if self.first is not None:
            first = min(self.first, latent_frames)
            rest = FrameBatches(self.size, False).sizes(latent_frames - first)
            return (first, *rest)
        full, rest = divmod(latent_frames, self.size)
        if not self.remainder_first:
            return (self.size,) * full + ((rest,) if rest else ())
        if full == 0:  # `max(num_frames // frame_batch_size, 1)`: one short batch
            return (latent_frames,)
        return (self.size + rest,) + (self.size,) * (full - 1)

    def stream_size(self, index: int) -> int:
        """Batch `index`'s size in a stream whose end is not known yet."""
        if index == 0 and self.first is not None:
            return self.first
        if index == 0 and self.remainder_first:
            return self.size + self.stream_remainder
        return self.size


@dataclass(frozen=True, slots=True)
class SpatialTiles:
    """A VAE's `tiled_decode` grid: latent tiles of `tile` (height, width) every
    `stride` latents; each decoded tile blended over `blend` pixels with the tile above
    and the one to its left, then `keep` pixels of it kept; the whole cropped to `crop`
    pixels where the VAE crops (Mochi), else None (CogVideoX)."""

    tile: tuple[int, int]
    stride: tuple[int, int]
    blend: tuple[int, int]
    keep: tuple[int, int]
    crop: tuple[int, int] | None = None

    def output_size(self, height: int, width: int, scale: int) -> tuple[int, int]:
        """The pixel size that `height` x `width` latents decode to through these tiles,
        a decoded tile being `scale` times its latents."""

        def side(length: int, axis: int) -> int:
            total = sum(
                min(self.keep[axis], scale * min(self.tile[axis], length - start))
                for start in range(0, length, self.stride[axis])
            )
            return total if self.crop is None else min(total, self.crop[axis])

        return side(height, 0), side(width, 1)


class CachedBatches:
    """One decode's batches through `decode_tile`: whole, or tile by tile over
    `tiles`, each tile's conv cache carried from one batch to the next.

    The blend is `tiled_decode`'s loop over one batch's tiles, step for step, through
    the VAE's own `blend_v` and `blend_h` (which blend in place): its operations mix
    pixels of one frame only, so blending batch by batch gives the same frames as
    blending the tiles of the whole video.
    """

    def __init__(
        self,
        decode_tile: TileDecode,
        tiles: SpatialTiles | None = None,
        blend_v: Blend | None = None,
        blend_h: Blend | None = None,
    ) -> None:
        if tiles is not None and (blend_v is None or blend_h is None):
            raise ValueError("a tiled decode needs the VAE's blend_v and blend_h")
        self._decode_tile = decode_tile
        self._tiles = tiles
        self._blend_v = blend_v
        self._blend_h = blend_h
        self._caches: dict[tuple[int, int], Any] = {}

    def __call__(self, latents: torch.Tensor, index: int) -> torch.Tensor:
        tiles = self._tiles
        if tiles is None:
            frames, self._caches[0, 0] = self._decode_tile(latents, self._caches.get((0, 0)), index)
            return frames
        (tile_h, tile_w), (stride_h, stride_w) = tiles.tile, tiles.stride
        rows: list[list[torch.Tensor]] = []
        for r, i in enumerate(range(0, latents.shape[3], stride_h)):
            row: list[torch.Tensor] = []
            for c, j in enumerate(range(0, latents.shape[4], stride_w)):
                tile = latents[:, :, :, i : i + tile_h, j : j + tile_w]
                frames, self._caches[r, c] = self._decode_tile(
                    tile, self._caches.get((r, c)), index
                )
                row.append(frames)
            rows.append(row)
        return self._blend(rows, tiles)

    def _blend(self, rows: list[list[torch.Tensor]], tiles: SpatialTiles) -> torch.Tensor:
        assert self._blend_v is not None and self._blend_h is not None
        keep_h, keep_w = tiles.keep
        result_rows = []
        for i, row in enumerate(rows):
            result_row = []
            for j, tile in enumerate(row):
                # In place, as in diffusers: row[j - 1] and rows[i - 1][j] are the tiles
                # already blended with theirs.
                if i > 0:
                    tile = self._blend_v(rows[i - 1][j], tile, tiles.blend[0])
                if j > 0:
                    tile = self._blend_h(row[j - 1], tile, tiles.blend[1])
                result_row.append(tile[:, :, :, :keep_h, :keep_w])
            result_rows.append(torch.cat(result_row, dim=4))
        frames = torch.cat(result_rows, dim=3)
        if tiles.crop is not None:
            frames = frames[:, :, :, : tiles.crop[0], : tiles.crop[1]]
        return frames

    def close(self) -> None:
        self._caches = {}


class BatchStream:
    """A `LatentStream` over `FrameBatches`: each batch is decoded, and published as a
    chunk, as soon as its latents have arrived.

    `latent_frames` is the length where it is known from the start (a whole decode):
    the batches are then exactly `batches.sizes(latent_frames)`. A stream whose length
    is open decodes batches of `batches.stream_size(i)` and, at its end, the ones the
    end completes; if the batches it already decoded are not those of its length
    (possible only where `remainder_first`), `refuse(latent_frames)` is raised.
    """

    def __init__(
        self,
        batches: FrameBatches,
        decode_batch: BatchDecode,
        device: torch.device,
        dtype: torch.dtype,
        latent_frames: int | None = None,
        refuse: Callable[[int], Exception] | None = None,
        close: Callable[[], None] | None = None,
    ) -> None:
        self._batches = batches
        self._decode_batch: BatchDecode | None = decode_batch
        self._device = device
        self._dtype = dtype
        self._known = None if latent_frames is None else batches.sizes(latent_frames)
        self._refuse = refuse
        self._on_close = close
        self._pending: list[torch.Tensor] = []  # latent frames not yet decoded, in order
        self._decoded: list[int] = []  # the sizes of the batches decoded so far

    def push(self, block: torch.Tensor, emit: Emit) -> None:
        self._pending += block.to(self._device, self._dtype).split(1, dim=2)
        while (size := self._next_size()) is not None and len(self._pending) >= size:
            self._decode(size, emit)

    def finish(self, latent_frames: int, emit: Emit) -> None:
        sizes = self._batches.sizes(latent_frames)
        decoded = tuple(self._decoded)
        if sizes[: len(decoded)] != decoded:
            if self._refuse is None:
                raise RuntimeError(
                    f"batches {decoded} decoded; {latent_frames} frames make {sizes}"
                )
            raise self._refuse(latent_frames)
        for size in sizes[len(decoded) :]:
            self._decode(size, emit)

    def close(self) -> None:
        self._pending = []
        self._decode_batch = None
        if self._on_close is not None:
            self._on_close, on_close = None, self._on_close
            on_close()

    def _next_size(self) -> int | None:
        index = len(self._decoded)
        if self._known is None:
            return self._batches.stream_size(index)
        return self._known[index] if index < len(self._known) else None

    def _decode(self, size: int, emit: Emit) -> None:
        assert self._decode_batch is not None, "a closed stream decodes nothing"
        latents = torch.cat(self._pending[:size], dim=2)
        del self._pending[:size]
        frames = self._decode_batch(latents, len(self._decoded))
        del latents
        self._decoded.append(size)
        emit(frames)


@dataclass(frozen=True, slots=True)
class BatchChunking:
    """A family's `Chunking` over `FrameBatches`: each batch decoded through the VAE's
    decoder with its conv cache (`decode_tile`), tile by tile where the VAE tiles
    latents of that size (`tiles`), and published as a chunk."""

    batches: FrameBatches
    latent_channels: int
    spatial_scale: int
    # (batch index, its latent frames) -> the frames it decodes to.
    batch_frames: Callable[[int, int], int]
    frames_per_latent: int
    group_opening_frames: int  # the frames latent 0 stands for
    # (latent height, width) -> `tiled_decode`'s grid where `_decode` takes it, else None.
    tiles: Callable[[int, int], SpatialTiles | None]
    prepare: Prepare
    decode_tile: TileDecode
    blend_v: Blend
    blend_h: Blend
    device: torch.device
    dtype: torch.dtype
    # Raised where a stream's end shows that its first batches were cut wrong.
    refuse: Callable[[int], Exception] | None = None

    def output_size(self, height: int, width: int) -> tuple[int, int]:
        tiles = self.tiles(height, width)
        if tiles is None:
            return height * self.spatial_scale, width * self.spatial_scale
        return tiles.output_size(height, width, self.spatial_scale)

    def plan(self, latent_shape: Sequence[int]) -> DecodePlan:
        _, _, t, h, w = check_latent_shape(latent_shape, self.latent_channels)
        height, width = self.output_size(h, w)
        sizes = self.batches.sizes(t)
        chunk_frames = tuple(self.batch_frames(i, n) for i, n in enumerate(sizes))
        return DecodePlan(height=height, width=width, chunk_frames=chunk_frames)

    def plan_stream(self, first_block_shape: Sequence[int]) -> StreamPlan:
        _, _, _, h, w = check_latent_shape(first_block_shape, self.latent_channels)
        height, width = self.output_size(h, w)
        batches = self.batches
        return StreamPlan(
            height=height,
            width=width,
            first_chunk_frames=self.batch_frames(0, batches.stream_size(0)),
            chunk_frames=self.batch_frames(1, batches.stream_size(1)),
            frames_per_latent=self.frames_per_latent,
            group_opening_frames=self.group_opening_frames,
            latents_per_group=None,
        )

    def open_stream(
        self, first_block_shape: tuple[int, ...], latent_frames: int | None
    ) -> BatchStream:
        _, _, _, h, w = first_block_shape
        cached = CachedBatches(self.decode_tile, self.tiles(h, w), self.blend_v, self.blend_h)
        prepare = self.prepare
        return BatchStream(
            self.batches,
            # The decode step per batch: it is elementwise, so it is the pipeline's.
            lambda latents, index: cached(prepare(latents), index),
            self.device,
            self.dtype,
            latent_frames=latent_frames,
            refuse=self.refuse,
            close=cached.close,
        )
