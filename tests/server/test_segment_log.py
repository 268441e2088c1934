"""SegmentLog on its own: followers at their own pace, memory and spilled segments alike."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from vaecast.errors import DecodeFailedError, GoneError
from vaecast.server.stream.segment_log import SegmentLog

SEGMENTS = [b"init" * 10, b"a" * 100, b"b" * 300, b"c" * 50]


async def collect(log: SegmentLog, start: int = 0) -> list[bytes]:
    return [part async for part in log.follow(start)]


async def test_followers_get_every_segment_live_and_late() -> None:
    log = SegmentLog()
    early = asyncio.create_task(collect(log))
    for segment in SEGMENTS[:2]:
        await log.append(segment)
    await asyncio.sleep(0)
    late = asyncio.create_task(collect(log, start=1))
    for segment in SEGMENTS[2:]:
        await log.append(segment)
    log.finish()
    assert await asyncio.wait_for(early, 5) == SEGMENTS
    assert await asyncio.wait_for(late, 5) == SEGMENTS[1:]


async def test_in_memory_segments_reach_every_follower_without_a_copy() -> None:
    """The hot path of a fan-out: a hundred viewers, each handed the log's own bytes."""
    log = SegmentLog()
    followers = [asyncio.create_task(collect(log)) for _ in range(100)]
    for segment in SEGMENTS:
        await log.append(segment)
    log.finish()
    for got in await asyncio.wait_for(asyncio.gather(*followers), 5):
        assert got == SEGMENTS
        assert all(a is b for a, b in zip(got, SEGMENTS, strict=True))


async def test_spilled_segments_are_read_back(tmp_path: Path) -> None:
    log = SegmentLog(spill_threshold_bytes=150, spill_dir=tmp_path)
    for segment in SEGMENTS:
        await log.append(segment)
    log.finish()
    assert log.spill_path is not None and log.memory_bytes <= 150
    assert await collect(log) == SEGMENTS
    assert await log.read_all() == b"".join(SEGMENTS)
    await log.release()
    assert not list(tmp_path.iterdir())


async def test_a_broken_log_ends_followers_with_its_error_after_the_last_segment() -> None:
    log = SegmentLog()
    await log.append(SEGMENTS[0])
    follower = asyncio.create_task(collect(log))
    await asyncio.sleep(0)
    log.abort(DecodeFailedError("the decoder failed: boom"))
    with pytest.raises(DecodeFailedError, match="boom"):
        await asyncio.wait_for(follower, 5)


async def test_a_released_log_cuts_its_followers() -> None:
    log = SegmentLog()
    await log.append(SEGMENTS[0])
    follower = asyncio.create_task(collect(log, start=1))
    await asyncio.sleep(0)
    await log.release()
    with pytest.raises(GoneError):
        await asyncio.wait_for(follower, 5)
