"""A real vaecast server per test (`start_server`, tests/server/conftest.py) and its streams."""

from __future__ import annotations

import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

import aiohttp
import torch
from aiohttp import web

from vaecast.codecs.fmp4_reader import TopLevelBoxSplitter
from vaecast.codecs.h264 import EncoderSettings
from vaecast.server.config import ServerConfig
from vaecast.server.edge.parser_errors import answer_in_json
from vaecast.server.faces.face import FACES, MANAGER
from vaecast.server.faces.progressive.fanout_sender import FanoutSender
from vaecast.server.stream.manager import JobManager

TEST_CONFIG = ServerConfig(default_model="linear", encoder=replace(EncoderSettings(), crf=18))


@dataclass
class Server:
    url: str
    client: aiohttp.ClientSession
    app: web.Application
    runner: web.AppRunner

    @property
    def lost_connections(self) -> int:
        """Connections whose socket the server has seen close (peeks at aiohttp's handlers)."""
        assert self.runner.server is not None
        return sum(handler.transport is None for handler in self.runner.server.connections)

    @property
    def manager(self) -> JobManager:
        return self.app[MANAGER]

    def app_faces(self) -> tuple[Any, ...]:
        return self.app[FACES]

    def face(self, name: str) -> Any:
        """The running face of that name (the progressive face's sender, WHEP's sessions)."""
        (face,) = (face for face in self.app[FACES] if face.name == name)
        return face

    @property
    def fanout(self) -> FanoutSender:
        """The progressive face's sender thread."""
        return self.face("progressive").fanout


StartServer = Callable[..., Awaitable[Server]]


async def read_boxes(response: aiohttp.ClientResponse, count: int) -> list[bytes]:
    splitter, boxes = TopLevelBoxSplitter(), []
    while len(boxes) < count:
        data = await response.content.readany()
        assert data, "stream ended early"
        boxes += splitter.feed(data)
    return boxes


def noisy_latents(frames: int, height: int, width: int) -> torch.Tensor:
    """Random 8x8 colour blocks every frame: expensive to encode, so the MP4 is large."""
    generator = torch.Generator().manual_seed(1)
    return torch.rand(1, 16, frames, height, width, generator=generator) * 2 - 1


async def serve_on_loopback(app: web.Application, runner: web.AppRunner) -> str:
    """Start `runner` (of `app`) on a free port of 127.0.0.1; its base URL."""
    await runner.setup()
    answer_in_json(runner)  # as the CLI's server does
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    await web.SockSite(runner, sock).start()
    return f"http://127.0.0.1:{sock.getsockname()[1]}"
