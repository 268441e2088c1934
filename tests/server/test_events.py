"""The event stream stays open through a long chunk with keep-alive comments."""

from __future__ import annotations

import asyncio

from tests.helpers import GatedDecoder, safetensors_bytes, smooth_latents, until
from tests.helpers.server import StartServer


async def test_an_idle_event_stream_gets_keep_alive_comments(start_server: StartServer):
    decoder = GatedDecoder(hold_at=1)
    server = await start_server(decoders={"linear": decoder}, events_keepalive_s=0.05)
    async with server.client.post(
        "/v1/videos", data=safetensors_bytes(latents=smooth_latents(frames=3))
    ) as response:
        job_id = (await response.json())["id"]
    await asyncio.to_thread(decoder.holding.wait, 30)
    # Chunk 0's fragment is encoded while chunk 1 is held: its event is past too.
    await until(lambda: server.manager.jobs[job_id].record.chunks_done == 1)
    async with server.client.get(f"/v1/videos/{job_id}/events") as events:
        assert events.headers["Content-Type"] == "text/event-stream"
        lines: list[str] = []
        while lines.count(": keep-alive") < 2:  # the decode is held: nothing else to say
            lines.append((await events.content.readline()).decode().rstrip("\n"))
        assert lines[0] == "retry: 2000"
        assert "event: state" in lines
        assert not any(line.startswith("event: chunk") for line in lines)
        decoder.gate.set()
        rest = (await events.read()).decode()
    assert rest.count("event: chunk") == 2  # chunks 1 and 2 of 3, after the hold
    assert rest.count("event: done") == 1


async def test_a_head_of_the_events_is_their_headers_alone(start_server: StartServer):
    """Schemathesis's stateful phase found a HEAD that wrote the events anyway: on its
    keep-alive connection the next answer began inside them."""
    server = await start_server()
    body = safetensors_bytes(latents=smooth_latents(frames=3))
    async with server.client.post("/v1/videos", data=body) as response:
        job = await response.json()
    await until(lambda: server.manager.get(job["id"]).record.is_final)
    host, port = server.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    for tail in ("/events", "/content"):
        request = f"HEAD /v1/videos/{job['id']}{tail} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n"
        writer.write(request.encode())
    await writer.drain()
    heads = []
    for _ in range(2):
        heads.append(await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10))
    writer.close()
    await writer.wait_closed()
    assert heads[0].startswith(b"HTTP/1.1 200") and b"text/event-stream" in heads[0]
    assert heads[1].startswith(b"HTTP/1.1 200") and b"video/mp4" in heads[1], heads[1][:200]
