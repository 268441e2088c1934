"""The test decoders and the faulty encoder, and how a request asks for a fault.

Both sides import this module: the server (`server.py`) to build its decoders and
encoder factory, the client to build requests that trigger each fault. A request
asks for a fault through what it already carries, so the server under test needs
no extra route or state:
- a decoder fault by its model name, `fault-{kind}-at-{chunk}`;
- an encoder fault by the video's geometry: frames `ENCODER_FAULT_HEIGHT_PX` high,
  and a width that names the chunk (`encoder_fault_width_px`);
- a full disk by size: a video whose spill file outgrows the server's
  RLIMIT_FSIZE (`DISK_FULL_FILE_BYTES`) fails its write with EFBIG, for real.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from vaecast.codecs.stream import VideoStreamEncoder
from vaecast.models.base import ChunkCallback, DecodedChunk, DecodePlan
from vaecast.models.linear import SPATIAL_SCALE, LinearDecoder

SLOW_MODEL = "slow"
# Long enough per chunk that a client can leave mid-stream, short enough to keep
# a thousand jobs cheap; the sleep holds no CPU.
SLOW_CHUNK_S = 0.03

DECODER_FAULT_KINDS = ("runtime", "memory", "plan")
FAULT_CHUNKS = 6  # fault latents have this many latent frames, so this many chunks

# Latents of this height (5 latent rows) ask the encoder to fail; none of the other
# requests the suite sends is 40 px high.
ENCODER_FAULT_HEIGHT_PX = 5 * SPATIAL_SCALE
_ENCODER_FAULT_BASE_COLS = 9

# Every file the server process writes is capped at this size (RLIMIT_FSIZE): a
# spill file past it fails like a full disk. Every other video the suite asks for
# is far smaller.
DISK_FULL_FILE_BYTES = 64 * 1024
SPILL_THRESHOLD_BYTES = 8 * 1024


def decoder_fault_model(kind: str, chunk: int) -> str:
    return f"fault-{kind}-at-{chunk}"


def encoder_fault_width_px(chunk: int) -> int:
    """The frame width that asks the encoder to fail at `chunk` (-1: when it is built)."""
    return (_ENCODER_FAULT_BASE_COLS + 1 + chunk) * SPATIAL_SCALE


def encoder_fault_at(width: int, height: int) -> int | None:
    """The chunk a job of this size asks its encoder to fail at, if it asks."""
    if height != ENCODER_FAULT_HEIGHT_PX:
        return None
    return width // SPATIAL_SCALE - _ENCODER_FAULT_BASE_COLS - 1


class _Wrapped:
    """The linear decoder's identity and plan, for wrappers that change its behaviour."""

    def __init__(self, name: str) -> None:
        self.inner = LinearDecoder()
        self.name = name
        self.latent_channels = self.inner.latent_channels
        self.value_range = self.inner.value_range
        self.device = self.inner.device

    def plan(self, latent_shape: Sequence[int]) -> DecodePlan:
        return self.inner.plan(latent_shape)

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        return self.inner.decode(latents)


class SlowDecoder(_Wrapped):
    """The linear decoder, taking `SLOW_CHUNK_S` per chunk (asleep, like a GPU wait)."""

    def decode_chunks(self, latents: torch.Tensor, on_chunk: ChunkCallback) -> None:
        def slow(chunk: DecodedChunk) -> None:
            time.sleep(SLOW_CHUNK_S)
            on_chunk(chunk)

        self.inner.decode_chunks(latents, slow)


class FaultyDecoder(_Wrapped):
    """The linear decoder failing at chunk `at`: raising, or breaking its plan."""

    def __init__(self, kind: str, at: int) -> None:
        super().__init__(decoder_fault_model(kind, at))
        self.kind, self.at = kind, at

    def decode_chunks(self, latents: torch.Tensor, on_chunk: ChunkCallback) -> None:
        def faulty(chunk: DecodedChunk) -> None:
            on_chunk(self._broken(chunk) if chunk.index == self.at else chunk)

        self.inner.decode_chunks(latents, faulty)

    def _broken(self, chunk: DecodedChunk) -> DecodedChunk:
        if self.kind == "runtime":
            raise RuntimeError(f"CUDA out of memory at chunk {self.at} (injected)")
        if self.kind == "memory":
            raise MemoryError(f"host out of memory at chunk {self.at} (injected)")
        # "plan": one frame more than planned; the job must notice, not encode it.
        frames = torch.cat([chunk.frames, chunk.frames[:, :, -1:]], dim=2)
        return DecodedChunk(frames, chunk.index, chunk.total, chunk.frame_start)


def test_decoders() -> dict[str, Any]:
    """Every model the reliability server serves; `linear` is the default."""
    decoders: dict[str, Any] = {"linear": LinearDecoder(), SLOW_MODEL: SlowDecoder(SLOW_MODEL)}
    for kind in DECODER_FAULT_KINDS:
        for at in range(FAULT_CHUNKS):
            decoder = FaultyDecoder(kind, at)
            decoders[decoder.name] = decoder
    return decoders


class FaultyStreamEncoder(VideoStreamEncoder):
    """A stream encoder whose `encode_chunk` raises at fragment `fail_at`."""

    fail_at = -1

    def encode_chunk(self, frames: Any) -> bytes:
        if self.fragments_written == self.fail_at:
            raise RuntimeError(f"x264 failed at chunk {self.fail_at} (injected)")
        return super().encode_chunk(frames)


def encoder_factory(width: int, height: int, *args: Any, **kwargs: Any) -> VideoStreamEncoder:
    """VideoStreamEncoder's signature; fails where the geometry asks (`encoder_fault_at`)."""
    at = encoder_fault_at(width, height)
    if at is None:
        return VideoStreamEncoder(width, height, *args, **kwargs)
    if at < 0:
        raise RuntimeError("x264 could not be opened (injected)")
    encoder = FaultyStreamEncoder(width, height, *args, **kwargs)
    encoder.fail_at = at
    return encoder
