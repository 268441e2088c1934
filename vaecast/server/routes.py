"""HTTP routes: the /v1/videos API (the shape of OpenAI's, which vLLM-Omni serves too)."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.resources
import json
import logging
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from aiohttp import web

from vaecast.errors import InvalidRequestError, JobStateError, NotFoundError, VaecastError
from vaecast.params import leading_int, parse_int
from vaecast.server.http_errors import error_response
from vaecast.server.http_ranges import ByteRange, Unsatisfiable, etag_matches, parse_range
from vaecast.server.job import DecodeRequest, Job, JobStatus, PushRequest
from vaecast.server.live_demo import LiveDemoRequest, start_producer
from vaecast.server.manager import Admission, JobManager
from vaecast.server.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from vaecast.server.push import PushSessions, push_json, push_latents
from vaecast.server.uploads import read_decode_request

log = logging.getLogger("vaecast.http")

MANAGER = web.AppKey("manager", JobManager)
PUSH_SESSIONS = web.AppKey("push_sessions", PushSessions)


LIST_DEFAULT = 20
LIST_MAX = 100
SSE_RETRY_MS = 2000
STATIC_DIR = Path(str(importlib.resources.files("vaecast.static")))
# The page's assets by name: the folder is also a Python package, whose other files
# (__init__.py, caches) are nobody's business.
STATIC_SUFFIXES = frozenset({".html", ".js", ".css"})


def add_routes(app: web.Application) -> None:
    app.router.add_get("/", index)
    app.router.add_get("/static/{name}", static_asset)
    app.router.add_post("/v1/videos", create_video)
    app.router.add_get("/v1/videos", list_videos)
    app.router.add_post("/v1/videos/stream", stream_video)
    app.router.add_get("/v1/videos/{video_id}", get_video)
    app.router.add_delete("/v1/videos/{video_id}", delete_video)
    app.router.add_get("/v1/videos/{video_id}/content", get_content)
    app.router.add_get("/v1/videos/{video_id}/events", get_events)
    app.router.add_post("/v1/videos/{video_id}/latents", post_latents)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics)


async def index(request: web.Request) -> web.FileResponse:
    return web.FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})


async def static_asset(request: web.Request) -> web.FileResponse:
    name = request.match_info["name"]
    path = STATIC_DIR / name
    if (
        Path(name).suffix not in STATIC_SUFFIXES
        or name.startswith(".")
        or path.parent != STATIC_DIR
    ):
        raise NotFoundError(f"no static asset {name[:80]!r}")
    headers = {"Cache-Control": "no-cache"}
    if path.suffix == ".js":  # module scripts need a JavaScript type, whatever the OS's table
        headers["Content-Type"] = "text/javascript; charset=utf-8"
    # FileResponse stats and reads in a thread, and answers 404 for a missing file.
    return web.FileResponse(path, headers=headers)


async def list_videos(request: web.Request) -> web.Response:
    """The most recent jobs first: `?limit=N` (default 20, at most 100)."""
    limit = parse_int(request.query.get("limit", str(LIST_DEFAULT)), "limit", 1, LIST_MAX)
    manager = request.app[MANAGER]
    jobs = list(manager.jobs.values())[::-1][:limit]
    return web.json_response({"object": "list", "data": [job_json(job, manager) for job in jobs]})


async def create_video(request: web.Request) -> web.Response:
    manager = request.app[MANAGER]
    with manager.admit() as admission:  # before reading a large upload for nothing
        decode_request = await read_decode_request(
            request, manager.config, manager.check_latent_shape
        )
        job = _submit(admission, decode_request)
    body = job_json(job, manager)
    if isinstance(decode_request, PushRequest):  # where to push, and the secret to do it
        body["push"] = push_json(request.app[PUSH_SESSIONS].open(job))
    return web.json_response(body, status=201, headers={"Location": job_urls(job.id)["self"]})


def _submit(admission: Admission, request: DecodeRequest | PushRequest | LiveDemoRequest) -> Job:
    if isinstance(request, LiveDemoRequest):
        job = admission.submit(request.session())
        start_producer(job, request)
        return job
    return admission.submit(request)


async def post_latents(request: web.Request) -> web.Response:
    return await push_latents(request, request.app[PUSH_SESSIONS])


async def get_video(request: web.Request) -> web.Response:
    manager = request.app[MANAGER]
    return web.json_response(job_json(manager.get(request.match_info["video_id"]), manager))


def job_urls(job_id: str) -> dict[str, str]:
    base = f"/v1/videos/{job_id}"
    return {"self": base, "content": f"{base}/content", "events": f"{base}/events"}


def job_json(job: Job, manager: JobManager) -> dict[str, Any]:
    """The job object of the API: the job's own state, its queue place and its URLs."""
    return with_links(job.to_json(), manager.queue_position(job))


def with_links(job_object: dict[str, Any], queue_position: int | None = None) -> dict[str, Any]:
    return {**job_object, "queue_position": queue_position, "urls": job_urls(job_object["id"])}


async def delete_video(request: web.Request) -> web.Response:
    """Cancel a queued or running job (it stays, cancelled); delete a finished one.

    As in OpenAI's videos API, DELETE of a finished video deletes it: its bytes are
    freed and its id answers 410 from then on.
    """
    manager = request.app[MANAGER]
    job = manager.get(request.match_info["video_id"])
    if not job.finished:
        job.cancel("cancelled by request")
        await job.wait()
        return web.json_response(job_json(job, manager))
    await manager.delete(job)
    return web.json_response({"id": job.id, "object": "video.deleted", "deleted": True})


async def get_content(request: web.Request) -> web.StreamResponse:
    """The MP4: progressive while decoding, then a plain file (Range, ETag, HEAD).

    While the video grows only the whole of it can be streamed: no range, or
    `Range: bytes=0-` (Chromium's first request for a media URL), gets 200 and the
    growing stream; any other range waits for the decode to finish, then gets 206.
    """
    job = request.app[MANAGER].get(request.match_info["video_id"])
    _refuse_if_broken(job)
    range_header = request.headers.get("Range")
    if not job.log.complete and range_header and not _FROM_START.match(range_header):
        await job.wait()  # to the end of the decode, without reading what it wrote
        _refuse_if_broken(job)
    if job.log.complete:
        return await _send_file(request, job)
    return await _send_stream(request, job)


_FROM_START = re.compile(r"^\s*bytes\s*=\s*0\s*-\s*$", re.IGNORECASE)


def _refuse_if_broken(job: Job) -> None:
    if job.status in (JobStatus.FAILED, JobStatus.CANCELLED):
        assert job.error is not None
        raise JobStateError(
            f"video {job.id} has no content: {job.status.value}: {job.error.message}"
        )


async def stream_video(request: web.Request) -> web.StreamResponse:
    """Upload latents; the response body is the progressive MP4 of their decode."""
    manager = request.app[MANAGER]
    with manager.admit() as admission:  # before reading a large upload for nothing
        decode_request = await read_decode_request(
            request, manager.config, manager.check_latent_shape
        )
        if isinstance(decode_request, PushRequest):
            raise InvalidRequestError(
                "a push session is created with POST /v1/videos; its viewers use /content"
            )
        job = _submit(admission, decode_request)
    try:
        return await _send_stream(request, job, extra_headers={"X-Video-Id": job.id})
    finally:
        # This job has no other audience: if its one client left, stop decoding.
        if not job.finished:
            job.cancel("the client disconnected")


async def _send_file(request: web.Request, job: Job) -> web.StreamResponse:
    size = job.log.size
    etag = f'"{job.id}-{size}"'
    headers = {
        "Content-Type": job.content_type,
        "Accept-Ranges": "bytes",
        "ETag": etag,
        "Cache-Control": "private, max-age=3600",
    }
    if etag_matches(request.headers.get("If-None-Match"), etag):
        return web.Response(status=304, headers=headers)
    try:
        byte_range = parse_range(request.headers.get("Range"), size)
    except Unsatisfiable:
        response = error_response(416, "range_not_satisfiable", f"the video has {size} bytes")
        response.headers["Content-Range"] = f"bytes */{size}"
        return response
    response = web.StreamResponse(headers=headers)
    if byte_range is None:
        byte_range = ByteRange(0, size - 1)
    else:
        response.set_status(206)
        response.headers["Content-Range"] = byte_range.content_range(size)
    response.content_length = byte_range.length
    await response.prepare(request)
    if request.method != "HEAD":
        await _write_parts(
            request, response, job, job.log.read_range(byte_range.first, byte_range.last)
        )
    return response


async def _send_stream(
    request: web.Request, job: Job, extra_headers: dict[str, str] | None = None
) -> web.StreamResponse:
    """Write the job's MP4 as it grows; cut the connection if the job breaks midway.

    An error after the headers cannot change the status, so the connection is
    closed without the terminating chunk: clients see a truncated transfer, and the
    job object says why.
    """
    await job.log.wait_for_init()  # the Content-Type names the codec: known from then on
    response = web.StreamResponse(
        headers={
            "Content-Type": job.content_type,
            "Cache-Control": "no-store",
            **(extra_headers or {}),
        }
    )
    response.enable_chunked_encoding()
    await response.prepare(request)
    if request.method != "HEAD":
        await _write_parts(request, response, job, job.log.follow())
    return response


async def _write_parts(
    request: web.Request, response: web.StreamResponse, job: Job, parts: AsyncIterator[bytes]
) -> None:
    """Write `parts` to one viewer; drop only that viewer if it stalls or leaves."""
    metrics = request.app[MANAGER].metrics
    timeout_s = request.app[MANAGER].config.reader_write_timeout_s
    try:
        async with job.viewer(), contextlib.aclosing(parts):
            async for part in parts:
                await asyncio.wait_for(response.write(part), timeout_s)
                metrics.bytes_sent.inc(len(part))
    except VaecastError as error:
        log.info("stream of %s cut: %s", job.id, error.message)
        _cut(request)
        return
    except TimeoutError:
        log.info("viewer of %s dropped: nothing read for %g s", job.id, timeout_s)
        metrics.readers_dropped.inc()
        _cut(request)
        return
    except ConnectionError:  # reset, or lost while waiting for the socket to drain
        log.info("viewer of %s left", job.id)
        return
    await _end_response(response)


def _cut(request: web.Request) -> None:
    """Close the connection without ending the response: the client sees it truncated."""
    if request.transport is not None:
        request.transport.close()


async def get_events(request: web.Request) -> web.StreamResponse:
    """Server-sent events: `state` (the job so far), then queued/started/chunk/done/error.

    Each event's id is its index in the job's event log, so a reconnecting
    EventSource (Last-Event-ID) resumes where it left off; a reconnect after the
    final event gets 204, which tells EventSource to stop reconnecting.
    """
    manager = request.app[MANAGER]
    job = manager.get(request.match_info["video_id"])
    last_id = leading_int(request.headers.get("Last-Event-ID", ""))
    resuming = last_id is not None
    start = min(last_id + 1, len(job.events)) if last_id is not None else len(job.events)
    if resuming and job.events.closed and start >= len(job.events):
        return web.Response(status=204)
    response = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-store",
            "X-Accel-Buffering": "no",  # nginx: do not buffer the stream
        }
    )
    await response.prepare(request)
    await response.write(f"retry: {SSE_RETRY_MS}\n\n".encode())
    if not resuming:
        await response.write(_sse("state", start - 1, job_json(job, manager)))
    keepalive_s = manager.config.events_keepalive_s
    events = job.events.follow(start)
    index = start
    next_event: asyncio.Future[dict[str, Any]] | None = None
    try:
        while True:
            next_event = next_event or asyncio.ensure_future(anext(events))
            done, _ = await asyncio.wait({next_event}, timeout=keepalive_s)
            if not done:
                await response.write(b": keep-alive\n\n")
                continue
            try:
                event = next_event.result()
            except StopAsyncIteration:
                break
            next_event = None
            if "job" in event:  # the job object as the API shows it, links included
                event = {**event, "job": with_links(event["job"])}
            await response.write(_sse(event["event"], index, event))
            index += 1
    except ConnectionError:
        return response
    finally:
        if next_event is not None and not next_event.done():
            next_event.cancel()  # the cancel ends the generator too, as it propagates out
        else:
            if next_event is not None and not next_event.cancelled():
                next_event.exception()  # looked at: the end of the events, or nothing
            await events.aclose()
    await _end_response(response)
    return response


async def _end_response(response: web.StreamResponse) -> None:
    """Write the end of a response whose client may already have gone (and that is fine)."""
    with contextlib.suppress(ConnectionError):
        await response.write_eof()


def _sse(event: str, event_id: int, data: dict[str, Any]) -> bytes:
    return f"event: {event}\nid: {event_id}\ndata: {json.dumps(data)}\n\n".encode()


async def healthz(request: web.Request) -> web.Response:
    """Liveness (any answer) and readiness (200 only while jobs are admitted)."""
    manager = request.app[MANAGER]
    ready = not manager.draining
    return web.json_response(
        {
            "status": "ok" if ready else "draining",
            "ready": ready,
            "models": sorted(manager.decoders),
            "jobs": len(manager.jobs),
            "queue": {"depth": manager.queue_depth, "max": manager.config.max_queued_jobs},
            "decode_slots": manager.config.decode_slots,
        },
        status=200 if ready else 503,
    )


async def metrics(request: web.Request) -> web.Response:
    body = request.app[MANAGER].metrics.exposition()
    return web.Response(body=body, headers={"Content-Type": METRICS_CONTENT_TYPE})
