"""Requests aiohttp cannot parse, and routes of another method: answered in JSON too.

Sent over raw sockets, since no HTTP client sends them.
"""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from tests.helpers import until
from tests.helpers.server import Server, StartServer


async def exchange(server: Server, data: bytes) -> tuple[bytes, bytes]:
    """Send `data`; the answer's head and body (none for HEAD)."""
    host, port = server.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(data)
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        if data.startswith(b"HEAD "):
            return head, b""
        body = await asyncio.wait_for(reader.readexactly(length), 10)
        return head, body
    finally:
        writer.close()


HOST = b"Host: 127.0.0.1\r\n"


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GARBAGE\r\n\r\n",
        b"GET /healthz HTTP/9\r\n" + HOST + b"\r\n",
        b"GET /healthz HTTP/1.1\r\n" + HOST + b"Bad Header\r\n\r\n",
        b"POST /v1/videos HTTP/1.1\r\n" + HOST + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"GET /v1/videos/x/content?variant=" + b"v" * 10_000 + b" HTTP/1.1\r\n" + HOST + b"\r\n",
    ],
    ids=["garbage", "version", "header", "chunk", "long-url"],
)
async def test_what_aiohttp_cannot_parse_is_answered_in_json(
    start_server: StartServer, request_bytes: bytes, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.INFO)
    server = await start_server()
    head, body = await exchange(server, request_bytes)
    assert head.startswith(b"HTTP/1.0 400 "), head
    assert b"Content-Type: application/json" in head
    error = json.loads(body)["error"]
    assert error["type"] == "bad_request"
    # The reason is the parser's first line (its words differ between aiohttp's C and
    # Python parsers); the lines that echo the request are left out.
    reason = error["message"].removeprefix("the request cannot be parsed: ")
    assert reason != error["message"] and reason and "\n" not in reason
    async with server.client.get("/healthz") as response:  # the server is fine
        assert response.status == 200
    # The client's mistake: one line in the log, no traceback.
    logged = [r for r in caplog.records if "unparseable request" in r.getMessage()]
    assert len(logged) == 1 and logged[0].levelname == "INFO"
    assert not [r for r in caplog.records if r.exc_info or r.levelname == "ERROR"]


async def test_a_body_cut_short_by_its_client_is_no_server_error(
    start_server: StartServer, caplog: pytest.LogCaptureFixture
):
    """aiohttp raises RequestPayloadError into the body's reader: a refusal (400), not
    an unhandled error logged with its traceback; the place is given back. (Without
    handler cancellation, aiohttp's default: the handler then runs on to its end.)"""
    server = await start_server(handler_cancellation=False)
    host, port = server.url.removeprefix("http://").split(":")
    _, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"POST /v1/videos HTTP/1.1\r\n" + HOST + b"Content-Length: 100\r\n\r\nabcd")
    await writer.drain()
    await until(lambda: server.manager.places.counts()["receiving"] == 1, 10)
    writer.close()
    await until(lambda: server.manager.places.counts()["receiving"] == 0, 10)
    assert not [r for r in caplog.records if r.name == "vaecast.http" and r.levelname == "ERROR"]


@pytest.mark.parametrize("method", [b"GET", b"HEAD"])
async def test_the_stream_route_of_another_method_is_a_json_405(
    start_server: StartServer, method: bytes
):
    server = await start_server()
    head, body = await exchange(
        server, method + b" /v1/videos/stream HTTP/1.1\r\n" + HOST + b"\r\n"
    )
    assert head.startswith(b"HTTP/1.1 405 "), head
    assert b"Content-Type: application/json" in head
    assert b"Allow: POST\r\n" in head
    if method == b"GET":  # a HEAD answer has the headers alone
        assert json.loads(body)["error"] == {
            "type": "method_not_allowed",
            "message": "Method Not Allowed",
        }
