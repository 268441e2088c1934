"""Cancels, disconnects and failures: nothing lost, nothing leaked, nothing hangs."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from tests.helpers import (
    FailingDecoder,
    GatedDecoder,
    assert_threads_end,
    safetensors_bytes,
    smooth_latents,
    until,
    vaecast_threads,
)
from tests.helpers.server import Server, StartServer, read_boxes
from vaecast.errors import DecodeCancelled

LATENT_FRAMES = 30  # 30 chunks: a decode that runs to the end would publish them all


async def warm_up(server: Server) -> None:
    """Run one job to the end so the worker pools have their threads."""
    body = safetensors_bytes(latents=smooth_latents(frames=2, height=2, width=2))
    async with server.client.post("/v1/videos/stream", data=body) as response:
        await response.read()


@pytest.mark.parametrize("handler_cancellation", [True, False])
async def test_client_leaving_the_stream_cancels_its_decode(
    start_server: StartServer, handler_cancellation: bool
):
    decoder = GatedDecoder(hold_at=2)
    server = await start_server(
        decoders={"linear": decoder}, handler_cancellation=handler_cancellation
    )
    decoder.gate.set()
    await warm_up(server)
    threads_before = vaecast_threads()
    decoder.gate.clear()
    decoder.published = 0
    body = safetensors_bytes(latents=smooth_latents(frames=LATENT_FRAMES))
    response = await server.client.post("/v1/videos/stream", data=body)
    job = server.manager.get(response.headers["X-Video-Id"])
    await read_boxes(response, 2 + 2 * 2)  # init + chunks 0 and 1
    response.close()  # the viewer goes away
    # Open the gate only once the server has seen the close. With handler
    # cancellation, the cancelled handler cancels the job at once; without it, the
    # server learns at its next write, which must not land in the kernel buffer of
    # a half-closed socket, so wait for the server's side of the socket to close.
    if handler_cancellation:
        await until(lambda: job.error is not None)
    else:
        await until(lambda: server.lost_connections > 0)
    decoder.finished.clear()
    decoder.gate.set()
    await asyncio.wait_for(job.wait(), 30)
    assert (job.record.status, job.error.message) == ("cancelled", "the client disconnected")
    assert decoder.finished.is_set()
    assert isinstance(decoder.ended_with, DecodeCancelled)
    if handler_cancellation:
        # The handler was cancelled at the close, so the held chunk was never published.
        assert decoder.published == 2
    else:
        # Noticed at the first write after the close, a few chunks later: the decode
        # still stops well before its end.
        assert decoder.published < LATENT_FRAMES
    assert_threads_end(threads_before)  # the same idle pool workers, no more


async def test_delete_stops_the_decode_and_ends_every_reader(
    start_server: StartServer, tmp_path: Path
):
    decoder = GatedDecoder(hold_at=2)
    # A tiny spill threshold, so the job also has a temporary file to clean up.
    server = await start_server(
        decoders={"linear": decoder}, spill_threshold_bytes=1024, spill_dir=str(tmp_path)
    )
    decoder.gate.set()
    await warm_up(server)
    threads_before = vaecast_threads()
    decoder.gate.clear()
    decoder.published = 0
    body = safetensors_bytes(latents=smooth_latents(frames=LATENT_FRAMES))
    async with server.client.post("/v1/videos", data=body) as response:
        job_id = (await response.json())["id"]
    reader = await server.client.get(f"/v1/videos/{job_id}/content")
    await read_boxes(reader, 2 + 2 * 2)
    await asyncio.to_thread(decoder.holding.wait, 30)
    spill_file = server.manager.get(job_id).log.spill_path
    assert spill_file is not None and spill_file.exists()
    # DELETE answers once the decoder has stopped, which is at the end of the chunk
    # it is computing: the held one, released here.
    # (keep=false: nothing of it is kept; tests/server/test_partial.py keeps it.)
    deleting = asyncio.create_task(server.client.delete(f"/v1/videos/{job_id}?keep=false"))
    await until(lambda: server.manager.get(job_id).error is not None)
    decoder.gate.set()
    async with await deleting as response:
        assert response.status == 200
        job = await response.json()
    assert job["status"] == "cancelled"
    assert job["error"] == {"type": "cancelled", "message": "cancelled by request"}
    assert decoder.finished.is_set()
    assert isinstance(decoder.ended_with, DecodeCancelled)
    assert decoder.published == 2  # the held chunk was never published
    assert_threads_end(threads_before)  # the same idle pool workers, no more
    # The reader's stream ends truncated: no terminating chunk, so the client knows.
    with pytest.raises(aiohttp.ClientPayloadError):
        await reader.read()
    reader.close()
    async with server.client.get(f"/v1/videos/{job_id}/content") as response:
        assert response.status == 409
        assert (await response.json())["error"]["message"] == (
            f"video {job_id} has no content: cancelled: cancelled by request"
        )
    await until(lambda: not spill_file.exists())  # its temporary file is gone


async def test_a_decoder_error_cuts_the_stream_and_is_recorded(start_server: StartServer):
    server = await start_server(decoders={"linear": FailingDecoder(fail_at=3)})
    body = safetensors_bytes(latents=smooth_latents(frames=6))
    async with server.client.post("/v1/videos/stream", data=body) as response:
        assert response.status == 200
        job_id = response.headers["X-Video-Id"]
        with pytest.raises(aiohttp.ClientPayloadError):
            await response.read()
    async with server.client.get(f"/v1/videos/{job_id}") as response:
        job = await response.json()
    assert job["status"] == "failed"
    assert job["chunks"] == {"done": 3, "total": 6}
    assert job["error"] == {
        "type": "decode_failed",
        "message": "the decoder failed: out of memory (simulated)",
    }


async def test_shutdown_with_a_running_job_leaves_no_threads(start_server: StartServer):
    threads_before = vaecast_threads()
    decoder = GatedDecoder(hold_at=1)
    server = await start_server(decoders={"linear": decoder})
    body = safetensors_bytes(latents=smooth_latents(frames=LATENT_FRAMES))
    async with server.client.post("/v1/videos", data=body) as response:
        job = server.manager.get((await response.json())["id"])
    await asyncio.to_thread(decoder.holding.wait, 30)
    assert len(vaecast_threads()) > len(threads_before)
    closing = asyncio.create_task(server.manager.close())
    await until(lambda: job.error is not None)
    decoder.gate.set()
    await closing
    assert job.record.status == "cancelled"
    assert job.error.message == "server shutting down"
    assert_threads_end(threads_before)
