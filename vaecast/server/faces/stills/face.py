"""The stills face, built from `StillsFace()` in the config: each job's thumbnail and
spritesheet, as `?variant=thumbnail|spritesheet` of the `/content` the progressive
face serves (`add_content_variant`).

It attaches nothing: a still is made, when asked for, from the final rendition's log
(`routes.py`), on one thread of its own at a lowered priority, so that stills never
take a core from a decode or an encode that is running.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from vaecast.pipeline.thread_priority import lower_this_thread
from vaecast.server.faces.face import add_content_variant
from vaecast.server.faces.stills.cache import StillCache
from vaecast.server.faces.stills.routes import SPRITESHEET, THUMBNAIL, send_still
from vaecast.server.stream.job import Job
from vaecast.server.stream.manager import JobManager
from vaecast.server.stream.rendition import Rendition


@dataclass(frozen=True, slots=True)
class StillsFace:
    """Thumbnails and spritesheets: `max_bytes` of images kept, `max_pending` being
    made or waiting to be (more: 429)."""

    name: str = "stills"
    max_bytes: int = 64 * 1024 * 1024
    max_pending: int = 32

    def build(self) -> Stills:
        return Stills(self)


class Stills:
    """The running stills face: its cache and the one thread that makes the images."""

    def __init__(self, spec: StillsFace) -> None:
        self.name = spec.name
        self._spec = spec
        self._pool: ThreadPoolExecutor | None = None
        self.cache: StillCache | None = None

    def add_routes(self, app: web.Application) -> None:
        for variant in (THUMBNAIL, SPRITESHEET):
            add_content_variant(app, variant, self._send)

    async def _send(self, request: web.Request, job: Job) -> web.StreamResponse:
        assert self.cache is not None, "a request before the face started"
        return await send_still(request, job, self.cache)

    async def start(self, manager: JobManager) -> None:
        # Its thread starts with the first still asked for: none for a server never asked.
        self._pool = ThreadPoolExecutor(
            1, thread_name_prefix="vaecast-stills", initializer=lower_this_thread
        )
        self.cache = StillCache(self._pool, self._spec.max_bytes, self._spec.max_pending)

    def attach(self, rendition: Rendition) -> None:
        pass

    async def close(self) -> None:
        if self._pool is not None:
            await asyncio.to_thread(self._pool.shutdown, cancel_futures=True)

    def health(self) -> dict[str, Any] | None:
        return None
