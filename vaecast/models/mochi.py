"""`mochi`: the Mochi 1 video VAE decoder, streamed exactly: latent 0, then blocks of latents.

The model is diffusers' `AutoencoderKLMochi` (Apache-2.0; architecture by Genmo), as
`MochiPipeline` decodes with it. Each latent frame decodes to 6 frames (temporal
expansions 1 x 2 x 3), and `_decode` then drops the first 5 frames of the video
(`drop_last_temporal_frames`, on by default, despite its name): T latents give
6 T - 5 frames, latent 0 standing for one. 8x in space.

`_decode` has two paths. By default, and so in the pipeline, it decodes the whole clip
in one call. With `use_framewise_decoding` it decodes batches of
`num_latent_frames_batch_size` (2) latent frames, each as a clip of its own: Mochi's
convs pad in time with `pad_mode="replicate"`, which hands back no cache, so that path
is not the whole clip's (24 to 26 dB PSNR against it on random tiny weights).

This decoder streams the default path (`causal=True`, the default where the model's
structure allows it): the decoder is causal in time throughout, so
`vaecast.models.mochi_stream` runs it a few latent frames at a time, carrying each
causal conv's last input frames: latent frame 0 alone (1 frame, after the 5 dropped,
published at once), then blocks of `block_latents` (4 by default: 24 frames a chunk),
each final as soon as its latents have arrived (`block_latents=1`: a chunk per latent
frame; a step over several frames costs less per frame, see
`benchmarks/results/design_notes.md`). The chunks are `vae.decode`'s whole-clip
frames to float rounding (1e-6, tested at 1e-5), with the VAE's spatial tiling too
(`vae.enable_tiling()`: each tile carries its own caches and the tiles of each frame are
blended as `tiled_decode` blends them). A decoder whose structure is not the one that
pass repeats (`mochi_stream.check_decoder`) is decoded whole, exactly, and its chunks
published at the end, saying so in one log line. `causal=False` streams the frame-wise
path instead: it turns `use_framewise_decoding` on for the VAE (so that `vae.decode`
decodes as it streams), drives that loop from outside
(`vaecast/models/frame_batches.py`) and publishes each batch: 7 frames for the first,
12 for each next, bit for bit the frame-wise `vae.decode`.

Latents are what `MochiPipeline` returns with `output_type="latent"` (BCTHW, the
transformer's space), denormalized exactly as its decode step writes it:
`latents * latents_std / scaling_factor + latents_mean` (or `latents / scaling_factor`
where the config has no mean and std).

Decodes may overlap on one VAE: the caches are values the decoder returns (and empty),
each decode keeps its own, and the loop writes no state on the module.

The decoder is `DiffusersDecoder` with this family's spec (`FAMILY`):
`MochiDecoder.from_weights` loads a local diffusers folder (the VAE's or a model's, with
`vae/`); `MochiDecoder(vae)` wraps an `AutoencoderKLMochi` loaded some other way.
diffusers is imported only when a model is loaded, so `import vaecast` never needs it.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from vaecast.models import mochi_stream
from vaecast.models.diffusers_family import DiffusersDecoder, DiffusersFamily
from vaecast.models.frame_batches import BatchChunking, FrameBatches, SpatialTiles
from vaecast.models.margin_windows import MarginChunking, MarginWindows
from vaecast.models.streaming import Prepare
from vaecast.models.weights_io import WeightsError

log = logging.getLogger(__name__)
# Latent frames per step and chunk of the causal pass after latent 0's: it spends less
# per frame on blocks (measured: benchmarks/results/design_notes.md).
BLOCK_LATENTS = 4


def decode_step(vae: Any, device: torch.device) -> Prepare:
    """pipeline_mochi.py's decode step, the same expression and order for bit parity;
    its tensors built in float32, then cast to the latents' dtype."""
    config = vae.config
    scaling_factor = config.scaling_factor
    if config.latents_mean is None or config.latents_std is None:
        return lambda latents: latents.to(device, vae.dtype) / scaling_factor
    shape = (1, int(config.latent_channels), 1, 1, 1)
    mean = torch.tensor(config.latents_mean).view(shape).to(device, vae.dtype)
    std = torch.tensor(config.latents_std).view(shape).to(device, vae.dtype)
    return lambda latents: latents.to(device, vae.dtype) * std / scaling_factor + mean


def chunking(
    vae: Any,
    device: torch.device,
    prepare: Prepare,
    causal: bool | None = None,
    block_latents: int = BLOCK_LATENTS,
) -> BatchChunking | MarginChunking:
    """Latent 0's frame, then a chunk per `block_latents` latent frames, each block one
    step of the whole-clip decode's causal pass; or a chunk per frame-wise batch.

    `causal=None` streams causally where `mochi_stream.check_decoder` accepts the
    decoder, and otherwise decodes each clip whole, exactly, before streaming it (one
    log line says why); `False` streams frame-wise and turns `use_framewise_decoding`
    on for the VAE, so that `vae.decode` decodes as it streams. The batch size and
    `drop_last_temporal_frames` are read from the VAE here.
    """
    if block_latents < 1:
        raise ValueError(f"block_latents must be at least 1, got {block_latents}")
    problems = mochi_stream.check_decoder(vae.decoder) if causal is not False else []
    if causal and problems:
        raise WeightsError(f"mochi cannot stream this decoder causally: {'; '.join(problems)}")
    streams_causally = causal is not False and not problems
    frames_per_latent = int(vae.temporal_compression_ratio)
    # `_decode` drops these leading frames once the decode has at least
    # `temporal_compression_ratio` frames, which every decode has.
    dropped = frames_per_latent - 1 if vae.drop_last_temporal_frames else 0
    if problems and dropped:  # latent 0 is then one frame: the whole clip's windows fit
        log.warning(
            "mochi: decoding each clip whole before streaming it, exactly: the causal "
            "pass does not know this decoder (%s)",
            "; ".join(problems),
        )
        return MarginChunking(
            MarginWindows(frames_per_latent, block_latents, block_latents, reach=None),
            int(vae.config.latent_channels),
            int(vae.spatial_compression_ratio),
            prepare,
            lambda latents: vae.decode(latents, return_dict=False)[0],
        )
    if problems:
        log.warning(
            "mochi: streaming frame-wise, not exactly the whole-clip decode (%s)",
            "; ".join(problems),
        )
    if not streams_causally:
        vae.use_framewise_decoding = True

    def batch_frames(index: int, latent_frames: int) -> int:
        frames = latent_frames * frames_per_latent
        return frames - dropped if index == 0 else frames

    def decode_tile(latents: torch.Tensor, cache: Any, index: int) -> tuple[torch.Tensor, Any]:
        if streams_causally:
            cache = cache or mochi_stream.DecoderState()
            frames = mochi_stream.decode_step(vae.decoder, latents, cache)
        else:
            frames, cache = vae.decoder(latents, conv_cache=cache)
        if index == 0 and dropped:
            frames = frames[:, :, dropped:]
        return frames, cache

    batches = FrameBatches(block_latents, False, first=1)
    if not streams_causally:
        batches = FrameBatches(int(vae.num_latent_frames_batch_size), False)
    return BatchChunking(
        batches,
        latent_channels=int(vae.config.latent_channels),
        spatial_scale=int(vae.spatial_compression_ratio),
        batch_frames=batch_frames,
        frames_per_latent=frames_per_latent,
        group_opening_frames=frames_per_latent - dropped,
        tiles=lambda height, width: spatial_tiles(vae, height, width),
        prepare=prepare,
        decode_tile=decode_tile,
        blend_v=vae.blend_v,
        blend_h=vae.blend_h,
        device=device,
        dtype=vae.dtype,
    )


def spatial_tiles(vae: Any, height: int, width: int) -> SpatialTiles | None:
    """`tiled_decode`'s grid where `_decode` would take it for latents of this size."""
    scale = int(vae.spatial_compression_ratio)
    # _decode's and tiled_decode's arithmetic, operation for operation.
    tile_latent_min_height = vae.tile_sample_min_height // scale
    tile_latent_min_width = vae.tile_sample_min_width // scale
    if not (vae.use_tiling and (width > tile_latent_min_width or height > tile_latent_min_height)):
        return None
    return SpatialTiles(
        tile=(tile_latent_min_height, tile_latent_min_width),
        stride=(vae.tile_sample_stride_height // scale, vae.tile_sample_stride_width // scale),
        blend=(
            vae.tile_sample_min_height - vae.tile_sample_stride_height,
            vae.tile_sample_min_width - vae.tile_sample_stride_width,
        ),
        keep=(vae.tile_sample_stride_height, vae.tile_sample_stride_width),
        crop=(height * scale, width * scale),
    )


# What vaecast drives of the model beyond diffusers' public API, on the versions whose
# `AutoencoderKLMochi._decode` and `tiled_decode` loops and pipeline decode step are
# the ones we drive (0.35.0 and 0.42.1 are identical there).
FAMILY = DiffusersFamily(
    "mochi",
    "AutoencoderKLMochi",
    "diffusers>=0.35,<0.43",
    attributes=(
        "decoder",
        "use_framewise_decoding",
        "num_latent_frames_batch_size",
        "drop_last_temporal_frames",
        "temporal_compression_ratio",
        "spatial_compression_ratio",
        "use_tiling",
        "tile_sample_min_height",
        "tile_sample_min_width",
        "tile_sample_stride_height",
        "tile_sample_stride_width",
        "blend_v",
        "blend_h",
    ),
    config_keys=("latent_channels", "latents_mean", "latents_std", "scaling_factor"),
    signatures={"decoder.forward": ("hidden_states", "conv_cache")},
    weights_of="Mochi",
    decode_step=decode_step,
    chunking=chunking,
    # With `requires_grad` off, matmul folds Mochi's linear layers differently (~4e-7
    # in fp32 on CPU), and the pipeline decodes with it on, as loaded.
    keeps_grad=True,
)


class MochiDecoder(DiffusersDecoder):
    """Mochi's VAE decoder under the chunk contract: a chunk per latent frame, the
    whole-clip decode's (causal), or a chunk per frame-wise batch (`chunking`)."""

    family = FAMILY
