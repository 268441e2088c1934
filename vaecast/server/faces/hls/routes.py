"""HLS routes: a job's playlist and its media, served from the job's segment log.

- `GET /v1/videos/{id}/playlist.m3u8`: the LL-HLS media playlist (`playlist.py`), for
  running and finished jobs alike. `_HLS_msn`/`_HLS_part` make it a blocking
  reload: answered once that part is in the playlist (or the job ended), 400 when the
  segment asked for is too far ahead. A plain request (no `_HLS_msn`) for a rendition
  with no complete segment yet waits, bounded, until it has one: a player that reads
  whole segments only (FFmpeg, VLC) can open the playlist the instant a job exists, and
  hls.js gets a playlist to play at once instead of an empty one it polls again a target
  duration later.
- `GET .../hls/init.mp4`, `.../hls/part/{n}.m4s`, `.../hls/segment/{k}.m4s`: the init
  segment, fragment n, and the fragments of segment k, read from the log. A part that
  does not exist yet (the playlist's preload hint) is answered when it does.
- The same under `/v1/videos/{id}/preview/` for a job's preview rendition (a job with
  a preview decoder), and under `/v1/videos/{id}/live/` for its live rendition: a
  media playlist of its own, its media relative to it.
- `GET /v1/videos/{id}/master.m3u8`: the multivariant playlist, listing the final
  rendition (and the live one and the preview, ranked below it by `SCORE`), less one
  that failed or was stopped. It waits, bounded, for the init segment, which names the CODECS every
  variant must carry.

A rendition that failed or was stopped answers its playlist, init and parts as its
`/content` does: 409 with the reason; the job's `plays` lists the renditions that do
play.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Sequence

from aiohttp import web

from vaecast.errors import MalformedRequestError, NotFoundError, VaecastError
from vaecast.job.record import FINAL, FINAL_STATUSES, LIVE, PREVIEW
from vaecast.job.transitions import Variant as JobVariant
from vaecast.params import leading_int
from vaecast.server.contract.shared import (
    CACHE_CONTROL,
    CONTENT_ERRORS,
    M3U8,
    MEDIA_NUMBER,
    MP4,
    MP4_BODY,
    VIDEO_ID,
)
from vaecast.server.contract.spec import Param, Reply, operation
from vaecast.server.faces.common import end_response, refuse_if_broken, wait_for_init
from vaecast.server.faces.face import MANAGER
from vaecast.server.faces.hls.playlist import (
    MEDIA_TYPE,
    Part,
    Variant,
    has_complete_segment,
    listed_parts,
    media_playlist,
    multivariant_playlist,
    part_position,
    segments,
    too_far_ahead,
)
from vaecast.server.stream.job import Job, Rendition

MEDIA_NUMBER_TEXT = re.compile(r"[0-9]{1,9}")
# A blocking request waits at most this many target durations, then gets what exists
# (the specification asks for an answer within three).
BLOCK_TARGET_DURATIONS = 3
# A part or segment never changes once it exists.
CACHE_FINISHED = "max-age=3600"
PLAYLIST_TEXT = {"type": "string", "pattern": "^#EXTM3U"}
HLS_NUMBER = {"type": "integer", "minimum": 0, "maximum": 999_999_999}
PLAYLIST = operation(
    "A rendition's LL-HLS media playlist",
    tag="hls",
    description="`_HLS_msn` (and `_HLS_part`) make it a blocking reload: answered once "
    "that part is listed or the rendition ended, at most three target durations later. "
    "A plain request waits likewise until the playlist lists a complete segment. A "
    "rendition that failed or was stopped is 409, as its content is.",
    params=(
        VIDEO_ID,
        Param("_HLS_msn", "query", HLS_NUMBER, "wait for this media sequence number"),
        Param("_HLS_part", "query", HLS_NUMBER, "and this part of it (needs _HLS_msn)"),
    ),
    replies=(Reply(200, "the playlist", {M3U8: PLAYLIST_TEXT}, {"Cache-Control": CACHE_CONTROL}),),
    errors=(*CONTENT_ERRORS, MalformedRequestError),
)
MASTER = operation(
    "A job's multivariant playlist (its final rendition, and its preview)",
    tag="hls",
    description="It lists the renditions that play (the job's `plays`); 409 when none does.",
    params=(VIDEO_ID,),
    replies=(Reply(200, "the playlist", {M3U8: PLAYLIST_TEXT}, {"Cache-Control": CACHE_CONTROL}),),
    errors=CONTENT_ERRORS,
)
INIT = operation(
    "A rendition's init segment",
    tag="hls",
    params=(VIDEO_ID,),
    replies=(Reply(200, "the init segment (ftyp, moov)", {MP4: MP4_BODY}),),
    errors=CONTENT_ERRORS,
)
PART = operation(
    "One part (a fragment) of a rendition, answered once it exists",
    tag="hls",
    params=(VIDEO_ID, MEDIA_NUMBER),
    replies=(Reply(200, "the fragment (moof, mdat)", {MP4: MP4_BODY}),),
    errors=CONTENT_ERRORS,
)
SEGMENT = operation(
    "One complete segment of a rendition: its parts' fragments",
    tag="hls",
    params=(VIDEO_ID, MEDIA_NUMBER),
    replies=(Reply(200, "the segment's fragments", {MP4: MP4_BODY}),),
    errors=CONTENT_ERRORS,
)


def add_hls_routes(app: web.Application) -> None:
    base = "/v1/videos/{video_id}"
    _add_rendition_routes(app, FINAL, base)
    _add_rendition_routes(app, PREVIEW, f"{base}/{PREVIEW}")
    _add_rendition_routes(app, LIVE, f"{base}/{LIVE}")

    @MASTER
    async def master(request: web.Request) -> web.Response:
        job = request.app[MANAGER].get(request.match_info["video_id"])
        async with _blocking(job):  # CODECS come from the init segment
            await job.final.log.wait_for_init()
        playing = [rendition for rendition in reversed(job.renditions) if _plays(job, rendition)]
        if not playing:
            refuse_if_broken(job)  # the final's error: it is what the job ended with
        variants = [_variant(job, rendition) for rendition in playing]
        return web.Response(
            text=multivariant_playlist(variants),
            content_type=MEDIA_TYPE,
            headers={"Cache-Control": "no-cache"},
        )

    app.router.add_get(f"{base}/master.m3u8", master)


def _add_rendition_routes(app: web.Application, variant: JobVariant, prefix: str) -> None:
    """One rendition's playlist, init segment, parts and segments under `prefix`."""

    def found(request: web.Request) -> tuple[Job, Rendition]:
        job = request.app[MANAGER].get(request.match_info["video_id"])
        return job, job.rendition(variant)

    @PLAYLIST
    async def playlist(request: web.Request) -> web.Response:
        job, rendition = found(request)
        return await _playlist_answer(request, job, rendition)

    @INIT
    async def init(request: web.Request) -> web.StreamResponse:
        job, rendition = found(request)
        await wait_for_init(job, rendition)
        # A running rendition's init segment is rewritten once it finishes, to state
        # its duration (`finished_file`): kept by a cache only from then on.
        cache = CACHE_FINISHED if rendition.log.complete else "no-cache"
        return await _send_segments(request, job, rendition, [0], cache)

    @PART
    async def part(request: web.Request) -> web.StreamResponse:
        job, rendition = found(request)
        index = _media_number(request)
        await _until_parts(job, rendition, index + 1)
        if index >= len(rendition.fragments):
            # A job that failed first: its error, as for /content.
            refuse_if_broken(job, rendition)
            raise NotFoundError(f"video {job.id} has no part {index}")
        return await _send_segments(request, job, rendition, [index + 1])

    @SEGMENT
    async def segment(request: web.Request) -> web.StreamResponse:
        job, rendition = found(request)
        number = _media_number(request)
        grouped = segments(_listed(job, rendition), _ended(job, rendition))
        if number >= len(grouped) or not grouped[number].complete:
            raise NotFoundError(f"video {job.id} has no complete segment {number}")
        chosen = grouped[number]
        first = chosen.first_part + 1  # log segment 0 is the init segment
        indexes = list(range(first, first + len(chosen.parts)))
        return await _send_segments(request, job, rendition, indexes)

    app.router.add_get(f"{prefix}/playlist.m3u8", playlist)
    app.router.add_get(f"{prefix}/hls/init.mp4", init)
    app.router.add_get(f"{prefix}/hls/part/{{number}}.m4s", part)
    app.router.add_get(f"{prefix}/hls/segment/{{number}}.m4s", segment)


async def _playlist_answer(request: web.Request, job: Job, rendition: Rendition) -> web.Response:
    """The media playlist, once what the request waits for is listed (a blocking
    reload's `_HLS_msn`/`_HLS_part`), or once a player can start (a plain request)."""
    msn = _hls_number(request, "_HLS_msn")
    part = _hls_number(request, "_HLS_part")
    if part is not None and msn is None:
        raise MalformedRequestError("_HLS_part needs _HLS_msn")
    if msn is not None:
        if too_far_ahead(_listed(job, rendition), _ended(job, rendition), msn):
            raise MalformedRequestError(
                f"_HLS_msn={msn} is more than two segments past the playlist's last"
            )
        await _until_listed(job, rendition, msn, part)
    else:
        await _until_playable(job, rendition)
    # A rendition that failed or was stopped has no media to list: its error, as for
    # its /content and its parts (the job's other rendition may play). A whole file (an
    # interrupted job's kept fragments) plays, as its /content.
    if not rendition.log.complete:
        refuse_if_broken(job, rendition)
    return web.Response(
        text=_playlist_text(job, rendition),
        content_type=MEDIA_TYPE,
        headers={"Cache-Control": "no-cache"},
    )


def _plays(job: Job, rendition: Rendition) -> bool:
    """Whether the rendition's content is served: a whole file (an interrupted job's
    kept fragments too), or what the job's `plays` says while its bytes are kept."""
    log = rendition.log
    return log.complete or (rendition.variant in job.record.plays() and log.error is None)


def _ended(job: Job, rendition: Rendition) -> bool:
    """The rendition will have no more parts (the job may go on: its other one)."""
    return job.status_of(rendition) in FINAL_STATUSES or job.record.is_final


def _variant(job: Job, rendition: Rendition) -> Variant:
    """A rendition as the multivariant playlist lists it."""
    size = job.record.plan or job.record.geometry
    parts = rendition.fragments.facts
    seconds = sum(part.duration_s for part in parts)
    measured = rendition.log.size * 8 / seconds if seconds > 0 else None
    uri = "playlist.m3u8" if rendition.variant == FINAL else f"{rendition.variant}/playlist.m3u8"
    return Variant(
        uri=uri,
        name=rendition.variant,
        codecs=_codecs(job.record.content_type),
        width=None if size is None else size.width,
        height=None if size is None else size.height,
        fps=float(job.record.fps),
        bits_per_second=measured,
        score=_SCORES[rendition.variant],
    )


# The final is the best picture; the live rendition the best that never stalls.
_SCORES = {FINAL: 2.0, LIVE: 1.5, PREVIEW: 1.0}


def _codecs(content_type: str) -> str | None:
    """`avc1.640028,mp4a.40.2` from `video/mp4; codecs="avc1.640028, mp4a.40.2"`."""
    match = re.search(r'codecs="([^"]+)"', content_type)
    return None if match is None else ",".join(c.strip() for c in match.group(1).split(","))


def _part_target_s(job: Job, rendition: Rendition) -> float:
    """The longest chunk the rendition's decoder makes, in seconds."""
    longest_chunk = 4  # frames, until the job knows its chunks
    if job.plan is not None:
        longest_chunk = max(job.plan.chunk_frames)
    elif job.stream_plan is not None:  # a push session: its length is not known yet
        longest_chunk = max(job.stream_plan.first_chunk_frames, job.stream_plan.chunk_frames)
    part_target_s = float(longest_chunk / job.record.fps)
    if rendition.variant != FINAL or (
        job.plan is None and job.stream_plan is None and job.record.is_final
    ):
        # A preview's chunks are its own decoder's; a job restored from the store
        # knows its chunks only by its parts. The longest so far bounds them.
        part_target_s = max([part_target_s, *(f.duration_s for f in rendition.fragments.facts)])
    return part_target_s


def _listed(job: Job, rendition: Rendition) -> Sequence[Part]:
    """The parts the rendition's playlist lists now (`hls.listed_parts`): none once its
    log broke (a failed or cancelled job whose bytes are not kept: `/content` refuses
    it too), so that the playlist names no media that would not be served."""
    if rendition.log.error is not None:
        return []
    parts = rendition.fragments.facts
    return listed_parts(parts, _ended(job, rendition), _part_target_s(job, rendition))


def _playlist_text(job: Job, rendition: Rendition) -> str:
    return media_playlist(
        _listed(job, rendition),
        ended=_ended(job, rendition),
        target_duration_s=job.config.encoder.keyframe_interval_s,
        part_target_s=_part_target_s(job, rendition),
    )


async def _until_playable(job: Job, rendition: Rendition) -> None:
    """Until the rendition has a complete segment (its first two parts, the second
    starting with an IDR), or has ended."""
    async with _blocking(job):
        while not has_complete_segment(_listed(job, rendition), _ended(job, rendition)):
            if _ended(job, rendition) or rendition.log.closed:
                return
            await _parts(job, rendition, len(rendition.fragments) + 1)


async def _until_listed(job: Job, rendition: Rendition, msn: int, part: int | None) -> None:
    """Until segment `msn` (its part `part`) is in the playlist, or the rendition has
    ended. Asked again after each part: for a segment not yet begun, "one more part"
    is only the least it needs."""
    async with _blocking(job):
        while True:
            needed = part_position(_listed(job, rendition), _ended(job, rendition), msn, part)
            if needed is None or _ended(job, rendition):
                return
            # A part that exists may not be listed yet (`listed_parts`): then one more.
            await _parts(job, rendition, max(needed, len(rendition.fragments) + 1))


async def _until_parts(job: Job, rendition: Rendition, count: int) -> None:
    """Until the rendition has `count` parts or has ended."""
    async with _blocking(job):
        await _parts(job, rendition, count)


@contextlib.asynccontextmanager
async def _blocking(job: Job) -> AsyncIterator[None]:
    """A blocking request's wait: at most a few target durations, and a log that breaks
    ends it (what the job has is answered, its end shown)."""
    timeout_s = BLOCK_TARGET_DURATIONS * max(1.0, job.config.encoder.keyframe_interval_s)
    with contextlib.suppress(TimeoutError, VaecastError):
        async with asyncio.timeout(timeout_s):
            yield


async def _parts(job: Job, rendition: Rendition, count: int) -> None:
    fragments = rendition.fragments
    # A closed log has all its parts, whether or not its job has said it ended yet.
    while len(fragments) < count and not (_ended(job, rendition) or rendition.log.closed):
        await rendition.log.wait_for_segments(len(fragments) + 2)


async def _send_segments(
    request: web.Request,
    job: Job,
    rendition: Rendition,
    indexes: list[int],
    cache: str = CACHE_FINISHED,
) -> web.StreamResponse:
    """Log segments `indexes`, in order, as one MP4 body."""
    log = rendition.log
    if log.released:
        raise NotFoundError(f"video {job.id} is no longer kept")
    response = web.StreamResponse(headers={"Content-Type": "video/mp4", "Cache-Control": cache})
    response.content_length = sum(log.segment_size(i) for i in indexes)
    await response.prepare(request)
    if request.method != "HEAD":
        try:
            async with job.viewer():
                for index in indexes:
                    await response.write(await log.read_segment(index))
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
    if not MEDIA_NUMBER_TEXT.fullmatch(text):
        raise NotFoundError(f"no media {text[:20]!r}")
    return int(text)
