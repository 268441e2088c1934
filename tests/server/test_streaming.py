"""The streaming spine end to end: latents in over HTTP, progressive fMP4 out."""

from __future__ import annotations

import asyncio
import io

import numpy as np
import pytest

from tests.helpers import (
    GatedDecoder,
    decode_mp4,
    psnr,
    safetensors_bytes,
    smooth_latents,
    split_stream,
)
from tests.helpers.mp4_duration import as_streamed
from tests.helpers.server import StartServer
from vaecast.codecs.fmp4_reader import TopLevelBoxSplitter, parse_fragment, parse_init_segment
from vaecast.codecs.quantize import quantize_to_host
from vaecast.models.linear import LinearDecoder

# CRF 18 on smooth content: measured ~45 dB; the floor leaves room for x264 changes.
MIN_PSNR_DB = 38.0


def expected_frames(latents) -> np.ndarray:
    decoder = LinearDecoder()
    return quantize_to_host(decoder.decode(latents), decoder.value_range)


def check_stream(data: bytes, latents, fps_timescale_check: bool = True) -> None:
    """What a viewer would notice: frame count, size, pixels, and fragment structure."""
    plan = LinearDecoder().plan(latents.shape)
    init, fragments = split_stream(data)
    (track,) = parse_init_segment(init).tracks
    assert (track.width, track.height) == (plan.width, plan.height)
    assert len(fragments) == plan.chunks
    next_decode_time = 0
    for number, (fragment, frames) in enumerate(zip(fragments, plan.chunk_frames, strict=True), 1):
        parsed = parse_fragment(fragment)
        (run,) = parsed.runs
        assert parsed.sequence_number == number
        assert run.base_media_decode_time == next_decode_time
        assert len(run.sample_sizes) == frames
        next_decode_time += run.duration
    decoded = decode_mp4(data)
    assert len(decoded) == plan.frames
    assert decoded[0].shape == (plan.height, plan.width, 3)
    assert psnr(np.stack(decoded), expected_frames(latents)) > MIN_PSNR_DB


async def test_stream_endpoint_returns_a_playable_progressive_mp4(start_server: StartServer):
    server = await start_server()
    latents = smooth_latents(frames=5)
    async with server.client.post(
        "/v1/videos/stream?fps=24", data=safetensors_bytes(latents=latents)
    ) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith('video/mp4; codecs="avc1.')
        assert response.headers["Transfer-Encoding"] == "chunked"
        job_id = response.headers["X-Video-Id"]
        data = await response.read()
    check_stream(data, latents)
    async with server.client.get(f"/v1/videos/{job_id}") as response:
        job = await response.json()
    assert job["status"] == "completed"
    assert (job["frames"], job["fps"], job["chunks"]) == (17, 24.0, {"done": 5, "total": 5})
    assert job["bytes"] == len(data)
    assert job["timings"]["time_to_first_fragment_s"] <= job["timings"]["total_s"]


async def test_first_fragment_arrives_while_later_chunks_are_still_held(start_server: StartServer):
    """Deterministic progressive delivery: chunk k+1 is not even published until the
    client has received the init segment and the fragment of chunk k."""
    held_chunk = 3
    decoder = GatedDecoder(hold_at=held_chunk)
    server = await start_server(decoders={"linear": decoder})
    latents = smooth_latents(frames=6)
    async with server.client.post(
        "/v1/videos/stream", data=safetensors_bytes(latents=latents)
    ) as response:
        splitter = TopLevelBoxSplitter()
        boxes: list[bytes] = []
        while len(boxes) < 2 + 2 * held_chunk:  # ftyp, moov, then moof+mdat per chunk
            chunk = await response.content.readany()
            assert chunk, "stream ended before the held chunk"
            boxes += splitter.feed(chunk)
        assert not decoder.gate.is_set()
        # The decoder thread counts a chunk after its callback returns, which can be
        # after the client has it; once it waits at the gate, the count is final.
        await asyncio.to_thread(decoder.holding.wait, 30)
        assert decoder.published == held_chunk
        received_before_release = b"".join(boxes)
        decoder.gate.set()
        rest = await response.read()
    data = received_before_release + b"".join(splitter.feed(rest))
    assert splitter.pending == 0
    check_stream(data, latents)


async def test_create_then_fetch_content_gives_the_same_video(start_server: StartServer):
    server = await start_server()
    latents = smooth_latents(frames=3, height=4, width=6)
    async with server.client.post(
        "/v1/videos",
        data={"file": io.BytesIO(safetensors_bytes(latents=latents)), "fps": "30000/1001"},
    ) as response:
        assert response.status == 201
        job = await response.json()
    assert job["status"] in {"queued", "in_progress"}
    assert (job["width"], job["height"], job["frames"]) == (48, 32, 9)
    assert response.headers["Location"] == f"/v1/videos/{job['id']}"
    async with server.client.get(job["urls"]["content"]) as response:
        assert response.status == 200
        data = await response.read()
    check_stream(data, latents)
    # Once complete, the same URL is a plain file with a length: the same bytes, its
    # init segment now stating the duration the live stream could not.
    async with server.client.get(job["urls"]["content"]) as response:
        assert response.headers["Content-Length"] == str(len(data))
        assert as_streamed(await response.read()) == data
    async with server.client.get(f"/v1/videos/{job['id']}") as response:
        assert (await response.json())["fps"] == pytest.approx(30000 / 1001)


async def test_two_viewers_of_one_job_get_identical_bytes(start_server: StartServer):
    decoder = GatedDecoder(hold_at=2)
    server = await start_server(decoders={"linear": decoder})
    latents = smooth_latents(frames=4)
    async with server.client.post("/v1/videos", data=safetensors_bytes(latents=latents)) as r:
        job = await r.json()

    async def read_all() -> bytes:
        async with server.client.get(job["urls"]["content"]) as response:
            return await response.read()

    viewers = [asyncio.create_task(read_all()) for _ in range(2)]
    await asyncio.to_thread(decoder.holding.wait, 30)
    decoder.gate.set()
    first, second = await asyncio.gather(*viewers)
    assert first == second
    check_stream(first, latents)


async def test_safetensors_metadata_fps_is_used_when_no_parameter_is_given(
    start_server: StartServer,
):
    server = await start_server()
    body = safetensors_bytes(metadata={"fps": "12"}, latents=smooth_latents(frames=2))
    async with server.client.post("/v1/videos", data=body) as response:
        job = await response.json()
    assert job["fps"] == 12.0
    assert job["seconds"] == pytest.approx(5 / 12, abs=1e-3)
