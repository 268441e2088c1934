"""The preview page's test server, its gated decoder, and driving the page in headless Chromium."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import torch
from aiohttp import web

from tests.helpers.cdp import Page
from tests.helpers.server import serve_on_loopback
from vaecast.demo.sources import SceneSpec
from vaecast.models.base import ChunkCallback, DecodedChunk, DecodePlan, StreamPlan
from vaecast.models.tiny import TinyDecoder
from vaecast.server.app import create_app, runner_settings
from vaecast.server.config import ServerConfig
from vaecast.server.faces.face import MANAGER
from vaecast.server.stream.job import Job
from vaecast.server.stream.manager import JobManager

GATE_TIMEOUT_S = 60.0


CONFIG = ServerConfig(default_model="tiny")


class GatedTinyDecoder:
    """The real `tiny` decoder under its own name, holding chunk `hold_at` (and so
    every later one) back until the test opens `gate`.

    Re-armed by `hold(at)` for each job; teardown opens the gate so no decoder
    thread waits out its timeout.
    """

    name = "tiny"

    def __init__(self) -> None:
        self.inner = TinyDecoder()
        self.latent_channels = self.inner.latent_channels
        self.value_range = self.inner.value_range
        self.device = self.inner.device
        self.hold_at: int | None = None
        self.error: BaseException | None = None  # raised instead of publishing the held chunk
        self.gate = threading.Event()
        self.holding = threading.Event()  # set while chunk `hold_at` waits for the gate

    def hold(self, at: int) -> None:
        self.hold_at = at
        self.error = None
        self.holding.clear()
        self.gate.clear()

    def release(self, error: BaseException | None = None) -> None:
        """Let the decode go on, or make it fail with `error` at the held chunk."""
        self.error = error
        self.gate.set()

    def plan(self, latent_shape: Sequence[int]) -> DecodePlan:
        return self.inner.plan(latent_shape)

    def plan_stream(self, first_block_shape: Sequence[int]) -> StreamPlan:
        return self.inner.plan_stream(first_block_shape)

    def decode_chunks(self, latents: torch.Tensor, on_chunk: ChunkCallback) -> None:
        self.inner.decode_chunks(latents, self._gated(on_chunk))

    def decode_stream(self, blocks: Iterable[torch.Tensor], on_chunk: ChunkCallback) -> DecodePlan:
        return self.inner.decode_stream(blocks, self._gated(on_chunk))

    def _gated(self, on_chunk: ChunkCallback) -> ChunkCallback:
        def gated(chunk: DecodedChunk) -> None:
            if chunk.index == self.hold_at:
                self.holding.set()
                if not self.gate.wait(GATE_TIMEOUT_S):
                    raise TimeoutError("the test never opened the gate")
                if self.error is not None:
                    raise self.error
            on_chunk(chunk)

        return gated

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        return self.inner.decode(latents)


@dataclass
class Server:
    url: str
    client: aiohttp.ClientSession
    app: web.Application
    decoder: GatedTinyDecoder

    @property
    def manager(self) -> JobManager:
        return self.app[MANAGER]

    def job(self, job_id: str) -> Job:
        return self.manager.get(job_id)

    async def create_demo(self, **body: Any) -> dict[str, Any]:
        async with self.client.post("/v1/videos", json=body) as response:
            assert response.status == 201, await response.text()
            return await response.json()


async def until_set(event: threading.Event, timeout_s: float = 30.0) -> None:
    """Wait for a thread's event without blocking the loop; fail after `timeout_s`."""
    if not await asyncio.to_thread(event.wait, timeout_s):
        raise TimeoutError(f"not set within {timeout_s} s")


PLAY_TIMEOUT_S = 30.0


VIDEO_FACTS = """(v => ({
  readyState: v.readyState,
  currentTime: v.currentTime,
  error: v.error && v.error.message,
  ended: v.ended,
  duration: v.duration,
  buffered: Array.from(
    {length: v.buffered.length}, (_, i) => [v.buffered.start(i), v.buffered.end(i)]
  ),
  totalVideoFrames: v.getVideoPlaybackQuality().totalVideoFrames,
  droppedVideoFrames: v.getVideoPlaybackQuality().droppedVideoFrames,
  videoWidth: v.videoWidth,
  videoHeight: v.videoHeight,
}))(document.getElementById("video"))"""


STATE = "window.vaecast.state"

# A browser with no Media Source and no HLS of its own (Chromium says it plays HLS):
# the page's last resort, the MP4 in a plain <video src>.
NO_MEDIA_SOURCE_NOR_HLS = """delete window.MediaSource; delete window.ManagedMediaSource;
  const plays = HTMLMediaElement.prototype.canPlayType;
  HTMLMediaElement.prototype.canPlayType = function (type) {
    return type === "application/vnd.apple.mpegurl" ? "" : plays.call(this, type);
  };"""


async def start_demo(page: Page, spec: SceneSpec, fps: int) -> None:
    await page.evaluate(
        f"""(() => {{
          const form = document.getElementById("demo-form");
          form.scene.value = {spec.scene!r};
          form.frames.value = "{spec.frames}";
          form.size.value = "{spec.width}x{spec.height}";
          form.fps.value = "{fps}";
          form.seed.value = "{spec.seed}";
          // A select given a value it does not offer turns blank: fail loudly instead.
          for (const field of ["scene", "frames", "size", "fps"]) {{
            if (!form[field].value) throw new Error(`the form offers no such ${{field}}`);
          }}
          document.getElementById("start").click();
        }})()"""
    )


def assert_no_script_errors(page: Page) -> None:
    """No uncaught exception, rejected promise or console.error in the page."""
    assert [line for line in page.console if line.startswith(("exception", "error"))] == []


@contextlib.asynccontextmanager
async def serving(
    decoder: GatedTinyDecoder,
    config: ServerConfig = CONFIG,
    extend: Callable[[web.Application], None] | None = None,
) -> AsyncIterator[Server]:
    """A vaecast server on 127.0.0.1 serving `decoder` as `tiny`; `extend` adds to its
    app (routes, middlewares) before it starts. The decoder's gate opens at the end."""
    app = create_app(config, {"tiny": decoder})
    if extend is not None:
        extend(app)
    async with running(app, config) as served:
        try:
            yield Server(served.url, served.client, app, decoder)
        finally:
            decoder.release()


@dataclass
class Served:
    url: str
    client: aiohttp.ClientSession


@contextlib.asynccontextmanager
async def running(app: web.Application, config: ServerConfig = CONFIG) -> AsyncIterator[Served]:
    """`app` served on 127.0.0.1 as `vaecast serve` runs it with `config`: its base URL
    and a client for it, both closed at the end."""
    runner = web.AppRunner(app, **runner_settings(config))
    url = await serve_on_loopback(app, runner)
    client = aiohttp.ClientSession(url, timeout=aiohttp.ClientTimeout(total=60))
    try:
        yield Served(url, client)
    finally:
        await client.close()
        await runner.cleanup()
