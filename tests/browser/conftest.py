"""The preview page's test bed: a real vaecast server on 127.0.0.1 whose `tiny` decode
the test holds back, and one headless Chromium per module.

Every fixture here runs on the module's event loop (the browser outlives one test),
so test modules in this folder mark themselves `asyncio(loop_scope="module")`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from tests.helpers.browser import GatedTinyDecoder, Server, serving
from tests.helpers.cdp import CHROMIUM, Browser, Page, launch_chromium

# The server exactly as `vaecast serve` configures it by default (its QP included):
# the colour tolerance below is what a user's stream gets.


@pytest_asyncio.fixture(loop_scope="module")
async def server() -> AsyncIterator[Server]:
    """A vaecast server on 127.0.0.1 serving the gated `tiny` decoder (gate open)."""
    async with serving(GatedTinyDecoder()) as server:
        yield server


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def browser() -> AsyncIterator[Browser]:
    if not CHROMIUM.exists():
        pytest.fail(
            f"{CHROMIUM} is missing: run tools/install-test-deps (it installs Debian's chromium)"
        )
    async with launch_chromium() as launched:
        yield launched


@pytest_asyncio.fixture(loop_scope="module")
async def page(browser: Browser) -> AsyncIterator[Page]:
    """A fresh tab for one test, closed after it."""
    page = await browser.new_page()
    try:
        yield page
    finally:
        await browser.close_page(page)
