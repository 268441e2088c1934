"""`hunyuan-video`: HunyuanVideo's video VAE decoder, streamed through its own temporal tiles.

The model is diffusers' `AutoencoderKLHunyuanVideo` (Apache-2.0; architecture by
Tencent Hunyuan), the VAE of `HunyuanVideoPipeline`, whose latents and decode step
this takes (HunyuanVideo Framepack and Kandinsky 5 use the same VAE, but decode in
sections or return channels-last latents: their own steps). Its decoder is causal
but keeps no cache between calls, and its `use_framewise_decoding` is on by default,
so `vae.decode` of more than 4 latent frames is its `_temporal_tiled_decode`: tiles
of 5 latents every 3, each decoded on its own (its first frame dropped after tile 0),
blended over 4 frames with the tile before by `blend_t`, 12 frames kept per tile (13
for the first). `CausalTileStream` (`vaecast/models/causal_tiles.py`) runs that scheme
tile by tile and publishes each tile's frames as soon as it is decoded: latent
T = 13 gives chunks of 13, 12, 12, 12 frames (49 in all), and a stream decodes tile
i once latents up to 3i + 5 have arrived. Each tile goes through the VAE's own
per-tile path (`tiled_decode` where its `use_tiling` applies to the tile, else
`post_quant_conv` and `decoder`), so the chunks concatenate to `vae.decode` bit for
bit (tested, one thread on CPU); the tile sizes are read from the VAE when the decoder
is built. A VAE a user set to `use_framewise_decoding = False` decodes the whole clip in
one call, which this decoder does too, exactly, publishing its chunks when it is done
(`vaecast/models/margin_windows.py` with no reach shown): nothing on the VAE is changed.

Latents come in pipeline space (`output_type="latent"`: BCTHW, 16 channels, 8x in
space, 4x in time) and are scaled exactly as `pipeline_hunyuan_video.py` writes it,
`latents.to(vae.dtype) / vae.config.scaling_factor`; frames come out in [-1, 1],
unclamped, as `vae.decode` gives them.

A tile decode keeps no state on the module (no cache, no hooks of ours), so decodes
may share one VAE: each holds only its own pending latents and last tile's tail.

The decoder is `DiffusersDecoder` with this family's spec (`FAMILY`):
`HunyuanVideoDecoder.from_weights` loads a local diffusers folder;
`HunyuanVideoDecoder(vae)` wraps an `AutoencoderKLHunyuanVideo` loaded some other way.
diffusers is imported only when a model is loaded, so `import vaecast` never needs it.
"""

from __future__ import annotations

from typing import Any

import torch

from vaecast.models.causal_tiles import (
    SCHEME_ATTRIBUTES,
    CausalTiles,
    TileChunking,
    missing_scheme_lines,
    per_tile_decoder,
)
from vaecast.models.diffusers_family import DiffusersDecoder, DiffusersFamily
from vaecast.models.margin_windows import MarginChunking, MarginWindows
from vaecast.models.streaming import Prepare

# Latent frames per chunk of a whole-clip decode: 1 + 4 * 2 = 9 frames, then 12, as its tiles.
WHOLE_CLIP_CHUNK_LATENTS = 3
# The lines of `_temporal_tiled_decode` that fix the scheme: which frame a later tile
# drops, and that it is blended with the previous tile as diffusers stores it.
SCHEME_LINES = (
    "decoded = decoded[:, :, 1:, :, :]",
    "tile = self.blend_t(row[i - 1], tile, blend_num_frames)",
)


def decode_step(vae: Any, device: torch.device) -> Prepare:
    """pipeline_hunyuan_video.py's decode step, its expression for bit parity."""
    scaling_factor = vae.config.scaling_factor
    return lambda latents: latents.to(device).to(vae.dtype) / scaling_factor


def chunking(vae: Any, device: torch.device, prepare: Prepare) -> TileChunking | MarginChunking:
    """As the VAE decodes now: a chunk per temporal tile (`use_framewise_decoding`, on
    by default for this VAE), or the whole clip at once, its chunks at the end."""
    latent_channels = int(vae.config.latent_channels)
    spatial_scale = int(vae.spatial_compression_ratio)
    decode_tile = per_tile_decoder(
        vae,
        lambda latents: vae.tiled_decode(latents, return_dict=True).sample,
        lambda latents: vae.decoder(vae.post_quant_conv(latents)),
    )
    if not vae.use_framewise_decoding:
        chunk = WHOLE_CLIP_CHUNK_LATENTS  # no reach: one window, the whole clip
        windows = MarginWindows(int(vae.temporal_compression_ratio), chunk, chunk, reach=None)
        return MarginChunking(windows, latent_channels, spatial_scale, prepare, decode_tile)
    return TileChunking(
        CausalTiles.of(vae, drop="first", model=FAMILY.model),
        latent_channels=latent_channels,
        spatial_scale=spatial_scale,
        prepare=prepare,
        decode_tile=decode_tile,
        blend=vae.blend_t,
    )


# What vaecast drives of the model beyond diffusers' public API, on the versions whose
# `_temporal_tiled_decode` is the scheme we reproduce (checked in 0.42.1).
FAMILY = DiffusersFamily(
    "hunyuan-video",
    "AutoencoderKLHunyuanVideo",
    "diffusers>=0.42,<0.43",
    attributes=(*SCHEME_ATTRIBUTES, "post_quant_conv"),
    config_keys=("latent_channels", "scaling_factor"),
    signatures={
        "tiled_decode": ("z", "return_dict"),
        "blend_t": ("a", "b", "blend_extent"),
        "decoder.forward": ("hidden_states",),
    },
    weights_of="HunyuanVideo",
    more_checks=lambda vae: missing_scheme_lines(vae, SCHEME_LINES),
    decode_step=decode_step,
    chunking=chunking,
)


class HunyuanVideoDecoder(DiffusersDecoder):
    """HunyuanVideo's VAE decoder under the chunk contract: a chunk per temporal tile."""

    family = FAMILY
