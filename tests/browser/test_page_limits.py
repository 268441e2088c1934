"""The page offers only what its server accepts: the demo form's frame counts and sizes
past the server's limits (its /healthz `limits`) are disabled, in real Chromium."""

from __future__ import annotations

import pytest

from tests.helpers.browser import Server, assert_no_script_errors
from tests.helpers.cdp import Page

pytestmark = [pytest.mark.browser, pytest.mark.asyncio(loop_scope="module")]

DISABLED = """(name => [...document.getElementById("demo-form").elements[name].options]
  .filter(o => o.disabled).map(o => o.value))"""


async def choose(page: Page, name: str, value: str) -> None:
    await page.evaluate(
        f"""(() => {{ const s = document.getElementById("demo-form").elements.{name};
        s.value = "{value}"; s.dispatchEvent(new Event("change")); }})()"""
    )


async def test_the_demo_form_disables_what_the_server_refuses(server: Server, page: Page):
    await page.navigate(server.url + "/")
    await page.wait_for("window.vaecast.state.ready")
    # The demo renders at most 81 frames of 832x480 in all.
    assert await page.evaluate(f'{DISABLED}("frames")') == ["121"]
    assert await page.evaluate(f'{DISABLED}("size")') == ["1280x720"]
    await choose(page, "frames", "121")  # not offered: the size moves to what allows it
    size = await page.evaluate('document.getElementById("demo-form").elements.size.value')
    assert size == "480x272"
    assert await page.evaluate(f'{DISABLED}("size")') == ["832x480", "1280x720"]
    await choose(page, "frames", "17")
    assert await page.evaluate(f'{DISABLED}("size")') == []
    assert_no_script_errors(page)
