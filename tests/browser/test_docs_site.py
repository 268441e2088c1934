"""The documentation site as CI builds it (`mkdocs build --strict`) and as a reader's
browser loads it: every page in headless Chromium, served from 127.0.0.1, with no
console error, no failed request and no request to another host; the HTTP reference
lists every route of the app's router."""

from __future__ import annotations

import asyncio
import mimetypes
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import pytest_asyncio
from aiohttp import web

from tests.helpers.browser import Served, assert_no_script_errors, running
from tests.helpers.cdp import Browser, Page
from vaecast.models.linear import LinearDecoder
from vaecast.server.app import create_app
from vaecast.server.config import ServerConfig
from vaecast.server.contract.spec import NOT_A_ROUTE, operation_of

pytestmark = pytest.mark.slow


ROOT = Path(__file__).resolve().parents[2]
BUILD_TIMEOUT_S = 300
SEARCH = """(() => {
    const input = document.querySelector('.md-search__input');
    input.focus();
    input.value = 'push session';
    for (const kind of ['focus', 'input', 'keyup']) input.dispatchEvent(new Event(kind));
})()"""
ROUTES_TABLE = """[...document.querySelectorAll('article table tr')].map(
    row => [...row.cells].map(cell => cell.innerText.trim()))"""


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site as `mkdocs build --strict` makes it: a warning (a broken link, a missing
    reference or include, a route the OpenAPI document lacks) fails the build."""
    out = tmp_path_factory.mktemp("site")
    # No VAECAST_* default may reach the CLI reference from the builder's environment.
    environment = {k: v for k, v in os.environ.items() if not k.startswith("VAECAST_")}
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env={**environment, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
    )
    assert built.returncode == 0, built.stderr[-4000:]
    return out


def static_site(root: Path) -> web.Application:
    """The built site as a web server serves it: `dir/` is `dir/index.html`.

    Each file is read whole (in a thread) and answered from memory: a `FileResponse`
    that the browser abandons mid-send (it moved on to the next page) leaves its file
    to the garbage collector, a ResourceWarning on a busy machine."""

    async def page(request: web.Request) -> web.StreamResponse:
        target = (root / request.match_info["path"]).resolve()
        if target.is_dir():
            target = target / "index.html"
        if not target.is_relative_to(root) or not target.is_file():
            raise web.HTTPNotFound()
        body = await asyncio.to_thread(target.read_bytes)
        content_type = mimetypes.guess_type(target.name)[0] or "application/octet-stream"
        return web.Response(body=body, content_type=content_type)

    app = web.Application()
    app.router.add_get("/{path:.*}", page)
    return app


@pytest_asyncio.fixture(loop_scope="module")
async def served(site: Path) -> AsyncIterator[Served]:
    async with running(static_site(site.resolve())) as served:
        yield served


def site_pages(site: Path) -> list[str]:
    """The URL path of every page the build made, the 404 page aside."""
    folders = (index.parent.relative_to(site).as_posix() for index in site.rglob("index.html"))
    return sorted("/" if folder == "." else f"/{folder}/" for folder in folders)


def app_routes() -> set[tuple[str, str]]:
    """(method, path) of every route `vaecast serve` answers, HEAD aside (aiohttp's
    twin of each GET), and the handlers that only refuse methods (`not_a_route`)."""
    app = create_app(ServerConfig(default_model="linear"), {"linear": LinearDecoder()})
    return {
        (route.method, resource.canonical)
        for resource in app.router.resources()
        for route in resource
        if route.method != "HEAD" and operation_of(route.handler) is not NOT_A_ROUTE
    }


class Watched:
    """What a page loaded: the responses it got that failed, and its log's errors."""

    def __init__(self, page: Page) -> None:
        self.failures: list[str] = []
        on = page.connection.on
        on("Network.responseReceived", self._response, page.session_id)
        on("Network.loadingFailed", self._failed, page.session_id)
        on("Log.entryAdded", self._log, page.session_id)

    def _response(self, params: dict[str, Any]) -> None:
        response = params["response"]
        if response["status"] >= 400:
            self.failures.append(f"{response['status']} {response['url']}")

    def _failed(self, params: dict[str, Any]) -> None:
        if not params.get("canceled"):
            self.failures.append(f"failed: {params.get('errorText')}")

    def _log(self, params: dict[str, Any]) -> None:
        entry = params["entry"]
        if entry["level"] == "error":
            self.failures.append(f"log: {entry['text']} {entry.get('url', '')}")


def test_the_site_builds_strict(site: Path):
    for page in ("reference/http", "reference/cli", "reference/python", "how-it-works"):
        assert (site / page / "index.html").is_file(), page
    assert (site / "reference" / "openapi.json").is_file()


@pytest.mark.browser
@pytest.mark.asyncio(loop_scope="module")
async def test_every_page_loads_from_this_host_alone(browser: Browser, served: Served, site: Path):
    paths = site_pages(site)
    assert "/reference/http/" in paths and "/guides/operating/" in paths
    page = await browser.new_page()
    try:
        await page.send("Log.enable")
        watched = Watched(page)
        for path in paths:
            await page.navigate(served.url + path)
            title = await page.evaluate("document.querySelector('article h1')?.innerText")
            assert title, f"{path} has no heading"
        # The search, as a reader uses it: its worker and index load from here too.
        await page.evaluate(SEARCH)
        found = "document.querySelectorAll('.md-search-result__item').length"
        assert await page.wait_for(found) > 0
        assert_no_script_errors(page)
        assert watched.failures == []
        hosts = {urlsplit(url).netloc for url in page.requests if url.startswith("http")}
        assert hosts == {urlsplit(served.url).netloc}
        # Nothing but this host's http, inline data and the page's own object URLs.
        schemes = {url.split(":")[0] for url in page.requests}
        assert schemes <= {"http", "data", "blob"}
    finally:
        await browser.close_page(page)


@pytest.mark.browser
@pytest.mark.asyncio(loop_scope="module")
async def test_the_http_reference_lists_every_route(browser: Browser, served: Served):
    page = await browser.new_page()
    try:
        await page.navigate(served.url + "/reference/http/")
        rows = await page.evaluate(ROUTES_TABLE)
        listed = {(cells[0], cells[1]) for cells in rows if len(cells) >= 2}
        routes = app_routes()
        assert len(routes) > 20
        assert sorted(routes - listed) == []
        assert_no_script_errors(page)
    finally:
        await browser.close_page(page)
