"""The aiohttp application: the edge, the jobs API, the configured faces, and the
lifetime of the job manager and of the faces around it. `serving` runs it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web

from vaecast.models.base import ChunkedDecoder
from vaecast.models.linear import LinearDecoder
from vaecast.pipeline.run import Stages
from vaecast.server.api.routes import PUSH_SESSIONS, add_routes
from vaecast.server.app.serving import (
    raise_open_file_limit,
    runner_settings,
    serve_until_signalled,
)
from vaecast.server.config import ServerConfig
from vaecast.server.edge.http_errors import json_errors
from vaecast.server.edge.loop_lag import watch_loop_lag
from vaecast.server.edge.security import SecurityGuard
from vaecast.server.faces.face import FACES, MANAGER, Face
from vaecast.server.faces.standard import standard_faces
from vaecast.server.intake.live_demo import DEMO_WARM_UP, warm_up_demo
from vaecast.server.intake.push import PushSessions
from vaecast.server.intake.uploads import DEMO_MODEL
from vaecast.server.stream.manager import JobManager

log = logging.getLogger("vaecast.server")

__all__ = [
    "ACCESS_LOG_FORMAT",
    "create_app",
    "default_app",
    "find_jobs",
    "raise_open_file_limit",
    "runner_settings",
    "serve_until_signalled",
]

# Bodies are read by vaecast.server.intake.uploads with the configured limit; aiohttp's own
# cap (client_max_size) only guards request.read()/post(), which the app never calls
# on uploads, so it is left at the configured limit as a second fence.

# One line per request, key=value, for log processors (aiohttp access log atoms).
ACCESS_LOG_FORMAT = (
    'remote=%a request="%r" status=%s bytes=%b duration_s=%Tf agent="%{User-Agent}i"'
)


def create_app(
    config: ServerConfig,
    decoders: Mapping[str, ChunkedDecoder],
    stages: Stages = Stages(),  # noqa: B008 (frozen, immutable)
    *,
    manager: JobManager | None = None,
    warm_demo: bool = False,
) -> web.Application:
    """An app serving `decoders` (already loaded: model loading is the caller's job,
    done off the event loop). `stages` replaces the pipeline's host conversion or
    encoder for every job, e.g. to measure them or to inject faults.

    `manager` is the caller's when its jobs run elsewhere (Ray mode: the CLI builds
    it with the cluster's runners, `vaecast.cluster.runners`; `decoders` then only
    plan and check requests); by default a manager of jobs decoded here is made at
    start.

    With `warm_demo` (what `vaecast serve` asks for), when the default model is `tiny`
    (the demo's) and decodes here, a demo click's first-call work runs once in the
    background after start (vaecast.server.intake.live_demo.warm_up_demo). Off by default:
    in tests and benchmarks its decode and its start-up CPU would show in what they
    measure (a gated test decoder, a timed benchmark decoder)."""
    if config.default_model not in decoders:
        raise ValueError(f"default model {config.default_model!r} is not among {sorted(decoders)}")
    # The guard sits inside json_errors (its refusals are JSON) and before every
    # handler, so a refused request never reaches one nor has its body read.
    guard = SecurityGuard(config.security)
    # Finding jobs that run elsewhere comes after the guard: a refused request looks
    # up nothing.
    middlewares = [json_errors, guard.middleware, find_jobs]
    app = web.Application(
        middlewares=middlewares,
        client_max_size=config.limits.max_upload_bytes,
    )
    app.on_response_prepare.append(guard.add_cors_headers)
    add_routes(app)
    specs = config.faces if config.faces is not None else standard_faces()
    faces: tuple[Face, ...] = tuple(spec.build() for spec in specs)
    app[FACES] = faces
    for face in faces:
        face.add_routes(app)

    given = manager

    async def job_manager(app: web.Application) -> AsyncIterator[None]:
        manager = given or JobManager(config, decoders, stages)
        app[MANAGER] = manager
        app[PUSH_SESSIONS] = sessions = PushSessions(manager)
        # Before the first job is made (the store's restored ones included): each face
        # attaches what it needs to every rendition from the start.
        for face in faces:
            await face.start(manager)
            manager.rendition_hooks.add(face.attach)
        # Before the port opens: the jobs the store kept are served from the first request.
        await manager.open_store()
        manager.start()
        lag_watch = asyncio.create_task(
            watch_loop_lag(manager.metrics.record_loop_lag), name="vaecast-loop-lag"
        )
        warm_up = None
        if warm_demo and manager.runners.decodes_here and config.default_model == DEMO_MODEL:
            warm_up = _warm_up_demo(manager, decoders[DEMO_MODEL])
        app[DEMO_WARM_UP] = warm_up
        yield
        tasks = [lag_watch] if warm_up is None else [lag_watch, warm_up]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for face in faces:  # before the jobs are cancelled: WHEP's sessions end as shut down
            await face.close()
        await sessions.close()
        await manager.close()

    app.cleanup_ctx.append(job_manager)
    return app


def default_app() -> web.Application:
    """The app `vaecast serve` makes with its default configuration, built, never
    started (no model is loaded, no port opened): what its OpenAPI document is of. Its
    decoders are stand-ins, which only the check of the default model's name looks at
    before a start."""
    config = ServerConfig()
    return create_app(config, {config.default_model: LinearDecoder()})


def _warm_up_demo(manager: JobManager, decoder: ChunkedDecoder) -> asyncio.Task[Any]:
    """The demo's first-call work, as a task: the server answers (/healthz, jobs)
    while it runs."""
    config = manager.config
    warm_up = asyncio.create_task(
        warm_up_demo(
            decoder,
            config.device,
            config.default_fps,
            config.encoder,
            # The manager's: the demo's encoder is then opened ahead for the first
            # click (encoder_spares).
            manager.stages,
            # The threads jobs decode and encode on: a fresh thread would pay its
            # first-call costs again.
            manager.workers,
            # A job, or a request being read: the warm-up would only compete.
            busy=lambda: manager.places.busy,
        ),
        name="vaecast-demo-warm-up",
    )
    warm_up.add_done_callback(lambda _: manager.replenish_spare_encoder())
    return warm_up


@web.middleware
async def find_jobs(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Around every API request: an answer is a promise.

    Before the route: what has happened so far is committed (`manager.settle`), so a
    read says nothing a crash could take back; job `{video_id}` is adopted if it runs
    elsewhere and this process has not seen it, and a read (GET, HEAD) of a running
    one waits until this process has what any other said of it (Ray mode). After the
    route, before its answer goes out (a streamed body's end too: aiohttp writes it
    after the middlewares return): what the route did is committed (a job created,
    deleted, cancelled), and the jobs it created can be found from elsewhere.
    """
    manager = request.app[MANAGER]
    job_id = request.match_info.get("video_id")
    api = request.path.startswith("/v1/")
    if api:
        await manager.settle()
    if job_id is not None:
        await manager.find(job_id, reading=request.method in ("GET", "HEAD"))
    response = await handler(request)
    if api:
        await manager.settle()
    return response
