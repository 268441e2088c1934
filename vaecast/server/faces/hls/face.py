"""The LL-HLS face, built from `HlsFace()` in the config.

It attaches nothing: its playlists are made from each rendition's fragment index,
and its media are read from the rendition's log.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiohttp import web

from vaecast.server.faces.hls.routes import add_hls_routes
from vaecast.server.stream.manager import JobManager
from vaecast.server.stream.rendition import Rendition


@dataclass(frozen=True, slots=True)
class HlsFace:
    """Playlists (media, multivariant), init segments, parts and segments."""

    name: str = "hls"

    def build(self) -> HlsPlaylists:
        return HlsPlaylists(self.name)


class HlsPlaylists:
    """The running HLS face: routes only."""

    def __init__(self, name: str) -> None:
        self.name = name

    def add_routes(self, app: web.Application) -> None:
        add_hls_routes(app)

    async def start(self, manager: JobManager) -> None:
        pass

    def attach(self, rendition: Rendition) -> None:
        pass

    async def close(self) -> None:
        pass

    def health(self) -> dict[str, Any] | None:
        return None
