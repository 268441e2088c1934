"""The preview page against a server started with an API key, in real headless Chromium."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace

import pytest
import pytest_asyncio

from tests.helpers.browser import (
    CONFIG,
    NO_MEDIA_SOURCE_NOR_HLS,
    PLAY_TIMEOUT_S,
    STATE,
    VIDEO_FACTS,
    GatedTinyDecoder,
    Server,
    assert_no_script_errors,
    serving,
    start_demo,
)
from tests.helpers.cdp import Browser, Page
from vaecast.demo.sources import SceneSpec
from vaecast.server.edge.security_config import SecurityConfig

pytestmark = [pytest.mark.browser, pytest.mark.asyncio(loop_scope="module")]

KEY = "sk-page+test;42"  # a ';' and a '+': the cookie must carry it URL-encoded
SPEC = SceneSpec("shapes", frames=17, width=256, height=160)
FPS = 16


@pytest_asyncio.fixture(loop_scope="module")
async def keyed_server() -> AsyncIterator[Server]:
    config = replace(CONFIG, security=SecurityConfig(api_key=KEY))
    async with serving(GatedTinyDecoder(), config) as server:
        yield server


async def key_asked(page: Page) -> str:
    """The reason the page gives once it shows its key form."""
    return await page.wait_for(
        "(f => !f.hidden && document.getElementById('key-reason').textContent)"
        "(document.getElementById('key-form'))"
    )


async def type_key(page: Page, key: str) -> None:
    await page.evaluate(
        f"""(() => {{
          document.getElementById("key-form").key.value = {key!r};
          document.querySelector("#key-form button").click();
        }})()"""
    )


async def play_demo(page: Page) -> dict[str, object]:
    await start_demo(page, SPEC, FPS)
    await page.wait_for("document.getElementById('video').ended", PLAY_TIMEOUT_S)
    # `completed` arrives on the job's event stream: EventSource got in by the cookie.
    state = await page.wait_for(f"(s => s.status === 'completed' && s)({STATE})")
    facts = await page.evaluate(VIDEO_FACTS)
    assert facts["error"] is None
    assert facts["totalVideoFrames"] == SPEC.frames
    assert state["errors"] == []
    return state


async def test_the_page_asks_for_the_key_keeps_it_and_plays(
    keyed_server: Server, browser: Browser
) -> None:
    page = await browser.new_page()
    try:
        await page.navigate(keyed_server.url + "/")
        assert await key_asked(page) == "This server needs an API key."
        assert not await page.evaluate(f"{STATE}.ready")
        await type_key(page, "a wrong key")
        await page.wait_for("document.getElementById('key-reason').textContent.startsWith('That')")
        assert await key_asked(page) == "That key was not accepted."
        await type_key(page, KEY)
        await page.wait_for(f"{STATE}.ready")
        assert await page.evaluate("document.getElementById('key-form').hidden")
        assert await page.evaluate("localStorage.getItem('vaecast_api_key')") == KEY
        assert await page.evaluate("document.cookie") == "vaecast_api_key=sk-page%2Btest%3B42"
        assert (await play_demo(page))["playback"] == "mse"

        # Reloaded without MediaSource: the kept key is used without asking, and
        # <video src> (which cannot send a header) plays by the cookie.
        await page.send(
            "Page.addScriptToEvaluateOnNewDocument",
            source=NO_MEDIA_SOURCE_NOR_HLS,
        )
        await page.navigate(keyed_server.url + "/")
        await page.wait_for(f"window.vaecast && {STATE}.ready")
        assert await page.evaluate("document.getElementById('key-form').hidden")
        assert (await play_demo(page))["playback"] == "src"
        assert_no_script_errors(page)
    finally:
        await browser.close_page(page)
