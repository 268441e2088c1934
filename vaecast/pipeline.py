"""One video, from latents to fragments: the pipeline every caller runs.

    latent source --(decode thread)--> ChunkBridge --(bounded queue)--> encode thread
        decoder.decode_chunks          to_host: quantize          encoder: H.264 (+AAC)
        one chunk at a time            + one device->host copy    -> one fMP4 fragment
                                                                  -> sink.append(bytes)

`run_pipeline` is that whole path for one video. The server's job (its sink is the
job's SegmentLog, which any number of viewers follow), `vaecast decode` (a file) and
the benchmarks (a recorder) all call it; what differs between them is injected: the
sink, the thread pools, the host conversion and the encoder factory (`Stages`), and
observers of each fragment. Nothing here knows about HTTP.

The latent source is an object that runs the decoder on the decode thread. A whole
tensor is the simple case (`WholeLatents`); a source whose latents arrive over time
blocks inside the decoder's thread until the next block exists, and the rest of the
pipeline does not change.

However it ends (done, decoder error, encoder error, cancel), `run_pipeline` returns
or raises only after the decode thread has returned and the encoder is closed, so no
thread, codec or queued chunk outlives it. Cancelling the task that awaits it stops
the decoder at its next chunk.

Audio that arrives with the latents (a push session with audio; `LiveSource`). Each
fragment carries the audio of its own video span, as an upload's do: a fragment is
written once the audio that ends it within one AAC frame of its video's end is in,
and the last chunk's fragment carries the rest, fitted to end with the video, so no
fragment is audio-only. AAC hands a frame's packet out two frames after it (see
`codecs.live_audio`), so a chunk's fragment needs two to three AAC frames (43-64 ms
at 48 kHz, 128-192 ms at 16 kHz) of audio past its video's end: in practice the
next block's, which comes with the next block's latents. So the encoder, holding a chunk,
waits on the event loop (`LiveSource.feed_changed`; the decode thread goes on
meanwhile) until one of:
- a later block is in, and with it that audio (`live_audio_needed`), or the blocks
  that came reach past it: a block brings only audio from its own first frame on
  (`TimedAudio`), so there is no more to wait for, and the gaps before it are
  silence at once. Audio sent ahead does not spare the wait for the next block:
  only a later block (or the end) tells whether the chunk ends the video;
- the last block came (the session ended): then the chunk that ends the video is
  encoded as the last, with the rest of the audio;
- a block waits for room in the feed's queue: its producer is held back, and the
  decode may be waiting for this very encoder (the bounded chunk queue), so waiting
  on could only stall all three;
- the source stopped (cancelled, failed, timed out), or the task was cancelled;
- `audio_wait_s` passed: a producer slower than that, or one that waits for a
  fragment before it sends the next block, gets the fragment with the audio it has
  (ending up to three AAC frames short of the video; the next fragments catch up).
So the wait never blocks the loop or a thread, never outlives the session, and
holds nothing but what the feed's bounded queue already bounds: the audio of the
blocks put and not yet encoded, taken into the encoder (as AAC packets) as it
comes. What it costs: each fragment waits for the next block's arrival, so a
fragment's block-to-viewer latency (`latency_s`) grows by the producer's interval
between blocks, up to `audio_wait_s` (the live demo renders its next block as soon
as the queue has room, so its wait is a block's rendering). Sessions without audio,
and sources that are no `LiveSource`, never wait: each chunk is encoded the moment
it is decoded.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from vaecast.bridge import ChunkBridge, DecodeEnded, DecodeRaised, HostChunk, ToHost
from vaecast.codecs.aac import AudioSettings
from vaecast.codecs.h264 import EncoderSettings
from vaecast.codecs.quantize import quantize_yuv420_to_host
from vaecast.codecs.stream import Soundtrack, VideoStreamEncoder
from vaecast.errors import DecodeFailedError
from vaecast.models.base import ChunkCallback, ChunkedDecoder, DecodePlan, StreamPlan
from vaecast.thread_priority import lowered_pool

DEFAULT_QUEUE_CHUNKS = 2
# The longest a chunk of a push session with audio waits for the audio that ends its
# fragment with its video (module docstring).
DEFAULT_AUDIO_WAIT_S = 5.0

# What builds the encoder: VideoStreamEncoder's signature.
EncoderFactory = Callable[..., VideoStreamEncoder]


class Sink(Protocol):
    """Where the fragments go, in order: the init segment first, then one per chunk."""

    async def append(self, segment: bytes) -> None: ...


class LatentSource(Protocol):
    """Runs `decoder` over its latents on the decode thread; may block for latents."""

    def decode(self, decoder: ChunkedDecoder, on_chunk: ChunkCallback) -> None: ...

    def cancel(self) -> None:
        """Callable from any thread: a decode waiting for latents stops."""

    def take_audio(self) -> list[TimedAudio]:
        """Audio that arrived with the latents since the last call."""


@dataclass(frozen=True, slots=True)
class WholeLatents:
    """A latent tensor that exists in full before the decode starts (BCTHW)."""

    latents: torch.Tensor

    def decode(self, decoder: ChunkedDecoder, on_chunk: ChunkCallback) -> None:
        decoder.decode_chunks(self.latents.to(decoder.device), on_chunk)

    def cancel(self) -> None:
        pass  # never waits: the bridge's cancel stops it

    def take_audio(self) -> list[TimedAudio]:
        return []  # a whole video's soundtrack is given to the encoder up front


@dataclass(frozen=True, slots=True)
class TimedAudio:
    """Audio that came with a latent block: (channels, n) float32 from the block's
    first video frame on. A block brings no audio for frames before its own (the
    pipeline gives up a gap, as silence, once a later block is in)."""

    samples: np.ndarray
    first_frame: int


@dataclass(frozen=True, slots=True)
class FeedState:
    """Where a live source's blocks stand, for the audio of the fragments."""

    latent_frames: int  # in the blocks put so far, whose audio is all in `take_audio`
    ended: bool  # the last block is in
    held_back: bool  # a block waits for room in the queue: its producer is held back
    stopped: bool  # cancelled or failed: the decode is ending
    version: int  # changes whenever any of the above does


@runtime_checkable
class LiveSource(LatentSource, Protocol):
    """A latent source whose blocks, and the audio with them, arrive over time (a push
    session): with audio, each fragment waits for its audio (module docstring)."""

    def feed_state(self) -> FeedState:
        """Now; on the event loop."""

    async def feed_changed(self, version: int) -> None:
        """Return once `feed_state().version` is no longer `version`."""


@dataclass(frozen=True, slots=True)
class Stages:
    """The two replaceable steps: how a chunk reaches the host, and what encodes it."""

    to_host: ToHost = quantize_yuv420_to_host
    encoder_factory: EncoderFactory = VideoStreamEncoder


@dataclass(frozen=True, slots=True)
class Workers:
    """Threads for the decode and the encode. Each encoder is used by one thread at a
    time, whatever the pool sizes: the pipeline never runs two of its calls at once.

    `encode` opens each video's encoder and encodes its first chunk (the first
    fragment is what a viewer waits for). `encode_rest`, when given, encodes the
    chunks after it while the encoder keeps up (no chunk waiting behind the one taken):
    a pool at a lower priority (nice 10, `vaecast.thread_priority`), so that on cores
    the decode fills the encoder takes mostly the time the decode leaves idle. A chunk
    taken with another waiting goes to `encode`: the encoder is behind, and at a
    tenth of a core's share the stream would fall further behind.
    """

    decode: Executor
    encode: Executor
    encode_rest: Executor | None = None

    @classmethod
    def for_slots(cls, slots: int) -> Workers:
        """A thread of each kind per decode slot. The rest of each video's chunks are
        encoded at a lower priority only when the process decodes one video at a time:
        then the decode beside an encoder is its own, which waits (the bounded queue)
        when its encoder falls behind; with more slots another video's decode would
        hold this one's encoder to a fraction of its share, and nothing would wait."""
        return cls(
            decode=ThreadPoolExecutor(slots, thread_name_prefix="vaecast-decode"),
            encode=ThreadPoolExecutor(slots, thread_name_prefix="vaecast-encode"),
            encode_rest=lowered_pool(slots, "vaecast-encode-low") if slots == 1 else None,
        )

    def shutdown(self) -> None:
        """Wait for every pool's work, then stop its threads."""
        for pool in (self.decode, self.encode, self.encode_rest):
            if pool is not None:
                pool.shutdown()

    def after_first(self) -> Executor:
        """Where the chunks after a video's first are encoded while the encoder keeps up."""
        return self.encode if self.encode_rest is None else self.encode_rest


@dataclass(frozen=True, slots=True)
class AudioFormat:
    """The audio a stream will carry, before any of it exists."""

    sample_rate: int
    channels: int


@dataclass(frozen=True, slots=True)
class VideoOutput:
    """What the encoder makes of the decoded frames: a whole soundtrack up front, or
    (a push session) the format of audio that arrives with the latents."""

    fps: Fraction
    settings: EncoderSettings = EncoderSettings()  # noqa: RUF009 (frozen, immutable)
    soundtrack: Soundtrack | None = None
    audio_format: AudioFormat | None = None


@dataclass(frozen=True, slots=True)
class FragmentDone:
    """One chunk's fragment is in the sink."""

    index: int
    total: int | None  # None while a stream's length is unknown
    frame_start: int
    frames: int
    bytes: int
    encode_s: float
    decode_wait_s: float  # how long the encoder side waited for this chunk
    audio_wait_s: float = 0.0  # how long it then waited for the audio that ends it


class PipelineObserver(Protocol):
    def started(self, content_type: str) -> None:
        """The encoder is open; its init segment is about to be appended."""

    def fragment(self, done: FragmentDone) -> None:
        """A chunk's fragment was appended to the sink."""


async def run_pipeline(
    source: LatentSource,
    decoder: ChunkedDecoder,
    plan: DecodePlan | StreamPlan,
    output: VideoOutput,
    sink: Sink,
    workers: Workers,
    *,
    stages: Stages = Stages(),
    observer: PipelineObserver | None = None,
    queue_chunks: int = DEFAULT_QUEUE_CHUNKS,
    audio_wait_s: float = DEFAULT_AUDIO_WAIT_S,
) -> None:
    """Decode `source` with `decoder`, encode each chunk, append each fragment to `sink`.

    `plan` is the decoder's plan of a whole video, or its stream plan (frame size and
    chunk sizes, not the length) for one whose length is known when its source ends.
    `audio_wait_s` bounds each chunk's wait for its audio (audio arriving with the
    latents of a `LiveSource` only; see the module docstring).
    Raises DecodeFailedError when the decoder, the encoder or the sink fails, or the
    decoder breaks its plan; DecodeCancelled or CancelledError when stopped.
    """
    loop = asyncio.get_running_loop()
    bridge = ChunkBridge(loop, decoder.value_range, max_chunks=queue_chunks, to_host=stages.to_host)
    # The decode starts first and the encoder opens on the encode thread meanwhile:
    # opening x264 and writing the init segment take milliseconds that would
    # otherwise come before the first chunk's decode, on the way to the first fragment.
    decoding = loop.run_in_executor(
        workers.decode, bridge.run, functools.partial(source.decode, decoder)
    )
    opening = loop.run_in_executor(
        workers.encode,
        functools.partial(
            stages.encoder_factory,
            plan.width,
            plan.height,
            output.fps,
            output.settings,
            **_audio_options(output, plan),
        ),
    )
    encoder: VideoStreamEncoder | None = None
    encoding: asyncio.Future[Any] | None = None

    async def encode_call(pool: Executor, function: Callable[..., Any], *args: Any) -> Any:
        """`function(encoder, *args)` on `pool`: the encoder's one call in flight."""
        nonlocal encoding
        encoding = loop.run_in_executor(pool, function, encoder, *args)
        try:
            return await encoding
        except Exception as error:
            raise DecodeFailedError(f"the encoder failed: {error}") from error

    live = source if output.audio_format is not None and isinstance(source, LiveSource) else None
    try:
        encoder = await _join(opening)  # an error opening it is the caller's, as it was
        if observer is not None:
            observer.started(encoder.content_type)
        await _append(sink, encoder.init_segment)
        chunks_done = frames_done = 0
        ended_video = False  # a chunk was encoded as the video's last
        while True:
            waited_from = time.perf_counter()
            item = await bridge.get()
            decode_wait_s = time.perf_counter() - waited_from
            if isinstance(item, DecodeEnded):
                break
            if isinstance(item, DecodeRaised):
                raise DecodeFailedError(f"the decoder failed: {item.error}") from item.error
            if ended_video:
                raise DecodeFailedError(
                    f"the decoder broke its plan: chunk {item.index} came after the "
                    f"{frames_done} frames its latents decode to"
                )
            _check_against_plan(plan, chunks_done, frames_done, item)
            # At the lower priority only while the encoder keeps up. Anything already
            # waiting behind this chunk means it does not: the decode outruns it, or
            # other work (another process) holds the cores; at normal priority it then
            # gets its fair share. (The decode's end waiting: nothing is left to yield to.)
            caught_up = chunks_done > 0 and bridge.backlog == 0
            pool = workers.after_first() if caught_up else workers.encode
            audio_waited_s = 0.0
            if live is None:
                encode_from = time.perf_counter()
                fragment = await encode_call(pool, _encode, item.pixels, source.take_audio())
            else:
                fragment, ended_video, audio_waited_s, encode_from = await _encode_aligned(
                    live,
                    plan,
                    encoder,
                    item,
                    functools.partial(encode_call, pool),
                    audio_wait_s,
                )
            encode_s = time.perf_counter() - encode_from
            await _append(sink, fragment)
            chunks_done += 1
            frames_done += item.frame_count
            if observer is not None:
                observer.fragment(
                    FragmentDone(
                        item.index,
                        item.total,
                        item.frame_start,
                        item.frame_count,
                        len(fragment),
                        encode_s,
                        decode_wait_s,
                        audio_waited_s,
                    )
                )
        if isinstance(plan, DecodePlan) and chunks_done != plan.chunks:
            raise DecodeFailedError(
                f"the decoder published {chunks_done} chunks, its plan said {plan.chunks}"
            )
        # A stream's length is known only now: the rest of its audio, cut to the video
        # (nothing, where the last chunk's fragment carried it).
        tail = await encode_call(workers.encode, _finish, source.take_audio())
        if tail:
            await _append(sink, tail)
    finally:
        bridge.cancel()  # a no-op after a clean end; stops the decoder otherwise
        source.cancel()  # and a decoder waiting for latents
        # Even while this task is being cancelled: the decoder thread must return and
        # the encoder must be idle before it is closed (one thread at a time).
        # The decode thread ends normally, or with DecodeCancelled (other errors came
        # through the bridge). Drop that error's traceback: it holds the thread's frames
        # (tensors among them) in a cycle only a full garbage collection would free.
        await _join(decoding, outcome_handled=True)
        if not decoding.cancelled() and (stopped := decoding.exception()) is not None:
            stopped.__traceback__ = None
        if encoding is not None:
            await _join(encoding, outcome_handled=True)
        if encoder is None:  # the open failed, or this task was cancelled during it
            await _join(opening, outcome_handled=True)
            if not opening.cancelled() and opening.exception() is None:
                encoder = opening.result()
        if encoder is not None:
            await _join(loop.run_in_executor(workers.encode, encoder.close))


async def _append(sink: Sink, segment: bytes) -> None:
    try:
        await sink.append(segment)
    except OSError as error:  # disk full, file too large, I/O error
        raise DecodeFailedError(f"the video could not be stored: {error}") from error


def _audio_options(output: VideoOutput, plan: DecodePlan | StreamPlan) -> dict[str, Any]:
    if output.audio_format is not None:  # audio that will come with the latents
        fmt = output.audio_format
        return {"audio": AudioSettings(fmt.sample_rate, fmt.channels)}
    total_frames = plan.frames if isinstance(plan, DecodePlan) else None
    return {"soundtrack": output.soundtrack, "total_frames": total_frames}


def _encode(encoder: VideoStreamEncoder, pixels: Any, audio: list[TimedAudio]) -> bytes:
    """One chunk on the encode thread, after the audio that arrived with its latents."""
    _append_audio(encoder, audio)
    return encoder.encode_chunk(pixels)


async def _encode_aligned(
    live: LiveSource,
    plan: DecodePlan | StreamPlan,
    encoder: VideoStreamEncoder,
    chunk: HostChunk,
    call: Callable[..., Awaitable[Any]],
    max_wait_s: float,
) -> tuple[bytes, bool, float, float]:
    """Encode `chunk` once the audio that ends its fragment with its video is in, or
    there is no more to wait for (module docstring). Returns the fragment, whether it
    ended the video, how long the chunk waited for audio, and when its encode began.

    Once a later block (or the end) is in, each try takes in the audio that came (the
    encoder then holds it as AAC packets, not the feed as PCM) and encodes only if
    enough is in; between tries the wait is on the event loop, for the feed's next
    change, never past `max_wait_s` (0: no wait)."""
    loop = asyncio.get_running_loop()
    frame_end = chunk.frame_start + chunk.frame_count
    taken = time.perf_counter()
    deadline = loop.time() + max_wait_s
    while True:
        state = live.feed_state()
        if isinstance(plan, StreamPlan):
            video_in = plan.frames_for(state.latent_frames)  # of the blocks put
            more_follows = video_in > frame_end
        else:  # a push whose length was known before its decode began: ended
            video_in = plan.frames if state.ended else frame_end
            more_follows = frame_end < plan.frames
        last = state.ended and not more_follows
        settled = encoder.audio_sample_at(video_in)  # no more audio comes before this
        need = encoder.live_audio_needed(frame_end, more_follows)
        # Whether this chunk ends the video is known only once a later block, or the
        # end, is in: until then it waits, whatever audio came ahead.
        stop_waiting = state.ended or state.held_back or state.stopped or loop.time() >= deadline
        if stop_waiting or more_follows:
            encode_from = time.perf_counter()
            fragment = await call(
                _encode_live,
                chunk.pixels,
                live.take_audio(),
                settled,
                None if stop_waiting or settled >= need else need,
                True if last else (False if more_follows else None),
            )
            if fragment is not None:
                return fragment, last, encode_from - taken, encode_from
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout_at(deadline):
                await live.feed_changed(state.version)


def _encode_live(
    encoder: VideoStreamEncoder,
    pixels: Any,
    audio: list[TimedAudio],
    settled: int,
    need: int | None,
    last: bool | None,
) -> bytes | None:
    """On the encode thread: take in the audio that came and settle the gaps before
    `settled`; then the chunk's fragment, or None while fewer than `need` samples are
    in (the audio stays in the encoder for the next try)."""
    _append_audio(encoder, audio)
    encoder.settle_audio(settled)
    if need is not None and encoder.audio_received < need:
        return None
    return encoder.encode_chunk(pixels, last=last)


def _finish(encoder: VideoStreamEncoder, audio: list[TimedAudio]) -> bytes:
    if not encoder.last_chunk_encoded:  # else the feed had ended: no audio came since
        _append_audio(encoder, audio)
    return encoder.finish()


def _append_audio(encoder: VideoStreamEncoder, audio: list[TimedAudio]) -> None:
    for piece in audio:
        encoder.append_audio(piece.samples, at_sample=encoder.audio_sample_at(piece.first_frame))


def _check_against_plan(
    plan: DecodePlan | StreamPlan, index: int, frame_start: int, chunk: HostChunk
) -> None:
    got = (chunk.index, chunk.frame_start, chunk.frame_count, *chunk.pixels.shape[1:3])
    if isinstance(plan, StreamPlan):
        # The length is open: each chunk has its planned size, except the last, which
        # may be shorter (a later chunk would then start in the wrong place).
        planned = plan.frames_of(index)
        count = chunk.frame_count if 1 <= chunk.frame_count <= planned else planned
        start = plan.chunk_start(index) if frame_start == plan.chunk_start(index) else None
        expected = (index, start, count, plan.height, plan.width)
    elif index < plan.chunks:
        # Every chunk before this one had its planned size, so `frame_start` (the frames
        # so far) is where the plan starts this one (`plan.chunk_starts` would rebuild
        # the whole list per chunk: quadratic in the video's length).
        expected = (index, frame_start, plan.chunk_frames[index], plan.height, plan.width)
    else:
        expected = None
    if got != expected:
        raise DecodeFailedError(
            f"the decoder broke its plan at chunk {index}: got (index, frame_start, frames, "
            f"height, width) = {got}, planned {expected}"
        )


async def _join(future: asyncio.Future[Any], outcome_handled: bool = False) -> Any:
    """Wait for `future` to finish even if this task is cancelled meanwhile.

    A cancel that arrives while waiting is re-raised once the future is done, so the
    pipeline never ends while its executor work is still running. With
    `outcome_handled`, the future's result or error is not looked at again.
    """
    cancelled = False
    while True:
        try:
            await asyncio.wait([future])
            break
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
    if outcome_handled:
        return None
    return future.result()
