"""Prometheus metrics, health, and draining for shutdown."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from tests.helpers import (
    GatedDecoder,
    assert_threads_end,
    safetensors_bytes,
    smooth_latents,
    until,
    vaecast_threads,
)
from tests.helpers.server import StartServer, read_boxes
from vaecast.version import VERSION


async def test_metrics_describe_what_happened(start_server: StartServer):
    server = await start_server()
    body = safetensors_bytes(latents=smooth_latents(frames=3))
    async with server.client.post("/v1/videos/stream", data=body) as response:
        sent = len(await response.read())
    async with server.client.get("/metrics") as response:
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = await response.text()
    lines = set(text.splitlines())
    for expected in [
        'vaecast_jobs{status="completed"} 1.0',
        'vaecast_jobs_finished_total{status="completed"} 1.0',
        "vaecast_queue_depth 0.0",
        "vaecast_active_readers 0.0",
        f"vaecast_bytes_sent_total {float(sent)}",
        "vaecast_time_to_first_fragment_seconds_count 1.0",
        "vaecast_decode_seconds_count 1.0",
        "vaecast_chunk_encode_seconds_count 3.0",
    ]:
        assert expected in lines, expected


async def test_health_reports_liveness_and_readiness(start_server: StartServer):
    server = await start_server()
    async with server.client.get("/healthz") as response:
        assert response.status == 200
        health = await response.json()
    assert health == {
        "status": "ok",
        "ready": True,
        "version": VERSION,
        "models": ["linear"],
        "limits": {
            "max_frames": 2001,
            "max_pixels_per_frame": 1920 * 1088,
            "max_upload_bytes": 512 * 1024 * 1024,
            "max_demo_pixels": 81 * 832 * 480,
        },
        "jobs": 0,
        "queue": {"depth": 0, "max": 8},
        "decode_slots": 1,
        "places": {
            "receiving": 0,
            "push_waiting": 0,
            "queued": 0,
            "decoding": 0,
            "max_pending": 16,
            "max_pending_per_client": 8,
        },
        "warm_up": {"state": "off"},  # only `vaecast serve` warms the demo up
        "webrtc": {"viewers": {"h264": 0, "vp8": 0}, "max": 32},
    }


async def test_draining_refuses_new_jobs_and_lets_running_streams_finish(
    start_server: StartServer,
):
    decoder = GatedDecoder(hold_at=2)
    server = await start_server(decoders={"linear": decoder})
    body = safetensors_bytes(latents=smooth_latents(frames=4))
    stream = await server.client.post("/v1/videos/stream", data=body)
    boxes = await read_boxes(stream, 2 + 2 * 2)
    draining = asyncio.create_task(server.manager.drain(grace_s=30))
    await until(lambda: server.manager.draining)
    async with server.client.get("/healthz") as response:
        assert response.status == 503
        assert (await response.json())["status"] == "draining"
    async with server.client.post("/v1/videos", data=body) as response:
        assert response.status == 503
        assert (await response.json())["error"]["type"] == "shutting_down"
    decoder.gate.set()
    rest = await stream.read()  # the running stream completes normally
    await asyncio.wait_for(draining, 30)
    job = server.manager.get(stream.headers["X-Video-Id"])
    assert job.record.status == "completed"
    assert len(b"".join(boxes) + rest) == job.log.size
    stream.close()


async def test_past_the_grace_period_running_jobs_are_cancelled_and_nothing_is_left(
    start_server: StartServer, tmp_path: Path
):
    threads_before = vaecast_threads()
    decoder = GatedDecoder(hold_at=2)
    server = await start_server(
        decoders={"linear": decoder}, spill_threshold_bytes=1024, spill_dir=str(tmp_path)
    )
    body = safetensors_bytes(latents=smooth_latents(frames=30))
    stream = await server.client.post("/v1/videos/stream", data=body)
    await read_boxes(stream, 2 + 2 * 2)
    job = server.manager.get(stream.headers["X-Video-Id"])
    draining = asyncio.create_task(server.manager.drain(grace_s=0.2))
    await until(lambda: job.error is not None)  # the grace period ran out
    decoder.gate.set()  # the decoder finishes the chunk it was computing, then stops
    await asyncio.wait_for(draining, 30)
    assert (job.record.status, job.error.message) == ("cancelled", "server shutting down")
    with pytest.raises(aiohttp.ClientPayloadError):
        await stream.read()
    stream.close()
    await server.manager.close()
    assert_threads_end(threads_before)
    assert not any(tmp_path.iterdir())
