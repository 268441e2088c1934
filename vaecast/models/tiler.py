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
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

WindowDecoder = Callable[[torch.Tensor], torch.Tensor]
PieceCallback = Callable[[torch.Tensor, int], None]


@dataclass(frozen=True, slots=True)
class TilePlan:
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
class TemporalTiler:
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

    def plan(self, latent_frames: int) -> TilePlan:
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
        return TilePlan(latent_frames, windows, padding, tuple(chunk_frames), chunk_windows)

    def run(self, latents: torch.Tensor, decode_window: WindowDecoder, emit: PieceCallback) -> None:
        """Decode BCTHW `latents` window by window, calling `emit(frames, index)` per chunk.

        `decode_window` maps (B, C, window, h, w) to (B, C', window * F, H, W). The
        frames passed to `emit` are slices of the windows' output: borrowed.
        """
        plan = self.plan(latents.shape[2])
        if plan.padding:
            repeat = latents[:, :, -1:].repeat(1, 1, plan.padding, 1, 1)
            latents = torch.cat([latents, repeat], dim=2)
        f, lead = self.frames_per_latent, self.lead_frames
        previous_tail: torch.Tensor | None = None
        chunk = 0
        for index in range(plan.windows):
            start = index * self.stride
            clip = decode_window(latents[:, :, start : start + self.window])
            if clip.shape[2] != self.window * f:
                raise RuntimeError(
                    f"a window of {self.window} latents decoded to {clip.shape[2]} frames, "
                    f"expected {self.window * f}"
                )
            body = clip[:, :, lead : self.stride * f]
            if previous_tail is not None:
                body = blend(previous_tail, body)
            previous_tail = clip[:, :, self.stride * f + lead :] if self.overlap else None
            pieces = [body]
            if index == plan.windows - 1 and previous_tail is not None:
                pieces.append(previous_tail)
            for piece in pieces:
                if chunk == len(plan.chunk_frames):
                    return
                emit(piece[:, :, : plan.chunk_frames[chunk]], chunk)
                chunk += 1


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
