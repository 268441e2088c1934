"""HLS routes: a job's playlist and its media, served from the job's segment log.

- `GET /v1/videos/{id}/playlist.m3u8`: the LL-HLS media playlist (vaecast.server.faces.hls),
  for running and finished jobs alike. `_HLS_msn`/`_HLS_part` make it a blocking
  reload: answered once that part is in the playlist (or the job ended), 400 when the
  segment asked for is too far ahead.
- `GET .../hls/init.mp4`, `.../hls/part/{n}.m4s`, `.../hls/segment/{k}.m4s`: the init
  segment, fragment n, and the fragments of segment k, read from the log. A part that
  does not exist yet (the playlist's preload hint) is answered when it does.
"""

from __future__ import annotations

import asyncio
import contextlib
import re

from aiohttp import web

from vaecast.errors import MalformedRequestError, NotFoundError, VaecastError
from vaecast.params import leading_int
from vaecast.server.faces.content import end_response, refuse_if_broken, wait_for_init
from vaecast.server.faces.hls import (
    MEDIA_TYPE,
    media_playlist,
    part_position,
    segments,
    too_far_ahead,
)
from vaecast.server.stream.job import Job, JobStatus
from vaecast.server.stream.manager import JobManager

MEDIA_NUMBER = re.compile(r"[0-9]{1,9}")
# A blocking request waits at most this many target durations, then gets what exists
# (the specification asks for an answer within three).
BLOCK_TARGET_DURATIONS = 3


def add_hls_routes(app: web.Application, manager_key: web.AppKey[JobManager]) -> None:
    def manager(request: web.Request) -> JobManager:
        return request.app[manager_key]

    async def playlist(request: web.Request) -> web.Response:
        job = manager(request).get(request.match_info["video_id"])
        msn = _hls_number(request, "_HLS_msn")
        part = _hls_number(request, "_HLS_part")
        if part is not None and msn is None:
            raise MalformedRequestError("_HLS_part needs _HLS_msn")
        if msn is not None:
            if too_far_ahead(job.parts.parts, job.finished, msn):
                raise MalformedRequestError(
                    f"_HLS_msn={msn} is more than two segments past the playlist's last"
                )
            await _until_listed(job, msn, part)
        return web.Response(
            text=_playlist_text(job),
            content_type=MEDIA_TYPE,
            headers={"Cache-Control": "no-cache"},
        )

    async def init(request: web.Request) -> web.StreamResponse:
        job = manager(request).get(request.match_info["video_id"])
        await wait_for_init(job)
        return await _send_segments(request, job, [0])

    async def part(request: web.Request) -> web.StreamResponse:
        job = manager(request).get(request.match_info["video_id"])
        index = _media_number(request)
        await _until_parts(job, index + 1)
        if index >= len(job.parts.parts):
            refuse_if_broken(job)  # a job that failed first: its error, as for /content
            raise NotFoundError(f"video {job.id} has no part {index}")
        return await _send_segments(request, job, [index + 1])

    async def segment(request: web.Request) -> web.StreamResponse:
        job = manager(request).get(request.match_info["video_id"])
        number = _media_number(request)
        grouped = segments(job.parts.parts, job.finished)
        if number >= len(grouped) or not grouped[number].complete:
            raise NotFoundError(f"video {job.id} has no complete segment {number}")
        chosen = grouped[number]
        first = chosen.first_part + 1  # log segment 0 is the init segment
        return await _send_segments(request, job, list(range(first, first + len(chosen.parts))))

    base = "/v1/videos/{video_id}"
    app.router.add_get(f"{base}/playlist.m3u8", playlist)
    app.router.add_get(f"{base}/hls/init.mp4", init)
    app.router.add_get(f"{base}/hls/part/{{number}}.m4s", part)
    app.router.add_get(f"{base}/hls/segment/{{number}}.m4s", segment)


def _playlist_text(job: Job) -> str:
    settings = job.config.encoder
    longest_chunk = 4  # frames, until the job knows its chunks
    if job.plan is not None:
        longest_chunk = max(job.plan.chunk_frames)
    elif job.stream_plan is not None:  # a push session: its length is not known yet
        longest_chunk = max(job.stream_plan.first_chunk_frames, job.stream_plan.chunk_frames)
    part_target_s = float(longest_chunk / job.fps)
    if job.plan is None and job.stream_plan is None and job.finished and job.parts.parts:
        # A job restored from the store: its parts are all it knows of its chunks.
        part_target_s = max(part.duration_s for part in job.parts.parts)
    return media_playlist(
        job.parts.parts,
        finished=job.status is JobStatus.COMPLETED,
        ended_early=job.finished and job.status is not JobStatus.COMPLETED,
        target_duration_s=settings.keyframe_interval_s,
        part_target_s=part_target_s,
    )


async def _until_listed(job: Job, msn: int, part: int | None) -> None:
    needed = part_position(job.parts.parts, job.finished, msn, part)
    if needed is not None:
        await _until_parts(job, needed)


async def _until_parts(job: Job, count: int) -> None:
    """Until the job has `count` parts or has ended; bounded by a few target durations."""
    timeout_s = BLOCK_TARGET_DURATIONS * max(1.0, job.config.encoder.keyframe_interval_s)
    # A log that breaks ends the wait: what the job has is answered, its end shown.
    with contextlib.suppress(TimeoutError, VaecastError):
        async with asyncio.timeout(timeout_s):
            while len(job.parts.parts) < count and not job.finished:
                await job.log.wait_for_segments(len(job.parts.parts) + 2)


async def _send_segments(request: web.Request, job: Job, indexes: list[int]) -> web.StreamResponse:
    """Log segments `indexes`, in order, as one MP4 body."""
    if job.log.released:
        raise NotFoundError(f"video {job.id} is no longer kept")
    response = web.StreamResponse(
        headers={"Content-Type": "video/mp4", "Cache-Control": "max-age=3600"}
    )
    response.content_length = sum(job.log.segment_size(i) for i in indexes)
    await response.prepare(request)
    if request.method != "HEAD":
        try:
            async with job.viewer():
                for index in indexes:
                    await response.write(await job.log.read_segment(index))
        except ConnectionError:  # the player left (it often does, between parts)
            return response
    await end_response(response)
    return response


def _hls_number(request: web.Request, name: str) -> int | None:
    text = request.query.get(name)
    if text is None:
        return None
    value = leading_int(text)
    if value is None:
        raise MalformedRequestError(f"{name} must be a non-negative integer")
    return value


def _media_number(request: web.Request) -> int:
    text = request.match_info["number"]
    if not MEDIA_NUMBER.fullmatch(text):
        raise NotFoundError(f"no media {text[:20]!r}")
    return int(text)
