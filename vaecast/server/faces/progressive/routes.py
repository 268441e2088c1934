"""The progressive face's routes: a job's MP4 as it grows (`GET .../content`), and
latents in, their MP4 out, in one request (`POST /v1/videos/stream`).

`content.py` has the rules of what a request gets; here is the HTTP plumbing and
what each route promises (its `@operation`, which /openapi.json is made of).
"""

from __future__ import annotations

from aiohttp import web

from vaecast.errors import (
    CancelledByShutdown,
    DecodeCancelled,
    InvalidRequestError,
    JobStateError,
)
from vaecast.server.contract.shared import (
    ACCEPT_RANGES,
    CACHE_CONTROL,
    CONTENT_ERRORS,
    CONTENT_RANGE,
    CONTENT_VARIANT,
    ETAG,
    IF_NONE_MATCH,
    IMAGE_FORMAT,
    JPEG,
    MP4,
    MP4_BODY,
    PARTIAL,
    RANGE,
    RANGE_NOT_SATISFIABLE,
    SPRITESHEET_LAYOUT,
    STILL_FRAME,
    UPLOAD_BODY,
    UPLOAD_ERRORS,
    UPLOAD_PARAMS,
    VIDEO_ID,
    VIDEO_ID_HEADER,
    WEBP,
)
from vaecast.server.contract.spec import Reply, not_a_route, operation
from vaecast.server.faces.face import CONTENT_VARIANTS, MANAGER
from vaecast.server.faces.progressive.content import send_content, send_stream
from vaecast.server.intake.submit import client_of, read_request, submit
from vaecast.server.stream.job import BatchRequest, PushRequest

STREAM_VIDEO = operation(
    "Decode latents; the answer is their MP4, as it is encoded",
    tag="content",
    description="One video per request, its job gone with its client: the body is the "
    "fragmented MP4, chunked, each fragment sent as it is encoded. A failure after the "
    "headers cuts the connection (a truncated transfer). Push sessions and batches are "
    "POSTed to /v1/videos instead (422).",
    params=UPLOAD_PARAMS,
    body=UPLOAD_BODY,
    replies=(
        Reply(
            200,
            "the MP4, chunked",
            {MP4: MP4_BODY},
            {"X-Video-Id": VIDEO_ID_HEADER, "Cache-Control": CACHE_CONTROL},
        ),
    ),
    errors=(*UPLOAD_ERRORS, JobStateError, DecodeCancelled, CancelledByShutdown),
)
GET_CONTENT = operation(
    "A job's MP4: progressive while it decodes, then a file (Range, ETag)",
    tag="content",
    description="While the job runs: 200 and the MP4 as it grows (chunked), or 206 for "
    "committed bytes (`Content-Range: bytes a-b/*`); a range past them waits for them. "
    "Once complete: a plain file with a length, an ETag, ranges and 304. A failed or "
    "cancelled job that kept its video so far serves it so, with `X-Video-Partial: true`. "
    "`?variant=thumbnail|spritesheet`: an image of the video so far, from its first "
    "fragment on (a request before it waits), which changes as the video grows "
    "(`no-cache`, a strong ETag: 304 until it changes) and is final once it is complete.",
    params=(VIDEO_ID, CONTENT_VARIANT, IMAGE_FORMAT, RANGE, IF_NONE_MATCH),
    replies=(
        Reply(
            200,
            "the whole MP4 (growing, or finished), or the still asked for",
            {
                MP4: MP4_BODY,
                WEBP: {"type": "string", "contentMediaType": WEBP},
                JPEG: {"type": "string", "contentMediaType": JPEG},
            },
            {
                "ETag": ETAG,
                "Accept-Ranges": ACCEPT_RANGES,
                "Cache-Control": CACHE_CONTROL,
                "X-Video-Partial": PARTIAL,
                "X-Still-Frame": STILL_FRAME,
                "X-Spritesheet": SPRITESHEET_LAYOUT,
            },
        ),
        Reply(
            206,
            "the bytes of the range",
            {MP4: MP4_BODY},
            {"Content-Range": CONTENT_RANGE, "ETag": ETAG, "Accept-Ranges": ACCEPT_RANGES},
        ),
        Reply(304, "the ETag matches", {}, {"ETag": ETAG}),
    ),
    errors=(*CONTENT_ERRORS, RANGE_NOT_SATISFIABLE),
)


def add_progressive_routes(app: web.Application) -> None:
    stream = app.router.add_resource("/v1/videos/stream")
    stream.add_route("POST", stream_video)
    # Not the video with id "stream": any other method is 405, `Allow: POST`, as JSON.
    stream.add_route("*", post_only)
    app.router.add_get("/v1/videos/{video_id}/content", get_content)


@GET_CONTENT
async def get_content(request: web.Request) -> web.StreamResponse:
    """The MP4, growing or finished (`content.py` has the rules), or a kind of content
    another face serves (`?variant=thumbnail`, say)."""
    job = request.app[MANAGER].get(request.match_info["video_id"])
    served_elsewhere = request.app.get(CONTENT_VARIANTS, {}).get(request.query.get("variant", ""))
    if served_elsewhere is not None:
        return await served_elsewhere(request, job)
    return await send_content(request, job)


@STREAM_VIDEO
async def stream_video(request: web.Request) -> web.StreamResponse:
    """Upload latents; the response body is the progressive MP4 of their decode."""
    manager = request.app[MANAGER]
    with manager.admit(client_of(request)) as admission:  # before reading an upload for nothing
        decode_request = await read_request(request, manager)
        if isinstance(decode_request, PushRequest):
            raise InvalidRequestError(
                "a push session is created with POST /v1/videos; its viewers use /content"
            )
        if isinstance(decode_request, BatchRequest):
            raise InvalidRequestError(
                f"one response streams one video; these latents hold "
                f"{len(decode_request.videos)}: POST them to /v1/videos for a job each"
            )
        job = submit(admission, decode_request)
    try:
        return await send_stream(request, job, extra_headers={"X-Video-Id": job.id})
    finally:
        # This job has no other audience: if its one client left, stop decoding.
        if not job.record.is_final:
            job.cancel("the client disconnected", keep_partial=False)


@not_a_route
async def post_only(request: web.Request) -> web.Response:
    raise web.HTTPMethodNotAllowed(request.method, ["POST"])
