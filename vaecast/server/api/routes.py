"""The jobs API: /v1/videos (the shape of OpenAI's, which vLLM-Omni serves too), its
events, push blocks, /healthz, /metrics and the page. A job's media are the faces'
(`vaecast.server.faces`), which add their own routes."""

from __future__ import annotations

import asyncio
import importlib.resources
import json
import logging
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from vaecast.errors import InvalidRequestError, JobStateError, NotFoundError
from vaecast.job.links import job_urls, with_links
from vaecast.job.transitions import LIVE, Variant
from vaecast.job.views import job_object
from vaecast.params import leading_int, parse_int
from vaecast.server.api.operations import (
    CREATE_VIDEO,
    DELETE_VIDEO,
    GET_EVENTS,
    GET_VIDEO,
    HEALTHZ,
    INDEX,
    LIST_DEFAULT,
    LIST_MAX,
    LIST_VIDEOS,
    METRICS,
    STATIC_ASSET,
)
from vaecast.server.contract.routes import add_contract_routes
from vaecast.server.faces.common import end_response
from vaecast.server.faces.face import FACES, MANAGER
from vaecast.server.intake.live_demo import DEMO_WARM_UP, warm_up_raised, warm_up_state
from vaecast.server.intake.push import PUSH_LATENTS, PushSessions, push_json, push_latents
from vaecast.server.intake.push_batch import open_batch
from vaecast.server.intake.submit import client_of, read_request, submit
from vaecast.server.intake.uploads import MAX_DEMO_FRAME_PIXELS
from vaecast.server.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from vaecast.server.stream.job import BatchRequest, Job, PushRequest
from vaecast.server.stream.manager import JobManager
from vaecast.version import VERSION

log = logging.getLogger("vaecast.http")

PUSH_SESSIONS = web.AppKey("push_sessions", PushSessions)


SSE_RETRY_MS = 2000
# A DELETE ?variant= is answered once that rendition stopped: at its next chunk.
STOP_WAIT_S = 30.0
STATIC_DIR = Path(str(importlib.resources.files("vaecast.static")))
# The page's assets by name: the folder is also a Python package, whose other files
# (__init__.py, caches) are nobody's business.
STATIC_SUFFIXES = frozenset({".html", ".js", ".css"})


def add_routes(app: web.Application) -> None:
    app.router.add_get("/", index)
    app.router.add_get("/static/{name}", static_asset)
    app.router.add_post("/v1/videos", create_video)
    app.router.add_get("/v1/videos", list_videos)
    app.router.add_get("/v1/videos/{video_id}", get_video)
    app.router.add_delete("/v1/videos/{video_id}", delete_video)
    app.router.add_get("/v1/videos/{video_id}/events", get_events)
    app.router.add_post("/v1/videos/{video_id}/latents", post_latents)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics)
    add_contract_routes(app)


@INDEX
async def index(request: web.Request) -> web.FileResponse:
    return web.FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})


@STATIC_ASSET
async def static_asset(request: web.Request) -> web.FileResponse:
    name = request.match_info["name"]
    path = STATIC_DIR / name
    if (
        Path(name).suffix not in STATIC_SUFFIXES
        or name.startswith(".")
        or path.parent != STATIC_DIR
        # FileResponse's own 404 for a missing file would be empty, not the JSON error.
        or not await asyncio.to_thread(path.is_file)
    ):
        raise NotFoundError(f"no static asset {name[:80]!r}")
    headers = {"Cache-Control": "no-cache"}
    if path.suffix == ".js":  # module scripts need a JavaScript type, whatever the OS's table
        headers["Content-Type"] = "text/javascript; charset=utf-8"
    # FileResponse stats and reads in a thread.
    return web.FileResponse(path, headers=headers)


@LIST_VIDEOS
async def list_videos(request: web.Request) -> web.Response:
    """The most recent jobs first: `?limit=N` (default 20, at most 100)."""
    limit = parse_int(request.query.get("limit", str(LIST_DEFAULT)), "limit", 1, LIST_MAX)
    manager = request.app[MANAGER]
    jobs = list(manager.jobs.values())[::-1][:limit]
    return web.json_response({"object": "list", "data": [job_json(job, manager) for job in jobs]})


@CREATE_VIDEO
async def create_video(request: web.Request) -> web.Response:
    manager = request.app[MANAGER]
    with manager.admit(client_of(request)) as admission:  # before reading an upload for nothing
        decode_request = await read_request(request, manager)
        if isinstance(decode_request, BatchRequest):  # a job per video, in order
            jobs = admission.submit_batch(decode_request.videos)
            data = [job_json(job, manager) for job in jobs]
            return web.json_response({"object": "list", "data": data}, status=201)
        if isinstance(decode_request, PushRequest) and decode_request.batch > 1:
            jobs = admission.submit_batch([decode_request] * decode_request.batch)
            batch = open_batch(request.app[PUSH_SESSIONS], jobs)
            data = [job_json(job, manager) for job in jobs]
            body = {"object": "list", "data": data, "push": push_json(batch)}
            return web.json_response(body, status=201)
        job = submit(admission, decode_request)
    body = job_json(job, manager)
    if isinstance(decode_request, PushRequest):  # where to push, and the secret to do it
        body["push"] = push_json(request.app[PUSH_SESSIONS].open(job))
    return web.json_response(body, status=201, headers={"Location": job_urls(job.id)["self"]})


@PUSH_LATENTS
async def post_latents(request: web.Request) -> web.Response:
    return await push_latents(request, request.app[PUSH_SESSIONS])


@GET_VIDEO
async def get_video(request: web.Request) -> web.Response:
    manager = request.app[MANAGER]
    return web.json_response(job_json(manager.get(request.match_info["video_id"]), manager))


def job_json(job: Job, manager: JobManager) -> dict[str, Any]:
    """The job object of the API: the job's own state, its queue place, its URLs, and
    its live viewers as the server pictures their playout."""
    body = with_links(job_object(job.record), manager.queue_position(job))
    body["viewers"] = job.playouts.summary(time.perf_counter())
    return body


@DELETE_VIDEO
async def delete_video(request: web.Request) -> web.Response:
    """Cancel a queued or running job (it stays, cancelled); delete a finished one.

    As in OpenAI's videos API, DELETE of a finished video deletes it: its bytes are
    freed and its id answers 410 from then on. A cancelled job keeps the video it made
    so far as a file (`partial`), unless `?keep=false`: "an incomplete file anyway, so
    that we can check the computed frames". `?variant=final` (or `preview`) of a
    running job with a preview stops that rendition only: "the preview looks wrong,
    stop the full decode" keeps the preview; answered once it has stopped. The live
    rendition follows the other two and is not stopped on its own (422).
    """
    manager = request.app[MANAGER]
    job = manager.get(request.match_info["video_id"])
    variant = request.query.get("variant")
    keep = _keep(request.query.get("keep"))
    if variant is not None:
        return await _stop_variant(job, variant, manager)
    if not job.record.is_final:
        job.cancel("cancelled by request", keep_partial=keep)
        await job.wait()
        return web.json_response(job_json(job, manager))
    await manager.delete(job)
    return web.json_response({"id": job.id, "object": "video.deleted", "deleted": True})


def _keep(text: str | None) -> bool:
    if text is None or text == "true":
        return True
    if text == "false":
        return False
    raise InvalidRequestError(f"keep is true or false, got {text[:40]!r}")


async def _stop_variant(job: Job, variant: Variant, manager: JobManager) -> web.Response:
    rendition = job.rendition(variant)  # 404 for a preview the job does not have
    if rendition.variant == LIVE:
        raise InvalidRequestError(
            "the live rendition decodes nothing of its own (each chunk is its preview's or "
            "its final's): DELETE ?variant=final or ?variant=preview, or the job"
        )
    if job.preview is None:
        raise InvalidRequestError(
            f"video {job.id} has one rendition: DELETE it without ?variant to cancel it"
        )
    if job.record.is_final:
        raise JobStateError(f"video {job.id} has ended: {job.record.status.value}")
    job.cancel_variant(variant, f"the {variant} rendition was stopped by request")
    # Answered once it has stopped (at its next chunk), as a DELETE of the job is.
    async with asyncio.timeout(STOP_WAIT_S):
        while not (job.record.is_final or rendition.log.closed):
            await job.events.wait_for(len(job.events.items()) + 1)
    return web.json_response(job_json(job, manager))


@GET_EVENTS
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
    headers = {
        "Content-Type": "text/event-stream",
        "Cache-Control": "no-store",
        "X-Accel-Buffering": "no",  # nginx: do not buffer the stream
    }
    response = web.StreamResponse(headers=headers)
    await response.prepare(request)
    if request.method == "HEAD":
        # The headers alone: aiohttp sends what a HEAD's stream writes, unframed, and on
        # a keep-alive connection the next answer would start inside those events.
        return response
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
            if (
                job.record.is_final
            ):  # no end is told before it is committed (an answer is a promise)
                await manager.settle()
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
    await end_response(response)
    return response


def _sse(event: str, event_id: int, data: dict[str, Any]) -> bytes:
    return f"event: {event}\nid: {event_id}\ndata: {json.dumps(data)}\n\n".encode()


@HEALTHZ
async def healthz(request: web.Request) -> web.Response:
    """Liveness (any answer) and readiness (200 only while jobs are admitted and would
    not fail as the warm-up did)."""
    manager = request.app[MANAGER]
    warm_up = request.app.get(DEMO_WARM_UP)
    # A warm-up that raised met what every job would: not ready, though not draining.
    failing = warm_up_raised(warm_up)
    store_failing = manager.durable.store.failing if manager.durable is not None else None
    ready = not manager.draining and not failing and store_failing is None
    status = (
        "draining"
        if manager.draining
        else "failing"
        if failing or store_failing is not None
        else "ok"
    )
    body: dict[str, Any] = {
        "status": status,
        "ready": ready,
        "version": VERSION,
        "models": sorted(manager.decoders),
        # What one request may ask for (413 past it): the page offers only what fits.
        "limits": {
            "max_frames": manager.config.limits.max_frames,
            "max_pixels_per_frame": manager.config.limits.max_pixels_per_frame,
            "max_upload_bytes": manager.config.limits.max_upload_bytes,
            "max_demo_pixels": MAX_DEMO_FRAME_PIXELS,
        },
        "jobs": len(manager.jobs),
        "queue": {"depth": manager.queue_depth, "max": manager.config.max_queued_jobs},
        "decode_slots": manager.config.decode_slots,
        # Requests being read and unfinished jobs, by kind (stream.admission).
        "places": {
            **{kind.value: count for kind, count in manager.places.counts().items()},
            "max_pending": manager.config.max_pending,
            "max_pending_per_client": manager.config.max_pending_per_client,
        },
        # The first demo click is as fast as later ones once this is `done`.
        "warm_up": warm_up_state(warm_up),
    }
    for face in request.app[FACES]:  # what each face says of itself (WHEP: its viewers)
        face_health = face.health()
        if face_health is not None:
            body[face.name] = face_health
    if manager.durable is not None:  # --store: whether it can write, and if not why
        body["store"] = "ok" if store_failing is None else "failing"
        if store_failing is not None:
            body["store_error"] = store_failing
    replicas = manager.replica_health()
    if replicas is not None:  # Ray mode: the decoder replicas (count, healthy, by state)
        body["replicas"] = replicas
    return web.json_response(body, status=200 if ready else 503)


@METRICS
async def metrics(request: web.Request) -> web.Response:
    body = request.app[MANAGER].metrics.exposition()
    return web.Response(body=body, headers={"Content-Type": METRICS_CONTENT_TYPE})
