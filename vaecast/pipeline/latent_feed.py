"""Latent blocks that arrive over time: pushed on the event loop, pulled by the decoder.

A push session's blocks come in over HTTP while a generator produces them. The
event loop `put`s each block into a thread-safe queue that the feed keeps *bounded*
(the put waits while it is full: that is the backpressure a producer wants), and the
decode thread takes them straight from it, blocking until the next one exists,
inside `decoder.decode_stream`: no hop through the loop per block, so a busy loop
does not delay a block that is already there. Each take is told to the loop after
the fact (it frees room for a held-back put). So the pipeline runs unchanged: this
is just a latent source that blocks.

The thread side never hangs: while it waits it looks at the cancel flags and at the
loop every `GET_POLL_S`, as the bridge does for its puts.

A block's audio (`TimedAudio`, from the block's first video frame on) is handed to
the encoder with the next chunk it encodes. With audio, the pipeline holds each
chunk's fragment until the audio that ends it with its video is in (see
`vaecast.pipeline.run`): it reads where the blocks stand (`feed_state`: latent frames put,
whose audio is all here by then; the end; a producer held back by the full queue; a
cancel) and waits on the loop for the next change (`feed_changed`), which every put,
the end, a held-back put and a cancel (from any thread) signal.

Where the blocks come from is the one part that differs between the two block
transports, and it is composed, not subclassed: a server's push session `put`s them
on the loop itself; a Ray replica gives the feed a `pull` (a `BlockPull`: the next
block from the job's host actor, None after the last), and the feed then runs a pump
on its loop that pulls each block and `put`s it, waiting for room as a producer's
put does, until the end, a cancel, or a failed pull (which fails the feed). Either
way the queue, the decode thread's side, the audio and `feed_state` are this one.

A job with a preview decodes the same blocks twice. `split(2)` gives each decoder a
reader of its own (a `FeedTap`: its own queue of the same blocks, its own audio and
cancel), fed by every put; the feed's own `decode` is then unused. A put waits for
room in the preview's queue; the final's may grow (to the session's own latents), so
that neither the producer nor the preview waits for the slow decoder. A tap that is
cancelled (one rendition stopped) stops counting, and the other decoder goes on;
cancelling or failing the feed stops every reader.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, replace

import torch

from vaecast.errors import DecodeCancelled, DecodeFailedError, VaecastError
from vaecast.models.base import ChunkCallback, ChunkedDecoder, DecodedChunk
from vaecast.pipeline.run import FeedState, TimedAudio

GET_POLL_S = 0.05


@dataclass(frozen=True, slots=True)
class _Block:
    latents: torch.Tensor
    arrived: float  # time.perf_counter() when it was put


@dataclass(frozen=True, slots=True)
class _End:
    """Put after the last block."""


@dataclass(frozen=True, slots=True)
class PulledBlock:
    """A block as a `BlockPull` hands it over: its latents (BCTHW), its audio, and when
    it arrived (on the clock its `chunk_arrivals` are read by)."""

    latents: torch.Tensor
    audio: TimedAudio | None
    arrived: float


# On the feed's loop: the next block, or None after the last. Cancelled when the feed is.
BlockPull = Callable[[], Awaitable[PulledBlock | None]]


class LatentFeed:
    """One push session's latent blocks (BCTHW), in order; see the module docstring."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, max_blocks: int, pull: BlockPull | None = None
    ) -> None:
        """`pull`: where the blocks come from when they are not `put` here (module
        docstring); the pump starts at once, so construct the feed on `loop`."""
        self._loop = loop
        self._max_blocks = max_blocks
        self._taken = asyncio.Event()  # pulsed each time a decoder takes a block
        self._cancelled = threading.Event()
        self._error: VaecastError | None = None
        # What every reader of this feed is told and looks at (`FeedLink`).
        self._link = FeedLink(loop, self._cancelled, self._stop_error, self._block_taken)
        self._first: asyncio.Future[tuple[int, ...]] = loop.create_future()
        self._ended = False
        self._main: _Reader | None = _Reader(self._link)  # the decoder's, unless split
        self._taps: list[FeedTap] = []
        self.latent_frames = 0
        self._puts_held = 0  # puts waiting for room in the queue
        self._version = 0  # of `feed_state`
        self._changed = asyncio.Event()  # pulsed at each change
        self._pump: asyncio.Task[None] | None = None
        if pull is not None:
            self._pump = loop.create_task(self._pull_all(pull), name="latent-feed-pull")

    # The event loop's side.

    async def put(
        self,
        latents: torch.Tensor,
        audio: TimedAudio | None = None,
        *,
        dtype: str | None = None,
        wait_for_room: bool = True,
    ) -> None:
        """Queue a block (waits while the queue is full); its audio goes to the encoder
        with the next chunk it encodes. `audio` starts at the block's first frame.
        `dtype` (the block's as pushed) matters to feeds that keep it elsewhere.

        `wait_for_room=False` queues it past the bound at once: for a batch's video
        that waits for a decode slot, whose blocks must not hold back the videos that
        decode (the caller bounds what it holds, by `held_bytes`)."""
        await self._put(latents, audio, time.perf_counter(), wait_for_room)

    async def _put(
        self,
        latents: torch.Tensor,
        audio: TimedAudio | None,
        arrived: float,
        wait_for_room: bool,
    ) -> None:
        """A block that arrived at `arrived` (put here, or by the pump)."""
        if self._ended:
            raise RuntimeError("put after the end of the feed")
        # Counted with its audio before any wait: a fragment waiting for this audio
        # has it even while the put waits for room.
        self.latent_frames += int(latents.shape[2])
        if not self._first.done():
            self._first.set_result(tuple(latents.shape))
        readers = self._readers()
        if audio is not None:
            for reader in readers:
                reader.audio.append(audio)
        block = _Block(latents, arrived)
        if wait_for_room and self._fullest() >= self._max_blocks:
            self._puts_held += 1
            self._changed_now()
            try:
                while self._fullest() >= self._max_blocks:
                    await self._taken.wait()
            finally:
                self._puts_held -= 1
        for reader in self._readers():
            reader.offer(block)
        self._changed_now()

    def _readers(self) -> list[_Reader]:
        """Those still reading: the decoder's, and every tap not cancelled."""
        main = [] if self._main is None else [self._main]
        return [*main, *(tap.reader for tap in self._taps if not tap.reader.stopped)]

    def _fullest(self) -> int:
        """The longest queue of a reader that holds the producer back."""
        readers = [reader for reader in self._readers() if reader.holds_back]
        return max((reader.queue.qsize() for reader in readers), default=0)

    @property
    def held_bytes(self) -> int:
        """Of the blocks queued and not yet taken by the decoder that is furthest behind."""
        return max((reader.held_bytes for reader in self._readers()), default=0)

    @property
    def chunk_arrivals(self) -> dict[int, float]:
        """Per chunk the decoder published (a split feed's: its first reader's), when
        the newest block it had taken by then arrived: where that chunk's
        block-to-viewer latency starts."""
        return self._first_reader().chunk_arrivals

    def split(self, count: int, lagging: int | None = None) -> list[FeedTap]:
        """`count` readers of every block put from now on, one per decoder (a job
        with a preview: its final's, then its preview's); the feed's own `decode`
        is unused from then on. Reader `lagging` (the final's) may fall behind
        without holding the producer back: the blocks it has not taken wait for it
        (at most the session's own latents, which the server's limits bound), so
        the fast reader and the producer never wait for the slow decoder."""
        if self.latent_frames:
            raise RuntimeError("a feed is split before its first block")
        self._main = None
        self._taps = [
            FeedTap(self._link, self._reader_gone, self.feed_state, self.feed_changed)
            for _ in range(count)
        ]
        if lagging is not None:
            self._taps[lagging].reader.holds_back = False
        return list(self._taps)

    def _first_reader(self) -> _Reader:
        return self._main if self._main is not None else self._taps[0].reader

    async def end(self) -> None:
        """No more blocks: the decoder finishes what it has."""
        if self._ended:
            return
        self._ended = True
        for reader in self._readers():
            reader.end()
        self._changed_now()
        if not self._first.done():
            self._set_first_error(DecodeCancelled("the session ended before any block"))

    @property
    def ended(self) -> bool:
        return self._ended

    async def first_block_shape(self) -> tuple[int, ...]:
        """The shape of the first block, once it has been put."""
        return await asyncio.shield(self._first)

    def fail(self, error: VaecastError) -> None:
        """Stop the decoder at its next wait for a block, raising `error` there."""
        self._error = error
        self.cancel()

    def take_audio(self) -> list[TimedAudio]:
        return self._first_reader().take_audio()

    async def shared_state(self) -> None:
        """What this feed keeps elsewhere for its session (nothing: it is all here)."""
        return None

    def feed_state(self) -> FeedState:
        return FeedState(
            latent_frames=self.latent_frames,
            ended=self._ended,
            held_back=self._puts_held > 0,
            stopped=self._cancelled.is_set(),
            version=self._version,
        )

    async def feed_changed(self, version: int) -> None:
        """Return once `feed_state()` has changed from `version` (a put, the end, a put
        held back or let through, a cancel); cancelling the caller stops the wait."""
        while self._version == version:
            await self._changed.wait()

    def _reader_gone(self) -> None:
        """On the loop: a tap stopped. A put held back for room in its queue may go."""
        self._block_taken()
        self._changed_now()

    def _block_taken(self) -> None:
        """On the loop: a reader took a block; the held-back puts check the room again."""
        self._taken.set()
        self._taken.clear()

    def _stop_error(self) -> VaecastError:
        """What a reader raises when the feed stops it: the failure, or a cancel."""
        if self._error is not None:
            return self._error.detached()
        return DecodeCancelled("decode cancelled")

    def _changed_now(self) -> None:
        """On the loop: a new `feed_state`; wake whoever waits for one."""
        self._version += 1
        self._changed.set()  # wakes every waiter now; the next waits for the next set
        self._changed.clear()

    async def _pull_all(self, pull: BlockPull) -> None:
        """The pump: every block `pull` hands over, put here, then the end."""
        try:
            while (block := await pull()) is not None:
                await self._put(block.latents, block.audio, block.arrived, wait_for_room=True)
            await self.end()
        except VaecastError as error:
            self.fail(error)
        except Exception as error:  # the host is gone, say: the decode cannot go on
            self.fail(DecodeFailedError(f"the session's next block could not be had: {error}"))

    def _stop_pump(self) -> None:
        if self._pump is not None and not self._pump.done():
            self._pump.cancel()

    # The decode thread's side.

    def cancel(self) -> None:
        """Callable from any thread: the decoder's next wait for a block raises, and a
        fragment waiting for audio stops waiting."""
        self._cancelled.set()
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
            self._loop.call_soon_threadsafe(self._changed_now)
            self._loop.call_soon_threadsafe(self._stop_pump)
        if not self._first.done():
            self._loop.call_soon_threadsafe(self._cancel_first)

    def decode(self, decoder: ChunkedDecoder, on_chunk: ChunkCallback) -> None:
        if self._main is None:
            raise RuntimeError("a split feed is decoded through its taps")
        self._main.decode(decoder, on_chunk)

    def _cancel_first(self) -> None:
        self._set_first_error(self._error or DecodeCancelled("cancelled"))

    def _set_first_error(self, error: VaecastError) -> None:
        if not self._first.done():
            self._first.set_exception(error)
            self._first.exception()  # nobody may be waiting: do not warn that none looked


@dataclass(frozen=True, slots=True)
class FeedLink:
    """What a feed's readers share with it: its loop (where each take is told, and
    whose stop stops them), its cancel flag, the error it stops them with, and what a
    take is told to (on the loop)."""

    loop: asyncio.AbstractEventLoop
    cancelled: threading.Event
    stop_error: Callable[[], VaecastError]
    block_taken: Callable[[], None]

    def tell(self, callback: Callable[[], None]) -> None:
        """Run `callback` on the loop, from any thread; nothing if the loop closed."""
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
            self.loop.call_soon_threadsafe(callback)


class FeedTap:
    """Another decoder's reader of a feed's blocks (`LatentFeed.split`): a latent
    source whose cancel stops only this reader. Its `waiting` hook, if set, is told on
    the decode thread when the reader starts (True) and stops (False) waiting for a
    block."""

    def __init__(
        self,
        link: FeedLink,
        reader_gone: Callable[[], None],
        feed_state: Callable[[], FeedState],
        feed_changed: Callable[[int], Awaitable[None]],
    ) -> None:
        """`reader_gone`, `feed_state` and `feed_changed`: the feed's, for this tap."""
        self._link, self._reader_gone = link, reader_gone
        self._feed_state, self._feed_changed = feed_state, feed_changed
        self.reader = _Reader(link)
        self.waiting: Callable[[bool], None] | None = None

    def decode(self, decoder: ChunkedDecoder, on_chunk: ChunkCallback) -> None:
        self.reader.waiting = self.waiting
        self.reader.decode(decoder, on_chunk)

    def cancel(self) -> None:
        """Callable from any thread: this reader stops; the feed and its decoder go on."""
        self.reader.stop()
        self._link.tell(self._reader_gone)

    def take_audio(self) -> list[TimedAudio]:
        return self.reader.take_audio()

    def feed_state(self) -> FeedState:
        state = self._feed_state()
        return replace(state, stopped=state.stopped or self.reader.stopped)

    async def feed_changed(self, version: int) -> None:
        await self._feed_changed(version)


class _Reader:
    """One decoder's side of a feed: its queue of the blocks (thread-safe: the loop
    puts, the decode thread takes), the audio not yet handed to its encoder, and where
    its chunks' latency starts. Its thread never hangs: while it waits it looks at the
    cancel flags (its own and the feed's) and at the loop every `GET_POLL_S`."""

    def __init__(self, link: FeedLink) -> None:
        self._link = link
        self.holds_back = True  # a put waits for room in its queue (`LatentFeed.split`)
        # Unbounded as a queue; the feed's `put` keeps it at `max_blocks` unless told not to.
        self.queue: queue.SimpleQueue[_Block | _End] = queue.SimpleQueue()
        self._held_bytes = 0  # of the blocks queued and not yet taken
        self._bytes_lock = threading.Lock()
        self.audio: list[TimedAudio] = []  # arrived, not yet handed to the encoder
        self._stopped = threading.Event()
        self._taken_arrival: float | None = None
        self.chunk_arrivals: dict[int, float] = {}
        self.waiting: Callable[[bool], None] | None = None

    @property
    def stopped(self) -> bool:
        return self._stopped.is_set()

    @property
    def held_bytes(self) -> int:
        return self._held_bytes

    def stop(self) -> None:
        self._stopped.set()

    def offer(self, block: _Block) -> None:
        """On the loop: the next block, for this reader."""
        with self._bytes_lock:
            self._held_bytes += _nbytes(block.latents)
        self.queue.put(block)

    def end(self) -> None:
        """On the loop: no block after those offered (a mark: the bound is for blocks)."""
        self.queue.put(_End())

    def take_audio(self) -> list[TimedAudio]:
        audio, self.audio = self.audio, []
        return audio

    def decode(self, decoder: ChunkedDecoder, on_chunk: ChunkCallback) -> None:
        def on_chunk_timed(chunk: DecodedChunk) -> None:
            if self._taken_arrival is not None:
                self.chunk_arrivals[chunk.index] = self._taken_arrival
            on_chunk(chunk)

        decoder.decode_stream(self._blocks(), on_chunk_timed)

    def _blocks(self) -> Iterator[torch.Tensor]:
        while True:
            item = self._get()
            if isinstance(item, _End):
                return
            self._taken_arrival = item.arrived
            yield item.latents

    def _get(self) -> _Block | _End:
        """On the decode thread: the next block, or the end; raises if the feed or
        this reader was stopped, or the loop is gone."""
        link = self._link
        if self.waiting is not None:
            self.waiting(True)
        try:
            while True:
                if link.cancelled.is_set() or self.stopped:
                    raise link.stop_error()
                if not link.loop.is_running():
                    raise DecodeCancelled("event loop stopped")
                try:
                    item = self.queue.get(timeout=GET_POLL_S)
                except queue.Empty:
                    continue
                if isinstance(item, _Block):
                    with self._bytes_lock:
                        self._held_bytes -= _nbytes(item.latents)
                link.tell(link.block_taken)  # room for a held-back put
                return item
        finally:
            if self.waiting is not None:
                self.waiting(False)


def _nbytes(latents: torch.Tensor) -> int:
    return latents.element_size() * latents.nelement()
