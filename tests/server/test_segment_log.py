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


@pytest.mark.parametrize("spill_threshold", [None, 0], ids=["init-in-ram", "init-in-file-only"])
async def test_the_init_segment_is_rewritten_in_place_in_ram_and_in_the_store_file(
    tmp_path: Path, spill_threshold: int | None
) -> None:
    path = tmp_path / "video.mp4"
    log = SegmentLog(spill_threshold, durable_path=path)
    for segment in SEGMENTS:
        await log.append(segment)
    memory_before = log.memory_bytes
    new_init = b"INIT" * 10
    rewriting = asyncio.ensure_future(log.rewrite_init(new_init))
    await asyncio.sleep(0)  # the rewrite's file write is under way in a thread
    # Every reader from the call on gets the new init from RAM, never a half-written file.
    assert await log.read_segment(0) == new_init
    await rewriting
    log.finish()
    whole = new_init + b"".join(SEGMENTS[1:])
    assert await log.read_all() == whole
    assert path.read_bytes() == whole  # every later segment at its offset
    assert [part async for part in log.read_range(40, 139)] == [SEGMENTS[1]]
    assert log.memory_bytes == memory_before + (len(new_init) if spill_threshold == 0 else 0)
    log.drop_memory()
    assert await log.read_all() == whole  # from the file alone


async def test_a_spilled_init_segment_is_rewritten_in_ram(tmp_path: Path) -> None:
    log = SegmentLog(spill_threshold_bytes=0, spill_dir=tmp_path)
    for segment in SEGMENTS:
        await log.append(segment)
    await log.rewrite_init(b"INIT" * 10)
    log.finish()
    assert await log.read_all() == b"INIT" * 10 + b"".join(SEGMENTS[1:])
    await log.release()


async def test_a_rewrite_keeps_the_length_and_comes_before_the_end() -> None:
    log = SegmentLog()
    await log.append(SEGMENTS[0])
    with pytest.raises(ValueError) as raised:
        await log.rewrite_init(b"short")
    assert str(raised.value) == "an init segment of 5 bytes for 40"
    log.finish()
    with pytest.raises(RuntimeError) as refused:
        await log.rewrite_init(b"INIT" * 10)
    assert str(refused.value) == "rewrite of a closed SegmentLog"
    assert await log.read_all() == SEGMENTS[0]
