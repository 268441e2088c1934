"""Hostile and unlucky input: each case a user found, answered with a 4xx in bounded time.

Each test names the defect it guards against. "Bounded time" is checked where it
matters by the server still answering (the event loop was never held), not by
timing assertions.
"""

from __future__ import annotations

import asyncio
import gc
import io
import json
import weakref

import aiohttp
import pytest
import torch

from tests.helpers import GatedDecoder, safetensors_bytes, smooth_latents, until
from tests.helpers.server import StartServer
from vaecast.job.views import job_object
from vaecast.models.tiny import TinyDecoder
from vaecast.server.config import Limits

BODY = safetensors_bytes(latents=smooth_latents(frames=2))
HUGE_EXPONENT = "1e10000000"  # Fraction() would build 10**10000000 on the loop


async def _error(response) -> tuple[int, dict]:
    return response.status, (await response.json())["error"]


@pytest.mark.parametrize(
    ("where", "value"),
    [("query", HUGE_EXPONENT), ("form", HUGE_EXPONENT), ("metadata", HUGE_EXPONENT)]
    + [("query", value) for value in ("²", "9" * 5000, "1/0", "nan", "inf", "0x10", " ")],
)
async def test_fps_text_is_refused_without_computing_it(
    start_server: StartServer, where: str, value: str
):
    server = await start_server()
    if where == "query":
        request = server.client.post("/v1/videos", params={"fps": value}, data=BODY)
    elif where == "form":
        form = aiohttp.FormData()
        form.add_field("file", BODY, filename="z.safetensors")
        form.add_field("fps", value)
        request = server.client.post("/v1/videos", data=form)
    else:
        body = safetensors_bytes({"fps": value}, latents=smooth_latents(frames=2))
        request = server.client.post("/v1/videos", data=body)
    async with request as response:
        status, error = await _error(response)
    assert (status, error["type"]) == (422, "invalid_request"), error
    assert error["message"].startswith("fps must be")
    assert len(error["message"]) < 200  # never echoes a megabyte back


async def test_fps_in_a_demo_request_is_bounded_too(start_server: StartServer):
    server = await start_server()
    # A JSON number this large parses to inf; as a string it is the same text as above.
    for fps in (HUGE_EXPONENT, 1e308, [16], {"n": 16}, True):
        body = {"scene": "gradient", "frames": 1, "width": 16, "height": 16, "fps": fps}
        async with server.client.post("/v1/videos", json=body) as response:
            status, error = await _error(response)
        assert (status, error["type"]) == (422, "invalid_request"), (fps, error)


@pytest.mark.parametrize("limit", ["²", "٣", "9" * 5000, "-1", "0", "101", "1e2", ""])
async def test_list_limit_must_be_ascii_digits_in_range(start_server: StartServer, limit: str):
    server = await start_server()
    async with server.client.get("/v1/videos", params={"limit": limit}) as response:
        status, error = await _error(response)
    assert status == 422
    assert error["message"].startswith("limit must be an integer from 1 to 100, got ")


@pytest.mark.parametrize("last_event_id", ["²", "9" * 4000, "-3", "abc"])
async def test_a_bad_last_event_id_starts_a_fresh_event_stream(
    start_server: StartServer, last_event_id: str
):
    server = await start_server()
    async with server.client.post("/v1/videos", data=BODY) as response:
        job = await response.json()
    await asyncio.wait_for(server.manager.get(job["id"]).wait(), 30)
    headers = {"Last-Event-ID": last_event_id}
    async with server.client.get(f"/v1/videos/{job['id']}/events", headers=headers) as response:
        assert response.status == 200
        text = await response.text()
    assert "event: state" in text  # a fresh subscriber's first event


async def test_a_huge_last_event_id_on_a_finished_job_stops_reconnects(
    start_server: StartServer,
):
    server = await start_server()
    async with server.client.post("/v1/videos", data=BODY) as response:
        job = await response.json()
    await asyncio.wait_for(server.manager.get(job["id"]).wait(), 30)
    headers = {"Last-Event-ID": "9" * 30}
    async with server.client.get(f"/v1/videos/{job['id']}/events", headers=headers) as response:
        assert response.status == 204


@pytest.mark.parametrize(
    ("range_header", "status"),
    [
        (f"bytes={'9' * 5000}-", 416),
        (f"bytes=0-{'9' * 5000}", 206),
        (f"bytes=-{'9' * 5000}", 206),
        (f"bytes={'9' * 4000}-{'9' * 4001}", 416),
        ("bytes=²-", 200),  # not a valid range: ignored, the whole file
    ],
    ids=["first", "last", "suffix", "both", "superscript"],
)
async def test_range_numbers_of_any_length(
    start_server: StartServer, range_header: str, status: int
):
    server = await start_server()
    async with server.client.post("/v1/videos", data=BODY) as response:
        job = await response.json()
    await asyncio.wait_for(server.manager.get(job["id"]).wait(), 30)
    size = server.manager.get(job["id"]).log.size
    headers = {"Range": range_header}
    async with server.client.get(f"/v1/videos/{job['id']}/content", headers=headers) as response:
        assert response.status == status
        body = await response.read()
    if status in (200, 206):
        assert len(body) == size


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("seed", 2**63, "seed must be an integer from 0 to 4294967295"),
        ("seed", -1, "seed must be an integer from 0 to 4294967295"),
        ("model", ["tiny"], "model must be a string, got list"),
        ("model", {"name": "tiny"}, "model must be a string, got dict"),
        ("frames", 10**40 + 1, None),
    ],
)
async def test_demo_fields_of_the_wrong_kind_or_size(
    start_server: StartServer, field: str, value: object, message: str | None
):
    server = await start_server()
    body = {"scene": "gradient", "frames": 1, "width": 16, "height": 16, field: value}
    async with server.client.post("/v1/videos", json=body) as response:
        status, error = await _error(response)
    assert 400 <= status < 500, error
    if message is not None:
        assert (status, error["message"]) == (422, message)
    assert server.manager.jobs == {}


async def test_a_demo_is_decoded_with_tiny_whatever_the_default_model(
    start_server: StartServer,
):
    # Demo latents are in tiny's latent space: the linear decoder would show noise.
    server = await start_server(decoders={"linear": GatedDecoder(), "tiny": TinyDecoder()})
    body = {"scene": "gradient", "frames": 5, "width": 32, "height": 32, "sound": False}
    async with server.client.post("/v1/videos", json=body) as response:
        job = await response.json()
    assert (response.status, job["model"]) == (201, "tiny")
    await asyncio.wait_for(server.manager.get(job["id"]).wait(), 60)
    assert server.manager.get(job["id"]).record.status == "completed"


async def test_a_demo_without_tiny_served_says_why(start_server: StartServer):
    server = await start_server()
    body = {"scene": "gradient", "frames": 1, "width": 16, "height": 16, "sound": False}
    async with server.client.post("/v1/videos", json=body) as response:
        status, error = await _error(response)
    assert (status, error["type"]) == (404, "model_not_found")
    assert error["message"] == "model 'tiny' is not served here; this server serves: linear"


async def test_a_demo_too_large_to_render_is_refused_before_rendering(
    start_server: StartServer,
):
    server = await start_server()
    body = {"scene": "gradient", "frames": 141, "width": 1920, "height": 1088}
    async with server.client.post("/v1/videos", json=body) as response:
        status, error = await _error(response)
    assert (status, error["type"]) == (413, "payload_too_large")
    assert error["message"] == (
        "a demo renders at most 32348160 pixels in all (81 frames at 832x480); "
        "141 frames of 1920x1088 is more"
    )


async def test_delete_of_a_finished_job_deletes_it(start_server: StartServer):
    server = await start_server(spill_threshold_bytes=0)
    async with server.client.post("/v1/videos", data=BODY) as response:
        job_id = (await response.json())["id"]
    job = server.manager.get(job_id)
    await asyncio.wait_for(job.wait(), 30)
    spill = job.log.spill_path
    assert spill is not None and spill.exists()
    async with server.client.delete(f"/v1/videos/{job_id}") as response:
        assert response.status == 200
        assert await response.json() == {"id": job_id, "object": "video.deleted", "deleted": True}
    assert not spill.exists() and job.log.memory_bytes == 0
    for path in (f"/v1/videos/{job_id}", f"/v1/videos/{job_id}/content"):
        async with server.client.get(path) as response:
            status, error = await _error(response)
        assert (status, error["message"]) == (
            410,
            f"video {job_id} is no longer kept (deleted by request)",
        )
    async with server.client.delete(f"/v1/videos/{job_id}") as response:
        assert response.status == 410
    async with server.client.get("/metrics") as response:
        assert 'vaecast_jobs_evicted_total{reason="deleted"} 1.0' in await response.text()


async def test_a_queued_stream_cut_by_shutdown_gets_503(start_server: StartServer):
    decoder = GatedDecoder(hold_at=0)
    server = await start_server(decoders={"linear": decoder}, decode_slots=1)
    async with server.client.post("/v1/videos", data=BODY) as response:
        assert response.status == 201
    await asyncio.to_thread(decoder.holding.wait, 30)

    async def queued_stream() -> tuple[int, dict]:
        async with server.client.post("/v1/videos/stream", data=BODY) as response:
            return await _error(response)

    stream = asyncio.create_task(queued_stream())
    await until(lambda: server.manager.queue_depth == 1)
    draining = asyncio.create_task(server.manager.drain(grace_s=0))
    status, error = await asyncio.wait_for(stream, 30)
    decoder.gate.set()
    await asyncio.wait_for(draining, 30)
    assert (status, error) == (
        503,
        {"type": "shutting_down", "message": "server shutting down"},
    )


@pytest.mark.parametrize("name", ["__init__.py", "__pycache__", ".hidden.js", "app.py"])
async def test_only_the_page_assets_are_static(start_server: StartServer, name: str):
    server = await start_server()
    async with server.client.get(f"/static/{name}") as response:
        assert response.status == 404
        assert (await response.json())["error"]["type"] == "not_found"
    async with server.client.get("/static/app.js") as response:
        assert response.status == 200


async def test_a_client_slow_to_send_its_headers_is_cut(start_server: StartServer):
    server = await start_server(header_timeout_s=0.3)
    host, port = server.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
    await writer.drain()
    # Keep trickling: bytes that arrive do not extend the deadline.
    for _ in range(3):
        await asyncio.sleep(0.15)
        if reader.at_eof():
            break
        writer.write(b"a")
        await writer.drain()
    assert await asyncio.wait_for(reader.read(), 10) == b""  # closed, nothing answered
    writer.close()


async def test_a_client_slow_to_send_its_body_gets_408(start_server: StartServer):
    server = await start_server(body_timeout_s=0.3)
    host, port = server.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        b"POST /v1/videos HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000\r\n\r\n" + BODY[:10]
    )
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    body = await asyncio.wait_for(reader.readexactly(length), 10)
    writer.close()
    assert head.startswith(b"HTTP/1.1 408 ")
    assert b"Connection: close" in head  # the rest of the body is not waited for
    assert json.loads(body)["error"] == {
        "type": "request_timeout",
        "message": "no part of the request body arrived for 0.3 s",
    }
    assert server.manager.jobs == {}


async def test_a_chunked_upload_in_odd_pieces_is_read_whole(start_server: StartServer):
    """Transfer-Encoding: chunked, chunks of 1 to 997 bytes written apart: the chunk
    boundaries the body reader sees are not the body's end."""
    server = await start_server()
    latents = smooth_latents(frames=3)
    body = safetensors_bytes(latents=latents)
    host, port = server.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        b"POST /v1/videos HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    offset, sizes = 0, [1, 997, 13, 256, 2]
    while offset < len(body):
        piece = body[offset : offset + sizes[offset % len(sizes)]]
        writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
        await writer.drain()
        offset += len(piece)
    writer.write(b"0\r\n\r\n")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    job = json.loads(await asyncio.wait_for(reader.readexactly(length), 10))
    writer.close()
    assert head.startswith(b"HTTP/1.1 201 "), head
    assert job["frames"] == 9  # the linear decoder: 1 + 4 * 2 frames from 3 latent frames


async def test_empty_bodies_one_after_another_are_each_refused_at_once(start_server):
    """aiohttp hands every empty body the same reader object, which says "end of a
    chunk" for ever once read: the body reader must still see the end each time."""
    server = await start_server()
    for _ in range(3):
        async with asyncio.timeout(10):
            async with server.client.post("/v1/videos/stream", data=b"") as response:
                assert response.status == 422
                assert (await response.json())["error"]["type"] == "invalid_request"


async def test_an_upload_still_arriving_takes_no_decode_place_until_read(
    start_server: StartServer,
):
    """A slow upload holds a pending place, not the decode queue's: a request whose body
    has arrived goes first, and the slow one, once read, finds the queue full."""
    decoder = GatedDecoder(hold_at=0)
    server = await start_server(decoders={"linear": decoder}, decode_slots=1, max_queued_jobs=0)
    host, port = server.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    head = f"POST /v1/videos HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(BODY)}\r\n\r\n"
    writer.write(head.encode() + BODY[:20])
    await writer.drain()
    await until(lambda: server.manager.places.counts()["receiving"] == 1)
    assert server.manager.capacity_left == 1
    async with server.client.post("/v1/videos", data=BODY) as response:
        assert response.status == 201
    # The one decode place is taken now: refused before its body is read.
    demo = {"scene": "gradient", "frames": 1, "width": 16, "height": 16}
    async with server.client.post("/v1/videos", json=demo) as response:
        assert response.status == 429
    writer.write(BODY[20:])
    await writer.drain()
    answer = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
    assert answer.startswith(b"HTTP/1.1 429 ")
    writer.close()
    decoder.gate.set()


async def test_a_refused_upload_gives_its_place_back(start_server: StartServer):
    server = await start_server(decode_slots=1, max_queued_jobs=0)
    for _ in range(3):
        async with server.client.post("/v1/videos", data=b"not a tensor file") as response:
            assert response.status == 415
    assert server.manager.capacity_left == 1
    async with server.client.post("/v1/videos", data=BODY) as response:
        assert response.status == 201


async def test_a_finished_job_lets_go_of_its_latents(start_server: StartServer):
    decoder = GatedDecoder(hold_at=1)
    server = await start_server(decoders={"linear": decoder})
    body = safetensors_bytes(latents=smooth_latents(frames=3))
    async with server.client.post("/v1/videos", data=body) as response:
        job = server.manager.get((await response.json())["id"])
    await asyncio.to_thread(decoder.holding.wait, 30)
    latents = weakref.ref(job.runner._source.latents)  # what the upload became
    decoder.gate.set()
    await asyncio.wait_for(job.wait(), 30)
    gc.collect()
    assert latents() is None
    assert job_object(job.record)["status"] == "completed"  # the job itself is still served


async def test_the_retention_sweep_survives_an_error(start_server: StartServer):
    server = await start_server(retention_s=0.2)
    jobs = []
    for _ in range(2):
        async with server.client.post("/v1/videos", data=BODY) as response:
            jobs.append(server.manager.get((await response.json())["id"]))
        await asyncio.wait_for(jobs[-1].wait(), 30)
    real_release = jobs[0].log.release
    failures = []

    async def failing_release() -> None:
        if not failures:
            failures.append(1)
            raise OSError("the spill file's disk went away (simulated)")
        await real_release()

    jobs[0].log.release = failing_release  # type: ignore[method-assign]
    await until(lambda: not server.manager.jobs, timeout_s=30)
    assert failures == [1]


async def test_loop_lag_is_in_the_metrics(start_server: StartServer):
    server = await start_server()
    await asyncio.sleep(0.35)  # a few 100 ms ticks
    async with server.client.get("/metrics") as response:
        text = await response.text()
    assert "vaecast_event_loop_lag_seconds_bucket" in text
    count = next(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith("vaecast_event_loop_lag_seconds_count")
    )
    assert count >= 2
    assert "vaecast_event_loop_lag_max_seconds " in text


async def test_many_tiny_form_fields_are_refused_without_holding_the_loop(
    start_server: StartServer,
):
    server = await start_server()
    boundary = "vaecastboundary"
    part = f'--{boundary}\r\nContent-Disposition: form-data; name="x"\r\n\r\n1\r\n'
    body = (part * 40_000 + f"--{boundary}--\r\n").encode()
    headers = {"Content-Type": f"multipart/form-data; boundary={boundary}"}
    request = server.client.post("/v1/videos", data=io.BytesIO(body), headers=headers)
    posting = asyncio.create_task(request.__aenter__())
    # Meanwhile the loop answers others.
    while not posting.done():
        async with server.client.get("/healthz") as response:
            assert response.status == 200
        await asyncio.sleep(0.01)
    response = posting.result()
    status, error = await _error(response)
    response.release()
    assert (status, error["type"]) == (400, "bad_request")
    assert "32" in error["message"]


@pytest.mark.parametrize(("line_bytes", "status"), [(9_000, 201), (20_000, 400)])
async def test_long_form_part_header_lines(start_server: StartServer, line_bytes: int, status: int):
    # aiohttp's reader raised past 8,190 bytes and the server answered 500.
    server = await start_server()
    boundary = "vaecastboundary"
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"\r\n'
            f"X-Long: {'a' * line_bytes}\r\n\r\n"
        ).encode()
        + BODY
        + f"\r\n--{boundary}--\r\n".encode()
    )
    headers = {"Content-Type": f"multipart/form-data; boundary={boundary}"}
    async with server.client.post("/v1/videos", data=body, headers=headers) as response:
        assert response.status == status
        answer = await response.json()
    if status == 400:
        assert answer["error"]["message"] == (
            "the part headers are too long: at most 16384 bytes of headers are accepted per part"
        )


async def test_a_declared_shape_over_the_limits_is_refused_as_declared(
    start_server: StartServer,
):
    # F8: converted to float32 this would be 4x the upload; refused on the header.
    server = await start_server(limits=Limits(max_pixels_per_frame=64 * 64))
    latents = torch.zeros(16, 2, 100, 100).to(torch.float8_e4m3fn)
    body = safetensors_bytes(latents=latents)
    async with server.client.post("/v1/videos", data=body) as response:
        status, error = await _error(response)
    assert (status, error["type"]) == (413, "payload_too_large")
    assert "800x800" in error["message"]


async def test_deeply_nested_json_is_a_400(start_server: StartServer):
    server = await start_server()
    body = b"[" * 60_000
    headers = {"Content-Type": "application/json"}
    async with server.client.post("/v1/videos", data=body, headers=headers) as response:
        status, error = await _error(response)
    assert (status, error["type"]) == (400, "bad_request")
    assert error["message"].startswith("the JSON body cannot be parsed")


@pytest.mark.parametrize("encoding", ["gzip", "br", "deflate"])
async def test_a_compressed_body_is_refused_not_inflated(start_server: StartServer, encoding: str):
    # aiohttp would inflate it on the event loop, to any size: a zip bomb's playground.
    server = await start_server()
    headers = {"Content-Encoding": encoding}
    async with server.client.post("/v1/videos", data=b"junk", headers=headers) as response:
        status, error = await _error(response)
    assert (status, error["type"]) == (415, "unsupported_media_type")
    assert error["message"] == (
        f"Content-Encoding '{encoding}' is not accepted; send the file uncompressed"
    )


async def test_a_failed_job_keeps_its_error_without_the_frames_it_was_raised_through(
    start_server: StartServer,
):
    # A traceback kept on a job holds the decode's frames (tensors, requests) in
    # reference cycles that only a full garbage collection frees, pausing the loop.
    from tests.helpers import FailingDecoder

    # (At its first chunk: a job that fails later keeps its video so far, unbroken.)
    server = await start_server(decoders={"linear": FailingDecoder(fail_at=0)})
    async with server.client.post("/v1/videos", data=BODY) as response:
        job = server.manager.get((await response.json())["id"])
    await asyncio.wait_for(job.wait(), 30)
    assert job.record.status == "failed"
    error = job.error
    assert error is not None and error.message.startswith("the decoder failed")
    assert (error.__traceback__, error.__cause__, error.__context__) == (None, None, None)
    async with server.client.get(f"/v1/videos/{job.id}/events") as response:
        assert '"status": "failed"' in await response.text()
    assert job.log.error is not None and job.log.error.__traceback__ is None
