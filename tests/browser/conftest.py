"""The preview page's test bed: a real vaecast server on 127.0.0.1 whose `tiny` decode
the test holds back, and one headless Chromium per module.

Every fixture here runs on the module's event loop (the browser outlives one test),
so test modules in this folder mark themselves `asyncio(loop_scope="module")`.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
import torch
from aiohttp import web

from tests.browser.cdp import CHROMIUM, Browser, launch_chromium
from vaecast.models.base import ChunkCallback, DecodedChunk, DecodePlan
from vaecast.models.tiny import TinyDecoder
from vaecast.server.app import create_app, runner_settings
from vaecast.server.config import ServerConfig
from vaecast.server.jobs import Job, JobManager
from vaecast.server.routes import MANAGER

GATE_TIMEOUT_S = 60.0
# The server exactly as `vaecast serve` configures it by default (crf included):
# the colour tolerance below is what a user's stream gets.
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

    def decode_chunks(self, latents: torch.Tensor, on_chunk: ChunkCallback) -> None:
        def gated(chunk: DecodedChunk) -> None:
            if chunk.index == self.hold_at:
                self.holding.set()
                if not self.gate.wait(GATE_TIMEOUT_S):
                    raise TimeoutError("the test never opened the gate")
                if self.error is not None:
                    raise self.error
            on_chunk(chunk)

        self.inner.decode_chunks(latents, gated)

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


@pytest_asyncio.fixture(loop_scope="module")
async def server() -> AsyncIterator[Server]:
    """A vaecast server on 127.0.0.1 serving the gated `tiny` decoder (gate open)."""
    decoder = GatedTinyDecoder()
    app = create_app(CONFIG, {"tiny": decoder})
    runner = web.AppRunner(app, **runner_settings(CONFIG))
    await runner.setup()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    await web.SockSite(runner, sock).start()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    client = aiohttp.ClientSession(url, timeout=aiohttp.ClientTimeout(total=60))
    try:
        yield Server(url, client, app, decoder)
    finally:
        decoder.release()
        await client.close()
        await runner.cleanup()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def browser() -> AsyncIterator[Browser]:
    if not CHROMIUM.exists():
        pytest.fail(
            f"{CHROMIUM} is missing: run tools/install-test-deps (it installs Debian's chromium)"
        )
    async with launch_chromium() as launched:
        yield launched
