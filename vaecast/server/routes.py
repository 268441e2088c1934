"""HTTP routes: the /v1/videos API (the shape of OpenAI's, which vLLM-Omni serves too)."""

from __future__ import annotations

import logging

from aiohttp import web

from vaecast.errors import JobStateError, VaecastError
from vaecast.server.jobs import Job, JobManager, JobStatus
from vaecast.server.uploads import read_decode_request

log = logging.getLogger("vaecast.http")

MANAGER = web.AppKey("manager", JobManager)


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/videos", create_video)
    app.router.add_post("/v1/videos/stream", stream_video)
    app.router.add_get("/v1/videos/{video_id}", get_video)
    app.router.add_delete("/v1/videos/{video_id}", cancel_video)
    app.router.add_get("/v1/videos/{video_id}/content", get_content)
    app.router.add_get("/healthz", healthz)


async def create_video(request: web.Request) -> web.Response:
    manager = request.app[MANAGER]
    job = manager.submit(await read_decode_request(request, manager.config))
    return web.json_response(
        job.to_json(), status=201, headers={"Location": f"/v1/videos/{job.id}"}
    )


async def get_video(request: web.Request) -> web.Response:
    job = request.app[MANAGER].get(request.match_info["video_id"])
    return web.json_response(job.to_json())


async def cancel_video(request: web.Request) -> web.Response:
    job = request.app[MANAGER].get(request.match_info["video_id"])
    job.cancel("cancelled by request")
    await job.wait()
    return web.json_response(job.to_json())


async def get_content(request: web.Request) -> web.StreamResponse:
    job = request.app[MANAGER].get(request.match_info["video_id"])
    if job.status in (JobStatus.FAILED, JobStatus.CANCELLED):
        assert job.error is not None
        raise JobStateError(
            f"video {job.id} has no content: {job.status.value}: {job.error.message}"
        )
    return await _send_stream(request, job)


async def stream_video(request: web.Request) -> web.StreamResponse:
    """Upload latents; the response body is the progressive MP4 of their decode."""
    manager = request.app[MANAGER]
    job = manager.submit(await read_decode_request(request, manager.config))
    try:
        return await _send_stream(request, job, extra_headers={"X-Video-Id": job.id})
    finally:
        # This job has no other audience: if its one client left, stop decoding.
        if not job.finished:
            job.cancel("the client disconnected")


async def _send_stream(
    request: web.Request, job: Job, extra_headers: dict[str, str] | None = None
) -> web.StreamResponse:
    """Write the job's MP4 as it grows; cut the connection if the job breaks midway.

    A finished job is sent with its Content-Length; a running one with chunked
    transfer. An error after the headers cannot change the status, so the
    connection is closed without the terminating chunk: clients see a truncated
    transfer, and the job object says why.
    """
    await _wait_for_init_segment(job)
    response = web.StreamResponse(
        headers={
            "Content-Type": job.content_type,
            "Cache-Control": "private, max-age=3600" if job.log.complete else "no-store",
            **(extra_headers or {}),
        }
    )
    if job.log.complete:
        response.content_length = job.log.size
    else:
        response.enable_chunked_encoding()
    await response.prepare(request)
    try:
        async for segment in job.log.follow():
            await response.write(segment)
    except VaecastError as error:
        log.info("stream of %s cut: %s", job.id, error.message)
        if request.transport is not None:
            request.transport.close()
        return response
    except ConnectionResetError:
        log.info("viewer of %s left", job.id)
        return response
    await response.write_eof()
    return response


async def _wait_for_init_segment(job: Job) -> None:
    """The Content-Type names the codec, which is known once the init segment exists."""
    async for _ in job.log.follow():
        return
    # A log that closed empty: the job failed before it could start encoding.


async def healthz(request: web.Request) -> web.Response:
    manager = request.app[MANAGER]
    return web.json_response(
        {"status": "ok", "models": sorted(manager.decoders), "jobs": len(manager.jobs)}
    )
