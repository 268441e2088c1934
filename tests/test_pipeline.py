"""run_pipeline: the decode does not wait for the encoder to open, and however the open
ends (opened late, failed, cancelled), no thread or codec outlives the pipeline."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import sys
import threading
import time
from fractions import Fraction
from typing import Any, ClassVar

import pytest

from tests.helpers import GatedDecoder, decode_mp4, smooth_latents
from vaecast.codecs.stream import VideoStreamEncoder
from vaecast.errors import DecodeCancelled, DecodeFailedError
from vaecast.models.base import DecodedChunk
from vaecast.pipeline.run import Stages, VideoOutput, WholeLatents, Workers, run_pipeline
from vaecast.pipeline.thread_priority import lowered_nice

LATENTS = smooth_latents(frames=6)  # 6 chunks
WAIT_S = 10.0


class ListSink:
    def __init__(self) -> None:
        self.segments: list[bytes] = []

    async def append(self, segment: bytes) -> None:
        self.segments.append(segment)


class RecordedEncoder(VideoStreamEncoder):
    closed: ClassVar[list[RecordedEncoder]] = []

    def close(self) -> None:
        RecordedEncoder.closed.append(self)
        super().close()


async def _run(decoder: GatedDecoder, factory: Any, workers: Workers | None = None) -> ListSink:
    """The pipeline over LATENTS into a list, on `workers` (default: one slot's), whose
    pools are shut down after."""
    sink = ListSink()
    workers = workers or Workers.for_slots(1)
    try:
        await run_pipeline(
            WholeLatents(LATENTS),
            decoder,
            decoder.plan(LATENTS.shape),
            VideoOutput(Fraction(16)),
            sink,
            workers,
            stages=Stages(encoder_factory=factory),
        )
    finally:
        workers.shutdown()
    return sink


async def test_the_decode_runs_while_the_encoder_opens() -> None:
    decoder = GatedDecoder(hold_at=1)

    def open_after_the_first_chunk(*args: Any, **kwargs: Any) -> VideoStreamEncoder:
        # Chunk 0 is decoded and chunk 1 reached before the encoder exists.
        assert decoder.holding.wait(WAIT_S), "the decode waited for the encoder to open"
        decoder.gate.set()
        return VideoStreamEncoder(*args, **kwargs)

    late = await _run(decoder, open_after_the_first_chunk)
    at_once = await _run(GatedDecoder(), VideoStreamEncoder)
    # The same stream, byte for byte: the init segment first, one fragment per chunk.
    assert late.segments == at_once.segments
    assert len(late.segments) == 1 + decoder.plan(LATENTS.shape).chunks
    assert len(decode_mp4(b"".join(late.segments))) == decoder.plan(LATENTS.shape).frames


async def test_an_encoder_that_cannot_open_fails_the_pipeline_and_stops_the_decode() -> None:
    decoder = GatedDecoder()

    def no_encoder(*args: Any, **kwargs: Any) -> VideoStreamEncoder:
        raise RuntimeError("no x264 here (simulated)")

    with pytest.raises(RuntimeError, match=r"^no x264 here \(simulated\)$"):
        await _run(decoder, no_encoder)
    assert decoder.finished.is_set()  # returned before run_pipeline did
    assert isinstance(decoder.ended_with, DecodeCancelled) or decoder.ended_with is None


async def test_a_cancel_while_the_encoder_opens_still_closes_it() -> None:
    decoder = GatedDecoder()
    opening = threading.Event()
    release = threading.Event()
    RecordedEncoder.closed.clear()

    def slow_open(*args: Any, **kwargs: Any) -> VideoStreamEncoder:
        opening.set()
        assert release.wait(WAIT_S)
        return RecordedEncoder(*args, **kwargs)

    task = asyncio.create_task(_run(decoder, slow_open))
    assert await asyncio.to_thread(opening.wait, WAIT_S)
    task.cancel()
    await asyncio.sleep(0.05)
    assert not task.done()  # the pipeline waits for the open it started
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, WAIT_S)
    assert len(RecordedEncoder.closed) == 1
    assert decoder.finished.is_set()


class PlanBreakingDecoder(GatedDecoder):
    """The linear decoder, with one chunk made to disagree with its plan."""

    def __init__(self, breaking: str) -> None:
        super().__init__()
        self.breaking = breaking

    def decode_chunks(self, latents: Any, on_chunk: Any) -> None:
        def broken(chunk: DecodedChunk) -> None:
            if chunk.index == 2 and self.breaking == "start":
                chunk = dataclasses.replace(chunk, frame_start=chunk.frame_start + 1)
            elif chunk.index == 2 and self.breaking == "frames":
                chunk = dataclasses.replace(chunk, frames=chunk.frames[:, :, :-1])
            on_chunk(chunk)
            if chunk.is_final and self.breaking == "extra":
                on_chunk(dataclasses.replace(chunk, index=chunk.index + 1))

        super().decode_chunks(latents, broken)


@pytest.mark.parametrize(
    "breaking, planned",
    [
        ("start", r"got \(index, frame_start, frames, height, width\) = \(2, 6, 4, "),
        ("frames", r"= \(2, 5, 3, 48, 64\), planned \(2, 5, 4, 48, 64\)"),
        ("extra", r"at chunk 6: .*, planned None"),
    ],
)
async def test_a_decoder_that_breaks_its_plan_fails_the_pipeline(
    breaking: str, planned: str
) -> None:
    decoder = PlanBreakingDecoder(breaking)
    with pytest.raises(DecodeFailedError, match=f"the decoder broke its plan.*{planned}"):
        await _run(decoder, VideoStreamEncoder)


class ThreadRecordingEncoder(VideoStreamEncoder):
    """Records, per chunk, the thread that encoded it and that thread's nice value."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.threads: list[tuple[str, int | None]] = []
        self.encoded = threading.Semaphore(0)  # released after each chunk
        self.before_first: threading.Event | None = None  # chunk 0 waits for it, if set

    def encode_chunk(self, frames: Any) -> bytes:
        if self.before_first is not None and not self.threads:
            assert self.before_first.wait(WAIT_S)
        nice = os.getpriority(os.PRIO_PROCESS, 0) if sys.platform.startswith("linux") else None
        self.threads.append((threading.current_thread().name, nice))
        fragment = super().encode_chunk(frames)
        self.encoded.release()
        return fragment


class PacedDecoder(GatedDecoder):
    """Publishes each chunk after the one before it was encoded: the encoder keeps up."""

    def __init__(self, encoded: threading.Semaphore) -> None:
        super().__init__()
        self.encoded = encoded

    def _gated(self, on_chunk: Any) -> Any:
        gated = super()._gated(on_chunk)

        def paced(chunk: Any) -> None:
            if chunk.index > 0:
                assert self.encoded.acquire(timeout=WAIT_S)
            gated(chunk)

        return paced


async def _run_on(
    workers: Workers,
    decoder: GatedDecoder | None = None,
    before_first: threading.Event | None = None,
) -> tuple[ListSink, ThreadRecordingEncoder]:
    """The pipeline with a ThreadRecordingEncoder. The default decoder publishes no
    chunk before the previous one was encoded (so none waits when the loop takes one)."""
    encoded = threading.Semaphore(0)
    opened: list[ThreadRecordingEncoder] = []

    def recording(*args: Any, **kwargs: Any) -> ThreadRecordingEncoder:
        opened.append(ThreadRecordingEncoder(*args, **kwargs))
        opened[-1].encoded = encoded
        opened[-1].before_first = before_first
        return opened[-1]

    sink = await _run(decoder or PacedDecoder(encoded), recording, workers)
    return sink, opened[0]


async def test_one_slot_encodes_the_first_chunk_at_normal_priority_and_the_rest_lower() -> None:
    sink, encoder = await _run_on(Workers.for_slots(1))
    names = [name for name, _ in encoder.threads]
    assert len(names) == GatedDecoder().plan(LATENTS.shape).chunks
    assert names[0].startswith("vaecast-encode_")
    # The last chunk may find the decode's end already queued behind it: nothing left
    # to yield to, so it may go either way.
    assert all(name.startswith("vaecast-encode-low_") for name in names[1:-1])
    if sys.platform.startswith("linux"):
        ours = os.getpriority(os.PRIO_PROCESS, 0)
        assert encoder.threads[0][1] == ours
        assert {nice for _, nice in encoder.threads[1:-1]} == {lowered_nice(ours)}
    # Where a chunk is encoded changes nothing in the stream.
    several, _ = await _run_on(Workers.for_slots(2))
    assert sink.segments == several.segments


async def test_a_chunk_taken_with_another_waiting_is_encoded_at_normal_priority() -> None:
    # The encoder fell behind (here: the first encode waits until chunks 1 and 2 are
    # queued). A lowered thread would stay behind for as long as other work holds the
    # cores (it gets a tenth of a share), so a chunk taken with another waiting behind
    # it goes to the normal-priority thread.
    decoder, decoder_ahead = GatedDecoder(), threading.Event()
    task = asyncio.create_task(
        _run_on(Workers.for_slots(1), decoder=decoder, before_first=decoder_ahead)
    )
    await asyncio.to_thread(_until, lambda: decoder.published >= 3)  # 0 taken, 1 and 2 queued
    decoder_ahead.set()
    _, encoder = await task
    names = [name for name, _ in encoder.threads]
    assert names[0].startswith("vaecast-encode_")
    assert names[1].startswith("vaecast-encode_"), names  # chunk 2 was waiting behind it
    if sys.platform.startswith("linux"):
        assert encoder.threads[1][1] == os.getpriority(os.PRIO_PROCESS, 0)


def _until(condition: Any) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.005)


async def test_several_slots_encode_every_chunk_at_normal_priority() -> None:
    # Another video's decode would hold a lowered encoder to a fraction of its share.
    workers = Workers.for_slots(2)
    assert workers.encode_rest is None and workers.after_first() is workers.encode
    _, encoder = await _run_on(workers)
    assert all(name.startswith("vaecast-encode_") for name, _ in encoder.threads)
    if sys.platform.startswith("linux"):
        assert {nice for _, nice in encoder.threads} == {os.getpriority(os.PRIO_PROCESS, 0)}
