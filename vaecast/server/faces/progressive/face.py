"""The progressive face: each rendition's MP4 over plain HTTP, as it grows.

Built from `ProgressiveFace()` in the config. It attaches a `Broadcast` to every
rendition (the listener of its log that sends caught-up viewers each segment in one
batch) and owns the server's one `FanoutSender` thread, which makes those sends off
the event loop.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from vaecast.server.faces.progressive.broadcast import BROADCAST, Broadcast
from vaecast.server.faces.progressive.fanout_sender import FanoutSender
from vaecast.server.faces.progressive.routes import add_progressive_routes
from vaecast.server.metrics import Metrics
from vaecast.server.stream.manager import JobManager
from vaecast.server.stream.rendition import Rendition


@dataclass(frozen=True, slots=True)
class ProgressiveFace:
    """`GET .../content` (growing, then a file with ranges) and `POST /v1/videos/stream`."""

    name: str = "progressive"

    def build(self) -> ProgressiveViewers:
        return ProgressiveViewers(self.name)


class ProgressiveViewers:
    """The running progressive face: every rendition's broadcast and their sender."""

    def __init__(self, name: str) -> None:
        self.name = name
        # Every job's viewers are sent their fragments on this one thread.
        self.fanout = FanoutSender()
        self._metrics: Metrics | None = None

    def add_routes(self, app: web.Application) -> None:
        add_progressive_routes(app)

    async def start(self, manager: JobManager) -> None:
        self._metrics = manager.metrics

    def attach(self, rendition: Rendition) -> None:
        assert self._metrics is not None, "attached before the face started"
        broadcast = Broadcast(rendition.log, self._metrics.bytes_sent, self.fanout)
        rendition.attach(BROADCAST, broadcast)

    async def close(self) -> None:
        await asyncio.to_thread(self.fanout.close)

    def health(self) -> dict[str, Any] | None:
        return None
