"""Streaming a non-causal decoder exactly: windows with a margin its reach makes safe.

A decoder whose frames depend on latents up to `before` latent frames earlier and
`after` later (a `Reach`, derived from its architecture), and that maps latents
[a, b) to the whole clip's frames from `a * r` on but for what its own ends change
(a temporal upsampler that drops its first frames does: `vaecast/models/ltx_reach.py`),
decodes exactly in windows:
- to commit latents [start, stop), decode [start - before, stop + after), clipped to
  the clip, and keep the frames of [start, stop): no frame kept is within reach of a
  window end that is not the clip's own;
- latent c's frames are (c - 1) * r + 1 .. c * r (latent 0: frame 0 alone), and a window
  from a > 0 opens with the last frame of latent a, its first-frame rule;
- a window commits `window_latents` latents, published as chunks of `chunk_latents`
  (the first of `1 + r * (chunk_latents - 1)` frames, each next of `r * chunk_latents`,
  the last the rest), so the chunking is the same however the windows fall.

A stream decodes the next window once the latents its commit needs have arrived, and
the rest at the end. A clip no longer than the first window, or a decoder whose reach
is not known (`reach` None), is one decode of the whole clip at its end: exact by
definition, its chunks published together. Kept frames equal the whole clip's within
float rounding (a kernel may round differently over a window's length than over the
clip's); a clip that is one window is the whole-clip decode itself, bit for bit.

Each window is decoded from a fresh contiguous copy of its latents, whatever blocks they
came in, so a stream and a whole decode hand the model the same tensors.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from vaecast.models.base import DecodePlan, StreamPlan, check_latent_shape
from vaecast.models.streaming import Emit, Prepare

# (B, C, L, h, w) latents to (B, 3, (L - 1) * r + 1, H, W) frames.
WindowDecoder = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True, slots=True)
class Reach:
    """Latent frames a decoded frame may depend on, before and after its own latent."""

    before: int
    after: int


@dataclass(frozen=True, slots=True)
class MarginWindows:
    """How latents are cut into exact windows and chunks, known before decoding."""

    temporal_scale: int  # r
    chunk_latents: int
    window_latents: int  # a multiple of chunk_latents
    reach: Reach | None  # None: not shown, so the whole clip is one window

    def __post_init__(self) -> None:
        if self.temporal_scale < 1 or self.chunk_latents < 1:
            raise ValueError(f"unsupported windows: {self}")
        if self.window_latents < 1 or self.window_latents % self.chunk_latents:
            raise ValueError(
                f"a window commits whole chunks: {self.window_latents} latents is not a "
                f"multiple of {self.chunk_latents}"
            )

    def first_frame(self, latent: int) -> int:
        """The first frame of latent `latent` (or the frame count of that many)."""
        return 0 if latent == 0 else (latent - 1) * self.temporal_scale + 1

    def chunk_frames(self, latent_frames: int) -> tuple[int, ...]:
        step = self.chunk_latents
        return tuple(
            self.first_frame(min(start + step, latent_frames)) - self.first_frame(start)
            for start in range(0, latent_frames, step)
        )

    def stream_plan(self, height: int, width: int) -> StreamPlan:
        r, step = self.temporal_scale, self.chunk_latents
        return StreamPlan(
            height=height,
            width=width,
            first_chunk_frames=1 + r * (step - 1),
            chunk_frames=r * step,
            frames_per_latent=r,
            group_opening_frames=1,
            latents_per_group=None,
        )

    def ready(self, committed: int, received: int) -> bool:
        """Whether the next window can be decoded before the latents end."""
        if self.reach is None:
            return False
        return committed + self.window_latents + self.reach.after <= received

    def span(self, start: int, stop: int, latent_frames: int) -> tuple[int, int]:
        """The latents a window committing [start, stop) decodes, of `latent_frames`."""
        if self.reach is None:
            return 0, latent_frames
        return max(0, start - self.reach.before), min(latent_frames, stop + self.reach.after)


class MarginWindowStream:
    """One decode through `MarginWindows`. A `LatentStream`."""

    def __init__(
        self, windows: MarginWindows, prepare: Prepare, decode_window: WindowDecoder
    ) -> None:
        self._windows = windows
        self._prepare = prepare
        self._decode_window: WindowDecoder | None = decode_window
        # Latent frames from absolute index `_first` on: those a window not yet decoded
        # may read.
        self._latents: list[torch.Tensor] = []
        self._first = 0
        self._received = 0
        self._committed = 0

    def push(self, block: torch.Tensor, emit: Emit) -> None:
        frames = list(self._prepare(block).split(1, dim=2))
        self._latents += frames
        self._received += len(frames)
        windows = self._windows
        while windows.ready(self._committed, self._received):
            self._decode(self._committed + windows.window_latents, self._received, emit)

    def finish(self, latent_frames: int, emit: Emit) -> None:
        if self._committed < latent_frames:
            self._decode(latent_frames, latent_frames, emit)

    def close(self) -> None:
        self._latents = []
        self._decode_window = None

    def _decode(self, stop: int, available: int, emit: Emit) -> None:
        assert self._decode_window is not None, "a closed stream decodes nothing"
        windows, start = self._windows, self._committed
        low, high = windows.span(start, stop, available)
        latents = torch.cat(self._latents[low - self._first : high - self._first], dim=2)
        frames = self._decode_window(latents)
        del latents
        expected = (high - low - 1) * windows.temporal_scale + 1
        if frames.shape[2] != expected:
            raise RuntimeError(
                f"latents {low}..{high} decoded to {frames.shape[2]} frames, expected {expected}"
            )
        # A window from latent low > 0 opens with that latent's last frame.
        offset = 0 if low == 0 else low * windows.temporal_scale
        for begin in range(start, stop, windows.chunk_latents):
            end = min(begin + windows.chunk_latents, stop)
            first, last = windows.first_frame(begin) - offset, windows.first_frame(end) - offset
            emit(frames[:, :, first:last])
        self._committed = stop
        # The next window reads from `stop - before` on.
        keep_from = stop if windows.reach is None else max(0, stop - windows.reach.before)
        del self._latents[: keep_from - self._first]
        self._first = keep_from


@dataclass(frozen=True, slots=True)
class MarginChunking:
    """A family's `Chunking` through `MarginWindows`."""

    windows: MarginWindows
    latent_channels: int
    spatial_scale: int
    prepare: Prepare
    decode_window: WindowDecoder

    def plan(self, latent_shape: Sequence[int]) -> DecodePlan:
        _, _, t, h, w = check_latent_shape(latent_shape, self.latent_channels)
        scale = self.spatial_scale
        return DecodePlan(h * scale, w * scale, self.windows.chunk_frames(t))

    def plan_stream(self, first_block_shape: Sequence[int]) -> StreamPlan:
        _, _, _, h, w = check_latent_shape(first_block_shape, self.latent_channels)
        return self.windows.stream_plan(h * self.spatial_scale, w * self.spatial_scale)

    def open_stream(
        self, first_block_shape: tuple[int, ...], latent_frames: int | None
    ) -> MarginWindowStream:
        return MarginWindowStream(self.windows, self.prepare, self.decode_window)
