"""The preview page's test bed: a real vaecast server on 127.0.0.1 whose `tiny` decode
the test holds back, and one headless Chromium per module.

Every fixture here runs on the module's event loop (the browser outlives one test),
so test modules in this folder mark themselves `asyncio(loop_scope="module")`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web

from tests.helpers.browser import CONFIG, GatedTinyDecoder, Server
from tests.helpers.cdp import CHROMIUM, Browser, launch_chromium
from tests.helpers.server import serve_on_loopback
from vaecast.server.app import create_app, runner_settings

# The server exactly as `vaecast serve` configures it by default (crf included):
# the colour tolerance below is what a user's stream gets.


@pytest_asyncio.fixture(loop_scope="module")
async def server() -> AsyncIterator[Server]:
    """A vaecast server on 127.0.0.1 serving the gated `tiny` decoder (gate open)."""
    decoder = GatedTinyDecoder()
    app = create_app(CONFIG, {"tiny": decoder})
    runner = web.AppRunner(app, **runner_settings(CONFIG))
    url = await serve_on_loopback(app, runner)
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
