"""The thread -> loop bridge: backpressure, cancel, and a loop that goes away."""

from __future__ import annotations

import asyncio
import threading

import pytest

from tests.helpers import FailingDecoder, GatedDecoder, smooth_latents, until
from vaecast.codecs.colour import Yuv420Frames
from vaecast.codecs.quantize import quantize_yuv420_to_host
from vaecast.errors import DecodeCancelled
from vaecast.models.base import ChunkCallback, DecodedChunk
from vaecast.pipeline.bridge import ChunkBridge, DecodeEnded, DecodeRaised, HostChunk

LATENTS = smooth_latents(frames=12)  # 12 chunks


def start_decode(
    bridge: ChunkBridge, decoder: GatedDecoder, entering: dict[int, threading.Event] | None = None
) -> tuple[threading.Thread, list]:
    """Run the decode on a thread; `entering[i]` is set when chunk i reaches the bridge."""
    outcome: list[BaseException | None] = []
    entering = entering or {}

    def announced(on_chunk: ChunkCallback) -> ChunkCallback:
        def on_chunk_announced(chunk: DecodedChunk) -> None:
            if chunk.index in entering:
                entering[chunk.index].set()
            on_chunk(chunk)

        return on_chunk_announced

    def work() -> None:
        try:
            bridge.run(lambda on_chunk: decoder.decode_chunks(LATENTS, announced(on_chunk)))
            outcome.append(None)
        except BaseException as error:
            outcome.append(error)

    thread = threading.Thread(target=work, name="test-decode")
    thread.start()
    return thread, outcome


async def test_a_consumer_that_does_not_take_chunks_holds_the_decoder_back():
    decoder = GatedDecoder()
    bridge = ChunkBridge(asyncio.get_running_loop(), decoder.value_range, max_chunks=2)
    third = threading.Event()
    thread, outcome = start_decode(bridge, decoder, {2: third})
    assert await asyncio.to_thread(third.wait, 10)
    # The third chunk is in the bridge's hands and the queue holds two: nothing takes
    # from it, so its put cannot complete, however long we look.
    assert decoder.published == 2
    assert thread.is_alive()
    items = []
    while not isinstance(item := await bridge.get(), DecodeEnded):
        items.append(item)
    await asyncio.to_thread(thread.join, 10)
    assert outcome == [None]
    assert [item.index for item in items] == list(range(12))
    assert all(isinstance(item, HostChunk) for item in items)
    assert items[1].pixels.shape == (4, 48, 64, 3)


async def test_cancel_releases_a_decoder_blocked_on_a_full_queue():
    decoder = GatedDecoder()
    bridge = ChunkBridge(asyncio.get_running_loop(), decoder.value_range, max_chunks=1)
    thread, outcome = start_decode(bridge, decoder)
    await until(lambda: decoder.published == 1)
    bridge.cancel()
    await asyncio.to_thread(thread.join, 10)
    assert not thread.is_alive()
    assert isinstance(outcome[0], DecodeCancelled)
    assert decoder.published == 1


async def test_a_decoder_error_reaches_the_consumer():
    decoder = FailingDecoder(fail_at=2)
    bridge = ChunkBridge(asyncio.get_running_loop(), decoder.value_range, max_chunks=4)
    thread, outcome = start_decode(bridge, decoder)
    items = [await bridge.get() for _ in range(3)]
    await asyncio.to_thread(thread.join, 10)
    assert outcome == [None]  # handed to the consumer, not raised in the worker
    assert [type(item).__name__ for item in items] == ["HostChunk", "HostChunk", "DecodeRaised"]
    assert isinstance(items[2], DecodeRaised)
    assert str(items[2].error) == "out of memory (simulated)"


@pytest.mark.parametrize("how", ["stopped", "closed"])
def test_a_loop_that_goes_away_never_strands_the_worker(how: str):
    loop = asyncio.new_event_loop()
    loop_thread = threading.Thread(target=loop.run_forever, name="test-loop")
    loop_thread.start()
    decoder = GatedDecoder()
    bridge = ChunkBridge(loop, decoder.value_range, max_chunks=1)
    second = threading.Event()
    thread, outcome = start_decode(bridge, decoder, {1: second})
    try:
        assert second.wait(10), "the decoder never reached its second chunk"
        loop.call_soon_threadsafe(loop.stop)
        loop_thread.join(10)
        if how == "closed":
            loop.close()
        thread.join(10)
        assert not thread.is_alive()
        assert isinstance(outcome[0], DecodeCancelled)
    finally:
        if not loop.is_closed():
            loop.close()


async def test_a_cpu_decode_hands_over_frames_with_no_copy_pending():
    """The fallback of the GPU path: on a CPU the default host conversion is the plain
    synchronous copy, so every chunk the consumer gets is ready to read."""
    decoder = GatedDecoder()
    bridge = ChunkBridge(asyncio.get_running_loop(), decoder.value_range, max_chunks=2)
    thread, outcome = start_decode(bridge, decoder)
    items = []
    while not isinstance(item := await bridge.get(), DecodeEnded):
        items.append(item)
    await asyncio.to_thread(thread.join, 10)
    assert outcome == [None] and len(items) == 12
    assert not any(item.pixels.pending for item in items)


async def test_the_decode_thread_does_not_wait_for_a_copy_in_flight():
    """A GPU copy is waited for by whoever reads the planes (the encode thread), not
    by the decoder: played here with copies that land only when the test lets them."""
    landed = threading.Event()

    def wait_for_copy() -> None:
        assert landed.wait(10), "the test never let the copies land"

    def pending_to_host(frames, value_range):
        ready = quantize_yuv420_to_host(frames, value_range)
        return Yuv420Frames(ready.planes, ready.height, ready.width, wait_for_copy)

    decoder = GatedDecoder()
    bridge = ChunkBridge(
        asyncio.get_running_loop(), decoder.value_range, max_chunks=12, to_host=pending_to_host
    )
    thread, outcome = start_decode(bridge, decoder)
    # All 12 chunks and the end marker go through while no copy has landed.
    items = [await asyncio.wait_for(bridge.get(), 10) for _ in range(13)]
    await asyncio.to_thread(thread.join, 10)
    assert outcome == [None] and isinstance(items[-1], DecodeEnded)
    assert all(item.pixels.pending for item in items[:-1])
    landed.set()
    assert items[1].pixels.planes.shape == (4, 72, 64)
    assert not items[1].pixels.pending
