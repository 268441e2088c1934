"""`cogvideox`: the CogVideoX video VAE decoder (2B, 5B, 1.5), a chunk per decoded frame batch.

The model is diffusers' `AutoencoderKLCogVideoX` (Apache-2.0; architecture by the CogVideoX
team, Tsinghua University and ZhipuAI), as `CogVideoXPipeline` and its image-, video- and
Fun-control pipelines decode with it. `vae.decode` (`_decode`) feeds the latents through
`vae.decoder(z, conv_cache=...)` in batches of `num_latent_frames_batch_size` (2) latent
frames, the first batch taking the odd one out (`T % 2`), and carries the causal convs'
cache from batch to batch; a batch's frames are final once it is decoded. We drive that
loop from outside (`vaecast/models/frame_batches.py`) and publish each batch as a chunk,
so the chunks concatenate bit for bit to `vae.decode` (tested). With the VAE's spatial
tiling on (`vae.enable_tiling()`, not part of its saved config: off on a loaded VAE, as
in the pipelines by default) each batch is decoded tile by tile with one cache per tile
and blended as `tiled_decode` blends, bit for bit too (every tile's cache is then kept
for the whole decode, where diffusers drops one tile's before the next: the caches of
one untiled decode, in all).

Frames: each time-compressing upsampler (two in CogVideoX) maps a batch of n frames to
2n (n even), 2n - 1 (n odd, above 1) or 1 (n = 1). A batch of 2 latents gives 8 frames,
one of 3 gives 9, a lone latent 1: T odd gives 1 + 4 (T - 1) frames in chunks of
9, 8, 8, ... (T = 13: 49 frames, 9 + 6 x 8); T even gives 4 T in chunks of 8 (T = 12: 48).

Latents are what the pipelines return with `output_type="latent"`: BTCHW, in the
transformer's space. Their decode step (`decode_latents`) permutes them to BCTHW and
takes `1 / vae.config.scaling_factor * latents`, written here the same way for bit
parity. CogVideoX 1.5's pipelines (transformer `patch_size_t` 2) pad the latents with
leading frames to a multiple of 2 and drop them (`latents[:, additional_frames:]`)
only when they decode: with `output_type="latent"` they return the padded latents. The
request's `num_frames` (the pipeline call's) says how many latent frames are real,
`(num_frames - 1) // 4 + 1`, and the layout (`CogVideoXLatents`) drops the padding;
without it every frame is decoded, which is right for CogVideoX 1.0 (no padding).

Streams: where the batches fall depends on T's parity (the first batch takes the odd one
out), and so does every frame: an odd and an even T put every batch boundary elsewhere.
A stream does not know T until it ends, so nothing it could commit early is certain.
It commits under the pipelines' usual lengths, T odd (num_frames = 8k + 1 to 8k + 4:
49 frames, 13 latents; CogVideoX 1.5's 81 frames, 21 latents once unpadded): batch 0
once latents 0-2 have arrived, then each pair as soon as both have. That is exactly the
whole decode of every odd T, and of T = 2 (nothing is committed before the third latent,
so its single batch is decoded at the end). A stream that ends with an even T >= 4 is
refused at its end (`InvalidRequestError`) after its first chunks were published under
the odd batching; such latents decode as one tensor (`decode_chunks` knows T from the
start and takes its exact batches, even or odd). The `StreamPlan` is the odd lengths':
9 frames, then 8 per chunk, latent 0 standing for 1 frame and each next for 4 (for a
stream of T = 2 its `frames_for(2)` says 5; the decode has 8).

Decodes may overlap on one VAE: the conv caches are values the decoder returns and
each decode keeps its own; the loop writes no state on the module.

`CogVideoXDecoder.from_weights` loads a local diffusers folder (the VAE's or a model's,
with `vae/`); `CogVideoXDecoder(vae)` wraps an `AutoencoderKLCogVideoX` loaded some other
way (its tiling state is read at each decode). diffusers is imported only when a model
is loaded, so `import vaecast` never needs it.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from vaecast.errors import InvalidRequestError
from vaecast.models.base import (
    ChunkCallback,
    DecodePlan,
    StreamPlan,
    check_latent_shape,
)
from vaecast.models.diffusers_family import DiffusersFamily
from vaecast.models.frame_batches import (
    BatchStream,
    CachedBatches,
    FrameBatches,
    SpatialTiles,
)
from vaecast.models.layouts import BTCHW, MAX_GEOMETRY_VALUE, BoundLayout, Params
from vaecast.models.streaming import StreamingDecoder
from vaecast.models.weights_io import WeightsError
from vaecast.params import parse_int

# What vaecast drives of the model beyond diffusers' public API, on the versions whose
# `AutoencoderKLCogVideoX._decode` and `tiled_decode` loops and pipeline decode step
# are the ones we drive (0.35.0 and 0.42.1 are identical there).
FAMILY = DiffusersFamily(
    "cogvideox",
    "AutoencoderKLCogVideoX",
    "diffusers>=0.35,<0.43",
    attributes=(
        "decoder",
        "post_quant_conv",
        "num_latent_frames_batch_size",
        "use_tiling",
        "tile_latent_min_height",
        "tile_latent_min_width",
        "tile_sample_min_height",
        "tile_sample_min_width",
        "tile_overlap_factor_height",
        "tile_overlap_factor_width",
        "blend_v",
        "blend_h",
    ),
    config_keys=(
        "latent_channels",
        "block_out_channels",
        "temporal_compression_ratio",
        "scaling_factor",
    ),
    signatures={"decoder.forward": ("sample", "temb", "conv_cache")},
    weights_of="a CogVideoX model",
)
# The batch the VAE decodes at a time; its own comment warns that the model was
# trained for no other, and the stream's rule (odd lengths) is this one's.
BATCH_LATENT_FRAMES = 2
# CogVideoX 1.5's transformer patch_size_t: its pipelines pad the latents to a multiple.
PATCH_SIZE_T = 2
# CogVideoX's temporal compression, as the pipelines read it from the VAE.
TEMPORAL_SCALE = 4

# The length of the latents a `decode_chunks` call is decoding: known from the start,
# the batches are then exact whatever T's parity (a stream's length is open).
_WHOLE_FRAMES: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "vaecast_cogvideox_whole_frames", default=None
)


@dataclass(frozen=True, slots=True)
class CogVideoXLatents:
    """BTCHW, as CogVideoX's pipelines return their latents; given `num_frames` (the
    pipeline call's), the leading frames CogVideoX 1.5's pipelines pad them with are
    dropped, as their decode step drops them."""

    temporal_scale: int = TEMPORAL_SCALE
    name: str = "BTCHW (with num_frames for CogVideoX 1.5's padded latents)"

    def bind(self, params: Params) -> BoundLayout:
        text = params.get("num_frames")
        if not text:
            return BTCHW
        frames = parse_int(text, "num_frames", 1, MAX_GEOMETRY_VALUE)
        return _Unpadded(frames, (frames - 1) // self.temporal_scale + 1)


@dataclass(frozen=True, slots=True)
class _Unpadded:
    num_frames: int
    latent_frames: int  # the pipeline's `latent_frames`: the ones it decodes

    def bcthw_shape(self, declared: tuple[int, ...]) -> tuple[int, ...]:
        shape = BTCHW.bcthw_shape(declared)
        real = self.latent_frames
        padded = real + (-real % PATCH_SIZE_T)
        if shape[2] not in (real, padded):
            padding = "" if padded == real else f" ({padded} as CogVideoX 1.5 pads them)"
            raise InvalidRequestError(
                f"num_frames={self.num_frames} makes {real} latent frames{padding}, but these "
                f"latents have {shape[2]} (BTCHW: T is the second dimension)"
            )
        return (*shape[:2], real, *shape[3:])

    def to_bcthw(self, tensor: torch.Tensor) -> torch.Tensor:
        latents = BTCHW.to_bcthw(tensor)
        # pipeline_cogvideox.py's `latents[:, additional_frames:]`: the padding leads.
        return latents[:, :, latents.shape[2] - self.latent_frames :]


def check_internals(vae: Any) -> None:
    """Raise `WeightsError` if `vae` lacks the diffusers internals this decoder drives,
    or decodes in batches other than the one the stream's rule is made for."""
    FAMILY.check(vae, _missing_upsamplers)
    if vae.num_latent_frames_batch_size != BATCH_LATENT_FRAMES:
        raise WeightsError(
            f"unsupported CogVideoX decode: num_latent_frames_batch_size "
            f"{vae.num_latent_frames_batch_size}; vaecast streams batches of {BATCH_LATENT_FRAMES}"
        )


def _missing_upsamplers(vae: Any) -> list[str]:
    """The decoder's temporal upsamplers, whose `compress_time` the stream reads."""
    decoder = getattr(vae, "decoder", None)
    if decoder is None:
        return []
    blocks = getattr(decoder, "up_blocks", None)
    if blocks is None or not all(hasattr(block, "upsamplers") for block in blocks):
        return ["decoder.up_blocks[i].upsamplers"]
    if not all(hasattr(up, "compress_time") for up in _upsamplers(decoder)):
        return ["decoder.up_blocks[i].upsamplers[j].compress_time"]
    return []


def _upsamplers(decoder: Any) -> list[Any]:
    return [up for block in decoder.up_blocks for up in (block.upsamplers or ())]


def load_vae(weights: str | Path | None) -> Any:
    """`AutoencoderKLCogVideoX` from a local diffusers folder (the model's or its `vae/`)."""
    return FAMILY.load(weights)


class CogVideoXDecoder(StreamingDecoder):
    """CogVideoX's VAE decoder under the chunk contract: a chunk per batch of 2 latent
    frames (the first of 3 when T is odd): 9, 8, 8, ... frames."""

    name = "cogvideox"
    value_range = (-1.0, 1.0)
    latent_layout = CogVideoXLatents()

    def __init__(self, vae: Any, device: str | torch.device = "cpu") -> None:
        check_internals(vae)
        self.device = torch.device(device)
        # Parameters keep `requires_grad` as loaded, as in the pipelines (it may change
        # which kernel a layer takes); inference mode records nothing either way.
        self.vae = vae.to(self.device).eval()
        config = vae.config
        self.latent_channels = int(config.latent_channels)
        # The pipelines' `vae_scale_factor_spatial` and `vae_scale_factor_temporal`.
        self.spatial_scale = 2 ** (len(config.block_out_channels) - 1)
        self.temporal_scale = int(config.temporal_compression_ratio)
        self.latent_layout = CogVideoXLatents(self.temporal_scale)
        # The frame counts follow the decoder's own upsamplers, not the config's ratio.
        self._time_stages = sum(bool(up.compress_time) for up in _upsamplers(vae.decoder))
        self.batches = FrameBatches(BATCH_LATENT_FRAMES, remainder_first=True, stream_remainder=1)

    @classmethod
    def from_weights(
        cls, weights: str | Path | None, device: str | torch.device = "cpu"
    ) -> CogVideoXDecoder:
        """Load the VAE from a local diffusers folder with `load_vae`."""
        return cls(load_vae(weights), device)

    def batch_frames(self, latent_frames: int) -> int:
        """The frames one batch of `latent_frames` latent frames decodes to."""
        frames = latent_frames
        for _ in range(self._time_stages):
            # CogVideoXUpsample3D: a lone frame stays one; an odd count keeps its first.
            frames = 1 if frames == 1 else 2 * frames - frames % 2
        return frames

    def plan(self, latent_shape: Sequence[int]) -> DecodePlan:
        _, _, t, h, w = check_latent_shape(latent_shape, self.latent_channels)
        height, width = self._output_size(h, w)
        chunk_frames = tuple(self.batch_frames(n) for n in self.batches.sizes(t))
        return DecodePlan(height=height, width=width, chunk_frames=chunk_frames)

    def plan_stream(self, first_block_shape: Sequence[int]) -> StreamPlan:
        _, _, _, h, w = check_latent_shape(first_block_shape, self.latent_channels)
        height, width = self._output_size(h, w)
        per_batch = self.batch_frames(BATCH_LATENT_FRAMES)
        return StreamPlan(
            height=height,
            width=width,
            first_chunk_frames=self.batch_frames(self.batches.stream_size(0)),
            chunk_frames=per_batch,
            frames_per_latent=per_batch // BATCH_LATENT_FRAMES,
            group_opening_frames=1,
            latents_per_group=None,
        )

    def decode_chunks(self, latents: torch.Tensor, on_chunk: ChunkCallback) -> None:
        token = _WHOLE_FRAMES.set(int(latents.shape[2]) if latents.ndim == 5 else None)
        try:
            super().decode_chunks(latents, on_chunk)
        finally:
            _WHOLE_FRAMES.reset(token)

    def decode_stream(self, blocks: Iterable[torch.Tensor], on_chunk: ChunkCallback) -> DecodePlan:
        token = _WHOLE_FRAMES.set(None)  # a stream's length is open, even inside a decode
        try:
            return super().decode_stream(blocks, on_chunk)
        finally:
            _WHOLE_FRAMES.reset(token)

    def open_stream(self, first_block_shape: tuple[int, ...]) -> BatchStream:
        _, _, _, h, w = first_block_shape
        batches = CachedBatches(
            self._decode_tile, self._tiles(h, w), self.vae.blend_v, self.vae.blend_h
        )
        return BatchStream(
            self.batches,
            # Denormalized per batch: the scaling is elementwise, so it is the pipeline's.
            lambda latents, index: batches(self._denormalize(latents), index),
            self.device,
            self.vae.dtype,
            latent_frames=_WHOLE_FRAMES.get(),
            refuse=self._refuse_stream,
            close=batches.close,
        )

    def _denormalize(self, latents: torch.Tensor) -> torch.Tensor:
        # pipeline_cogvideox.py's `decode_latents`, the same expression for bit parity.
        return 1 / self.vae.config.scaling_factor * latents

    def _decode_tile(
        self, latents: torch.Tensor, cache: Any, index: int
    ) -> tuple[torch.Tensor, Any]:
        vae = self.vae
        if vae.post_quant_conv is not None:
            latents = vae.post_quant_conv(latents)
        frames, cache = vae.decoder(latents, conv_cache=cache)
        return frames, cache

    def _tiles(self, height: int, width: int) -> SpatialTiles | None:
        """`tiled_decode`'s grid where `_decode` would take it for latents of this size."""
        vae = self.vae
        if not (
            vae.use_tiling
            and (width > vae.tile_latent_min_width or height > vae.tile_latent_min_height)
        ):
            return None
        # tiled_decode's arithmetic, operation for operation.
        overlap_height = int(vae.tile_latent_min_height * (1 - vae.tile_overlap_factor_height))
        overlap_width = int(vae.tile_latent_min_width * (1 - vae.tile_overlap_factor_width))
        blend_extent_height = int(vae.tile_sample_min_height * vae.tile_overlap_factor_height)
        blend_extent_width = int(vae.tile_sample_min_width * vae.tile_overlap_factor_width)
        return SpatialTiles(
            tile=(vae.tile_latent_min_height, vae.tile_latent_min_width),
            stride=(overlap_height, overlap_width),
            blend=(blend_extent_height, blend_extent_width),
            keep=(
                vae.tile_sample_min_height - blend_extent_height,
                vae.tile_sample_min_width - blend_extent_width,
            ),
        )

    def _output_size(self, height: int, width: int) -> tuple[int, int]:
        tiles = self._tiles(height, width)
        if tiles is None:
            return height * self.spatial_scale, width * self.spatial_scale
        return tiles.output_size(height, width, self.spatial_scale)

    def _refuse_stream(self, latent_frames: int) -> InvalidRequestError:
        return InvalidRequestError(
            f"a cogvideox stream must have an odd number of latent frames (or exactly 2), got "
            f"{latent_frames}: CogVideoX decodes batches of 2 with the odd one out in the "
            f"first, so an even length moves every batch, and this stream's first chunks "
            f"were decoded as for an odd one; send latents of an even length as one tensor"
        )
