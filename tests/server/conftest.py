"""A real vaecast server on 127.0.0.1 for each test, and a client for it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import replace

import aiohttp
import pytest
from aiohttp import web

from tests.helpers.server import TEST_CONFIG, Server, StartServer, serve_on_loopback
from vaecast.models.base import ChunkedDecoder
from vaecast.models.linear import LinearDecoder
from vaecast.server.app import create_app, runner_settings

# Tests compare pixels: a low CRF keeps H.264 error well under their thresholds.


@pytest.fixture
async def start_server() -> AsyncIterator[StartServer]:
    """Start a server: `await start_server(decoders={...}, handler_cancellation=..., **config)`."""
    started: list[tuple[web.AppRunner, aiohttp.ClientSession]] = []

    async def start(
        decoders: Mapping[str, ChunkedDecoder] | None = None,
        handler_cancellation: bool = True,
        **config_changes: object,
    ) -> Server:
        config = replace(TEST_CONFIG, **config_changes)  # type: ignore[arg-type]
        app = create_app(config, decoders or {"linear": LinearDecoder()})
        runner = web.AppRunner(
            app, **{**runner_settings(config), "handler_cancellation": handler_cancellation}
        )
        url = await serve_on_loopback(app, runner)
        client = aiohttp.ClientSession(url, timeout=aiohttp.ClientTimeout(total=60))
        started.append((runner, client))
        return Server(url, client, app, runner)

    yield start
    for runner, client in started:
        await client.close()
        await runner.cleanup()
