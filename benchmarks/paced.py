"""A real decoder made to decode at a chosen pace: a full VAE slower than real time,
on a machine where the embedded one is far faster.

`PacedDecoder` runs the decoder it wraps, chunk by chunk, and holds each chunk back
until `pace` seconds of wall time per second of video have passed since the decode
began (1.5: one and a half times slower than real time). The frames are the wrapped
decoder's own; only when they come out changes. The never-stall benchmark and the
live rendition's tests use it for their "final 1.5x / 3x slower" cases.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence

import torch

from vaecast.models.base import ChunkCallback, ChunkedDecoder, DecodedChunk, DecodePlan, StreamPlan


class PacedDecoder:
    """`inner`, at `pace` wall seconds per video second (at `fps`), under `name`."""

    def __init__(self, inner: ChunkedDecoder, pace: float, fps: float, name: str | None = None):
        self.inner, self.pace, self.fps = inner, pace, fps
        self.name = name or inner.name
        self.latent_channels = inner.latent_channels
        self.value_range = inner.value_range
        self.device = inner.device
        if hasattr(inner, "latent_space"):
            self.latent_space = inner.latent_space
        self._stop = threading.Event()

    def plan(self, latent_shape: Sequence[int]) -> DecodePlan:
        return self.inner.plan(latent_shape)

    def plan_stream(self, first_block_shape: Sequence[int]) -> StreamPlan:
        return self.inner.plan_stream(first_block_shape)

    def decode_chunks(self, latents: torch.Tensor, on_chunk: ChunkCallback) -> None:
        self.inner.decode_chunks(latents, self._paced(on_chunk))

    def decode_stream(self, blocks: Iterable[torch.Tensor], on_chunk: ChunkCallback) -> DecodePlan:
        return self.inner.decode_stream(blocks, self._paced(on_chunk))

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        return self.inner.decode(latents)

    def release(self) -> None:
        """Stop pacing (teardown: no decode thread sleeps on)."""
        self._stop.set()

    def _paced(self, on_chunk: ChunkCallback) -> ChunkCallback:
        began = time.perf_counter()

        def paced(chunk: DecodedChunk) -> None:
            end_s = (chunk.frame_start + chunk.frame_count) / self.fps
            wait_s = began + end_s * self.pace - time.perf_counter()
            if wait_s > 0:
                self._stop.wait(wait_s)
            on_chunk(chunk)

        return paced
