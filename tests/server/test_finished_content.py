"""A finished video is a plain file: length, ETag, ranges, HEAD, conditional GET."""

from __future__ import annotations

import asyncio

from tests.helpers import GatedDecoder, decode_mp4, safetensors_bytes, smooth_latents
from tests.helpers.mp4_duration import as_streamed
from tests.helpers.server import Server, StartServer


async def finished_video(server: Server) -> tuple[str, bytes]:
    async with server.client.post(
        "/v1/videos", data=safetensors_bytes(latents=smooth_latents(frames=4))
    ) as response:
        url = (await response.json())["urls"]["content"]
    return await finished_video_at(server, url)


async def finished_video_at(server: Server, url: str) -> tuple[str, bytes]:
    async with server.client.get(url) as response:
        await response.read()  # live, to the end
    # The finished file: the live stream's bytes, but for its init segment's durations.
    async with server.client.get(url) as response:
        assert "Content-Length" in response.headers
        return url, await response.read()


async def test_whole_file_with_length_etag_and_ranges_advertised(start_server: StartServer):
    server = await start_server()
    url, data = await finished_video(server)
    async with server.client.get(url) as response:
        assert response.status == 200
        assert response.headers["Content-Length"] == str(len(data))
        assert response.headers["Accept-Ranges"] == "bytes"
        assert response.headers["ETag"].startswith('"video_')
        assert await response.read() == data


async def test_ranges_give_206_with_the_right_bytes(start_server: StartServer):
    server = await start_server()
    url, data = await finished_video(server)
    size = len(data)
    for header, first, last in [
        ("bytes=0-99", 0, 99),
        ("bytes=100-", 100, size - 1),
        ("bytes=-50", size - 50, size - 1),
        (f"bytes={size - 10}-{size + 500}", size - 10, size - 1),
    ]:
        async with server.client.get(url, headers={"Range": header}) as response:
            assert response.status == 206, header
            assert response.headers["Content-Range"] == f"bytes {first}-{last}/{size}"
            assert response.headers["Content-Length"] == str(last - first + 1)
            assert await response.read() == data[first : last + 1]
    # Chromium's first request for a media URL: the whole file (as 206).
    async with server.client.get(url, headers={"Range": "bytes=0-"}) as response:
        assert response.status == 206
        assert len(decode_mp4(await response.read())) == 13


async def test_unsatisfiable_range_is_416(start_server: StartServer):
    server = await start_server()
    url, data = await finished_video(server)
    async with server.client.get(url, headers={"Range": f"bytes={len(data)}-"}) as response:
        assert response.status == 416
        assert response.headers["Content-Range"] == f"bytes */{len(data)}"
        assert (await response.json())["error"]["type"] == "range_not_satisfiable"


async def test_head_and_if_none_match(start_server: StartServer):
    server = await start_server()
    url, data = await finished_video(server)
    async with server.client.head(url) as response:
        assert response.status == 200
        assert response.headers["Content-Length"] == str(len(data))
        etag = response.headers["ETag"]
        assert await response.read() == b""
    async with server.client.get(url, headers={"If-None-Match": etag}) as response:
        assert response.status == 304
        assert response.headers["ETag"] == etag
        assert await response.read() == b""
    async with server.client.get(url, headers={"If-None-Match": '"other"'}) as response:
        assert response.status == 200


async def test_while_decoding_bytes_0_streams_and_a_range_past_the_bytes_so_far_waits(
    start_server: StartServer,
):
    decoder = GatedDecoder(hold_at=2)
    server = await start_server(decoders={"linear": decoder})
    async with server.client.post(
        "/v1/videos", data=safetensors_bytes(latents=smooth_latents(frames=4))
    ) as response:
        url = (await response.json())["urls"]["content"]
    streaming = await server.client.get(url, headers={"Range": "bytes=0-"})
    assert streaming.status == 200
    assert streaming.headers["Transfer-Encoding"] == "chunked"
    # Past anything the held decode has written: answered once the video is complete.
    # (Ranges of a running job: tests/server/test_running_ranges.py.)
    past = {"Range": "bytes=10-99999999"}
    ranged = asyncio.create_task(server.client.get(url, headers=past))
    await asyncio.to_thread(decoder.holding.wait, 30)
    assert not ranged.done()
    decoder.gate.set()
    streamed = await streaming.read()
    streaming.close()
    _, data = await finished_video_at(server, url)
    assert streamed == as_streamed(data)  # its init segment said no duration yet
    async with await ranged as response:
        assert response.status == 206
        assert response.headers["Content-Range"] == f"bytes 10-{len(data) - 1}/{len(data)}"
        assert await response.read() == data[10:]
