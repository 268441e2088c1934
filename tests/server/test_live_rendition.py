"""The live rendition over real HTTP: a job with a preview streams `variant=live`, each
chunk the final's fragment when it is there by its deadline, the preview's otherwise.

The final is the real `tiny` decoder held to a pace (`benchmarks.paced`): 1.5x slower
than real time, a viewer of the live rendition from its first fragment never waits,
sees some of the final's chunks, and each live chunk decodes to exactly the frames of
the rendition its record names; a viewer of the final alone stalls.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
import pytest

from benchmarks.paced import PacedDecoder
from tests.helpers import FailingDecoder, decode_mp4, smooth_latents, split_stream
from tests.helpers.server import Server, StartServer
from tests.server.test_preview import content, ended, upload
from vaecast.codecs.fmp4_reader import iter_boxes
from vaecast.models.linear import LinearDecoder
from vaecast.models.tiny import TinyDecoder

FPS = 16
LATENTS = smooth_latents(frames=11, height=6, width=8)  # 41 frames of 64x48: 2.56 s
# A fragment counts as a stall only if it came later than the viewer needed it by more
# than this: a frame at 25 fps (the splice itself keeps a 0.1 s margin).
STALL_TOLERANCE_S = 0.04


def paced_server_decoders(pace: float | None) -> dict[str, Any]:
    tiny = TinyDecoder() if pace is None else PacedDecoder(TinyDecoder(), pace, FPS)
    return {"tiny": tiny, "linear": LinearDecoder()}


async def watch(server: Server, job_id: str, variant: str) -> tuple[bytes, list[float]]:
    """A viewer of `variant` from the job's start: the bytes, and when each fragment
    had fully arrived (this clock)."""
    body, arrivals = b"", []
    params = {"variant": variant}
    async with server.client.get(f"/v1/videos/{job_id}/content", params=params) as response:
        assert response.status == 200, await response.text()
        async for data in response.content.iter_any():
            body += data
            complete = _complete_fragments(body)
            arrivals += [time.perf_counter()] * (complete - len(arrivals))
    return body, arrivals


def _complete_fragments(data: bytes) -> int:
    """How many whole moof+mdat pairs `data` holds (a prefix of a stream)."""
    sizes = [box.type for box in iter_boxes(_whole_boxes(data))]
    return sizes.count("mdat")


def _whole_boxes(data: bytes) -> bytes:
    offset = 0
    while offset + 8 <= len(data):
        size = int.from_bytes(data[offset : offset + 4], "big")
        if size < 8 or offset + size > len(data):
            break
        offset += size
    return data[:offset]


# Each chunk's frames: 1, then 4 a chunk.
CHUNK_FRAMES = [1] + [4] * 10


def stalls(arrivals: list[float]) -> tuple[int, float]:
    """(stalls, seconds stalled) of a viewer who starts at the first fragment's
    arrival and plays in real time, waiting (and shifting) where one is late."""
    durations = [frames / FPS for frames in CHUNK_FRAMES]
    start, played, shift, count, stalled = arrivals[0], 0.0, 0.0, 0, 0.0
    for arrived, duration in zip(arrivals, durations, strict=True):
        late = arrived - (start + shift + played)
        if late > STALL_TOLERANCE_S:
            count += 1
            stalled += late
            shift += late
        played += duration
    return count, stalled


def _source_mark(fragment: bytes) -> tuple[tuple[int, str], bytes]:
    """A live fragment's emsg, read as a player would: (its id, the ID3 TXXX frame's
    value), and the fragment after it."""
    (emsg, *_) = iter_boxes(fragment)
    assert emsg.type == "emsg"
    body = fragment[emsg.payload_offset : emsg.end]
    event_id = int.from_bytes(body[20:24], "big")
    scheme, value, tag = body[24:].split(b"\x00", 2)
    assert (scheme, value) == (b"https://aomedia.org/emsg/ID3", b"")
    assert tag[:3] == b"ID3" and tag[10:14] == b"TXXX"
    description, source = tag[21:].split(b"\x00")
    assert description == b"vaecast_source"
    return (event_id, source.decode()), fragment[emsg.end :]


@pytest.fixture
def server_decoders() -> Any:
    made: list[Any] = []

    def make(pace: float | None) -> dict[str, Any]:
        decoders = paced_server_decoders(pace)
        made.extend(decoders.values())
        return decoders

    yield make
    for decoder in made:
        if isinstance(decoder, PacedDecoder):
            decoder.release()


async def test_a_final_slower_than_real_time_live_never_stalls_and_carries_some_final(
    start_server: StartServer, server_decoders: Any
):
    server = await start_server(decoders=server_decoders(1.5), default_model="tiny")
    job = await upload(server, LATENTS, preview="linear", fps=str(FPS))
    assert job["urls"]["live_content"] == f"/v1/videos/{job['id']}/content?variant=live"
    (live, live_at), (final, final_at) = await asyncio.gather(
        watch(server, job["id"], "live"), watch(server, job["id"], "final")
    )
    done = await ended(server, job["id"])
    record = done["variants"]["live"]
    sources = record["sources"]
    _, live_fragments = split_stream(live)
    _, final_fragments = split_stream(final)
    assert len(sources) == len(live_fragments) == len(final_fragments) == 11
    assert stalls(live_at) == (0, 0.0)
    assert "final" in sources and "preview" in sources  # some of the final's, in time
    assert record["final_share"] == pytest.approx(sources.count("final") / 11, abs=1e-4)
    assert 0 < record["start_delay_s"] <= 1.0 + 0.5  # the tunable, and the loop's lag
    count, stalled = stalls(final_at)
    assert count > 0 and stalled > 0.3  # the final alone stalls
    # Chunk by chunk, the live rendition is its source's fragment, and decodes so.
    preview = await content(server, job["id"], "preview")
    renditions = {"final": final, "preview": preview}
    fragments = {name: split_stream(data)[1] for name, data in renditions.items()}
    frames = {name: decode_mp4(data) for name, data in renditions.items()}
    live_frames = decode_mp4(live)
    assert len(live_frames) == 41
    start = 0
    for index, source in enumerate(sources):
        # Its source's very bytes, after the emsg that names that source.
        mark, copied = _source_mark(live_fragments[index])
        assert copied == fragments[source][index]
        assert mark == (index, source)
        for offset in range(start, start + CHUNK_FRAMES[index]):
            assert np.array_equal(live_frames[offset], frames[source][offset]), (index, source)
        start += CHUNK_FRAMES[index]
    metrics = await (await server.client.get("/metrics")).text()
    for source in ("final", "preview"):
        line = f'vaecast_live_chunks_total{{source="{source}"}} {sources.count(source)}.0'
        assert line in metrics, metrics
    # The finished file is those fragments, its init segment stating their duration.
    assert split_stream(await content(server, job["id"], "live"))[1] == live_fragments


async def test_a_final_ahead_of_real_time_is_all_the_live_rendition_carries(
    start_server: StartServer, server_decoders: Any
):
    server = await start_server(decoders=server_decoders(None), default_model="tiny")
    job = await upload(server, LATENTS, preview="linear", fps=str(FPS))
    done = await ended(server, job["id"])
    live = done["variants"]["live"]
    assert live["status"] == "completed"
    assert live["sources"] == ["final"] * 11 and live["final_share"] == 1.0
    live_init, live = split_stream(await content(server, job["id"], "live"))
    final_init, final = split_stream(await content(server, job["id"], "final"))
    assert live_init == final_init  # both state the same duration once finished
    assert [_source_mark(f)[1] for f in live] == final
    assert done["plays"] == ["live", "preview", "final"]


async def test_a_final_that_fails_leaves_a_whole_live_rendition_of_the_preview(
    start_server: StartServer,
):
    """The full decode fails at its third chunk: the live rendition takes the preview's
    chunks from there on, at once (nothing better is coming), and ends whole."""
    decoders = {"gated": FailingDecoder(fail_at=2), "linear": LinearDecoder()}
    server = await start_server(decoders=decoders, default_model="gated")
    latents = smooth_latents(frames=6, height=6, width=8)  # linear: 21 frames, 6 chunks
    job = await upload(server, latents, preview="linear", fps=str(FPS))
    done = await ended(server, job["id"])
    assert done["status"] == "failed"
    live = done["variants"]["live"]
    assert live["status"] == "completed" and len(live["sources"]) == 6
    assert live["sources"][2:] == ["preview"] * 4
    assert "live" in done["plays"]
    assert len(decode_mp4(await content(server, job["id"], "live"))) == 21


async def test_a_job_without_a_preview_has_no_live_rendition(start_server: StartServer):
    server = await start_server()
    job = await upload(server, smooth_latents(frames=2, height=6, width=8))
    assert "live_content" not in job["urls"]
    await ended(server, job["id"])
    for path in ("content?variant=live", "live/playlist.m3u8"):
        async with server.client.get(f"/v1/videos/{job['id']}/{path}") as response:
            assert response.status == 404
            assert "has no live rendition" in (await response.json())["error"]["message"]


async def test_the_live_rendition_is_not_stopped_on_its_own(
    start_server: StartServer, server_decoders: Any
):
    server = await start_server(decoders=server_decoders(3.0), default_model="tiny")
    job = await upload(server, LATENTS, preview="linear", fps=str(FPS))
    params = {"variant": "live"}
    async with server.client.delete(f"/v1/videos/{job['id']}", params=params) as response:
        assert response.status == 422
        assert "DELETE ?variant=final" in (await response.json())["error"]["message"]
    async with server.client.delete(f"/v1/videos/{job['id']}") as response:
        assert response.status == 200
    done = await ended(server, job["id"])
    assert done["status"] == "cancelled" and done["variants"]["live"]["status"] == "cancelled"
