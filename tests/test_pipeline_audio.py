"""run_pipeline over a LatentFeed with audio: each chunk's fragment waits for the audio
that ends it with its video, and for no more: not without audio, not for audio sent
ahead, not for a producer the full queue holds back, not past `audio_wait_s`, not
past a cancel."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
import torch

from tests.helpers import (
    GatedDecoder,
    assert_threads_end,
    smooth_latents,
    until,
    vaecast_threads,
)
from tests.helpers.fragment_audio import assert_aligned, timeline
from vaecast.codecs.aac import samples_for_duration
from vaecast.errors import DecodeFailedError
from vaecast.models.base import ChunkCallback, DecodedChunk, StreamPlan
from vaecast.models.linear import LinearDecoder
from vaecast.pipeline.latent_feed import LatentFeed
from vaecast.pipeline.run import AudioFormat, FragmentDone, TimedAudio, VideoOutput, Workers
from vaecast.pipeline.run import run_pipeline as pipeline

RATE = 16_000
LATENTS = smooth_latents(frames=8)  # 1 + 4 * 7 = 29 video frames, a chunk per latent frame
QUIET_S = 0.3  # how long a fragment that must wait is watched not coming


@dataclass
class Recorder:
    """The pipeline's sink and observer."""

    segments: list[bytes] = field(default_factory=list)
    done: list[FragmentDone] = field(default_factory=list)

    async def append(self, segment: bytes) -> None:
        self.segments.append(segment)

    def started(self, content_type: str) -> None:
        pass

    def fragment(self, done: FragmentDone) -> None:
        self.done.append(done)

    @property
    def data(self) -> bytes:
        return b"".join(self.segments)


@dataclass
class Session:
    """A push session's feed, pipeline task and producer side, as the server wires them."""

    feed: LatentFeed
    fps: Fraction
    recorder: Recorder
    task: asyncio.Task[None] | None = None
    pushed: int = 0  # latent frames

    def video_frames(self, latent_frames: int) -> int:
        return 0 if latent_frames == 0 else 1 + 4 * (latent_frames - 1)

    def sample(self, frame: int) -> int:
        return samples_for_duration(Fraction(frame) / self.fps, RATE)

    def audio_of(self, first: int, last: int, ahead: int = 0) -> TimedAudio:
        """The audio of video frames [first, last), `ahead` frames more, as the server
        places it: at the block's first frame."""
        start, stop = self.sample(first), self.sample(last + ahead)
        t = np.arange(start, stop) / RATE
        return TimedAudio((0.2 * np.sin(2 * np.pi * 440 * t))[None].astype(np.float32), first)

    async def push(self, count: int, audio: bool = True, ahead: int = 0) -> None:
        first, last = self.video_frames(self.pushed), self.video_frames(self.pushed + count)
        block = LATENTS[:, :, self.pushed : self.pushed + count]
        self.pushed += count
        await self.feed.put(block, self.audio_of(first, last, ahead) if audio else None)

    async def fragments(self, count: int) -> None:
        await until(lambda: len(self.recorder.done) >= count)

    async def quiet(self, count: int) -> None:
        """Still `count` fragments after QUIET_S: the next one is waiting."""
        await asyncio.sleep(QUIET_S)
        assert len(self.recorder.done) == count


@asynccontextmanager
async def session(
    fps: int = 8,
    audio: bool = True,
    decoder: Any = None,
    max_blocks: int = 4,
    ahead: int = 0,
    **options: Any,
) -> AsyncIterator[Session]:
    """A feed with its first block (one latent frame) in and the pipeline running; on
    leaving, the pipeline has ended (its outcome is the test's) and no thread is left."""
    threads_before = vaecast_threads()
    decoder = decoder or LinearDecoder()
    feed = LatentFeed(asyncio.get_running_loop(), max_blocks)
    live = Session(feed, Fraction(fps), Recorder())
    await live.push(1, audio, ahead)
    plan = decoder.plan_stream(await feed.first_block_shape())
    output = VideoOutput(Fraction(fps), audio_format=AudioFormat(RATE, 1) if audio else None)
    workers = Workers.for_slots(1)
    live.task = asyncio.create_task(
        pipeline(
            feed, decoder, plan, output, live.recorder, workers, observer=live.recorder, **options
        )
    )
    try:
        yield live
    finally:
        if not live.task.done():
            live.task.cancel()
        await asyncio.gather(live.task, return_exceptions=True)
        workers.shutdown()
        assert_threads_end(threads_before)


async def test_each_fragment_waits_for_the_next_blocks_audio_and_the_last_for_the_end():
    async with session() as live:
        await live.quiet(0)  # chunk 0 waits for the audio of block 1
        for count in range(1, 4):
            await live.push(1)
            await live.fragments(count)
            await live.quiet(count)
        await live.feed.end()
        await live.task
    assert len(live.recorder.done) == 4  # nothing after the last chunk's
    assert all(d.audio_wait_s > QUIET_S / 2 for d in live.recorder.done)
    line = assert_aligned(live.recorder.data)
    assert line.spans[0].audio == (0, 2048)  # the first fragment plays with its sound


async def test_without_audio_no_fragment_waits():
    async with session(audio=False) as live:
        for count in range(1, 4):
            await live.fragments(count)  # before the next block exists
            await live.push(1, audio=False)
        await live.fragments(4)
        await live.feed.end()
        await live.task
    assert all(d.audio_wait_s == 0.0 for d in live.recorder.done)


@pytest.mark.parametrize("ahead", [0, 4])
async def test_audio_sent_ahead_spares_waiting_for_more_than_the_next_block(ahead: int):
    # 30 fps at 16 kHz: a block of one latent frame (4 video frames) is 2133 samples,
    # less than the up to three AAC frames past its end that a fragment needs: sent
    # with its block alone, the audio that ends chunk 1's fragment comes with block 3.
    async with session(fps=30, ahead=ahead) as live:
        await live.push(1, ahead=ahead)
        await live.push(1, ahead=ahead)
        if ahead:
            await live.fragments(2)
        await live.quiet(2 if ahead else 1)
        await live.push(1, ahead=ahead)
        await live.fragments(2)
        await live.push(4, ahead=ahead)
        await live.feed.end()
        await live.task
    line = assert_aligned(live.recorder.data)
    assert len(line.spans) == 8


async def test_a_producer_held_back_by_the_full_queue_is_not_waited_for():
    # 120 fps at 16 kHz: a block of one latent frame is 533 samples, so chunk 0's audio
    # needs four more blocks. The decoder holds chunk 1 back, so it takes no block: one
    # waits in the queue and the next push waits for room. Waiting on would stall all.
    decoder = GatedDecoder(hold_at=1)
    async with session(fps=120, decoder=decoder, max_blocks=1, audio_wait_s=60.0) as live:
        await live.push(1)
        await until(decoder.holding.is_set)
        await live.push(1)  # into the queue
        assert live.recorder.done == []
        held = asyncio.create_task(live.push(1))  # no room
        await live.fragments(1)
        assert not held.done()
        decoder.gate.set()
        await held
        await live.push(4)
        await live.feed.end()
        await live.task
    assert live.recorder.done[0].audio_wait_s < 30
    # The fragments sent while the producer was held back have audio up to what was
    # in (none, for chunk 0's 133 samples); the later ones catch up, and the stream
    # stays whole: no audio-only fragment, the track contiguous, ending with the video.
    spans = timeline(live.recorder.data).spans
    assert spans[0].audio is None
    assert all(span.video is not None for span in spans)
    assert spans[-1].audio is not None and spans[-1].video is not None
    assert spans[-1].audio[1] == spans[-1].video[1]


async def test_the_wait_ends_after_audio_wait_s_and_the_audio_catches_up():
    async with session(audio_wait_s=0.2) as live:
        await live.fragments(1)  # no block 1: after 0.2 s, with the audio it has
        assert 0.2 <= live.recorder.done[0].audio_wait_s < 10
        await live.push(1)
        await live.push(1)
        await live.feed.end()
        await live.task
    spans = timeline(live.recorder.data).spans
    assert spans[0].audio is None  # 2000 samples in: no packet out of the encoder yet
    assert_aligned(live.recorder.data, without_audio=frozenset({0}))


async def test_a_fragment_waiting_for_audio_stops_waiting_when_the_feed_is_cancelled():
    async with session(audio_wait_s=60.0) as live:
        await live.quiet(0)
        stopped = time.perf_counter()
        threading.Thread(target=live.feed.cancel).start()  # as a session's end does
        await live.fragments(1)
        assert time.perf_counter() - stopped < 10
        assert live.feed.feed_state().stopped


async def test_cancelling_the_pipeline_while_a_fragment_waits_for_audio_ends_it():
    async with session(audio_wait_s=60.0) as live:
        await live.quiet(0)
        assert live.task is not None
        stopped = time.perf_counter()
        live.task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await live.task
        assert time.perf_counter() - stopped < 10


class OneChunkTooMany(LinearDecoder):
    """Publishes a chunk past the frames its latents decode to."""

    def decode_stream(self, blocks: Iterable[torch.Tensor], on_chunk: ChunkCallback) -> Any:
        published: list[DecodedChunk] = []

        def record(chunk: DecodedChunk) -> None:
            published.append(chunk)
            on_chunk(chunk)

        plan = super().decode_stream(blocks, record)
        last = published[-1]
        start = last.frame_start + last.frames.shape[2]
        on_chunk(DecodedChunk(last.frames[:, :, :1].clone(), last.index + 1, None, start))
        return plan


async def test_a_chunk_after_the_video_s_last_fails_the_pipeline():
    async with session(decoder=OneChunkTooMany()) as live:
        await live.push(1)
        await live.feed.end()
        with pytest.raises(DecodeFailedError, match="chunk 2 came after the 5 frames"):
            await live.task


def test_the_stream_plan_of_the_tests_is_the_causal_one():
    plan = LinearDecoder().plan_stream((1, 16, 1, 6, 8))
    assert isinstance(plan, StreamPlan)
    assert [plan.frames_for(n) for n in range(4)] == [0, 1, 5, 9]
