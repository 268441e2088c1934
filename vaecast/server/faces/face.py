"""What a delivery face is, to the app that serves it.

A face delivers what the stream core makes (a job's renditions: each a segment log
and a fragment index) in one protocol: the progressive MP4, LL-HLS, WHEP, or a face of
your own. The app builds each face the config lists (`ServerConfig.faces`, as hls.js
builds its controllers from its config), and the face:

- adds its routes, each handler carrying its `@operation` so that /openapi.json
  documents it (`add_routes`);
- attaches what it needs to every new rendition, such as a listener of its log
  (`attach`, called as each job is made, the store's restored ones included);
- starts with the job manager, and closes before the manager cancels what is still
  running (`start`, `close`);
- says what /healthz should show of it (`health`, or None).

A face may also serve a kind of a job's content that is not a rendition (the stills
face's `?variant=thumbnail`): it names it in `CONTENT_VARIANTS`, which the route that
owns `/content` (the progressive face's) asks before it looks for a rendition.

A face reads the core; the core imports no face (tests/test_layout.py checks it). So a
new face is one folder under `vaecast/server/faces/` and one entry in the config.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from aiohttp import web

from vaecast.server.stream.job import Job
from vaecast.server.stream.manager import JobManager
from vaecast.server.stream.rendition import Rendition

# The running app's job manager, for every route (the API's and each face's).
MANAGER = web.AppKey("manager", JobManager)


class Face(Protocol):
    """One delivery face of a running app (what a `FaceSpec` builds)."""

    @property
    def name(self) -> str:
        """Its name: the key /healthz shows it under."""

    def add_routes(self, app: web.Application) -> None:
        """Add its routes (the app's router is still open)."""

    def attach(self, rendition: Rendition) -> None:
        """Attach what it needs to a new rendition; must neither await nor raise."""

    async def start(self, manager: JobManager) -> None:
        """Start, before the first job is made and before the port opens."""

    async def close(self) -> None:
        """Stop and free what it holds, as the server stops: after the jobs' grace,
        before they are cancelled (a rendition's log may still be appended to or
        closed after; what the face attached must cope)."""

    def health(self) -> dict[str, Any] | None:
        """What /healthz shows of it, or None for nothing."""


# The faces an app was built with, in the order of the config.
FACES: web.AppKey[tuple[Face, ...]] = web.AppKey("faces", tuple)

# `?variant=` values of `GET /v1/videos/{id}/content` that a face serves, with the
# handler that answers them (given the request and its job); see the module's docstring.
ContentVariant = Callable[[web.Request, Job], Awaitable[web.StreamResponse]]
CONTENT_VARIANTS: web.AppKey[dict[str, ContentVariant]] = web.AppKey("content_variants", dict)


def add_content_variant(app: web.Application, name: str, handler: ContentVariant) -> None:
    """Serve `?variant=name` of every job's `/content` with `handler`."""
    variants = app.setdefault(CONTENT_VARIANTS, {})
    if name in variants:
        raise ValueError(f"content variant {name!r} is served by another face already")
    variants[name] = handler
