"""Decoders of a user's own, in the two framework contracts `vaecast.models.plugins` takes.

Each is a real (if small) decoder: 12 latent channels become 2x2 RGB pixels through
`pixel_shuffle` and `tanh`, one chunk per latent frame (the first 1 frame, each later
one 4, as a causal video VAE). Like a framework that reuses its buffers, each chunk is
written into one tensor that the decoder overwrites with garbage as soon as the
callback returns: a consumer that keeps the borrowed tensor instead of what it held
would show the garbage.

Factories are named `--model tests.helpers.plugins:driven` (and `:temporal`,
`:failing`, `:no_plan`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

LATENT_CHANNELS = 12
SCALE = 2
FRAMES_PER_LATENT = 4
GARBAGE = 7.0  # outside [-1, 1]: clamps to white if a consumer reads a reused buffer


def reference_decode(latents: torch.Tensor) -> torch.Tensor:
    """The frames every plugin here publishes, as one tensor (BCTHW in [-1, 1])."""
    return torch.cat([_frames(latents, t) for t in range(latents.shape[2])], dim=2)


def _frames(latents: torch.Tensor, t: int) -> torch.Tensor:
    image = torch.tanh(F.pixel_shuffle(latents[0, :, t], SCALE))  # (3, 2h, 2w)
    count = 1 if t == 0 else FRAMES_PER_LATENT
    # Each of a latent frame's frames a little darker, so that they differ.
    steps = torch.linspace(1.0, 0.7, count).view(1, count, 1, 1)
    return (image.unsqueeze(1) * steps).unsqueeze(0)


def plan(latent_shape: Sequence[int]) -> tuple[int, int, list[int]]:
    _, channels, frames, height, width = latent_shape
    if channels != LATENT_CHANNELS:
        raise ValueError(f"takes {LATENT_CHANNELS} latent channels, got {channels}")
    return height * SCALE, width * SCALE, [1] + [FRAMES_PER_LATENT] * (frames - 1)


class _Decoder:
    latent_channels = LATENT_CHANNELS
    chunk_value_range = (-1.0, 1.0)

    def __init__(self, fail_at: int | None = None) -> None:
        self.fail_at = fail_at
        self.plan = plan

    def _publish(self, z: torch.Tensor, publish: Callable[[torch.Tensor, int, int], None]) -> None:
        _, _, frames, height, width = z.shape
        buffer = torch.empty(1, 3, FRAMES_PER_LATENT, height * SCALE, width * SCALE)
        start = 0
        for t in range(frames):
            if t == self.fail_at:
                raise RuntimeError(f"the plugin's decoder broke at latent frame {t}")
            frames_t = _frames(z, t)
            chunk = buffer[:, :, : frames_t.shape[2]]
            chunk.copy_(frames_t)
            publish(chunk, t, start)
            chunk.fill_(GARBAGE)  # the framework reuses its buffer
            start += frames_t.shape[2]


class DrivenDecoder(_Decoder):
    """vLLM-Omni's `SupportsChunkedVAEDecode` shape."""

    def decode_with_chunks(self, z: torch.Tensor, *, on_chunk: Callable[[Any], None]) -> None:
        self._publish(z, lambda chunk, index, start: on_chunk(chunk))


class TemporalCallbackDecoder(_Decoder):
    """MiniMax-H3's `temporal_chunk_callback` v1 shape."""

    temporal_chunk_callback_api_version = 1

    def decode_base(
        self, latent: torch.Tensor, *, temporal_chunk_callback: Callable[..., None] | None = None
    ) -> torch.Tensor:
        total = latent.shape[2]

        def publish(chunk: torch.Tensor, index: int, start: int) -> None:
            assert temporal_chunk_callback is not None
            temporal_chunk_callback(
                chunk,
                chunk_index=index,
                total_chunks=total,
                frame_start=start,
                is_final=index == total - 1,
            )

        self._publish(latent, publish)
        return reference_decode(latent)


def driven(device: str, weights: str | None) -> DrivenDecoder:
    return DrivenDecoder()


def temporal(device: str, weights: str | None) -> TemporalCallbackDecoder:
    return TemporalCallbackDecoder()


def failing(device: str, weights: str | None) -> DrivenDecoder:
    return DrivenDecoder(fail_at=2)


def no_plan(device: str, weights: str | None) -> object:
    decoder = DrivenDecoder()
    del decoder.plan
    return decoder
