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

`MiniMaxH3Decoder.from_weights` loads a local diffusers folder;
`MiniMaxH3Decoder(vae)` wraps an `AutoencoderKLMiniMaxH3` loaded some other way.
diffusers is imported only when a model is loaded, so `import vaecast` never needs it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from vaecast.models.base import (
    DecodePlan,
    StreamPlan,
    check_latent_shape,
)
from vaecast.models.bidirectional_windows import WindowStream, WindowTiler
from vaecast.models.diffusers_family import DiffusersFamily
from vaecast.models.streaming import Emit, StreamingDecoder
from vaecast.models.weights_io import WeightsError

# Pixel normalization of MiniMax-H3's video VAE (ImageNet's), as its pipeline applies it.
PIXEL_MEAN = (0.485, 0.456, 0.406)
PIXEL_STD = (0.229, 0.224, 0.225)

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
)


def check_internals(vae: Any) -> None:
    """Raise `WeightsError` if `vae` lacks the diffusers internals this decoder drives."""
    FAMILY.check(vae)


def load_vae(weights: str | Path | None) -> Any:
    """`AutoencoderKLMiniMaxH3` from a local diffusers folder (the model's or its `vae/`)."""
    return FAMILY.load(weights)


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


class MiniMaxH3Decoder(StreamingDecoder):
    """MiniMax-H3's video decoder under the chunk contract: a chunk per decoded window.

    Takes at least `overlap + 1` latent frames (3): diffusers' decode has no window
    for fewer (a stream may start with fewer; it is refused at its end). A window
    decode keeps no state on the module, so decodes may share one instance.
    """

    name = "minimax-h3"
    value_range = (0.0, 1.0)

    def __init__(self, vae: Any, device: str | torch.device = "cpu") -> None:
        check_internals(vae)
        self.device = torch.device(device)
        self.vae = vae.to(self.device).eval().requires_grad_(False)
        self.tiler = tiler_for(vae)
        self.latent_channels = int(vae.config.latent_channels)
        self._mean = torch.tensor(vae.config.latents_mean, device=self.device).view(1, -1, 1, 1, 1)
        self._std = torch.tensor(vae.config.latents_std, device=self.device).view(1, -1, 1, 1, 1)
        self._pixel_mean = torch.tensor(PIXEL_MEAN, device=self.device).view(1, -1, 1, 1, 1)
        self._pixel_std = torch.tensor(PIXEL_STD, device=self.device).view(1, -1, 1, 1, 1)

    @classmethod
    def from_weights(
        cls, weights: str | Path | None, device: str | torch.device = "cpu"
    ) -> MiniMaxH3Decoder:
        """Load the VAE from a local diffusers folder with `load_vae`."""
        return cls(load_vae(weights), device)

    def plan(self, latent_shape: Sequence[int]) -> DecodePlan:
        _, _, t, h, w = check_latent_shape(
            latent_shape, self.latent_channels, min_frames=self.tiler.overlap + 1
        )
        scale = int(self.vae.spatial_compression_ratio)
        tiles = self.tiler.plan(t)
        return DecodePlan(height=h * scale, width=w * scale, chunk_frames=tiles.chunk_frames)

    def plan_stream(self, first_block_shape: Sequence[int]) -> StreamPlan:
        _, _, _, h, w = check_latent_shape(first_block_shape, self.latent_channels)
        scale = int(self.vae.spatial_compression_ratio)
        # Bodies all have the same length; the tail, and any trimmed chunk, is last.
        tiler = self.tiler
        return StreamPlan(
            height=h * scale,
            width=w * scale,
            first_chunk_frames=tiler.body_frames,
            chunk_frames=tiler.body_frames,
            frames_per_latent=tiler.frames_per_latent,
            group_opening_frames=tiler.latent_frame_count(0),
            latents_per_group=tiler.stride,
        )

    def open_stream(self, first_block_shape: tuple[int, ...]) -> _MiniMaxStream:
        return _MiniMaxStream(self)

    def latents_in(self, block: torch.Tensor) -> torch.Tensor:
        """Pipeline-space latents as the model takes them."""
        # The pipeline's denormalization, then `vae.decode`'s cast to the decoder dtype.
        z = block.to(self.device, torch.float32) * self._std + self._mean
        return z.to(self.vae.post_quant_conv.weight.dtype)

    def pixels(self, sample: torch.Tensor) -> torch.Tensor:
        """The model's ImageNet-normalized output as RGB in [0, 1]."""
        return (sample.float() * self._pixel_std + self._pixel_mean).clamp(0, 1)


class _MiniMaxStream:
    """Its state: the tiler's pending latents and last tail."""

    def __init__(self, decoder: MiniMaxH3Decoder) -> None:
        self._decoder = decoder
        self._tiles = WindowStream(decoder.tiler, decoder.vae._decode_clip)

    def push(self, block: torch.Tensor, emit: Emit) -> None:
        self._tiles.push(self._decoder.latents_in(block), self._emitter(emit))

    def finish(self, latent_frames: int, emit: Emit) -> None:
        self._tiles.finish(self._emitter(emit))

    def close(self) -> None:
        self._tiles.close()

    def _emitter(self, emit: Emit) -> Callable[[torch.Tensor, int], None]:
        return lambda sample, index: emit(self._decoder.pixels(sample))
