"""The producer contract: how a decoder hands committed chunks to vaecast.

A decoder publishes chunks through a synchronous callback rather than a generator:
a distributed decode must run its collectives to completion, and an abandoned
generator would strand peer ranks. The callback may raise (the consumer went away,
the job was cancelled); the exception stops the decode and propagates out of
`decode_chunks` or `decode_stream`, and the decoder keeps nothing of the chunks it
already published.

Two ways in:
- `decode_chunks(latents, on_chunk)`: a whole BCTHW tensor. `plan(latent_shape)` is
  exact and known before any decoding, so the init segment and the response headers
  can be written first, and every chunk carries `total`.
- `decode_stream(blocks, on_chunk)`: BCTHW blocks of t >= 1 latent frames from an
  iterator that may block (a generator still producing them); C, H and W are fixed by
  the first block, and the iterator ends after the last. Each chunk is published as
  soon as the latents it needs have arrived. `plan_stream(first_block_shape)` gives
  the frame size and the chunking from the first block, so an encoder can be opened
  before the second arrives; the length, and with it `total`, is known only when the
  iterator ends (`decode_stream` then returns the whole `DecodePlan`).

Guarantees every decoder keeps (and tests):
- chunks arrive in order, are non-empty and contiguous (`index` counts from 0,
  `frame_start` of chunk i+1 is `frame_start + frames` of chunk i), and their count
  equals `plan(...).chunks` of the latents decoded;
- concatenating them along T gives, bit for bit, the decoder's full decode
  (`decode`) of the same latents, however a stream split them into blocks;
- an exception, from the decoder, the callback or the iterator, leaves the decode
  with the decoder holding nothing of it.

The built-in decoders subclass `StreamingDecoder` (`vaecast/models/streaming.py`),
which runs both ways in through one per-decode `LatentStream`; `vaecast.models.registry`
maps model names to them. A class that reads a weights file says so by having a
`from_weights` classmethod. A decoder whose pipeline returns latents in another
layout than BCTHW names it as `latent_layout` (`vaecast.models.layouts`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch

from vaecast.errors import InvalidRequestError

if TYPE_CHECKING:
    from vaecast.codecs.colour import Yuv420Frames

# Wan 2.1's usual clip, in latent frames (81 video frames); quoted in messages.
TYPICAL_LATENT_FRAMES = 21


@dataclass(frozen=True, slots=True)
class DecodePlan:
    """What a decode of given latents will produce, known before it starts."""

    height: int
    width: int
    chunk_frames: tuple[int, ...]

    @property
    def frames(self) -> int:
        return sum(self.chunk_frames)

    @property
    def chunks(self) -> int:
        return len(self.chunk_frames)

    @property
    def chunk_starts(self) -> tuple[int, ...]:
        starts, total = [], 0
        for count in self.chunk_frames:
            starts.append(total)
            total += count
        return tuple(starts)


@dataclass(frozen=True, slots=True)
class StreamPlan:
    """What a streamed decode produces, known from its first block's shape.

    Every chunk but the stream's last has exactly `frames_of(index)` frames; the last
    has from 1 to that many, since where the video ends is known only at the end.
    `frames_for(n)` is how many frames the first n latent frames stand for, at any n
    (`plan` may refuse a length too short to decode on its own).
    """

    height: int
    width: int
    first_chunk_frames: int
    chunk_frames: int  # each chunk after the first
    frames_per_latent: int
    # A latent frame that opens a group stands for fewer: latent frame 0 for a causal
    # decoder (None: no other opens one), every `latents_per_group`-th for the tiler.
    group_opening_frames: int
    latents_per_group: int | None

    def frames_of(self, index: int) -> int:
        """The frames chunk `index` has unless it is the last (which may have fewer)."""
        return self.first_chunk_frames if index == 0 else self.chunk_frames

    def chunk_start(self, index: int) -> int:
        """Where chunk `index` starts, whether or not it is the last."""
        return 0 if index == 0 else self.first_chunk_frames + (index - 1) * self.chunk_frames

    def frames_for(self, latent_frames: int) -> int:
        """The video frames that the first `latent_frames` latent frames decode to."""
        if self.latents_per_group is None:
            groups = min(latent_frames, 1)
        else:
            groups = -(-latent_frames // self.latents_per_group)
        opening_less = self.frames_per_latent - self.group_opening_frames
        return latent_frames * self.frames_per_latent - groups * opening_less


@dataclass(frozen=True, slots=True)
class DecodedChunk:
    """One committed chunk. `frames` is BCTHW in the decoder's `value_range`.

    The tensor is borrowed: it is valid only during the callback (the decoder may
    reuse its storage), so a consumer copies what it keeps.

    `total` is the number of chunks when it is known as the chunk is published:
    always in `decode_chunks`; in `decode_stream` only once the iterator has ended,
    so None on every chunk published before (a causal decoder's last chunk too: it
    is committed before the iterator says there is no more). A stream's last chunk
    is the one published before `decode_stream` returns.

    `yuv420`: the same frames already quantized by `quantize_yuv420_to_host` (the
    server's host conversion), where the decoder did that on its own threads while
    decoding (`tiny` on a CPU); None elsewhere. `bridge.chunk_to_host` takes it.
    """

    frames: torch.Tensor
    index: int
    total: int | None
    frame_start: int
    yuv420: Yuv420Frames | None = None

    @property
    def is_final(self) -> bool:
        """Known to be the last chunk; False while a stream's length is unknown."""
        return self.total is not None and self.index == self.total - 1

    @property
    def frame_count(self) -> int:
        return int(self.frames.shape[2])


ChunkCallback = Callable[[DecodedChunk], None]


@runtime_checkable
class ChunkedDecoder(Protocol):
    """A video decoder that publishes its output chunk by chunk.

    Any object with these members is one; a subclass inherits `decode`.
    """

    name: str
    latent_channels: int
    value_range: tuple[float, float]
    device: torch.device

    def plan(self, latent_shape: Sequence[int]) -> DecodePlan:
        """The frames, size and chunking that latents of this BCTHW shape decode to.

        Raises `InvalidRequestError` for a shape the decoder cannot take.
        """
        ...

    def plan_stream(self, first_block_shape: Sequence[int]) -> StreamPlan:
        """The frame size and chunking of a stream whose first block has this shape.

        Raises `InvalidRequestError` for a block the decoder cannot take.
        """
        ...

    def decode_chunks(self, latents: torch.Tensor, on_chunk: ChunkCallback) -> None:
        """Decode BCTHW latents, calling `on_chunk` for each committed chunk in order."""
        ...

    def decode_stream(self, blocks: Iterable[torch.Tensor], on_chunk: ChunkCallback) -> DecodePlan:
        """Decode BCTHW latent blocks as they come, calling `on_chunk` for each chunk
        as soon as it is committed; returns the plan of the whole stream.

        Raises `InvalidRequestError` for a block unlike the first, or a stream the
        decoder cannot take (no blocks, too few frames in all); any exception from
        the iterator or the callback propagates.
        """
        ...

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """The full decode: the concatenation of every chunk `decode_chunks` publishes."""
        chunks: list[torch.Tensor] = []
        # Chunks are borrowed (valid only during the callback): keep copies.
        self.decode_chunks(latents, lambda chunk: chunks.append(chunk.frames.clone()))
        return torch.cat(chunks, dim=2)


def check_latent_shape(
    latent_shape: Sequence[int], latent_channels: int, min_frames: int = 1
) -> tuple[int, int, int, int, int]:
    """Validate a BCTHW latent shape shared by every decoder; returns it as a tuple."""
    if len(latent_shape) != 5:
        raise InvalidRequestError(f"latents must be BCTHW (5 dimensions), got {len(latent_shape)}")
    b, c, t, h, w = (int(d) for d in latent_shape)
    if b != 1:
        raise InvalidRequestError(f"latents must hold one video (batch 1), got batch {b}")
    if c != latent_channels:
        raise InvalidRequestError(f"this model takes {latent_channels} latent channels, got {c}")
    if t < min_frames:
        raise InvalidRequestError(f"latents need at least {min_frames} frame(s) in time, got {t}")
    if h < 1 or w < 1:
        raise InvalidRequestError(f"latents have an empty spatial size {h}x{w}")
    return b, c, t, h, w


def check_next_block(block_shape: Sequence[int], first_block_shape: Sequence[int]) -> None:
    """Refuse a stream's later block that is not BCTHW like its first, with t >= 1."""
    shape, first = tuple(int(d) for d in block_shape), tuple(int(d) for d in first_block_shape)
    if len(shape) != 5:
        raise InvalidRequestError(f"a latent block must be BCTHW (5 dimensions), got {len(shape)}")
    if shape[2] < 1:
        raise InvalidRequestError("a latent block needs at least 1 frame in time, got 0")
    if shape[:2] + shape[3:] != first[:2] + first[3:]:
        raise InvalidRequestError(
            f"a latent block of shape {shape} does not continue the stream: batch, channels, "
            f"height and width must be those of its first block, {first}"
        )


def causal_plan(
    latent_shape: Sequence[int],
    latent_channels: int,
    spatial_scale: int,
    temporal_scale: int,
    latents_per_chunk: int = 1,
    first_chunk_latents: int | None = None,
) -> DecodePlan:
    """The plan of a causal decoder in Wan 2.1's convention: latent frame 0 decodes to
    one frame and each later one to `temporal_scale`, one chunk per
    `latents_per_chunk` latent frames (the first chunk: `first_chunk_latents`, by
    default as many)."""
    _, _, t, h, w = check_latent_shape(latent_shape, latent_channels)
    per_latent = [1] + [temporal_scale] * (t - 1)
    first = latents_per_chunk if first_chunk_latents is None else first_chunk_latents
    starts = [0, *range(first, t, latents_per_chunk)] if t > first else [0]
    ends = [*starts[1:], t]
    chunk_frames = tuple(sum(per_latent[a:b]) for a, b in zip(starts, ends, strict=True))
    return DecodePlan(height=h * spatial_scale, width=w * spatial_scale, chunk_frames=chunk_frames)


def causal_stream_plan(
    first_block_shape: Sequence[int],
    latent_channels: int,
    spatial_scale: int,
    temporal_scale: int,
    latents_per_chunk: int = 1,
    first_chunk_latents: int | None = None,
) -> StreamPlan:
    """`causal_plan`'s convention for a stream: the first chunk holds frame 0's one
    frame and `temporal_scale` for each other latent frame of its group."""
    _, _, _, h, w = check_latent_shape(first_block_shape, latent_channels)
    first = latents_per_chunk if first_chunk_latents is None else first_chunk_latents
    return StreamPlan(
        height=h * spatial_scale,
        width=w * spatial_scale,
        first_chunk_frames=1 + temporal_scale * (first - 1),
        chunk_frames=temporal_scale * latents_per_chunk,
        frames_per_latent=temporal_scale,
        group_opening_frames=1,
        latents_per_group=None,
    )


def check_video_geometry(
    frames: int, width: int, height: int, spatial_scale: int, temporal_scale: int
) -> None:
    """Refuse a video size that no latents in `causal_plan`'s convention decode to.

    Those are 1 + `temporal_scale` * k frames whose sides are positive multiples of
    `spatial_scale`; an encoder of that geometry (and a demo encoded with one) takes
    only such videos.
    """
    if frames < 1 or (frames - 1) % temporal_scale:
        examples = ", ".join(str(1 + temporal_scale * k) for k in range(3))
        typical = 1 + temporal_scale * (TYPICAL_LATENT_FRAMES - 1)
        raise InvalidRequestError(
            f"frames must be 1 + {temporal_scale}k ({examples}, ..., {typical}), got {frames}"
        )
    if not all(side >= spatial_scale and side % spatial_scale == 0 for side in (width, height)):
        raise InvalidRequestError(
            f"width and height must be positive multiples of {spatial_scale}, got {width}x{height}"
        )
