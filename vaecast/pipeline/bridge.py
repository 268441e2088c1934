"""The thread -> event loop bridge for one decode.

The decoder runs in an executor thread and publishes chunks through a synchronous
callback. The callback converts the chunk to the host (by default, quantized to
8-bit YUV 4:2:0 on the decoder's device, so the encoder has no colour conversion
left and only a 4:2:0 frame crosses to the host: 170 against 89 frames/s for the
RGB path at 832x480, benchmarks/results/before/benchmarks.md), makes the one
device-to-host copy, and puts the frames on a *bounded* asyncio.Queue. From a CUDA
decoder that copy is still in flight when the chunk is queued (pinned memory, a side
stream: `codecs/quantize.copy_to_host`): the decode thread goes on to the next chunk,
and the encode thread waits for the copy when it first reads the planes; the bridge
itself never waits for it.

The bound is a semaphore of `max_chunks` places that the worker thread takes before it
hands a chunk over and the consumer gives back when it takes one: with room, the hand-
over is one `call_soon_threadsafe` and the decode thread goes straight on to its next
chunk, without waiting for the event loop to run a put (the old
`run_coroutine_threadsafe(put).result()` cost the decode thread 451 ms of waiting over
an 81-frame video). Without room, it blocks the decoder thread: that is the
backpressure that keeps memory at O(queue size x chunk), whatever the video length.

The worker thread never hangs: while it waits for a place it looks at the cancel flag
and at the loop every `PUT_POLL_S`, so a cancelled job or a stopped loop ends the
decode with `DecodeCancelled` at the next chunk.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeAlias

import torch

from vaecast.codecs.colour import Yuv420Frames
from vaecast.codecs.quantize import quantize_yuv420_to_host
from vaecast.errors import DecodeCancelled
from vaecast.models.base import ChunkCallback, DecodedChunk

PUT_POLL_S = 0.05
DEFAULT_QUEUE_CHUNKS = 2

# A chunk's frames (on the decoder's device, in its value range) to 8-bit host frames.
ToHost: TypeAlias = Callable[[torch.Tensor, tuple[float, float]], Yuv420Frames]


def chunk_to_host(
    chunk: DecodedChunk, to_host: ToHost, value_range: tuple[float, float]
) -> Yuv420Frames:
    """`to_host(chunk.frames, value_range)`: the YUV 4:2:0 the decoder made while
    decoding where it is that conversion (the same bytes, already on the host)."""
    if chunk.yuv420 is not None and to_host is quantize_yuv420_to_host:
        return chunk.yuv420
    return to_host(chunk.frames, value_range)


@dataclass(frozen=True, slots=True)
class HostChunk:
    """A committed chunk as 8-bit YUV 4:2:0 frames on the host (`pixels.shape` is
    (T, H, W, 3), that of the RGB frames they stand for)."""

    index: int
    total: int | None  # None while a stream's length is unknown
    frame_start: int
    pixels: Yuv420Frames

    @property
    def frame_count(self) -> int:
        return int(self.pixels.shape[0])


@dataclass(frozen=True, slots=True)
class DecodeEnded:
    """Put after the last chunk of a decode that returned normally."""


@dataclass(frozen=True, slots=True)
class DecodeRaised:
    """Put when the decoder raised (not on cancel): the consumer fails the job with it."""

    error: BaseException


BridgeItem = HostChunk | DecodeEnded | DecodeRaised


class ChunkBridge:
    """Carries one decode's chunks from its worker thread to a consumer on `loop`."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        value_range: tuple[float, float],
        max_chunks: int = DEFAULT_QUEUE_CHUNKS,
        to_host: ToHost = quantize_yuv420_to_host,
    ) -> None:
        self._loop = loop
        self._value_range = value_range
        self._to_host = to_host
        # Unbounded as a queue; bounded by `_room`, which the worker thread takes.
        self._queue: asyncio.Queue[BridgeItem] = asyncio.Queue()
        self._room = threading.Semaphore(max_chunks)
        self._cancelled = threading.Event()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def cancel(self) -> None:
        """Stop the decode at its next chunk (callable from any thread)."""
        self._cancelled.set()

    @property
    def backlog(self) -> int:
        """Items handed over and not yet taken (on the loop's thread)."""
        return self._queue.qsize()

    async def get(self) -> BridgeItem:
        item = await self._queue.get()
        self._room.release()
        return item

    def run(self, decode: Callable[[ChunkCallback], None]) -> None:
        """Worker-thread entry point: `decode(on_chunk)`, then an end marker.

        Raises `DecodeCancelled` if the decode was cancelled; any other decoder
        error is handed to the consumer as `DecodeRaised` (and not re-raised, so the
        executor future only ever fails with a cancel).
        """
        try:
            with torch.inference_mode():
                decode(self.on_chunk)
        except DecodeCancelled:
            raise
        except Exception as error:
            self._put(DecodeRaised(error))
        else:
            self._put(DecodeEnded())

    def on_chunk(self, chunk: DecodedChunk) -> None:
        """The decoder's callback: runs on the worker thread, may block (backpressure)."""
        if self._cancelled.is_set():
            raise DecodeCancelled("decode cancelled")
        pixels = chunk_to_host(chunk, self._to_host, self._value_range)
        self._put(HostChunk(chunk.index, chunk.total, chunk.frame_start, pixels))

    def _put(self, item: BridgeItem) -> None:
        while not self._room.acquire(timeout=PUT_POLL_S):
            if self._cancelled.is_set() or not self._loop.is_running():
                raise DecodeCancelled("decode cancelled")
        if self._cancelled.is_set():
            self._room.release()
            raise DecodeCancelled("decode cancelled")
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the loop is closed
            self._room.release()
            raise DecodeCancelled("event loop closed") from None
