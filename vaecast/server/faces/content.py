"""A job's MP4 over HTTP (`GET /v1/videos/{id}/content`), growing or finished.

While the job decodes, the MP4 goes out as it grows (200, chunked), and a range gets
the bytes committed so far (206 with `/*`: the complete length is not known yet);
once the job is complete, the MP4 is a plain file: length, ETag, ranges, HEAD, 304.
Every body is read from the job's segment log, the only copy of the video.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import web

from vaecast.errors import JobStateError, VaecastError
from vaecast.server.edge.http_errors import error_response
from vaecast.server.edge.http_ranges import (
    ByteRange,
    Unsatisfiable,
    etag_matches,
    growing_range,
    parse_range,
)
from vaecast.server.stream.job import Job, JobStatus

log = logging.getLogger("vaecast.http")


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
      as a finished file (206 with the real length, or 416); one that fails or is
      cancelled, 409 like any request for its content;
    - `bytes=-0`, which no length can satisfy: 416 at once.
    """
    while not job.log.complete:
        refuse_if_broken(job)
        try:
            plan = growing_range(request.headers.get("Range"), job.log.size)
        except Unsatisfiable:  # no end of the video could satisfy it: said at once
            return error_response(416, "range_not_satisfiable", "the range selects no bytes")
        if plan is None:
            return await send_stream(request, job)
        if isinstance(plan, ByteRange):
            return await _send_committed(request, job, plan)
        # A log that breaks meanwhile is refused at the top, as any request for it.
        with contextlib.suppress(VaecastError):
            await job.log.wait_for_size(plan.size)
    return await _send_file(request, job)


def refuse_if_broken(job: Job) -> None:
    """Refuse a request for the content of a job that failed or was cancelled (409,
    naming the job's error), or whose bytes are gone."""
    if job.status in (JobStatus.FAILED, JobStatus.CANCELLED):
        assert job.error is not None
        raise JobStateError(
            f"video {job.id} has no content: {job.status.value}: {job.error.message}"
        )
    if job.log.error is not None:  # its bytes are gone (evicted, shut down)
        raise job.log.error.detached()


async def _send_committed(
    request: web.Request, job: Job, byte_range: ByteRange
) -> web.StreamResponse:
    """Bytes of a running job that are already in its log: 206, length unknown (`/*`)."""
    response = web.StreamResponse(
        status=206,
        headers={
            "Content-Type": job.content_type,
            "Accept-Ranges": "bytes",
            "Cache-Control": "no-store",  # the representation is still growing
            "Content-Range": byte_range.content_range(None),
        },
    )
    response.content_length = byte_range.length
    await response.prepare(request)
    if request.method != "HEAD":
        await _write_parts(
            request, response, job, job.log.read_range(byte_range.first, byte_range.last)
        )
    return response


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


async def send_stream(
    request: web.Request, job: Job, extra_headers: dict[str, str] | None = None
) -> web.StreamResponse:
    """Write the job's MP4 as it grows; cut the connection if the job breaks midway.

    Caught up, the viewer is one of the log's broadcast members (`broadcast.py`): each
    new segment is sent to all of them in one batch. An error after the headers
    cannot change the status, so the connection is closed without the terminating
    chunk: clients see a truncated transfer, and the job object says why.
    """
    await wait_for_init(job)  # the Content-Type names the codec: known from then on
    response = web.StreamResponse(
        headers={
            "Content-Type": job.content_type,
            "Cache-Control": "no-store",
            **(extra_headers or {}),
        }
    )
    response.enable_chunked_encoding()
    writer = await response.prepare(request)
    if request.method != "HEAD":
        broadcast = job.broadcast
        timeout_s = job.config.reader_write_timeout_s
        await _serve_viewer(
            request,
            response,
            job,
            lambda: broadcast.follow(job.log, response, writer, timeout_s),
        )
    return response


async def wait_for_init(job: Job) -> None:
    """Until the job's init segment exists. A job that fails without one is refused as
    any request for a failed job's content (409 naming its error), not with its error's
    own status: a push session's producer that timed out (408) is no fault of its
    viewer. A cancelled job's error stays as it is (503 for a shutdown: try elsewhere)."""
    try:
        await job.log.wait_for_init()
    except VaecastError:
        if job.status is JobStatus.FAILED:
            refuse_if_broken(job)
        raise


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


async def end_response(response: web.StreamResponse) -> None:
    """Write the end of a response whose client may already have gone (and that is fine)."""
    with contextlib.suppress(ConnectionError):
        await response.write_eof()


def _cut(request: web.Request) -> None:
    """Close the connection without ending the response: the client sees it truncated."""
    if request.transport is not None:
        request.transport.close()
