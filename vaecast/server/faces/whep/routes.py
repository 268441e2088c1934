"""WHEP (draft-ietf-wish-whep): WebRTC playback of a running or live job.

- `POST /v1/videos/{id}/whep` with an SDP offer (`application/sdp`): 201 with the SDP
  answer, `Location` naming the session, and a `Link` per configured ICE server (what
  WHEP clients read them from). `?variant=preview|final|live` as on `/content`.
- `DELETE /v1/videos/{id}/whep/{session}`: ends the session (200).
- `PATCH` on a session (trickle ICE) is 405: the answer carries every candidate.

The API key is a Bearer token here as everywhere (`Authorization: Bearer KEY`), which
is what WHEP specifies; Host and Origin rules apply as on every route. A job that
already ended is not live: 409, and its MP4 is at `/content`.
"""

from __future__ import annotations

from aiohttp import web

from vaecast.errors import (
    InvalidRequestError,
    JobStateError,
    MalformedRequestError,
    NotFoundError,
    PayloadTooLargeError,
    RequestTimeoutError,
    ServerBusyError,
    UnsupportedMediaError,
)
from vaecast.job.transitions import FINAL_STATUSES
from vaecast.server.contract.models import DeletedWhepSession
from vaecast.server.contract.shared import CONTENT_ERRORS, JSON, LOCATION, SDP, VARIANT, VIDEO_ID
from vaecast.server.contract.spec import Header, Param, Reply, operation
from vaecast.server.edge.body_reading import read_small_body
from vaecast.server.faces.common import refuse_if_broken, rendition_of
from vaecast.server.faces.face import MANAGER
from vaecast.server.faces.whep.offer import MAX_OFFER_BYTES, MEDIA_TYPE, VideoCodec, read_offer
from vaecast.server.faces.whep.sessions import WhepSessions
from vaecast.server.faces.whep.settings import IceServer

WHEP_SESSIONS = web.AppKey("whep_sessions", WhepSessions)
SDP_TEXT = {"type": "string", "maxLength": MAX_OFFER_BYTES}
SESSION_ID = Param("session", "path", {"type": "string", "maxLength": 64}, "the session", True)
POST_WHEP = operation(
    "Watch a running job over WebRTC (WHEP): an SDP offer in, its answer out",
    tag="webrtc",
    params=(VIDEO_ID, VARIANT),
    body={SDP: {**SDP_TEXT, "description": "the viewer's SDP offer (receive-only video)"}},
    replies=(
        Reply(
            201,
            "the SDP answer, with every ICE candidate (no trickle)",
            {SDP: SDP_TEXT},
            {
                "Location": LOCATION,
                "Link": Header('an ICE server: `<url>; rel="ice-server"`, one header each'),
                "X-WebRTC-Video": Header(
                    "the video codec the session sends", {"enum": [c.value for c in VideoCodec]}
                ),
            },
        ),
    ),
    errors=(
        *CONTENT_ERRORS,
        MalformedRequestError,
        UnsupportedMediaError,
        PayloadTooLargeError,
        RequestTimeoutError,
        InvalidRequestError,
        ServerBusyError,
    ),
)
DELETE_WHEP = operation(
    "End a WHEP session",
    tag="webrtc",
    params=(VIDEO_ID, SESSION_ID),
    replies=(Reply(200, "the session has ended", {JSON: DeletedWhepSession}),),
    errors=(NotFoundError,),
)


def add_whep_routes(app: web.Application) -> None:
    @POST_WHEP
    async def post_whep(request: web.Request) -> web.Response:
        manager = request.app[MANAGER]
        job = manager.get(request.match_info["video_id"])
        rendition = rendition_of(request, job)
        refuse_if_broken(job, rendition)
        if job.status_of(rendition) in FINAL_STATUSES:
            raise JobStateError(
                f"video {job.id} is {job.status_of(rendition).value}, not live: "
                f"its MP4 is at /v1/videos/{job.id}/content"
            )
        body = await read_small_body(request, manager.config.body_pace(), MAX_OFFER_BYTES)
        offer = read_offer(request.headers.get("Content-Type", ""), body)
        sessions = request.app[WHEP_SESSIONS]
        session, answer = await sessions.open(
            job.id, rendition.variant, rendition.log, offer, job.playouts
        )
        location = f"/v1/videos/{job.id}/whep/{session.id}"
        response = web.Response(
            status=201,
            body=answer.encode(),
            headers={
                "Content-Type": MEDIA_TYPE,
                "Location": location,
                "Cache-Control": "no-store",
                "X-WebRTC-Video": session.video.value,
            },
        )
        for link in ice_links(sessions.settings.ice_servers):
            response.headers.add("Link", link)
        return response

    @DELETE_WHEP
    async def delete_whep(request: web.Request) -> web.Response:
        sessions = request.app[WHEP_SESSIONS]
        session = sessions.session(request.match_info["video_id"], request.match_info["session"])
        await sessions.close(session, "deleted")
        return web.json_response({"id": session.id, "object": "whep_session", "deleted": True})

    app.router.add_post("/v1/videos/{video_id}/whep", post_whep)
    app.router.add_delete("/v1/videos/{video_id}/whep/{session}", delete_whep)


def ice_links(servers: tuple[IceServer, ...]) -> list[str]:
    """WHEP's `Link: <url>; rel="ice-server"` headers, credentials as the draft spells."""
    links = []
    for server in servers:
        link = f'<{server.url}>; rel="ice-server"'
        if server.username is not None:
            link += f'; username="{server.username}"; credential="{server.credential}"'
            link += '; credential-type="password"'
        links.append(link)
    return links
