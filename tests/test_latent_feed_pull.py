"""A LatentFeed whose blocks are pulled (the Ray replica's transport, `pull=`): the same
feed as a put one, to the decoder and to the pipeline's per-fragment audio; a failed
pull fails it, a cancel cancels the pull in flight."""

from __future__ import annotations

import asyncio
from fractions import Fraction

import numpy as np
import pytest

from tests.helpers import assert_threads_end, smooth_latents, until, vaecast_threads
from tests.helpers.fragment_audio import assert_aligned
from tests.test_pipeline_audio import RATE, Recorder
from vaecast.codecs.aac import samples_for_duration
from vaecast.errors import DecodeCancelled, DecodeFailedError, JobStateError
from vaecast.models.linear import LinearDecoder
from vaecast.pipeline.latent_feed import LatentFeed, PulledBlock
from vaecast.pipeline.run import AudioFormat, TimedAudio, VideoOutput, Workers
from vaecast.pipeline.run import run_pipeline as pipeline

FPS = 8
LATENTS = smooth_latents(frames=6)


class Host:
    """A job host's block queue, as `next_block` hands it out (None after the last)."""

    def __init__(self) -> None:
        self.blocks: asyncio.Queue[PulledBlock | Exception | None] = asyncio.Queue()
        self.pulls = 0
        self.cancelled = 0

    async def pull(self) -> PulledBlock | None:
        self.pulls += 1
        try:
            item = await self.blocks.get()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        if isinstance(item, Exception):
            raise item
        return item

    def push(self, first: int, count: int = 1, arrived: float = 0.0) -> None:
        frames = [1 + 4 * (n - 1) if n else 0 for n in (first, first + count)]
        start, stop = (samples_for_duration(Fraction(f, FPS), RATE) for f in frames)
        t = np.arange(start, stop) / RATE
        audio = TimedAudio((0.2 * np.sin(2 * np.pi * 440 * t))[None].astype(np.float32), frames[0])
        latents = LATENTS[:, :, first : first + count]
        self.blocks.put_nowait(PulledBlock(latents, audio, arrived))


async def test_pulled_blocks_give_each_fragment_its_own_audio():
    threads_before = vaecast_threads()
    host = Host()
    feed = LatentFeed(asyncio.get_running_loop(), 1, pull=host.pull)
    host.push(0, arrived=100.0)
    decoder = LinearDecoder()
    plan = decoder.plan_stream(await feed.first_block_shape())
    recorder, workers = Recorder(), Workers.for_slots(1)
    output = VideoOutput(Fraction(FPS), audio_format=AudioFormat(RATE, 1))
    task = asyncio.create_task(
        pipeline(feed, decoder, plan, output, recorder, workers, observer=recorder)
    )
    try:
        await asyncio.sleep(0.3)
        assert recorder.done == []  # chunk 0 waits for block 1's audio
        for first in range(1, 6):
            host.push(first, arrived=100.0 + first)
            await until(lambda first=first: len(recorder.done) >= first)
        host.blocks.put_nowait(None)
        await task
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        workers.shutdown()
    assert_threads_end(threads_before)  # the pipeline's own pools are stopped
    state = feed.feed_state()
    assert (state.latent_frames, state.ended, state.held_back) == (6, True, False)
    assert len(assert_aligned(recorder.data).spans) == 6
    assert feed.chunk_arrivals == {i: 100.0 + i for i in range(6)}  # the pulled clock


async def test_the_pump_waits_for_room_and_says_it_is_held_back():
    host = Host()
    feed = LatentFeed(asyncio.get_running_loop(), 1, pull=host.pull)
    for first in range(3):
        host.push(first)
    await until(lambda: feed.feed_state().held_back)
    assert feed.latent_frames == 2  # one queued, one held back (counted, audio in)
    assert host.pulls == 2 and len(feed.take_audio()) == 2
    feed.cancel()
    await until(lambda: not feed.feed_state().held_back)
    assert feed.feed_state().stopped


async def test_cancel_cancels_the_pull_in_flight():
    host = Host()
    feed = LatentFeed(asyncio.get_running_loop(), 2, pull=host.pull)
    await until(lambda: host.pulls == 1)
    feed.cancel()
    await until(lambda: host.cancelled == 1)
    with pytest.raises(DecodeCancelled):
        await feed.first_block_shape()


async def test_an_end_before_any_block_fails_the_first_block_shape():
    host = Host()
    host.blocks.put_nowait(None)
    feed = LatentFeed(asyncio.get_running_loop(), 2, pull=host.pull)
    with pytest.raises(DecodeCancelled, match="before any block"):
        await feed.first_block_shape()
    assert feed.ended


@pytest.mark.parametrize(
    ("error", "raised", "match"),
    [
        (JobStateError("the job is gone"), JobStateError, "the job is gone"),
        (ConnectionError("host lost"), DecodeFailedError, "could not be had: host lost"),
    ],
)
async def test_a_failed_pull_fails_the_feed_and_its_decode(error, raised, match):
    host = Host()
    feed = LatentFeed(asyncio.get_running_loop(), 2, pull=host.pull)
    host.push(0)
    await feed.first_block_shape()
    host.blocks.put_nowait(error)
    await until(lambda: feed.feed_state().stopped)
    loop = asyncio.get_running_loop()
    with pytest.raises(raised, match=match):
        await loop.run_in_executor(None, feed.decode, LinearDecoder(), lambda chunk: None)
