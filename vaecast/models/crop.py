"""A decoder's output cut to the size a user asked for: the top-left `width` x `height`.

Decoders decode whole latent pixels, a multiple of their spatial scale (16 for Wan 2.2,
32 for LTX): a pipeline asked for 848x480 pads, and its own output is cropped back, as
vLLM-Omni's MP4 session does. `CroppedDecoder` does that around any decoder, by
composition: the same plans with the smaller size, the same chunks cut to it. Sizes must
be even (H.264's 4:2:0 halves them) and no larger than the decoded frames.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

import torch

from vaecast.errors import InvalidRequestError
from vaecast.models.base import ChunkCallback, ChunkedDecoder, DecodedChunk, DecodePlan, StreamPlan
from vaecast.models.layouts import LatentLayout, layout_of


def check_crop_size(width: int, height: int) -> None:
    """Refuse a size that H.264 4:2:0 cannot carry."""
    for name, value in (("width", width), ("height", height)):
        if value < 2 or value % 2:
            raise InvalidRequestError(
                f"{name} must be an even number of pixels of at least 2 (4:2:0 video halves "
                f"it), got {value}"
            )


class CroppedDecoder(ChunkedDecoder):
    """`inner`'s frames cut to their top-left `width` x `height`."""

    def __init__(self, inner: ChunkedDecoder, width: int, height: int) -> None:
        check_crop_size(width, height)
        self.inner = inner
        self.width, self.height = width, height
        self.name = inner.name
        self.latent_space = getattr(inner, "latent_space", inner.name)
        self.latent_channels = inner.latent_channels
        self.value_range = inner.value_range
        self.device = inner.device
        self.latent_layout: LatentLayout = layout_of(inner)

    def _fit(self, height: int, width: int) -> None:
        if self.width > width or self.height > height:
            raise InvalidRequestError(
                f"the requested {self.width}x{self.height} is larger than the decoded "
                f"{width}x{height} frames; a crop keeps the top-left part of them"
            )

    def plan(self, latent_shape: Sequence[int]) -> DecodePlan:
        plan = self.inner.plan(latent_shape)
        self._fit(plan.height, plan.width)
        return dataclasses.replace(plan, height=self.height, width=self.width)

    def plan_stream(self, first_block_shape: Sequence[int]) -> StreamPlan:
        plan = self.inner.plan_stream(first_block_shape)
        self._fit(plan.height, plan.width)
        return dataclasses.replace(plan, height=self.height, width=self.width)

    def decode_chunks(self, latents: torch.Tensor, on_chunk: ChunkCallback) -> None:
        self.plan(latents.shape)  # refused before any decoding
        self.inner.decode_chunks(latents, self._cropping(on_chunk))

    def decode_stream(self, blocks: Iterable[torch.Tensor], on_chunk: ChunkCallback) -> DecodePlan:
        plan = self.inner.decode_stream(blocks, self._cropping(on_chunk))
        return dataclasses.replace(plan, height=self.height, width=self.width)

    def _cropping(self, on_chunk: ChunkCallback) -> ChunkCallback:
        def crop(chunk: DecodedChunk) -> None:
            frames = chunk.frames[:, :, :, : self.height, : self.width]
            # The decoder's own YUV is of the whole frame: the bridge converts the cut.
            on_chunk(dataclasses.replace(chunk, frames=frames, yuv420=None))

        return crop
