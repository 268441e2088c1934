"""Reading a request body under the server's rules: a pause limit and a minimum rate
(`body_rate.BodyPace`: 408 for a body that stops or trickles), no compressed bodies
(415), and a size limit (413), into one growing buffer (`body_buffer.BodyBuffer`).
What every route that takes a body reads it with: uploads and push blocks (the
intake), a demo's JSON, a WHEP offer."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from aiohttp import web

from vaecast.errors import (
    MalformedRequestError,
    PayloadTooLargeError,
    UnsupportedMediaError,
)
from vaecast.server.edge.body_buffer import BodyBuffer
from vaecast.server.edge.body_rate import BodyPace


async def body_chunks(request: web.Request, pace: BodyPace) -> AsyncIterator[bytes]:
    """The body as it arrives; RequestTimeoutError (408) when nothing comes for a
    while, or when, past its grace, it comes slower than the minimum rate
    (`vaecast.server.edge.body_rate`: a steady upload is fine, one that stops or
    trickles, holding its place, is not). Compressed bodies are refused: latents
    barely compress, and inflating costs CPU without a bound on the result (the app
    runs with aiohttp's auto_decompress off).
    """
    encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise UnsupportedMediaError(
            f"Content-Encoding {encoding[:40]!r} is not accepted; send the file uncompressed"
        )
    loop = asyncio.get_running_loop()
    started, received = loop.time(), 0
    # A chunked upload is read as whatever is buffered, in one piece: `readchunk` stops
    # at each of its chunks, so a body sent in 1-byte chunks would cost this loop a turn
    # per byte (measured: 8x the loop CPU of `readany`). A body with a length has no
    # such chunks, and there `readchunk` hands over each socket read as it came, where
    # `readany` joins what is buffered into a new object first: one copy of the upload
    # less (8.4 MB over loopback: 5.3 -> 4.6 ms to read, median of 39 alternating).
    sized = request.content_length is not None and "Transfer-Encoding" not in request.headers
    while True:
        try:
            async with asyncio.timeout_at(pace.next_deadline(loop.time(), started, received)):
                if sized:
                    chunk, _ = await request.content.readchunk()
                else:
                    chunk = await request.content.readany()
        except TimeoutError:
            raise pace.refusal(loop.time(), started, received) from None
        except (web.RequestPayloadError, ConnectionResetError) as error:  # cut short, say
            raise MalformedRequestError(f"the request body cannot be read: {error}") from None
        if not chunk:
            return
        received += len(chunk)
        yield chunk


async def read_small_body(request: web.Request, pace: BodyPace, max_bytes: int) -> bytes:
    """A small body (JSON, an SDP offer), held to the upload rules: 413 past `max_bytes`,
    408 for one that stalls or trickles, 415 for one compressed."""
    return bytes(await read_limited(body_chunks(request, pace), max_bytes))


async def read_limited(chunks: AsyncIterator[bytes], max_bytes: int) -> bytearray:
    """The body in one growing buffer (`body_buffer.BodyBuffer`: no copies, no heap
    holes), returned as is: a `bytes` copy of it would hold the upload twice at the
    peak. (Not sized from Content-Length: a client could then make us commit the
    upload limit by declaring it and sending nothing.)"""
    body = BodyBuffer()
    async for chunk in chunks:
        if len(body) + len(chunk) > max_bytes:
            raise too_large(max_bytes)
        body.append(chunk)
    return body.take()


def too_large(max_bytes: int) -> PayloadTooLargeError:
    return PayloadTooLargeError(f"the upload is over this server's limit of {max_bytes} bytes")
