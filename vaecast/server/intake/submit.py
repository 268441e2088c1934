"""A POST that makes jobs: who it counts against, what it asks for, and its job made.

Both routes that take latents (`POST /v1/videos` and the progressive face's
`POST /v1/videos/stream`) read a request the same way and submit it through the
manager's admission; a live demo's job gets its producer here too.
"""

from __future__ import annotations

from aiohttp import web

from vaecast.server.intake.live_demo import LiveDemoRequest, start_producer
from vaecast.server.intake.uploads import read_decode_request
from vaecast.server.stream.job import BatchRequest, DecodeRequest, Job, PushRequest
from vaecast.server.stream.manager import Admission, JobManager


def client_of(request: web.Request) -> str:
    """Who a request's places count against (fair admission): its peer's address."""
    return request.remote or "unknown"


async def read_request(
    request: web.Request, manager: JobManager
) -> DecodeRequest | BatchRequest | PushRequest | LiveDemoRequest:
    """What the POST asks for, checked against the manager's models and limits."""
    return await read_decode_request(
        request,
        manager.config,
        manager.check_latent_shape,
        manager.layout_for,
        manager.check_names,
        manager.sound_for,
    )


def submit(admission: Admission, request: DecodeRequest | PushRequest | LiveDemoRequest) -> Job:
    """The job of one video; a live demo's starts producing its scene."""
    if isinstance(request, LiveDemoRequest):
        job = admission.submit(request.session())
        start_producer(job, request)
        return job
    return admission.submit(request)
