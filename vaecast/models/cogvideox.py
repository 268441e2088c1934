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

The decoder is `DiffusersDecoder` with this family's spec (`FAMILY`):
`CogVideoXDecoder.from_weights` loads a local diffusers folder (the VAE's or a model's,
with `vae/`); `CogVideoXDecoder(vae)` wraps an `AutoencoderKLCogVideoX` loaded some other
way (its tiling state is read at each decode). diffusers is imported only when a model
is loaded, so `import vaecast` never needs it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from vaecast.errors import InvalidRequestError
from vaecast.models.diffusers_family import DiffusersDecoder, DiffusersFamily
from vaecast.models.frame_batches import BatchChunking, FrameBatches, SpatialTiles
from vaecast.models.layouts import BTCHW, MAX_GEOMETRY_VALUE, BoundLayout, Params
from vaecast.models.streaming import Prepare
from vaecast.models.weights_io import WeightsError
from vaecast.params import parse_int

# The batch the VAE decodes at a time; its own comment warns that the model was
# trained for no other, and the stream's rule (odd lengths) is this one's.
BATCH_LATENT_FRAMES = 2
# CogVideoX 1.5's transformer patch_size_t: its pipelines pad the latents to a multiple.
PATCH_SIZE_T = 2
# CogVideoX's temporal compression, as the pipelines read it from the VAE.
TEMPORAL_SCALE = 4


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


def decode_step(vae: Any, device: torch.device) -> Prepare:
    """pipeline_cogvideox.py's `decode_latents`, the same expression for bit parity."""
    scaling_factor = vae.config.scaling_factor
    return lambda latents: 1 / scaling_factor * latents.to(device, vae.dtype)


def batch_frames_of(vae: Any) -> Any:
    """(batch index, its latent frames) -> the frames the batch decodes to, by the
    decoder's own upsamplers, not the config's ratio."""
    time_stages = sum(bool(up.compress_time) for up in _upsamplers(vae.decoder))

    def batch_frames(index: int, latent_frames: int) -> int:
        frames = latent_frames
        for _ in range(time_stages):
            # CogVideoXUpsample3D: a lone frame stays one; an odd count keeps its first.
            frames = 1 if frames == 1 else 2 * frames - frames % 2
        return frames

    return batch_frames


def chunking(vae: Any, device: torch.device, prepare: Prepare) -> BatchChunking:
    """A chunk per batch of 2 latent frames (the first of 3 when T is odd): 9, 8, 8,
    ... frames; refused for a VAE that decodes other batches."""
    if vae.num_latent_frames_batch_size != BATCH_LATENT_FRAMES:
        raise WeightsError(
            f"unsupported CogVideoX decode: num_latent_frames_batch_size "
            f"{vae.num_latent_frames_batch_size}; vaecast streams batches of {BATCH_LATENT_FRAMES}"
        )
    batch_frames = batch_frames_of(vae)
    per_batch = batch_frames(1, BATCH_LATENT_FRAMES)

    def decode_tile(latents: torch.Tensor, cache: Any, index: int) -> tuple[torch.Tensor, Any]:
        if vae.post_quant_conv is not None:
            latents = vae.post_quant_conv(latents)
        return vae.decoder(latents, conv_cache=cache)

    return BatchChunking(
        FrameBatches(BATCH_LATENT_FRAMES, remainder_first=True, stream_remainder=1),
        latent_channels=int(vae.config.latent_channels),
        # The pipelines' `vae_scale_factor_spatial`.
        spatial_scale=2 ** (len(vae.config.block_out_channels) - 1),
        batch_frames=batch_frames,
        frames_per_latent=per_batch // BATCH_LATENT_FRAMES,
        group_opening_frames=1,
        tiles=lambda height, width: spatial_tiles(vae, height, width),
        prepare=prepare,
        decode_tile=decode_tile,
        blend_v=vae.blend_v,
        blend_h=vae.blend_h,
        device=device,
        dtype=vae.dtype,
        refuse=_refuse_stream,
    )


def spatial_tiles(vae: Any, height: int, width: int) -> SpatialTiles | None:
    """`tiled_decode`'s grid where `_decode` would take it for latents of this size."""
    larger = width > vae.tile_latent_min_width or height > vae.tile_latent_min_height
    if not (vae.use_tiling and larger):
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


def _refuse_stream(latent_frames: int) -> InvalidRequestError:
    return InvalidRequestError(
        f"a cogvideox stream must have an odd number of latent frames (or exactly 2), got "
        f"{latent_frames}: CogVideoX decodes batches of 2 with the odd one out in the "
        f"first, so an even length moves every batch, and this stream's first chunks "
        f"were decoded as for an odd one; send latents of an even length as one tensor"
    )


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
    more_checks=_missing_upsamplers,
    decode_step=decode_step,
    chunking=chunking,
    # The pipelines' `vae_scale_factor_temporal`, read from the config.
    layout=lambda vae: CogVideoXLatents(int(vae.config.temporal_compression_ratio)),
    # Parameters keep `requires_grad` as loaded, as in the pipelines.
    keeps_grad=True,
)


class CogVideoXDecoder(DiffusersDecoder):
    """CogVideoX's VAE decoder under the chunk contract: a chunk per batch of 2 latent
    frames (the first of 3 when T is odd): 9, 8, 8, ... frames."""

    family = FAMILY
    latent_layout = CogVideoXLatents()
