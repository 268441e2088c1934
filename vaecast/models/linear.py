"""`linear`: a parameter-free causal decoder whose output is a known function of its input.

It has Wan 2.1's geometry (16 latent channels, 8x spatial and 4x temporal
upsampling, T latent frames -> 1 + 4(T-1) video frames) and publishes one chunk per
latent frame, like the causal VAEs vaecast serves, but its pixels are written down
in one line: latent channels 0-2 are red, green and blue, nearest-upsampled 8x in
space and linearly interpolated in time from the previous latent frame, clamped to
[-1, 1]. That makes it the decoder of choice for tests (expected frames are computed
independently) and for smoke-testing a deployment without weights.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from vaecast.models.base import (
    ChunkCallback,
    ChunkedDecoder,
    DecodedChunk,
    DecodePlan,
    causal_plan,
    register_decoder,
)

LATENT_CHANNELS = 16
SPATIAL_SCALE = 8
TEMPORAL_SCALE = 4


class LinearDecoder(ChunkedDecoder):
    """`linear` under the chunk contract; parameter-free, hence no `from_weights`."""

    name = "linear"
    latent_channels = LATENT_CHANNELS
    value_range = (-1.0, 1.0)

    def __init__(self, device: str | torch.device = "cpu") -> None:
        self.device = torch.device(device)

    def plan(self, latent_shape: Sequence[int]) -> DecodePlan:
        return causal_plan(latent_shape, self.latent_channels, SPATIAL_SCALE, TEMPORAL_SCALE)

    def decode_chunks(self, latents: torch.Tensor, on_chunk: ChunkCallback) -> None:
        plan = self.plan(latents.shape)
        rgb = latents[:, :3].to(self.device, torch.float32)
        previous: torch.Tensor | None = None
        for index, frame_start in enumerate(plan.chunk_starts):
            current = rgb[:, :, index : index + 1]
            if previous is None:
                frames = current
            else:
                # Sub-frame j of 4 sits j/4 of the way from the previous latent frame.
                weights = torch.arange(1, TEMPORAL_SCALE + 1, device=self.device) / TEMPORAL_SCALE
                weights = weights.view(1, 1, -1, 1, 1)
                frames = torch.lerp(previous, current, weights)
            pixels = frames.repeat_interleave(SPATIAL_SCALE, dim=3)
            pixels = pixels.repeat_interleave(SPATIAL_SCALE, dim=4).clamp_(-1.0, 1.0)
            on_chunk(DecodedChunk(pixels, index, plan.chunks, frame_start))
            previous = current


register_decoder("linear", LinearDecoder)
