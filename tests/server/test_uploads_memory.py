"""An upload is held once: read into one buffer, parsed into tensors that are views of it.

Measured with tracemalloc, which sees every Python buffer (the body, `bytes` copies of
it, multipart slices); torch's own allocations are measured in
tests/test_latent_files.py (RSS of a fresh process). Real HTTP over 127.0.0.1: an
aiohttp app whose handler runs the server's own `read_upload` and `load_latents`.
"""

from __future__ import annotations

import asyncio
import io
import tracemalloc
from collections.abc import AsyncIterator

import aiohttp
import numpy as np
import pytest
import torch
from aiohttp import web
from safetensors.torch import save

from tests.helpers.server import TEST_CONFIG, serve_on_loopback
from vaecast.errors import PayloadTooLargeError
from vaecast.latent_files import load_latents
from vaecast.server.edge.body_buffer import MAPPED_ROOM_BYTES
from vaecast.server.edge.body_reading import body_chunks, read_limited
from vaecast.server.intake.uploads import read_upload

MIB = 1024 * 1024


async def chunks_of(total: int, size: int = 256 * 1024) -> AsyncIterator[bytes]:
    for start in range(0, total, size):
        yield b"\x01" * min(size, total - start)


async def test_the_body_is_read_into_one_buffer_and_returned_as_is():
    total = 32 * MIB
    tracemalloc.start()
    try:
        body = await read_limited(chunks_of(total), 64 * MIB)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert isinstance(body, bytearray) and len(body) == total
    # One buffer (and bytearray's growth margin of 1/8): a `bytes` copy would make it 2x.
    assert peak <= 1.2 * total, peak / total


async def test_the_limit_is_checked_before_the_chunk_is_added():
    with pytest.raises(PayloadTooLargeError):
        await read_limited(chunks_of(MIB + 1), MIB)
    assert len(await read_limited(chunks_of(MIB), MIB)) == MIB


def latents_file(frames: int) -> tuple[torch.Tensor, bytes]:
    latents = torch.linspace(-1, 1, 16 * frames * 32 * 32).reshape(1, 16, frames, 32, 32)
    return latents, save({"latents": latents})


async def peak_of_upload(send: object, **post: object) -> tuple[float, torch.Tensor, int]:
    """POST to a handler that reads and loads the upload as the server does: the
    tracemalloc peak over the read and the load, the latents, the body size."""
    seen: dict[str, object] = {}

    async def handler(request: web.Request) -> web.Response:
        tracemalloc.start()
        try:
            upload = await read_upload(request, TEST_CONFIG)
            seen["latents"] = load_latents(upload.data).latents
            seen["size"] = request.content_length
            _, seen["peak"] = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        return web.Response(text="ok")

    app = web.Application(client_max_size=1024 * MIB)
    app.router.add_post("/", handler)
    runner = web.AppRunner(app)
    url = await serve_on_loopback(app, runner)
    try:
        timeout = aiohttp.ClientTimeout(total=60)
        async with (
            aiohttp.ClientSession(timeout=timeout) as client,
            client.post(url, data=send, **post) as response,  # type: ignore[arg-type]
        ):
            assert response.status == 200, await response.text()
    finally:
        await runner.cleanup()
    size = seen["size"]
    assert isinstance(size, int)
    # tracemalloc counts the room a BodyBuffer keeps past the body (it makes a body over
    # 1 MiB its own mapping, at least MAPPED_ROOM_BYTES of address space); nothing
    # writes that room, so it is not memory held: only the written bytes count here.
    # (tests/server/test_body_buffer.py checks the RSS of a body read that way.)
    room = max(0, MAPPED_ROOM_BYTES - size)
    return (seen["peak"] - room) / size, seen["latents"], size  # type: ignore[operator, return-value]


@pytest.mark.slow
async def test_a_raw_upload_is_held_once_from_socket_to_tensor():
    latents, data = latents_file(frames=256)  # 16 MiB
    ratio, loaded, _ = await peak_of_upload(io.BytesIO(data))
    assert torch.equal(loaded, latents)
    # Before: the bytearray, its bytes copy, safetensors' copy of the tensor: 3x.
    assert ratio <= 1.2, ratio


@pytest.mark.slow
async def test_a_form_upload_is_held_once_after_the_parse():
    latents, data = latents_file(frames=256)
    form = aiohttp.FormData()
    form.add_field("fps", "8")
    form.add_field("file", io.BytesIO(data), filename="z.safetensors")
    ratio, loaded, _ = await peak_of_upload(form)
    assert torch.equal(loaded, latents)
    # The body and the file part's slice of it, for the moment between parsing the form
    # and dropping the body; then the part alone (before: 4x with two bytes copies).
    assert ratio <= 2.2, ratio


async def test_a_sized_body_arrives_whole_and_in_order_read_by_read():
    """A body with a Content-Length is handed over as the socket's reads came (no
    join of what is buffered): every byte, in order, in pieces no bigger than a read."""
    body = np.random.default_rng(7).integers(0, 256, 6 * 2**20, dtype=np.uint8).tobytes()
    pieces: list[bytes] = []

    async def handler(request: web.Request) -> web.Response:
        assert request.content_length == len(body)
        async for piece in body_chunks(request, TEST_CONFIG.body_pace()):
            pieces.append(piece)
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/", handler)
    runner = web.AppRunner(app)
    url = await serve_on_loopback(app, runner)
    try:
        async with aiohttp.ClientSession() as session:
            response = await session.post(url, data=io.BytesIO(body))
            assert response.status == 200
    finally:
        await runner.cleanup()
    assert b"".join(pieces) == body
    assert len(pieces) > 1


async def test_a_body_in_one_byte_http_chunks_is_read_in_few_pieces():
    """A client controls how it cuts a chunked body: 1-byte chunks must not cost the
    event loop a read per byte. The body arrives in one write of 200,000 chunks; the
    reader takes what is buffered, so the pieces number like the socket's reads."""
    body = bytes(range(256)) * 782 + b"end"
    pieces: list[int] = []

    async def handler(request: web.Request) -> web.Response:
        async for piece in body_chunks(request, TEST_CONFIG.body_pace()):
            pieces.append(len(piece))
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/", handler)
    runner = web.AppRunner(app)
    url = await serve_on_loopback(app, runner)
    host, port = url.removeprefix("http://").rstrip("/").split(":")
    try:
        reader, writer = await asyncio.open_connection(host, int(port))
        wire = b"".join(b"1\r\n%s\r\n" % body[i : i + 1] for i in range(len(body)))
        writer.write(
            b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n"
            + wire
            + b"0\r\n\r\n"
        )
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 60)
        writer.close()
    finally:
        await runner.cleanup()
    assert head.startswith(b"HTTP/1.1 200 "), head
    assert sum(pieces) == len(body)
    assert len(pieces) < len(body) // 100, len(pieces)
