"""The WHEP face, built from `WhepFace(webrtc=WebRtcSettings(...))` in the config.

Its viewers' sessions are made at their offers; each reads a rendition's log, so it
attaches nothing to a rendition. It starts with the manager's metrics and, at close,
ends every session and its peers' process.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from vaecast.codecs.encoder_settings import EncoderSettings
from vaecast.server.faces.whep.routes import WHEP_SESSIONS, add_whep_routes
from vaecast.server.faces.whep.sessions import WhepSessions
from vaecast.server.faces.whep.settings import WebRtcSettings
from vaecast.server.stream.manager import JobManager
from vaecast.server.stream.rendition import Rendition


@dataclass(frozen=True, slots=True)
class WhepFace:
    """`POST .../whep` (an SDP offer in, its answer out) and `DELETE` of a session."""

    webrtc: WebRtcSettings = field(default_factory=WebRtcSettings)
    name: str = "webrtc"

    def build(self) -> WhepViewers:
        return WhepViewers(self.name, self.webrtc)


class WhepViewers:
    """The running WHEP face: its sessions, made once the manager's metrics exist."""

    def __init__(self, name: str, settings: WebRtcSettings) -> None:
        self.name, self.settings = name, settings
        self._app: web.Application | None = None
        self.sessions: WhepSessions | None = None

    def add_routes(self, app: web.Application) -> None:
        self._app = app
        add_whep_routes(app)

    async def start(self, manager: JobManager) -> None:
        encoder: EncoderSettings = manager.config.encoder
        self.sessions = WhepSessions(self.settings, encoder, manager.metrics)
        if self._app is not None:
            self._app[WHEP_SESSIONS] = self.sessions

    def attach(self, rendition: Rendition) -> None:
        pass

    async def close(self) -> None:
        if self.sessions is not None:
            await self.sessions.close_all()

    def health(self) -> dict[str, Any] | None:
        """Its viewers, by what their video is, against --max-webrtc-viewers."""
        counts = {} if self.sessions is None else self.sessions.counts()
        return {"viewers": counts, "max": self.settings.max_viewers}
