"""vaecast inside your own Python program: the app, its settings, and serving it.

The stable way to run the server from Python, as `vaecast serve` does and as the
benchmarks and the chaos suite do: build an app from a config and decoders you have
loaded (any `vaecast.models.base.ChunkedDecoder`), with the pipeline's stages swapped
where you measure or inject faults (`Stages`: the host conversion and the encoder
factory), and serve it until SIGINT or SIGTERM. A delivery face of your own is built
from what is here too (`Face`, `FaceSpec`, `Rendition`, `Attachment`, `MANAGER`,
`rendition_of`, `add_content_variant`, and the `operation` records /openapi.json is
made of; the docs' "Faces" guide shows one). Everything under `vaecast.server` is how
the server is made, and may move between releases; what is here does not.

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
from vaecast.server.config import MIB, FaceSpec, Limits, ServerConfig, WebhookSettings
from vaecast.server.contract.shared import JOB_LOOKUP_ERRORS, JSON, VARIANT, VIDEO_ID
from vaecast.server.contract.spec import Header, Param, Reply, operation
from vaecast.server.faces.common import rendition_of
from vaecast.server.faces.face import MANAGER, Face, add_content_variant
from vaecast.server.faces.hls.face import HlsFace
from vaecast.server.faces.progressive.face import ProgressiveFace
from vaecast.server.faces.progressive.fanout_sender import THREAD_NAME as FANOUT_THREAD_NAME
from vaecast.server.faces.standard import standard_faces
from vaecast.server.faces.stills.face import StillsFace
from vaecast.server.faces.webhooks.face import WebhooksFace
from vaecast.server.faces.whep.face import WhepFace
from vaecast.server.faces.whep.settings import WebRtcSettings
from vaecast.server.stream.manager import JobManager
from vaecast.server.stream.rendition import Attachment, Rendition

__all__ = [
    "ACCESS_LOG_FORMAT",
    "FANOUT_THREAD_NAME",
    "JOB_LOOKUP_ERRORS",
    "JSON",
    "MANAGER",
    "MIB",
    "VARIANT",
    "VIDEO_ID",
    "Attachment",
    "Face",
    "FaceSpec",
    "Header",
    "HlsFace",
    "JobManager",
    "Limits",
    "Param",
    "ProgressiveFace",
    "Rendition",
    "Reply",
    "ServerConfig",
    "Stages",
    "StillsFace",
    "WebRtcSettings",
    "WebhookSettings",
    "WebhooksFace",
    "WhepFace",
    "add_content_variant",
    "create_app",
    "default_app",
    "drain",
    "operation",
    "rendition_of",
    "runner_settings",
    "serve_until_signalled",
    "standard_faces",
]


async def drain(app: web.Application, grace_s: float) -> None:
    """What `vaecast serve` does at SIGTERM before it stops: take no new jobs, and let
    the running ones finish for up to `grace_s` (then they are cancelled)."""
    await app[MANAGER].drain(grace_s)
