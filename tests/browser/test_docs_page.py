"""/docs in real Chromium: Swagger UI renders every operation of /openapi.json from
this server's own files, under its Content-Security-Policy, with no script error."""

from __future__ import annotations

import pytest

from tests.helpers.browser import Server, assert_no_script_errors
from tests.helpers.cdp import Page

pytestmark = [pytest.mark.browser, pytest.mark.asyncio(loop_scope="module")]

OPERATIONS = "document.querySelectorAll('.opblock').length"
# Recorded from the page's first script on: what its Content-Security-Policy blocked.
WATCH_POLICY = """window.violations = [];
document.addEventListener("securitypolicyviolation",
  e => window.violations.push(`${e.violatedDirective} ${e.blockedURI}`));"""


async def test_the_reference_page_renders_every_operation_from_here(server: Server, page: Page):
    async with server.client.get("/openapi.json") as response:
        document = await response.json()
    operations = sum(len(item) for item in document["paths"].values())
    await page.send("Page.addScriptToEvaluateOnNewDocument", source=WATCH_POLICY)
    await page.navigate(server.url + "/docs")
    assert await page.wait_for(f"{OPERATIONS} >= {operations} && {OPERATIONS}") == operations
    title = await page.evaluate("document.querySelector('.info .title').textContent")
    assert title.startswith("vaecast") and document["info"]["version"] in title
    origin = server.url.rstrip("/")
    assert [url for url in page.requests if not url.startswith((origin, "data:"))] == []
    assert f"{origin}/docs/openapi-3.0.json" in page.requests
    assert await page.evaluate("window.violations") == []
    assert_no_script_errors(page)
