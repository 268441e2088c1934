"""One decode, whole or streamed: the loop the built-in decoders share.

`StreamingDecoder` implements both ways into the contract with one loop over latent
blocks (`decode_chunks` is a stream of one block whose length is known from the
start) and one `LatentStream` per decode: what a decoder keeps between blocks, and
the only place it keeps anything. A whole decode and a stream run the same code on
the same inputs, which is what makes a stream's chunks bit-identical to `decode`
however its blocks were split.

`CausalStream` is that state for decoders whose latent frame k decodes, given what
frames before it left behind, to its own frames (`tiny`, `taehv`, `wan2.1`,
`hunyuan-video-1.5`, `linear`): each latent frame is decoded as soon as it arrives and
its chunk is published at once; `CausalChunking` is that scheme as a diffusers family's
chunking (`vaecast/models/diffusers_family.py`). The other schemes have their own
modules (`frame_batches.py`, `causal_tiles.py`, `bidirectional_windows.py`).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from types import TracebackType
from typing import TYPE_CHECKING, Protocol, TypeVar

import torch

from vaecast.errors import InvalidRequestError
from vaecast.models.base import (
    ChunkCallback,
    ChunkedDecoder,
    DecodedChunk,
    DecodePlan,
    StreamPlan,
    causal_plan,
    causal_stream_plan,
    check_next_block,
)

if TYPE_CHECKING:
    from vaecast.codecs.colour import Yuv420Frames


_Plan = TypeVar("_Plan", DecodePlan, StreamPlan)
# Pipeline-space latents (BCTHW, as they arrive: any device and dtype) to what a VAE's
# decode takes: its pipeline's decode step.
Prepare = Callable[[torch.Tensor], torch.Tensor]


class Emit(Protocol):
    """What a `LatentStream` calls with the frames of each chunk it commits, in order
    (and their YUV 4:2:0 where it made that too: `DecodedChunk.yuv420`)."""

    def __call__(self, frames: torch.Tensor, yuv420: Yuv420Frames | None = None) -> None: ...


class LatentStream(Protocol):
    """One decode's state between latent blocks."""

    def push(self, block: torch.Tensor, emit: Emit) -> None:
        """Decode what the next BCTHW block (as it came: any device and dtype) makes
        decodable, calling `emit(frames)` for each chunk that is then committed."""
        ...

    def finish(self, latent_frames: int, emit: Emit) -> None:
        """The latents ended after `latent_frames` frames: commit every chunk left."""
        ...

    def close(self) -> None:
        """Drop every tensor and release what the decode holds (a lock). Called once,
        however the decode ended."""
        ...


class StreamingDecoder(ChunkedDecoder):
    """A decoder whose `decode_chunks` and `decode_stream` run through `open_stream`.

    A subclass gives `plan`, `plan_stream` and `open_stream`.
    """

    def open_stream(
        self, first_block_shape: tuple[int, ...], latent_frames: int | None
    ) -> LatentStream:
        """A new decode's state, for a stream whose first block (already checked
        against `plan_stream`) has this shape; `latent_frames` is the length when it is
        known from the start (a whole tensor), else None (a stream)."""
        raise NotImplementedError

    def decode_chunks(self, latents: torch.Tensor, on_chunk: ChunkCallback) -> None:
        self._run([latents], on_chunk, tuple(int(d) for d in latents.shape))

    def decode_stream(self, blocks: Iterable[torch.Tensor], on_chunk: ChunkCallback) -> DecodePlan:
        """See `ChunkedDecoder.decode_stream`. When it raises, it closes `blocks`'
        iterator if that has `close()` (a generator's `finally` then runs at once)."""
        return self._run(blocks, on_chunk, None)

    def _run(
        self,
        blocks: Iterable[torch.Tensor],
        on_chunk: ChunkCallback,
        whole_shape: tuple[int, ...] | None,
    ) -> DecodePlan:
        chunks = _Chunks(on_chunk)
        if whole_shape is not None:
            chunks.plan = self.plan(whole_shape)  # refuse bad latents before any work
        iterator = iter(blocks)
        stream: LatentStream | None = None
        block: torch.Tensor | None = None
        first: tuple[int, ...] = ()
        received = 0
        try:
            for block in iterator:
                shape = tuple(int(d) for d in block.shape)
                if stream is None:
                    chunks.stream_plan = self.plan_stream(shape)
                    first = shape
                    stream = self.open_stream(
                        shape, None if whole_shape is None else whole_shape[2]
                    )
                else:
                    check_next_block(shape, first)
                received += shape[2]
                with torch.inference_mode():
                    stream.push(block, chunks.emit)
                block = None  # not kept while the next block is awaited
            if stream is None:
                raise InvalidRequestError("the latent stream ended before its first block")
            # The length is known now: refuse too few frames in all, and give every
            # chunk from here on its total.
            plan = self.plan((*first[:2], received, *first[3:]))
            if chunks.plan is not None and plan != chunks.plan:
                raise RuntimeError(f"{self.name}: decoded {received} latent frames of {first}")
            chunks.plan = plan
            with torch.inference_mode():
                stream.finish(received, chunks.emit)
            chunks.check_complete(self.name)
            return plan
        except BaseException as error:
            # A stored exception keeps its traceback's frames, and their locals, alive
            # (a job keeps its error for as long as it is retained): clear the frames
            # below this one (activations, chunks, caches' last users) and drop ours.
            block = None
            _clear_frames(error.__traceback__)
            _close(iterator, error)
            raise
        finally:
            if stream is not None:
                stream.close()
                stream = None  # an error's traceback keeps this frame


def _clear_frames(tb: TracebackType | None) -> None:
    """Drop the locals of the finished function frames in `tb`.

    Not `traceback.clear_frames`: it closes a suspended generator or coroutine whose
    frame it meets, and an exception handed on from a task that goes on running (on
    the event loop's thread) has that task's frame in its traceback.
    """
    while tb is not None:
        frame = tb.tb_frame
        if not frame.f_code.co_flags & _SUSPENDABLE:
            with contextlib.suppress(RuntimeError):  # still running: ours, or another thread's
                frame.clear()
        tb = tb.tb_next


_SUSPENDABLE = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR


def _close(iterator: Iterator[torch.Tensor], error: BaseException) -> None:
    close = getattr(iterator, "close", None)
    if callable(close):
        try:
            close()
        except Exception as close_error:  # never hide the error that stopped the decode
            error.add_note(f"closing the latent block iterator failed too: {close_error!r}")


@dataclass(slots=True)
class _Chunks:
    """Numbers the chunks a `LatentStream` emits and holds it to its plans."""

    on_chunk: ChunkCallback
    plan: DecodePlan | None = None  # known for a whole tensor, or once a stream ends
    stream_plan: StreamPlan | None = None
    frame_counts: list[int] = field(default_factory=list)
    frame_start: int = 0

    def emit(self, frames: torch.Tensor, yuv420: Yuv420Frames | None = None) -> None:
        index = len(self.frame_counts)
        count = int(frames.shape[2])
        assert self.stream_plan is not None
        size = (self.stream_plan.height, self.stream_plan.width)
        if self.plan is not None:
            ok = index < self.plan.chunks and count == self.plan.chunk_frames[index]
        else:  # only the last chunk may be short, and it comes after the end
            ok = count == self.stream_plan.frames_of(index)
        if not ok or tuple(frames.shape[3:]) != size:
            raise RuntimeError(
                f"a decoder broke its plan at chunk {index}: {tuple(frames.shape)} frames, "
                f"plan {self.plan or self.stream_plan}"
            )
        total = None if self.plan is None else self.plan.chunks
        self.on_chunk(DecodedChunk(frames, index, total, self.frame_start, yuv420))
        self.frame_counts.append(count)
        self.frame_start += count

    def check_complete(self, name: str) -> None:
        assert self.plan is not None
        if tuple(self.frame_counts) != self.plan.chunk_frames:
            raise RuntimeError(
                f"{name} published chunks of {self.frame_counts} frames, "
                f"its plan says {list(self.plan.chunk_frames)}"
            )


class CausalStream:
    """A causal decode's state: latent frame k gives 1 frame for k = 0 and
    `temporal_scale` after, and a chunk is committed every `latents_per_chunk` latent
    frames (the rest when the latents end). With `block_latents` above 1, `step` is
    given latent 0 alone and then blocks of that many latent frames (the last may be
    shorter), each block's frames one chunk: a decoder whose step takes several frames
    at once through the same carried state spends less per frame, and its first chunk
    still comes after one latent. A subclass gives `step` and extends `close` to drop
    what it keeps."""

    def __init__(
        self,
        device: torch.device,
        dtype: torch.dtype,
        latents_per_chunk: int = 1,
        block_latents: int = 1,
    ) -> None:
        if block_latents > 1 and latents_per_chunk != 1:
            raise ValueError("blocks are chunks of their own: latents_per_chunk must be 1")
        self._device = device
        self._dtype = dtype
        self._latents_per_chunk = latents_per_chunk
        self._block_latents = block_latents
        self._pending: list[torch.Tensor] = []  # latent frames waiting for their block
        self._group: list[torch.Tensor] = []
        self._group_yuv420: Yuv420Frames | None = None
        self._next = 0

    def step(self, latent: torch.Tensor, index: int) -> torch.Tensor:
        """Decode latent frames `index ..` ((B, C, n, h, w), contiguous and freshly
        allocated; n is 1 unless `block_latents` is larger) into their BCTHW frames."""
        raise NotImplementedError

    def push(self, block: torch.Tensor, emit: Emit) -> None:
        if self._block_latents > 1:
            self._pending += block.to(self._device, self._dtype).split(1, dim=2)
            while self._pending and len(self._pending) >= self._block_size():
                self._step_block(self._block_size(), emit)
            return
        for latent in self._latents(block):
            self._add(self.step(latent, self._next), emit)

    def _block_size(self) -> int:
        return 1 if self._next == 0 else self._block_latents

    def _step_block(self, size: int, emit: Emit) -> None:
        # A fresh contiguous tensor whatever blocks the frames came in (see `_latents`).
        latents = torch.cat(self._pending[:size], dim=2)
        del self._pending[:size]
        frames = self.step(latents, self._next)
        del latents
        self._next += size
        emit(frames)

    def _latents(self, block: torch.Tensor) -> Iterator[torch.Tensor]:
        """The block's latent frames, one (B, C, 1, h, w) at a time, as `step` takes them."""
        block = block.to(self._device, self._dtype)
        for t in range(block.shape[2]):
            # Each step gets its own contiguous copy, whatever block the frame came in,
            # so a whole decode and any split of a stream hand the model the same tensor,
            # strides and alignment included (kernels may choose by them).
            yield block[:, :, t : t + 1].clone(memory_format=torch.contiguous_format)

    def _add(self, frames: torch.Tensor, emit: Emit, yuv420: Yuv420Frames | None = None) -> None:
        """The next latent frame's frames, committed when they complete a chunk."""
        self._group.append(frames)
        self._group_yuv420 = yuv420  # passed on only for a chunk of one latent frame
        self._next += 1
        if len(self._group) == self._latents_per_chunk:
            self._commit(emit)

    def finish(self, latent_frames: int, emit: Emit) -> None:
        if self._pending:
            self._step_block(len(self._pending), emit)
        if self._group:
            self._commit(emit)

    def close(self) -> None:
        self._pending = []
        self._group = []
        self._group_yuv420 = None

    def _commit(self, emit: Emit) -> None:
        group, self._group = self._group, []
        yuv420, self._group_yuv420 = self._group_yuv420, None
        if len(group) == 1:
            emit(group[0], yuv420)
        else:
            emit(torch.cat(group, dim=2))


@dataclass(frozen=True, slots=True)
class CausalChunking:
    """A diffusers family's chunking for a causal decoder: latent 0's chunk, then a
    chunk per `block_latents` latent frames (`causal_plan`), each decode a
    `CausalStream` that `open` makes with those blocks."""

    latent_channels: int
    spatial_scale: int
    temporal_scale: int
    # (first block shape) -> a new decode's stream.
    open: Callable[[tuple[int, ...]], LatentStream]
    # Latent frames per chunk after latent 0's own (the stream's `block_latents`).
    block_latents: int = 1
    # (latent height, width) -> the frame size where it is not `spatial_scale` times
    # the latents' (a VAE's spatial tiles), else None.
    frame_size: Callable[[int, int], tuple[int, int] | None] = lambda height, width: None

    def plan(self, latent_shape: Sequence[int]) -> DecodePlan:
        plan = causal_plan(
            latent_shape,
            self.latent_channels,
            self.spatial_scale,
            self.temporal_scale,
            self.block_latents,
            first_chunk_latents=1,
        )
        return self._sized(plan, latent_shape)

    def plan_stream(self, first_block_shape: Sequence[int]) -> StreamPlan:
        plan = causal_stream_plan(
            first_block_shape,
            self.latent_channels,
            self.spatial_scale,
            self.temporal_scale,
            self.block_latents,
            first_chunk_latents=1,
        )
        return self._sized(plan, first_block_shape)

    def open_stream(
        self, first_block_shape: tuple[int, ...], latent_frames: int | None
    ) -> LatentStream:
        return self.open(first_block_shape)

    def _sized(self, plan: _Plan, latent_shape: Sequence[int]) -> _Plan:
        size = self.frame_size(int(latent_shape[3]), int(latent_shape[4]))
        return plan if size is None else replace(plan, height=size[0], width=size[1])
