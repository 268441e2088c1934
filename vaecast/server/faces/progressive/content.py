"""A job's MP4 over HTTP (`GET /v1/videos/{id}/content`), growing or finished.

While the job decodes, the MP4 goes out as it grows (200, chunked), and a range gets
the bytes committed so far (206 with `/*`: the complete length is not known yet);
once the job is complete, the MP4 is a plain file: length, ETag, ranges, HEAD, 304.
A job that failed or was cancelled after its first fragment keeps its video so far as
such a file, which `X-Video-Partial: true` marks (`Job.end_keeping_partial`).
Every body is read from the job's segment log, the only copy of the video.

A job with a preview has two renditions (`?variant=preview|final`, final by
default, so a client that knows nothing of previews gets the video it always did):
each is an MP4 of its own, with its own log, broadcast, ETag and end.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import web

from vaecast.errors import VaecastError
from vaecast.job.record import FINAL
from vaecast.server.config import Limits
from vaecast.server.edge.http_errors import error_response
from vaecast.server.edge.http_ranges import (
    ByteRange,
    Unsatisfiable,
    etag_matches,
    growing_range,
    parse_range,
)
from vaecast.server.faces.common import end_response, refuse_if_broken, rendition_of, wait_for_init
from vaecast.server.faces.progressive.broadcast import BROADCAST
from vaecast.server.stream.job import Job, JobStatus, Rendition

log = logging.getLogger("vaecast.http")

PARTIAL_HEADER = "X-Video-Partial"
FACE = "progressive"  # its viewers' playouts are labelled so
BROKEN = (JobStatus.FAILED, JobStatus.CANCELLED)


async def send_content(request: web.Request, job: Job) -> web.StreamResponse:
    """The MP4: progressive while decoding, then a plain file (Range, ETag, HEAD).

    While the job runs (`http_ranges.growing_range` has the rules and the RFC's reasons):
    - no Range, one that is ignored, or `bytes=0-` (Chromium's first request for a media
      URL): 200 and the whole MP4 as it grows;
    - a range within the committed bytes: at once, 206 with `Content-Range: bytes a-b/*`.
      `bytes=N-` gets N to the current end: no `Content-Range` can describe a 206 whose
      end is not known yet, so a client that follows the growth asks again from there;
    - a range past the committed bytes waits for them, for as long as the job runs: a
      closed range for its last byte, `bytes=N-` for byte N, a suffix `bytes=-N` for the
      job's end (its end is unknown until then). A job that completes meanwhile answers
      as a finished file (206 with the real length, or 416), as does one that fails or
      is cancelled keeping its video so far; one that ends without, 409 like any
      request for its content;
    - `bytes=-0`, which no length can satisfy, and a first byte past what any video of
      this server can reach (`max_video_bytes`): 416 at once.
    """
    rendition = rendition_of(request, job)
    log = rendition.log
    while not log.complete:
        refuse_if_broken(job, rendition)
        try:
            bound = max_video_bytes(job.config.limits)
            plan = growing_range(request.headers.get("Range"), log.size, bound)
        except Unsatisfiable:  # no end of the video could satisfy it: said at once
            return error_response(416, "range_not_satisfiable", "the range selects no bytes")
        if plan is None:
            return await send_stream(request, job, rendition=rendition)
        if isinstance(plan, ByteRange):
            return await _send_committed(request, job, rendition, plan)
        # A log that breaks meanwhile is refused at the top, as any request for it.
        with contextlib.suppress(VaecastError):
            await log.wait_for_size(plan.size)
    return await _send_file(request, job, rendition)


# Bytes a video's MP4 may take, at most: per frame, H.264's worst case (a lossless
# 4:2:0 frame is 1.5 bytes a pixel; 4 is generous) and each sample's headers, and the
# sound of one frame at the slowest rate (1 fps: a second of 8-channel AAC at its
# largest frame size, ~1.2 MB, rounded up); plus the init segment.
_MAX_BYTES_PER_PIXEL = 4
_MAX_BYTES_PER_FRAME = 64 * 1024 + 2 * 1024 * 1024
_MAX_INIT_BYTES = 1024 * 1024


def max_video_bytes(limits: Limits) -> int:
    """The size no MP4 this server makes can reach, by its limits: a range that starts
    there can never be satisfied."""
    per_frame = limits.max_pixels_per_frame * _MAX_BYTES_PER_PIXEL + _MAX_BYTES_PER_FRAME
    return limits.max_frames * per_frame + _MAX_INIT_BYTES


async def _send_committed(
    request: web.Request, job: Job, rendition: Rendition, byte_range: ByteRange
) -> web.StreamResponse:
    """Bytes of a running job that are already in its log: 206, length unknown (`/*`)."""
    response = web.StreamResponse(
        status=206,
        headers={
            "Content-Type": job.record.content_type,
            "Accept-Ranges": "bytes",
            "Cache-Control": "no-store",  # the representation is still growing
            "Content-Range": byte_range.content_range(None),
        },
    )
    response.content_length = byte_range.length
    await response.prepare(request)
    if request.method != "HEAD":
        await _write_parts(
            request, response, job, rendition.log.read_range(byte_range.first, byte_range.last)
        )
    return response


async def _send_file(request: web.Request, job: Job, rendition: Rendition) -> web.StreamResponse:
    size = rendition.log.size
    # The final's ETag is the one a job without a preview has (and had before one).
    variant = "" if rendition.variant == FINAL else f"-{rendition.variant}"
    etag = f'"{job.id}{variant}-{size}"'
    headers = {
        "Content-Type": job.record.content_type,
        "Accept-Ranges": "bytes",
        "ETag": etag,
        "Cache-Control": "private, max-age=3600",
    }
    if rendition.variant == FINAL and job.record.partial:
        headers[PARTIAL_HEADER] = "true"  # a failed or cancelled job's video so far
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
            request, response, job, rendition.log.read_range(byte_range.first, byte_range.last)
        )
    return response


async def send_stream(
    request: web.Request,
    job: Job,
    extra_headers: dict[str, str] | None = None,
    rendition: Rendition | None = None,
) -> web.StreamResponse:
    """Write the job's MP4 as it grows; cut the connection if the job breaks midway.

    Caught up, the viewer is one of the log's broadcast members (`broadcast.py`): each
    new segment is sent to all of them in one batch. An error after the headers
    cannot change the status, so the connection is closed without the terminating
    chunk: clients see a truncated transfer, and the job object says why.
    """
    rendition = rendition or job.final
    await wait_for_init(job, rendition)  # the Content-Type names the codec: known from then on
    response = web.StreamResponse(
        headers={
            "Content-Type": job.record.content_type,
            "Cache-Control": "no-store",
            **(extra_headers or {}),
        }
    )
    response.enable_chunked_encoding()
    writer = await response.prepare(request)
    if request.method != "HEAD":
        broadcast, log = rendition.attached(BROADCAST), rendition.log
        if broadcast is None:
            raise RuntimeError("a rendition made before the progressive face started")
        timeout_s = job.config.reader_write_timeout_s

        viewers = job.playouts
        playout = viewers.open(FACE, time.perf_counter())
        ends = broadcast.media_ends

        def written(count: int, at: float) -> None:  # its playout, told what it was sent
            viewers.sent(playout, ends[count - 1], at)

        playout.sync = functools.partial(broadcast.tell, written)

        async def follow() -> None:
            try:
                await broadcast.follow(log, response, writer, timeout_s, written)
            finally:
                viewers.close(playout)
            # A job that failed or was cancelled may keep its video so far as a file
            # (its log then ends whole), but a viewer who followed it live is told it
            # ended short: cut, as a broken log's viewers are.
            error = job.error_of(rendition)
            if job.status_of(rendition) in BROKEN and error is not None:
                raise error.detached()

        await _serve_viewer(request, response, job, follow)
    return response


async def _write_parts(
    request: web.Request, response: web.StreamResponse, job: Job, parts: AsyncIterator[bytes]
) -> None:
    """Write `parts` to one viewer; drop only that viewer if it stalls or leaves."""

    async def write_all() -> None:
        metrics = job.metrics
        timeout_s = job.config.reader_write_timeout_s
        async with contextlib.aclosing(parts):
            async for part in parts:
                # A timeout scope, not wait_for: wait_for wraps each write in a task of
                # its own, one more loop turn per part before its bytes reach the socket.
                async with asyncio.timeout(timeout_s):
                    await response.write(part)
                metrics.bytes_sent.inc(len(part))

    await _serve_viewer(request, response, job, write_all)


async def _serve_viewer(
    request: web.Request,
    response: web.StreamResponse,
    job: Job,
    body: Callable[[], Awaitable[None]],
) -> None:
    """Run `body` (one viewer's writes) and end the response; cut it if the log broke,
    drop the viewer if it took nothing for `reader_write_timeout_s`."""
    timeout_s = job.config.reader_write_timeout_s
    try:
        async with job.viewer():
            await body()
            # The terminating chunk waits for the socket to drain: bounded like a write.
            async with asyncio.timeout(timeout_s):
                await end_response(response)
    except VaecastError as error:
        log.info("stream of %s cut: %s", job.id, error.message)
        _cut(request)
    except TimeoutError:
        log.info("viewer of %s dropped: nothing read for %g s", job.id, timeout_s)
        job.metrics.readers_dropped.inc()
        _cut(request)
    except ConnectionError:  # reset, or lost while waiting for the socket to drain
        log.info("viewer of %s left", job.id)


def _cut(request: web.Request) -> None:
    """Close the connection without ending the response: the client sees it truncated."""
    if request.transport is not None:
        request.transport.close()
