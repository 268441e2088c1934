"""`frames`: the decoder of a push session whose producer decodes on its own.

A producer that runs its own VAE (on its own GPU, as vLLM-Omni's Wan S2V does) pushes
frames, not latents. This pass-through stands where a decoder stands, so that the
pipeline, the encode, the fan-out, HLS and the events are those of any push session:
blocks of BCTHW RGB (uint8, or floats in `value_range`) in, chunks of frames out.

Chunks have one size, the first block's frame count, as every streamed decode's do
(`StreamPlan`): a later block of another size is cut into chunks of that size, the rest
waiting for the next block (or the end). A producer that pushes blocks of one size,
as generators do, gets a chunk per block, published the moment it arrives.
One instance per session: its chunk size is that session's.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from vaecast.errors import InvalidRequestError
from vaecast.models.base import DecodePlan, StreamPlan, check_latent_shape
from vaecast.models.streaming import Emit, StreamingDecoder

RGB_CHANNELS = 3
UINT8_MAX = 255.0


class FramesDecoder(StreamingDecoder):
    """Frames through unchanged, cut into chunks of the first block's length."""

    name = "frames"
    latent_channels = RGB_CHANNELS

    def __init__(
        self, value_range: tuple[float, float] = (0.0, 1.0), device: str | torch.device = "cpu"
    ) -> None:
        low, high = (float(v) for v in value_range)
        if not low < high:
            raise InvalidRequestError(
                f"value_range must be [low, high], low < high; got {value_range}"
            )
        self.value_range = (low, high)
        self.device = torch.device(device)
        self.chunk_frames: int | None = None  # the first block's frame count

    def plan(self, latent_shape: Sequence[int]) -> DecodePlan:
        _, _, frames, height, width = self._check(latent_shape)
        chunk = self.chunk_frames or frames
        sizes = [chunk] * (frames // chunk) + ([frames % chunk] if frames % chunk else [])
        return DecodePlan(height=height, width=width, chunk_frames=tuple(sizes))

    def plan_stream(self, first_block_shape: Sequence[int]) -> StreamPlan:
        _, _, frames, height, width = self._check(first_block_shape)
        if self.chunk_frames is None:
            self.chunk_frames = frames
        return StreamPlan(
            height=height,
            width=width,
            first_chunk_frames=self.chunk_frames,
            chunk_frames=self.chunk_frames,
            frames_per_latent=1,
            group_opening_frames=1,
            latents_per_group=None,
        )

    def open_stream(
        self, first_block_shape: tuple[int, ...], latent_frames: int | None = None
    ) -> _FramesStream:
        assert self.chunk_frames is not None  # plan_stream ran on this shape
        return _FramesStream(self.chunk_frames, self.value_range, self.device)

    @staticmethod
    def _check(shape: Sequence[int]) -> tuple[int, int, int, int, int]:
        if len(shape) == 5 and int(shape[1]) != RGB_CHANNELS:
            raise InvalidRequestError(f"frames must be RGB (3 channels), got {int(shape[1])}")
        checked = check_latent_shape(shape, RGB_CHANNELS)
        height, width = checked[3], checked[4]
        # H.264 here is 4:2:0: each chroma sample covers 2x2 pixels, so a frame the
        # encoder takes has an even width and height (a 63x65 block failed the job later).
        if height % 2 or width % 2:
            raise InvalidRequestError(
                f"frames must have an even width and height (H.264 4:2:0), got {width}x{height}"
            )
        return checked


class _FramesStream:
    """Frames waiting for a whole chunk: at most one chunk's worth."""

    def __init__(
        self, chunk_frames: int, value_range: tuple[float, float], device: torch.device
    ) -> None:
        self._chunk = chunk_frames
        self._low, self._high = value_range
        self._device = device
        self._pending: list[torch.Tensor] = []
        self._pending_frames = 0

    def push(self, block: torch.Tensor, emit: Emit) -> None:
        frames = block.to(self._device)
        if frames.dtype == torch.uint8:  # 0-255 into the session's range, as floats
            frames = frames.to(torch.float32) * ((self._high - self._low) / UINT8_MAX) + self._low
        self._pending.append(frames.to(torch.float32))
        self._pending_frames += int(frames.shape[2])
        while self._pending_frames >= self._chunk:
            joined = torch.cat(self._pending, dim=2) if len(self._pending) > 1 else self._pending[0]
            emit(joined[:, :, : self._chunk].contiguous())
            rest = joined[:, :, self._chunk :]
            self._pending = [rest] if rest.shape[2] else []
            self._pending_frames = int(rest.shape[2])

    def finish(self, latent_frames: int, emit: Emit) -> None:
        if self._pending:
            emit(torch.cat(self._pending, dim=2).contiguous())
        self._pending, self._pending_frames = [], 0

    def close(self) -> None:
        self._pending, self._pending_frames = [], 0
