"""GET /v1/videos/{id}/events, the feed behind the preview page's progress bars.

Plain aiohttp clients, no browser: the events a page would receive, in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from tests.helpers.browser import Server, until_set

pytestmark = pytest.mark.asyncio(loop_scope="module")

DEMO = {"scene": "shapes", "frames": 33, "width": 128, "height": 96, "fps": 16}
CHUNKS = 9
CHUNK_FRAMES = [1] + [4] * (CHUNKS - 1)
STREAM_TIMEOUT_S = 30.0


async def sse(response: aiohttp.ClientResponse) -> AsyncIterator[dict[str, Any]]:
    """Each event of a text/event-stream body: {"event", "id", "data" (parsed JSON)}."""
    fields: dict[str, str] = {}
    async for raw in response.content:
        line = raw.decode().rstrip("\r\n")
        if line.startswith(":"):  # a comment: the keep-alive
            continue
        if line:
            name, _, value = line.partition(":")
            fields[name] = value.removeprefix(" ")
            continue
        if "data" in fields:  # a block with only `retry:` is no event
            yield {
                "event": fields["event"],
                "id": int(fields["id"]),
                "data": json.loads(fields["data"]),
            }
        fields = {}


@contextlib.asynccontextmanager
async def subscribe(server: Server, job_id: str) -> AsyncIterator[AsyncIterator[dict[str, Any]]]:
    async with server.client.get(f"/v1/videos/{job_id}/events") as response:
        assert response.status == 200
        assert response.content_type == "text/event-stream"
        yield sse(response)


async def first(events: AsyncIterator[dict[str, Any]]) -> dict[str, Any]:
    """The next event. Once a subscriber has its `state`, it will get every later event."""
    return await asyncio.wait_for(anext(events), STREAM_TIMEOUT_S)


async def rest(events: AsyncIterator[dict[str, Any]]) -> list[dict[str, Any]]:
    """The remaining events, until the server ends the stream."""

    async def read() -> list[dict[str, Any]]:
        return [event async for event in events]

    return await asyncio.wait_for(read(), STREAM_TIMEOUT_S)


async def test_chunk_events_arrive_in_order_and_done_once(server: Server) -> None:
    server.decoder.hold(0)  # the job starts, then waits before its first chunk
    job = await server.create_demo(**DEMO)
    await until_set(server.decoder.holding)
    async with subscribe(server, job["id"]) as stream:
        events = [await first(stream)]
        server.decoder.release()
        events += await rest(stream)

    assert [e["event"] for e in events] == ["state"] + ["chunk"] * CHUNKS + ["done"]
    state, chunks, done = events[0]["data"], [e["data"] for e in events[1:-1]], events[-1]["data"]
    assert (state["status"], state["chunks"]) == ("in_progress", {"done": 0, "total": CHUNKS})
    assert [e["id"] for e in events[1:]] == list(
        range(events[1]["id"], events[1]["id"] + CHUNKS + 1)
    )
    assert [c["index"] for c in chunks] == list(range(CHUNKS))
    assert {c["total"] for c in chunks} == {CHUNKS}
    assert [c["frames"] for c in chunks] == CHUNK_FRAMES
    starts = [sum(CHUNK_FRAMES[:i]) for i in range(CHUNKS)]
    assert [c["frame_start"] for c in chunks] == starts
    assert [c["frames_done"] for c in chunks] == [
        s + f for s, f in zip(starts, CHUNK_FRAMES, strict=True)
    ]
    totals = [c["total_bytes"] for c in chunks]
    assert totals == sorted(totals) and len(set(totals)) == CHUNKS
    assert all(c["bytes"] > 0 for c in chunks)
    assert chunks[-1]["progress"] == 100
    assert done["job"]["status"] == "completed"
    assert done["job"]["chunks"] == {"done": CHUNKS, "total": CHUNKS}
    assert done["job"]["bytes"] == totals[-1] == server.job(job["id"]).log.size

    # A reconnect after the end (EventSource sends Last-Event-ID) is told to stop.
    async with server.client.get(
        f"/v1/videos/{job['id']}/events", headers={"Last-Event-ID": str(events[-1]["id"])}
    ) as response:
        assert response.status == 204


async def test_a_late_subscriber_gets_the_state_so_far_first(server: Server) -> None:
    held_at = 3
    server.decoder.hold(held_at)
    job = await server.create_demo(**DEMO)
    await until_set(server.decoder.holding)
    # The decoder holds chunk 3 once chunk 2 is handed over; wait for its fragment too.
    await asyncio.wait_for(_chunks_done(server, job["id"], held_at), STREAM_TIMEOUT_S)
    async with subscribe(server, job["id"]) as stream:
        events = [await first(stream)]
        server.decoder.release()
        events += await rest(stream)

    state = events[0]
    assert state["event"] == "state"
    assert state["data"]["status"] == "in_progress"
    assert state["data"]["chunks"] == {"done": held_at, "total": CHUNKS}
    assert state["data"]["frames_done"] == sum(CHUNK_FRAMES[:held_at])
    assert [e["event"] for e in events[1:]] == ["chunk"] * (CHUNKS - held_at) + ["done"]
    assert [e["data"]["index"] for e in events[1:-1]] == list(range(held_at, CHUNKS))

    # After the end, a new subscriber gets the final state, and the stream ends.
    async with subscribe(server, job["id"]) as stream:
        after = await rest(stream)
    assert [e["event"] for e in after] == ["state"]
    assert after[0]["data"]["status"] == "completed"


async def _chunks_done(server: Server, job_id: str, count: int) -> None:
    job = server.job(job_id)
    while job.record.chunks_done < count:  # noqa: ASYNC110 - the job offers nothing to wait on
        await asyncio.sleep(0.005)
