"""Range requests on a job that is still decoding (issue 14), over real HTTP.

A gated decoder holds the decode at a chunk, so "while it runs" is a fact, not a race:
whatever arrives before the gate opens was answered from the bytes committed so far.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable

import aiohttp
import pytest

from tests.helpers import FailingDecoder, GatedDecoder, safetensors_bytes, smooth_latents, until
from tests.helpers.mp4_duration import as_streamed
from tests.helpers.server import Server, StartServer
from vaecast.server.stream.job import Job

HELD_CHUNK = 2  # the init segment and chunks 0 and 1 are committed while it is held
CHUNKS = 6
# How long a request that must wait is watched for an early answer: a wrong one comes
# within milliseconds on loopback; a right one never comes before the gate opens.
NO_ANSWER_WINDOW_S = 0.3


async def held_job(server: Server, decoder: GatedDecoder) -> tuple[Job, str, int]:
    """A job held at HELD_CHUNK: (the job, its content URL, the bytes committed)."""
    body = safetensors_bytes(latents=smooth_latents(frames=CHUNKS))
    async with server.client.post("/v1/videos", data=body) as response:
        created = await response.json()
    job = server.manager.get(created["id"])
    await asyncio.to_thread(decoder.holding.wait, 30)
    # The held chunk is never published, so the log stops at these segments.
    await until(lambda: len(job.log) == 1 + HELD_CHUNK)
    return job, created["urls"]["content"], job.log.size


async def whole_file(server: Server, job: Job, url: str) -> bytes:
    await asyncio.wait_for(job.wait(), 30)
    async with server.client.get(url) as response:
        assert response.status == 200
        return await response.read()


async def no_answer_yet(request: Awaitable[aiohttp.ClientResponse]) -> asyncio.Task:
    """Send `request` and check that no answer comes while the decode is held."""
    task = asyncio.ensure_future(request)
    done, _ = await asyncio.wait({task}, timeout=NO_ANSWER_WINDOW_S)
    assert not done, "answered before the bytes it asks for existed"
    return task


async def test_a_committed_range_is_answered_while_the_decode_is_held(
    start_server: StartServer,
):
    decoder = GatedDecoder(hold_at=HELD_CHUNK)
    server = await start_server(decoders={"linear": decoder})
    job, url, committed = await held_job(server, decoder)
    ranges = [(5, 104), (100, committed - 1), (committed // 2, None)]
    answers = []
    for first, last in ranges:
        header = f"bytes={first}-{'' if last is None else last}"
        async with server.client.get(url, headers={"Range": header}) as response:
            assert response.status == 206, header
            last = committed - 1 if last is None else last  # open: to the current end
            assert response.headers["Content-Range"] == f"bytes {first}-{last}/*"
            assert response.headers["Content-Length"] == str(last - first + 1)
            assert response.headers["Content-Type"] == job.record.content_type
            assert "ETag" not in response.headers  # the representation is not final
            answers.append((first, last, await response.read()))
    async with server.client.head(url, headers={"Range": "bytes=5-104"}) as response:
        assert (response.status, response.headers["Content-Length"]) == (206, "100")
        assert await response.read() == b""
    # A Range that is ignored gets the growing stream, at once, as no Range does.
    async with server.client.get(url, headers={"Range": "bytes=0-1,5-6"}) as response:
        assert response.status == 200
        assert response.headers["Transfer-Encoding"] == "chunked"
    assert not job.record.is_final and not decoder.gate.is_set()
    decoder.gate.set()
    data = await whole_file(server, job, url)
    live = as_streamed(data)  # the init segment as it was then: no duration stated yet
    for first, last, body in answers:
        assert body == live[first : last + 1]


async def test_open_ranges_follow_the_growth_to_the_end(start_server: StartServer):
    """`bytes=N-` gets N to the current end; asking again from there follows the video."""
    decoder = GatedDecoder(hold_at=HELD_CHUNK)
    server = await start_server(decoders={"linear": decoder})
    job, url, committed = await held_job(server, decoder)
    start = position = committed // 2
    received = b""
    content_ranges = []
    while True:
        request = server.client.get(url, headers={"Range": f"bytes={position}-"})
        if position == committed and not decoder.gate.is_set():
            # At the current end: the next bytes do not exist until the gate opens.
            pending = await no_answer_yet(request)
            decoder.gate.set()
            response = await pending
        else:
            response = await request
        async with response:
            if response.status == 416:  # asked from the very end of the finished video
                assert response.headers["Content-Range"] == f"bytes */{position}"
                break
            assert response.status == 206
            content_range = response.headers["Content-Range"]
            body = await response.read()
        assert content_range.startswith(f"bytes {position}-{position + len(body) - 1}/")
        content_ranges.append(content_range)
        received += body
        position += len(body)
        if not content_range.endswith("/*"):  # the job completed: the last answer
            assert content_range.endswith(f"/{position}")
            break
    assert content_ranges[0] == f"bytes {start}-{committed - 1}/*"
    data = await whole_file(server, job, url)
    assert received == data[start:]
    assert position == len(data)


async def test_ranges_past_the_committed_bytes_wait_for_them(start_server: StartServer):
    decoder = GatedDecoder(hold_at=HELD_CHUNK)
    server = await start_server(decoders={"linear": decoder})
    job, url, committed = await held_job(server, decoder)
    closed_last = committed + 50  # a little past what exists: the next fragment has it
    headers = {
        "closed": f"bytes=10-{closed_last}",
        "suffix": "bytes=-100",  # relative to an end that is not known yet
        "past the end": "bytes=1000000000-",  # the video will be far shorter
    }
    pending = {
        name: await no_answer_yet(server.client.get(url, headers={"Range": header}))
        for name, header in headers.items()
    }
    decoder.gate.set()
    answers = {}
    for name, task in pending.items():
        async with await task as response:
            answers[name] = (response.status, response.headers.get("Content-Range"))
            answers[name] += (await response.read(),)
    data = await whole_file(server, job, url)
    size = len(data)
    status, content_range, body = answers["closed"]
    assert status == 206
    # Answered once its last byte existed: as a running job's range (its init segment
    # as it streamed), or as the finished file's if the job completed first.
    assert content_range in {f"bytes 10-{closed_last}/*", f"bytes 10-{closed_last}/{size}"}
    expected = as_streamed(data) if content_range.endswith("/*") else data
    assert body == expected[10 : closed_last + 1]
    assert answers["suffix"] == (206, f"bytes {size - 100}-{size - 1}/{size}", data[-100:])
    status, content_range, body = answers["past the end"]
    assert (status, content_range) == (416, f"bytes */{size}")


# No end satisfies a zero-length suffix, and no video of this server reaches byte 10**24.
@pytest.mark.parametrize("header", ["bytes=-0", "bytes=" + "9" * 24 + "-"])
async def test_a_range_no_video_could_satisfy_gets_416_at_once_while_the_decode_is_held(
    start_server: StartServer, header: str
):
    decoder = GatedDecoder(hold_at=HELD_CHUNK)
    server = await start_server(decoders={"linear": decoder})
    job, url, _ = await held_job(server, decoder)
    async with asyncio.timeout(NO_ANSWER_WINDOW_S * 10):
        async with server.client.get(url, headers={"Range": header}) as response:
            assert response.status == 416
            assert (await response.json())["error"] == {
                "type": "range_not_satisfiable",
                "message": "the range selects no bytes",
            }
            assert "Content-Range" not in response.headers  # the complete length is unknown
    assert not job.record.is_final  # answered while it runs, not at its end
    decoder.gate.set()
    await asyncio.wait_for(job.wait(), 30)


@pytest.mark.parametrize("ending", ["failed", "cancelled", "cancelled, keeping nothing"])
async def test_waiting_ranges_of_a_job_that_breaks_get_its_end(
    start_server: StartServer, ending: str
):
    """A job that fails or is cancelled keeps its video so far: a waiting range is
    answered from that file, as from any finished one; one that keeps nothing, 409."""
    if ending == "failed":
        decoder: GatedDecoder = FailingDecoder(fail_at=HELD_CHUNK)
        decoder.hold_at = HELD_CHUNK  # held first, then it fails on that chunk
    else:
        decoder = GatedDecoder(hold_at=HELD_CHUNK)
    server = await start_server(decoders={"linear": decoder})
    job, url, committed = await held_job(server, decoder)
    pending = [
        await no_answer_yet(server.client.get(url, headers={"Range": header}))
        for header in [f"bytes=10-{committed + 50}", f"bytes={committed}-", "bytes=-100"]
    ]
    if ending == "failed":
        decoder.gate.set()
    else:  # DELETE answers once the decoder has stopped, at the held chunk
        keep = "false" if ending.endswith("nothing") else "true"
        deleting = asyncio.create_task(
            server.client.delete(f"/v1/videos/{job.id}", params={"keep": keep})
        )
        await until(lambda: job.error is not None)
        decoder.gate.set()
        async with await deleting as response:
            assert response.status == 200
    await asyncio.wait_for(job.wait(), 30)
    assert job.record.status == ending.split(",")[0]
    assert job.error is not None
    answers = []
    for task in pending:
        async with await task as response:
            answers.append((response.status, response.headers.get("Content-Range")))
            body = await response.read()
    if ending.endswith("nothing"):
        assert [status for status, _ in answers] == [409, 409, 409]
        assert json.loads(body)["error"] == {
            "type": "conflict",
            "message": f"video {job.id} has no content: cancelled: {job.error.message}",
        }
        return
    size = job.log.size
    assert size == committed  # the held chunk never came; the rest is kept as it was
    assert answers == [
        (206, f"bytes 10-{size - 1}/{size}"),
        (416, f"bytes */{size}"),
        (206, f"bytes {size - 100}-{size - 1}/{size}"),
    ]
