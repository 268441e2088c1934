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

Audio that arrives with the latents (a push session with audio, `LiveSource`) is
carried by each fragment for its own video span; how a chunk waits for it, and what
that costs, is `vaecast.pipeline.live_audio`'s docstring.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

from vaecast.codecs.aac import AudioSettings
from vaecast.codecs.stream import VideoStreamEncoder
from vaecast.errors import DecodeFailedError
from vaecast.models.base import ChunkedDecoder, DecodePlan, StreamPlan
from vaecast.pipeline.bridge import ChunkBridge, DecodeEnded, DecodeRaised, HostChunk
from vaecast.pipeline.interfaces import (
    AudioFormat,
    EncoderFactory,
    FeedState,
    FragmentDone,
    LatentSource,
    LiveSource,
    PipelineObserver,
    Sink,
    Stages,
    TimedAudio,
    VideoOutput,
    WholeLatents,
    Workers,
)
from vaecast.pipeline.live_audio import DEFAULT_AUDIO_WAIT_S, append_audio, encode_aligned

__all__ = [
    "DEFAULT_AUDIO_WAIT_S",
    "DEFAULT_QUEUE_CHUNKS",
    "AudioFormat",
    "EncoderFactory",
    "FeedState",
    "FragmentDone",
    "LatentSource",
    "LiveSource",
    "PipelineObserver",
    "Sink",
    "Stages",
    "TimedAudio",
    "VideoOutput",
    "WholeLatents",
    "Workers",
    "run_pipeline",
]

DEFAULT_QUEUE_CHUNKS = 2


async def run_pipeline(
    source: LatentSource,
    decoder: ChunkedDecoder,
    plan: DecodePlan | StreamPlan,
    output: VideoOutput,
    sink: Sink,
    workers: Workers,
    *,
    stages: Stages = Stages(),  # noqa: B008 (frozen, immutable)
    observer: PipelineObserver | None = None,
    queue_chunks: int = DEFAULT_QUEUE_CHUNKS,
    audio_wait_s: float = DEFAULT_AUDIO_WAIT_S,
    keyframes: Callable[[int], bool] | None = None,
) -> None:
    """Decode `source` with `decoder`, encode each chunk, append each fragment to `sink`.

    `plan` is the decoder's plan of a whole video, or its stream plan (frame size and
    chunk sizes, not the length) for one whose length is known when its source ends.
    `audio_wait_s` bounds each chunk's wait for its audio (audio arriving with the
    latents of a `LiveSource` only; see `vaecast.pipeline.live_audio`).
    `keyframes(index)`, asked on the event loop as chunk `index` goes to the encoder:
    whether its fragment must start with a keyframe (a live rendition's switch points).
    Raises DecodeFailedError when the decoder, the encoder or the sink fails, or the
    decoder breaks its plan; DecodeCancelled or CancelledError when stopped.
    """
    run = _PipelineRun(source, decoder, plan, output, sink, workers, stages, observer)
    run.keyframes = keyframes
    run.start(queue_chunks)
    try:
        await run.stream(audio_wait_s)
    finally:
        await run.stop()


class _PipelineRun:
    """One `run_pipeline` call's state: the decode thread and its bridge, the encoder
    and its one call in flight, and what has been encoded so far."""

    def __init__(
        self,
        source: LatentSource,
        decoder: ChunkedDecoder,
        plan: DecodePlan | StreamPlan,
        output: VideoOutput,
        sink: Sink,
        workers: Workers,
        stages: Stages,
        observer: PipelineObserver | None,
    ) -> None:
        self.source, self.decoder, self.plan, self.output = source, decoder, plan, output
        self.sink, self.workers, self.stages, self.observer = sink, workers, stages, observer
        self.loop = asyncio.get_running_loop()
        self.encoder: VideoStreamEncoder | None = None
        self.encoding: asyncio.Future[Any] | None = None
        self.chunks_done = self.frames_done = 0
        self.ended_video = False  # a chunk was encoded as the video's last
        self.keyframes: Callable[[int], bool] | None = None
        live = output.audio_format is not None and isinstance(source, LiveSource)
        self.live: LiveSource | None = source if live else None  # type: ignore[assignment]

    def start(self, queue_chunks: int) -> None:
        """The decode starts first and the encoder opens on the encode thread meanwhile:
        opening x264 and writing the init segment take milliseconds that would otherwise
        come before the first chunk's decode, on the way to the first fragment."""
        plan, output, stages = self.plan, self.output, self.stages
        self.bridge = ChunkBridge(
            self.loop, self.decoder.value_range, max_chunks=queue_chunks, to_host=stages.to_host
        )
        self.decoding = self.loop.run_in_executor(
            self.workers.decode,
            self.bridge.run,
            functools.partial(self.source.decode, self.decoder),
        )
        self.opening = self.loop.run_in_executor(
            self.workers.encode,
            functools.partial(
                stages.encoder_factory,
                plan.width,
                plan.height,
                output.fps,
                output.settings,
                **_audio_options(output, plan),
            ),
        )

    async def encode_call(self, pool: Executor, function: Callable[..., Any], *args: Any) -> Any:
        """`function(encoder, *args)` on `pool`: the encoder's one call in flight."""
        self.encoding = self.loop.run_in_executor(pool, function, self.encoder, *args)
        try:
            return await self.encoding
        except Exception as error:
            raise DecodeFailedError(f"the encoder failed: {error}") from error

    async def stream(self, audio_wait_s: float) -> None:
        """The init segment, a fragment per decoded chunk, then the stream's tail."""
        self.encoder = await _join(self.opening)  # an error opening it is the caller's
        if self.observer is not None:
            self.observer.started(self.encoder.content_type)
        await _append(self.sink, self.encoder.init_segment)
        while True:
            waited_from = time.perf_counter()
            item = await self.bridge.get()
            decode_wait_s = time.perf_counter() - waited_from
            if isinstance(item, DecodeEnded):
                break
            if isinstance(item, DecodeRaised):
                raise DecodeFailedError(f"the decoder failed: {item.error}") from item.error
            await self._chunk(item, decode_wait_s, audio_wait_s)
        if isinstance(self.plan, DecodePlan) and self.chunks_done != self.plan.chunks:
            raise DecodeFailedError(
                f"the decoder published {self.chunks_done} chunks, its plan said {self.plan.chunks}"
            )
        # A stream's length is known only now: the rest of its audio, cut to the video
        # (nothing, where the last chunk's fragment carried it).
        tail = await self.encode_call(self.workers.encode, _finish, self.source.take_audio())
        if tail:
            await _append(self.sink, tail)

    async def _chunk(self, item: HostChunk, decode_wait_s: float, audio_wait_s: float) -> None:
        """Encode one decoded chunk and append its fragment."""
        if self.ended_video:
            raise DecodeFailedError(
                f"the decoder broke its plan: chunk {item.index} came after the "
                f"{self.frames_done} frames its latents decode to"
            )
        _check_against_plan(self.plan, self.chunks_done, self.frames_done, item)
        # At the lower priority only while the encoder keeps up. Anything already
        # waiting behind this chunk means it does not: the decode outruns it, or other
        # work (another process) holds the cores; at normal priority it then gets its
        # fair share. (The decode's end waiting: nothing is left to yield to.)
        caught_up = self.chunks_done > 0 and self.bridge.backlog == 0
        pool = self.workers.after_first() if caught_up else self.workers.encode
        audio_waited_s = 0.0
        keyframe = self.keyframes is not None and self.keyframes(item.index)
        if self.live is None:
            encode_from = time.perf_counter()
            audio = self.source.take_audio()
            fragment = await self.encode_call(pool, _encode, item.pixels, audio, keyframe)
        else:
            assert self.encoder is not None
            fragment, self.ended_video, audio_waited_s, encode_from = await encode_aligned(
                self.live,
                self.plan,
                self.encoder,
                item,
                functools.partial(self.encode_call, pool),
                audio_wait_s,
                keyframe,
            )
        encode_s = time.perf_counter() - encode_from
        await _append(self.sink, fragment)
        self.chunks_done += 1
        self.frames_done += item.frame_count
        if self.observer is not None:
            self.observer.fragment(
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

    async def stop(self) -> None:
        """However the run ended: the decode thread returned and the encoder closed."""
        self.bridge.cancel()  # a no-op after a clean end; stops the decoder otherwise
        self.source.cancel()  # and a decoder waiting for latents
        # Even while this task is being cancelled: the decoder thread must return and
        # the encoder must be idle before it is closed (one thread at a time).
        # The decode thread ends normally, or with DecodeCancelled (other errors came
        # through the bridge). Drop that error's traceback: it holds the thread's frames
        # (tensors among them) in a cycle only a full garbage collection would free.
        decoding = self.decoding
        await _join(decoding, outcome_handled=True)
        if not decoding.cancelled() and (stopped := decoding.exception()) is not None:
            stopped.__traceback__ = None
        if self.encoding is not None:
            await _join(self.encoding, outcome_handled=True)
        if self.encoder is None:  # the open failed, or this task was cancelled during it
            await _join(self.opening, outcome_handled=True)
            if not self.opening.cancelled() and self.opening.exception() is None:
                self.encoder = self.opening.result()
        if self.encoder is not None:
            await _join(self.loop.run_in_executor(self.workers.encode, self.encoder.close))


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


def _encode(
    encoder: VideoStreamEncoder, pixels: Any, audio: list[TimedAudio], keyframe: bool
) -> bytes:
    """One chunk on the encode thread, after the audio that arrived with its latents."""
    append_audio(encoder, audio)
    if keyframe:  # (asked only then: an injected encoder need not know the option)
        return encoder.encode_chunk(pixels, keyframe=True)
    return encoder.encode_chunk(pixels)


def _finish(encoder: VideoStreamEncoder, audio: list[TimedAudio]) -> bytes:
    if not encoder.last_chunk_encoded:  # else the feed had ended: no audio came since
        append_audio(encoder, audio)
    return encoder.finish()


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
