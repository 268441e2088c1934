"""`minimax-h3`: MiniMax-H3's video VAE decoder, streamed through the temporal tiler.

The model is diffusers' `AutoencoderKLMiniMaxH3` (Apache-2.0; architecture by MiniMax):
a non-causal ViT decoder, so nothing can be committed frame by frame. diffusers'
`vae.decode` decodes overlapping windows of 7 latents (5 new + 2 overlap, 28
frames each), drops 3 leading frames per 20, blends each 5-frame tail into the next
17-frame body and trims the frames of the padding it added; `WindowTiler`
(`vaecast/models/bidirectional_windows.py`) does the same window by window and commits each body as
soon as its window is decoded; a stream decodes a window as soon as its 7 latents
have arrived, and the windows that need padding once the latents end. Each window
goes through the model's own `_decode_clip` (spatial tiling, on by default in
MiniMax-H3, included), so the concatenated chunks are bit-identical to `vae.decode`.

Latents are taken in pipeline space and denormalized as MiniMax-H3's decode step
does (`latent * latents_std + latents_mean`); the model's output is
ImageNet-normalized, so pixels are `sample * std + mean` clamped to [0, 1].

The decoder is `DiffusersDecoder` with this family's spec (`FAMILY`):
`MiniMaxH3Decoder.from_weights` loads a local diffusers folder; it takes at least
`overlap + 1` latent frames (3), and a window decode keeps no state on the module, so
decodes may share one instance.
`MiniMaxH3Decoder(vae)` wraps an `AutoencoderKLMiniMaxH3` loaded some other way.
diffusers is imported only when a model is loaded, so `import vaecast` never needs it.
"""

from __future__ import annotations

from typing import Any

import torch

from vaecast.models.bidirectional_windows import WindowChunking, WindowTiler
from vaecast.models.diffusers_family import DiffusersDecoder, DiffusersFamily
from vaecast.models.streaming import Prepare
from vaecast.models.weights_io import WeightsError

# Pixel normalization of MiniMax-H3's video VAE (ImageNet's), as its pipeline applies it.
PIXEL_MEAN = (0.485, 0.456, 0.406)
PIXEL_STD = (0.229, 0.224, 0.225)


def tiler_for(vae: Any) -> WindowTiler:
    """The tiler that reproduces `vae._decode`'s windows, blend and trim."""
    token_drop = int(vae.config.token_drop)
    stride, overlap = int(vae.tokens_chunk_size), int(vae.token_overlap)
    # diffusers pads to `latents + token_drop` whole groups and decodes one window
    # less than that many groups: the same windows as ours only when the dropped
    # tokens and the overlap make up one group (MiniMax-H3: 3 + 2 = 5), or nothing is
    # dropped at all.
    if token_drop and token_drop + overlap != stride:
        raise WeightsError(
            f"unsupported MiniMax-H3 geometry: token_drop {token_drop}, window stride "
            f"{stride}, overlap {overlap}"
        )
    tiler = WindowTiler(
        window=stride + overlap,
        overlap=overlap,
        frames_per_latent=int(vae.temporal_compression_ratio),
        lead_frames=int(vae.frame_pre_padding),
    )
    if tiler.tail_frames != vae.frame_overlap:
        raise WeightsError(
            f"unsupported MiniMax-H3 geometry: frame_overlap {vae.frame_overlap}, "
            f"expected {tiler.tail_frames}"
        )
    return tiler


def decode_step(vae: Any, device: torch.device) -> Prepare:
    """The pipeline's denormalization, then `vae.decode`'s cast to the decoder dtype."""
    mean = torch.tensor(vae.config.latents_mean, device=device).view(1, -1, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std, device=device).view(1, -1, 1, 1, 1)
    dtype = vae.post_quant_conv.weight.dtype
    return lambda latents: (latents.to(device, torch.float32) * std + mean).to(dtype)


def chunking(vae: Any, device: torch.device, prepare: Prepare) -> WindowChunking:
    """A chunk per decoded window, through the model's own `_decode_clip`; its
    ImageNet-normalized output made RGB in [0, 1]."""
    pixel_mean = torch.tensor(PIXEL_MEAN, device=device).view(1, -1, 1, 1, 1)
    pixel_std = torch.tensor(PIXEL_STD, device=device).view(1, -1, 1, 1, 1)
    return WindowChunking(
        tiler_for(vae),
        latent_channels=int(vae.config.latent_channels),
        spatial_scale=int(vae.spatial_compression_ratio),
        prepare=prepare,
        decode_window=vae._decode_clip,
        output=lambda sample: (sample.float() * pixel_std + pixel_mean).clamp(0, 1),
    )


# What vaecast drives of the model beyond diffusers' public API. The class arrived in
# diffusers 0.41 (its module is identical in 0.42.1).
FAMILY = DiffusersFamily(
    "minimax-h3",
    "AutoencoderKLMiniMaxH3",
    "diffusers>=0.41,<0.43",
    attributes=(
        "_decode_clip",
        "_decode",
        "post_quant_conv",
        "tokens_chunk_size",
        "token_overlap",
        "frame_pre_padding",
        "frame_overlap",
        "temporal_compression_ratio",
        "spatial_compression_ratio",
    ),
    config_keys=("clip_length", "token_drop", "latents_mean", "latents_std", "latent_channels"),
    signatures={"_decode_clip": ("z",)},
    needs={"accelerate": "diffusers keeps this model's norms in fp32 with it"},
    weights_of="MiniMax-H3",
    decode_step=decode_step,
    chunking=chunking,
    value_range=(0.0, 1.0),
)


class MiniMaxH3Decoder(DiffusersDecoder):
    """MiniMax-H3's video decoder under the chunk contract: a chunk per decoded window."""

    family = FAMILY
