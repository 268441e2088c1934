"""Streaming a bidirectional (non-causal) video decoder through overlapping temporal windows.

The scheme is MiniMax-H3's (diffusers `AutoencoderKLMiniMaxH3._decode`, Apache-2.0),
stated here for any decoder that maps `window` latent frames to
`window * frames_per_latent` frames:

- The latents are read in groups of `stride = window - overlap`; window i decodes
  group i plus the first `overlap` latents of group i+1.
- Each group was encoded as a clip padded with `lead_frames` leading frames, so the
  decoded window splits into a *body* (frames `lead .. stride * F`) and a *tail*
  (frames `stride * F + lead .. window * F`), F being `frames_per_latent`.
- Body i's head is blended with tail i-1 over the tail's length by a linear ramp
  (each overlap blended once, by one function); the last window's tail is the end
  of the video.
- Latents are padded by repeating the last frame until they fill whole windows, and
  the frames the padding produced are cut off the end. In the output, latent k
  stands for `F - lead` frames when it opens a group (k % stride == 0), F otherwise.

Chunk i is body i, final as soon as window i is decoded (no later window touches it);
the tail follows body n-1 as a last chunk. So the plan, `total` included, is known
before the first window is decoded. The full decode is defined as the
concatenation of the chunks, which makes chunks and full decode bit-identical.

Latents that arrive in blocks (`WindowStream`): window i is decoded, and body i
committed in full, as soon as its `window` latents have all arrived (a window of
real latents only ever yields wanted frames); the windows that need padding, the
last tail and the trim wait for the end of the latents. Every window is decoded
from a fresh contiguous copy of its latents, whatever blocks they came in, so a
stream and a whole decode give the model the same input.

`WindowChunking` is a family's chunking through them, a chunk per body and the tail.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from vaecast.models.base import DecodePlan, StreamPlan, check_latent_shape
from vaecast.models.streaming import Emit, Prepare

WindowDecoder = Callable[[torch.Tensor], torch.Tensor]
PieceCallback = Callable[[torch.Tensor, int], None]


@dataclass(frozen=True, slots=True)
class WindowPlan:
    """How latents of one length are tiled, known before decoding."""

    latent_frames: int
    windows: int
    padding: int  # latent frames repeated at the end
    chunk_frames: tuple[int, ...]  # frames per published chunk, after the trim
    chunk_windows: tuple[int, ...]  # the window after whose decode each chunk is final

    @property
    def frames(self) -> int:
        return sum(self.chunk_frames)


@dataclass(frozen=True, slots=True)
class WindowTiler:
    """Overlapping windows over time: `window` latents each, `overlap` shared with the next."""

    window: int
    overlap: int
    frames_per_latent: int
    lead_frames: int = 0

    def __post_init__(self) -> None:
        if self.frames_per_latent < 1:
            raise ValueError(f"frames_per_latent must be at least 1, got {self.frames_per_latent}")
        if not 0 <= self.lead_frames < self.frames_per_latent:
            raise ValueError(
                f"lead_frames must be in [0, frames_per_latent), got {self.lead_frames}"
            )
        # overlap <= stride: a tail blends into the next body only, and never outgrows it.
        if not 0 <= self.overlap <= self.stride:
            raise ValueError(
                f"overlap must be in [0, window - overlap]: window {self.window}, "
                f"overlap {self.overlap}"
            )

    @property
    def stride(self) -> int:
        return self.window - self.overlap

    @property
    def body_frames(self) -> int:
        return self.stride * self.frames_per_latent - self.lead_frames

    @property
    def tail_frames(self) -> int:
        return self.overlap * self.frames_per_latent - self.lead_frames if self.overlap else 0

    def latent_frame_count(self, index: int) -> int:
        """Output frames latent `index` stands for."""
        opens_group = index % self.stride == 0
        return self.frames_per_latent - (self.lead_frames if opens_group else 0)

    def plan(self, latent_frames: int) -> WindowPlan:
        if latent_frames < 1:
            raise ValueError(f"need at least one latent frame, got {latent_frames}")
        # Enough windows that the last one's tail reaches the end: latent_frames <=
        # windows * stride + overlap. Shorter input still gets one (padded) window.
        windows = max(1, math.ceil((latent_frames - self.overlap) / self.stride))
        padding = windows * self.stride + self.overlap - latent_frames
        pieces = [self.body_frames] * windows + ([self.tail_frames] if self.tail_frames else [])
        wanted = sum(self.latent_frame_count(k) for k in range(latent_frames))
        chunk_frames: list[int] = []
        for piece in pieces:
            kept = min(piece, wanted - sum(chunk_frames))
            if kept <= 0:
                break
            chunk_frames.append(kept)
        chunk_windows = tuple(min(i, windows - 1) for i in range(len(chunk_frames)))
        return WindowPlan(latent_frames, windows, padding, tuple(chunk_frames), chunk_windows)

    def run(self, latents: torch.Tensor, decode_window: WindowDecoder, emit: PieceCallback) -> None:
        """Decode BCTHW `latents` window by window, calling `emit(frames, index)` per chunk.

        `decode_window` maps (B, C, window, h, w) to (B, C', window * F, H, W). The
        frames passed to `emit` are borrowed.
        """
        stream = WindowStream(self, decode_window)
        try:
            stream.push(latents, emit)
            stream.finish(emit)
        finally:
            stream.close()


class WindowStream:
    """`WindowTiler`'s windows over latents that arrive in blocks (BCTHW)."""

    def __init__(self, tiler: WindowTiler, decode_window: WindowDecoder) -> None:
        self._tiler = tiler
        self._decode_window = decode_window
        # Latent frames not yet behind every window that needs them, one tensor
        # each, from absolute index `_first`; and the last one, which the padding
        # repeats.
        self._latents: list[torch.Tensor] = []
        self._first = 0
        self._last: torch.Tensor | None = None
        self._received = 0
        self._windows = 0  # decoded so far
        self._tail: torch.Tensor | None = None  # the last decoded window's tail
        self._chunks = 0  # emitted so far

    def push(self, latents: torch.Tensor, emit: PieceCallback) -> None:
        """Take the next latent frames; decode every window they complete."""
        frames = list(latents.split(1, dim=2))
        if not frames:
            return
        self._latents += frames
        self._last = frames[-1]
        self._received += len(frames)
        tiler = self._tiler
        while self._windows * tiler.stride + tiler.window <= self._received:
            self._decode(emit, plan=None)

    def finish(self, emit: PieceCallback) -> None:
        """The latents ended: pad them, decode the windows left, emit the rest trimmed."""
        plan = self._tiler.plan(self._received)
        if self._last is not None and plan.padding:
            self._latents += [self._last] * plan.padding
        if self._windows == plan.windows:  # every window was whole: only its tail is left
            self._emit_tail(emit, plan)
        while self._windows < plan.windows:
            self._decode(emit, plan)

    def close(self) -> None:
        self._latents, self._last, self._tail = [], None, None

    def _decode(self, emit: PieceCallback, plan: WindowPlan | None) -> None:
        tiler = self._tiler
        f, lead, stride = tiler.frames_per_latent, tiler.lead_frames, tiler.stride
        start = self._windows * stride - self._first
        clip = self._decode_window(torch.cat(self._latents[start : start + tiler.window], dim=2))
        if clip.shape[2] != tiler.window * f:
            raise RuntimeError(
                f"a window of {tiler.window} latents decoded to {clip.shape[2]} frames, "
                f"expected {tiler.window * f}"
            )
        self._windows += 1
        # The next window starts `stride` latents on: the ones before are done with.
        del self._latents[: start + stride]
        self._first = self._windows * stride
        body = clip[:, :, lead : stride * f]
        if self._tail is not None:
            body = blend(self._tail, body)
        # A copy, so that the window's other frames are freed while a stream waits.
        self._tail = clip[:, :, stride * f + lead :].clone() if tiler.overlap else None
        del clip
        self._emit(body, emit, plan)
        if plan is not None and self._windows == plan.windows:
            self._emit_tail(emit, plan)

    def _emit_tail(self, emit: PieceCallback, plan: WindowPlan) -> None:
        if self._tail is not None:
            self._emit(self._tail, emit, plan)

    def _emit(self, piece: torch.Tensor, emit: PieceCallback, plan: WindowPlan | None) -> None:
        if plan is not None:  # the end is known: trim the padding's frames
            if self._chunks == len(plan.chunk_frames):
                return
            piece = piece[:, :, : plan.chunk_frames[self._chunks]]
        self._chunks += 1
        emit(piece, self._chunks - 1)


def blend(tail: torch.Tensor, body: torch.Tensor) -> torch.Tensor:
    """Cross-fade `tail` into the head of `body` along time with a linear ramp.

    Written exactly as diffusers' `AutoencoderKLMiniMaxH3._blend` (same operations in
    the same order), so that a tiled decode here is bit-identical to `vae.decode`.
    """
    extent = min(tail.shape[2], body.shape[2])
    positions = torch.arange(extent, device=body.device, dtype=body.dtype)
    shape = [1] * body.ndim
    shape[2] = extent
    weight_tail = (1 - positions / extent).view(shape)
    weight_body = (positions / extent).view(shape)
    blended = tail[:, :, -extent:] * weight_tail + body[:, :, :extent] * weight_body
    if extent == body.shape[2]:
        return blended
    return torch.cat([blended, body[:, :, extent:]], dim=2)


@dataclass(frozen=True, slots=True)
class WindowChunking:
    """A family's `Chunking` through `WindowTiler`: each window of `prepare`d latents
    through `decode_window`, its output made frames by `output`."""

    tiler: WindowTiler
    latent_channels: int
    spatial_scale: int
    prepare: Prepare
    decode_window: WindowDecoder
    output: Callable[[torch.Tensor], torch.Tensor]

    def plan(self, latent_shape: Sequence[int]) -> DecodePlan:
        # Diffusers' decode has no window for fewer than `overlap + 1` latent frames (a
        # stream may start with fewer; it is refused at its end).
        _, _, t, h, w = check_latent_shape(
            latent_shape, self.latent_channels, min_frames=self.tiler.overlap + 1
        )
        scale = self.spatial_scale
        return DecodePlan(h * scale, w * scale, self.tiler.plan(t).chunk_frames)

    def plan_stream(self, first_block_shape: Sequence[int]) -> StreamPlan:
        _, _, _, h, w = check_latent_shape(first_block_shape, self.latent_channels)
        # Bodies all have the same length; the tail, and any trimmed chunk, is last.
        tiler = self.tiler
        return StreamPlan(
            height=h * self.spatial_scale,
            width=w * self.spatial_scale,
            first_chunk_frames=tiler.body_frames,
            chunk_frames=tiler.body_frames,
            frames_per_latent=tiler.frames_per_latent,
            group_opening_frames=tiler.latent_frame_count(0),
            latents_per_group=tiler.stride,
        )

    def open_stream(
        self, first_block_shape: tuple[int, ...], latent_frames: int | None
    ) -> WindowLatents:
        return WindowLatents(self)


class WindowLatents:
    """A `LatentStream` over `WindowChunking`: the tiler's pending latents and last tail."""

    def __init__(self, chunking: WindowChunking) -> None:
        self._prepare = chunking.prepare
        self._output = chunking.output
        self._windows = WindowStream(chunking.tiler, chunking.decode_window)

    def push(self, block: torch.Tensor, emit: Emit) -> None:
        self._windows.push(self._prepare(block), self._emitter(emit))

    def finish(self, latent_frames: int, emit: Emit) -> None:
        self._windows.finish(self._emitter(emit))

    def close(self) -> None:
        self._windows.close()

    def _emitter(self, emit: Emit) -> PieceCallback:
        return lambda sample, index: emit(self._output(sample))
