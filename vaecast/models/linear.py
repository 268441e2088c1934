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
    DecodePlan,
    StreamPlan,
    causal_plan,
    causal_stream_plan,
)
from vaecast.models.streaming import CausalStream, StreamingDecoder

LATENT_CHANNELS = 16
SPATIAL_SCALE = 8
TEMPORAL_SCALE = 4


class LinearDecoder(StreamingDecoder):
    """`linear` under the chunk contract; parameter-free, hence no `from_weights`."""

    name = "linear"
    latent_space = None  # any latents of its geometry (vaecast.models.latent_space)
    latent_channels = LATENT_CHANNELS
    value_range = (-1.0, 1.0)

    def __init__(self, device: str | torch.device = "cpu") -> None:
        self.device = torch.device(device)

    def plan(self, latent_shape: Sequence[int]) -> DecodePlan:
        return causal_plan(latent_shape, self.latent_channels, SPATIAL_SCALE, TEMPORAL_SCALE)

    def plan_stream(self, first_block_shape: Sequence[int]) -> StreamPlan:
        return causal_stream_plan(
            first_block_shape, self.latent_channels, SPATIAL_SCALE, TEMPORAL_SCALE
        )

    def open_stream(
        self, first_block_shape: tuple[int, ...], latent_frames: int | None = None
    ) -> _LinearStream:
        return _LinearStream(self.device)


class _LinearStream(CausalStream):
    """Its only state: the previous latent frame's RGB."""

    def __init__(self, device: torch.device) -> None:
        super().__init__(device, torch.float32)
        # Sub-frame j of 4 sits j/4 of the way from the previous latent frame.
        weights = torch.arange(1, TEMPORAL_SCALE + 1, device=device) / TEMPORAL_SCALE
        self._weights = weights.view(1, 1, -1, 1, 1)
        self._previous: torch.Tensor | None = None

    def step(self, latent: torch.Tensor, index: int) -> torch.Tensor:
        current = latent[:, :3]
        frames = (
            current
            if self._previous is None
            else torch.lerp(self._previous, current, self._weights)
        )
        self._previous = current
        pixels = frames.repeat_interleave(SPATIAL_SCALE, dim=3)
        return pixels.repeat_interleave(SPATIAL_SCALE, dim=4).clamp_(-1.0, 1.0)

    def close(self) -> None:
        super().close()
        self._previous = None
