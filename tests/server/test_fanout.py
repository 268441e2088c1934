"""One decode, many viewers: identical bytes, late joiners, stalled readers."""

from __future__ import annotations

import asyncio
import hashlib
import io
import socket
from dataclasses import replace

import torch

from tests.helpers import (
    GatedDecoder,
    decode_mp4,
    safetensors_bytes,
    smooth_latents,
    split_stream,
    until,
)
from tests.helpers.server import TEST_CONFIG, Server, StartServer, noisy_latents, read_boxes

VIEWERS = 50


async def create_job(server: Server, latents: torch.Tensor) -> dict:
    body = io.BytesIO(safetensors_bytes(latents=latents))
    async with server.client.post("/v1/videos", data=body) as r:
        assert r.status == 201
        return await r.json()


def stalled_reader(server: Server, path: str) -> socket.socket:
    """A viewer that sends its request and then never reads a byte."""
    host, port = server.url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    return sock


async def test_fifty_viewers_of_one_decode_get_identical_playable_bytes(
    start_server: StartServer,
):
    decoder = GatedDecoder(hold_at=2)
    server = await start_server(decoders={"linear": decoder})
    job = await create_job(server, smooth_latents(frames=6))

    async def watch() -> bytes:
        async with server.client.get(job["urls"]["content"]) as response:
            assert response.status == 200
            return await response.read()

    viewers = [asyncio.create_task(watch()) for _ in range(VIEWERS)]
    # Everyone is attached while the decode is held, so all of them follow it live.
    await until(lambda: server.manager.get(job["id"]).viewers == VIEWERS)
    decoder.gate.set()
    streams = await asyncio.gather(*viewers)
    assert len({hashlib.sha256(stream).digest() for stream in streams}) == 1
    assert len(decode_mp4(streams[0])) == 21


# Near-lossless H.264 of random colour blocks: megabytes, far more than a socket
# that is never read can absorb (loopback send buffers top out at 4 MiB here).
BIG_VIDEO = {"frames": 36, "height": 56, "width": 56}
BIG_ENCODER = replace(TEST_CONFIG.encoder, crf=1)


async def test_a_stalled_viewer_delays_neither_the_decode_nor_the_others(
    start_server: StartServer,
):
    server = await start_server(encoder=BIG_ENCODER, reader_write_timeout_s=60)
    job = await create_job(server, noisy_latents(**BIG_VIDEO))
    stalled = stalled_reader(server, job["urls"]["content"])
    try:
        await until(lambda: server.manager.get(job["id"]).viewers == 1)
        async with server.client.get(job["urls"]["content"]) as response:
            stream = await response.read()
        running = server.manager.get(job["id"])
        assert running.record.status == "completed"
        assert running.log.size > 8 * 1024 * 1024
        assert len(stream) == running.log.size
        assert running.viewers == 1  # the stalled viewer, still attached, socket full
    finally:
        stalled.close()


async def test_a_stalled_viewer_is_dropped_after_the_write_timeout(start_server: StartServer):
    server = await start_server(encoder=BIG_ENCODER, reader_write_timeout_s=0.5)
    job = await create_job(server, noisy_latents(**BIG_VIDEO))
    stalled = stalled_reader(server, job["urls"]["content"])
    try:
        await until(lambda: server.manager.get(job["id"]).record.is_final)
        await until(lambda: server.manager.get(job["id"]).viewers == 0)
        async with server.client.get("/metrics") as response:
            assert "vaecast_readers_dropped_total 1.0" in await response.text()
        # Everyone else is still served.
        async with server.client.get(job["urls"]["content"]) as response:
            assert len(decode_mp4(await response.read())) == 1 + 4 * (BIG_VIDEO["frames"] - 1)
    finally:
        stalled.close()


async def test_a_late_joiner_gets_the_same_bytes_as_an_early_viewer(start_server: StartServer):
    held = 3
    decoder = GatedDecoder(hold_at=held)
    server = await start_server(decoders={"linear": decoder})
    job = await create_job(server, smooth_latents(frames=6))
    early = await server.client.get(job["urls"]["content"])
    early_boxes = await read_boxes(early, 2 + 2 * held)
    # Joins after `held` fragments exist: gets the init segment and all of them at once.
    late = await server.client.get(job["urls"]["content"])
    late_boxes = await read_boxes(late, 2 + 2 * held)
    assert late_boxes == early_boxes
    decoder.gate.set()
    early_rest, late_rest = await asyncio.gather(early.read(), late.read())
    early_stream = b"".join(early_boxes) + early_rest
    assert early_stream == b"".join(late_boxes) + late_rest
    _, fragments = split_stream(early_stream)
    assert len(fragments) == 6
    early.close()
    late.close()
