"""vaecast inside your own Python program: the app, its settings, and serving it.

The stable way to run the server from Python, as `vaecast serve` does and as the
benchmarks and the chaos suite do: build an app from a config and decoders you have
loaded (any `vaecast.models.base.ChunkedDecoder`), with the pipeline's stages swapped
where you measure or inject faults (`Stages`: the host conversion and the encoder
factory), and serve it until SIGINT or SIGTERM. Everything under `vaecast.server` is
how the server is made, and may move between releases; what is here does not.

    config = ServerConfig(default_model="linear")
    app = create_app(config, {"linear": LinearDecoder()})
    await serve_until_signalled(app, "127.0.0.1", 8000, print, **runner_settings(config))
"""

from __future__ import annotations

from aiohttp import web

from vaecast.pipeline.run import Stages
from vaecast.server.app import (
    ACCESS_LOG_FORMAT,
    create_app,
    default_app,
    runner_settings,
    serve_until_signalled,
)
from vaecast.server.config import MIB, Limits, ServerConfig
from vaecast.server.faces.face import MANAGER
from vaecast.server.faces.progressive.fanout_sender import THREAD_NAME as FANOUT_THREAD_NAME
from vaecast.server.faces.standard import standard_faces

__all__ = [
    "ACCESS_LOG_FORMAT",
    "FANOUT_THREAD_NAME",
    "MIB",
    "Limits",
    "ServerConfig",
    "Stages",
    "create_app",
    "default_app",
    "drain",
    "runner_settings",
    "serve_until_signalled",
    "standard_faces",
]


async def drain(app: web.Application, grace_s: float) -> None:
    """What `vaecast serve` does at SIGTERM before it stops: take no new jobs, and let
    the running ones finish for up to `grace_s` (then they are cancelled)."""
    await app[MANAGER].drain(grace_s)
