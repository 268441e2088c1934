"""`?variant=thumbnail` and `?variant=spritesheet` of `GET /v1/videos/{id}/content`.

What a request gets: the still of the job's video as far as its log goes now, made
from its final rendition's fragments (`codecs.stills` says which frames and why from
the fragments). A request before the first fragment waits for it, as a request for
the MP4 waits for its first bytes; a job that failed or was cancelled without keeping
its video so far is refused (409) as its MP4 is. While the video grows, the answer is
`Cache-Control: no-cache` with a strong ETag of the image (revalidate: 304 until the
next fragment changes it); once the video is complete, the still is final and cached
as the finished MP4 is.
"""

from __future__ import annotations

import functools

from aiohttp import web

from vaecast.codecs.stills import (
    THUMBNAIL_FORMATS,
    Still,
    VideoUnits,
    make_spritesheet,
    make_thumbnail,
)
from vaecast.errors import InvalidRequestError, JobStateError, VaecastError
from vaecast.server.edge.http_ranges import etag_matches
from vaecast.server.faces.common import refuse_if_broken, wait_for_init
from vaecast.server.faces.stills.cache import StillCache
from vaecast.server.stream.job import Job

THUMBNAIL = "thumbnail"
SPRITESHEET = "spritesheet"
PARTIAL_HEADER = "X-Video-Partial"
FRAME_HEADER = "X-Still-Frame"
LAYOUT_HEADER = "X-Spritesheet"


def still_kind(request: web.Request) -> str:
    """What the request asks for: `thumbnail.webp`, `thumbnail.jpeg` or `spritesheet`."""
    variant = request.query["variant"]
    image_format = request.query.get("format")
    if variant == SPRITESHEET:
        if image_format not in (None, "jpeg"):
            raise InvalidRequestError("a spritesheet is a JPEG: format must be 'jpeg' or left out")
        return SPRITESHEET
    image_format = image_format or "webp"
    if image_format not in THUMBNAIL_FORMATS:
        raise InvalidRequestError(
            f"format must be one of {', '.join(THUMBNAIL_FORMATS)}, not {image_format[:40]!r}"
        )
    return f"{THUMBNAIL}.{image_format}"


async def send_still(request: web.Request, job: Job, cache: StillCache) -> web.StreamResponse:
    kind = still_kind(request)
    log = job.final.log
    refuse_if_broken(job)
    await wait_for_init(job)
    try:
        await log.wait_for_segments(2)  # the first fragment, or the log's end
    except VaecastError:
        refuse_if_broken(job)
        raise
    refuse_if_broken(job)
    segments, complete = len(log), log.complete
    if segments < 2:
        raise JobStateError(f"video {job.id} has no frames")

    async def read() -> list[bytes]:
        return [await log.read_segment(index) for index in range(segments)]

    made = await cache.get((job.id, kind), segments, complete, read, functools.partial(_make, kind))
    headers = {
        "Content-Type": made.still.media_type,
        "ETag": made.etag,
        # While the video grows, the still changes with it: ask each time (a 304 is cheap).
        "Cache-Control": "private, max-age=3600" if complete else "no-cache",
    }
    if job.record.partial:
        headers[PARTIAL_HEADER] = "true"
    if made.still.frame is not None:
        headers[FRAME_HEADER] = str(made.still.frame)
    if made.still.layout is not None:
        headers[LAYOUT_HEADER] = made.still.layout.header()
    if etag_matches(request.headers.get("If-None-Match"), made.etag):
        return web.Response(status=304, headers=headers)
    return web.Response(body=made.still.data, headers=headers)


def _make(kind: str, segments: list[bytes]) -> Still:
    """On the stills thread: the still `kind` of the video these segments hold."""
    video = VideoUnits(segments[0], segments[1:])
    if kind == SPRITESHEET:
        return make_spritesheet(video)
    return make_thumbnail(video, kind.removeprefix(f"{THUMBNAIL}."))
