"""The decode thread takes a feed's blocks from a thread-safe queue: a block already
queued reaches the decoder while the event loop is busy, and what it frees (room for
a held-back put) reaches the loop afterwards. The bound and a cancel still hold."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from tests.helpers import smooth_latents
from vaecast.errors import DecodeCancelled
from vaecast.pipeline.latent_feed import LatentFeed

BLOCK = smooth_latents(frames=4)[:, :, :1]


class Taker:
    """A decoder's `decode_stream` as the feed drives it: takes each block, noting
    whether the loop was busy when it did."""

    def __init__(self, loop_busy: threading.Event) -> None:
        self.loop_busy = loop_busy
        self.taken_while_busy: list[bool] = []

    def decode_stream(self, blocks, on_chunk) -> None:
        for _ in blocks:
            self.taken_while_busy.append(self.loop_busy.is_set())


async def test_a_queued_block_reaches_the_decoder_while_the_loop_is_busy() -> None:
    loop = asyncio.get_running_loop()
    feed = LatentFeed(loop, max_blocks=4)
    for _ in range(3):
        await feed.put(BLOCK)
    busy = threading.Event()
    taker = Taker(busy)
    # From here until the first await the loop is held (as by a handler that blocks it,
    # or a long garbage collection): the three blocks already queued reach the decoder
    # anyway, with no trip through the loop.
    busy.set()
    decode = loop.run_in_executor(None, lambda: feed.decode(taker, lambda chunk: None))
    deadline = time.monotonic() + 30
    while len(taker.taken_while_busy) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)  # noqa: ASYNC251 - holding the loop is the point
    busy.clear()
    assert taker.taken_while_busy == [True, True, True]
    await feed.end()
    await asyncio.wait_for(decode, 30)
    assert feed.held_bytes == 0


async def test_the_bound_holds_a_put_until_the_thread_takes_a_block() -> None:
    loop = asyncio.get_running_loop()
    feed = LatentFeed(loop, max_blocks=1)
    await feed.put(BLOCK)
    held = asyncio.create_task(feed.put(BLOCK))
    await asyncio.sleep(0.05)
    assert not held.done() and feed.feed_state().held_back
    taken = threading.Event()

    class OneTaker:
        def decode_stream(self, blocks, on_chunk) -> None:
            iterator = iter(blocks)
            next(iterator)
            taken.set()
            for _ in iterator:
                pass

    decode = loop.run_in_executor(None, lambda: feed.decode(OneTaker(), lambda chunk: None))
    await asyncio.wait_for(held, 30)  # the take made room, and the loop heard of it
    # (The thread tells the loop as it takes the block, before its decoder sees it.)
    assert await asyncio.to_thread(taken.wait, 30)
    await feed.end()
    await asyncio.wait_for(decode, 30)


async def test_a_cancel_stops_a_thread_waiting_for_a_block() -> None:
    loop = asyncio.get_running_loop()
    feed = LatentFeed(loop, max_blocks=2)

    class Waiter:
        def decode_stream(self, blocks, on_chunk) -> None:
            for _ in blocks:
                pass

    decode = loop.run_in_executor(None, lambda: feed.decode(Waiter(), lambda chunk: None))
    await asyncio.sleep(0.1)  # the thread waits for a first block
    feed.cancel()
    with pytest.raises(DecodeCancelled):
        await asyncio.wait_for(decode, 30)
