"""Real HLS players in headless Chromium against a vaecast test server.

- `SteppedTinyDecoder`: the gated `tiny` decoder, holding every chunk from `hold_at`
  on until the test allows it (`allow(k)`), so a test can hand a player one new part
  at a time.
- `add_player_pages`: routes on the test server's own app (added before it starts) for
  a page with Chromium's own `<video src=playlist.m3u8>`, a page playing the playlist
  with hls.js, and hls.js itself, installed by tools/install-test-deps under
  tools/node/. Page, script and media share one origin, so no request leaves the test
  server and no CORS is involved.
- `PlaylistGate`: holds playlist requests at the server's door while closed, so a test
  can let a job change several parts at once between two of a player's reloads.
- `MediaErrors`: what Chromium's media pipeline says when it refuses a stream (the
  DevTools `Media` domain), as readable cause chains.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import re
import threading
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler

from tests.helpers.browser import GATE_TIMEOUT_S, GatedTinyDecoder
from tests.helpers.cdp import Page
from vaecast.models.base import ChunkCallback, DecodedChunk

HLS_JS = Path(__file__).resolve().parents[2] / "tools/node/node_modules/hls.js/dist/hls.min.js"
HLS_JS_PATH = "/test/hls.min.js"
NATIVE_PAGE = "/test/native"  # + /{video_id}[?rendition=live|preview]
HLS_JS_PAGE = "/test/hls-js"  # + /{video_id}[?rendition=live|preview]
VIDEO_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")

# The page's hls.js: low-latency mode (parts, blocking playlist reloads), from the
# playlist's start rather than its live edge, every error event kept in `hlsErrors`.
HLS_JS_SCRIPT = """
window.hlsErrors = [];
const video = document.getElementById("video");
if (typeof Hls === "undefined" || !Hls.isSupported()) {
  window.hlsErrors.push({fatal: true, details: "hls.js did not load or MSE is missing"});
} else {
  const hls = (window.hls = new Hls({lowLatencyMode: true, startPosition: 0}));
  hls.on(Hls.Events.ERROR, (event, data) => {
    window.hlsErrors.push({
      type: data.type,
      details: data.details,
      fatal: data.fatal,
      reason: data.reason || String(data.error || ""),
      url: data.url || (data.frag && data.frag.url) || (data.context && data.context.url) || null,
    });
  });
  hls.loadSource(PLAYLIST);
  hls.attachMedia(video);
}
"""


# A player page's playout, for an init script (`Page.addScriptToEvaluateOnNewDocument`):
# `waits`, each wait for data (ms) after the video first played; `playingAt` and
# `lastAt` (`ended`), on the page's clock.
PLAYOUT_WATCH = """
window.playout = {playingAt: null, lastAt: null, waitingSince: null, waits: []};
document.addEventListener("DOMContentLoaded", () => {
  const video = document.getElementById("video");
  video.addEventListener("playing", () => {
    const now = performance.now();
    if (playout.playingAt === null) playout.playingAt = now;
    if (playout.waitingSince !== null) playout.waits.push(now - playout.waitingSince);
    playout.waitingSince = null;
  });
  video.addEventListener("waiting", () => {
    if (playout.playingAt !== null && !video.ended) playout.waitingSince = performance.now();
  });
  video.addEventListener("ended", () => { playout.lastAt = performance.now(); });
});
"""


class SteppedTinyDecoder(GatedTinyDecoder):
    """The gated `tiny` decoder, but each chunk from `hold_at` on waits for its own
    `allow(index)`; `release()` allows every chunk (teardown calls it)."""

    def __init__(self) -> None:
        super().__init__()
        self._allowed = -1
        self._step = threading.Condition()

    def hold(self, at: int) -> None:
        super().hold(at)
        with self._step:
            self._allowed = at - 1

    def allow(self, index: int) -> None:
        """Let chunk `index` (and every one before it) be published."""
        with self._step:
            self._allowed = max(self._allowed, index)
            self._step.notify_all()

    def release(self, error: BaseException | None = None) -> None:
        super().release(error)
        self.allow(2**31)

    def _gated(self, on_chunk: ChunkCallback) -> ChunkCallback:
        def gated(chunk: DecodedChunk) -> None:
            if self.hold_at is not None and chunk.index >= self.hold_at:
                if chunk.index == self.hold_at:
                    self.holding.set()
                with self._step:
                    if not self._step.wait_for(
                        lambda: self._allowed >= chunk.index, GATE_TIMEOUT_S
                    ):
                        raise TimeoutError(f"the test never allowed chunk {chunk.index}")
                if self.error is not None:
                    raise self.error
            on_chunk(chunk)

        return gated


def add_player_pages(app: web.Application, hls_js: Path) -> None:
    """The player pages and hls.js, on `app` (before its runner starts)."""

    async def script(request: web.Request) -> web.FileResponse:
        # A missing file answers 404 (the tests that need it fail first, saying why).
        return web.FileResponse(
            hls_js,
            headers={"Content-Type": "text/javascript; charset=utf-8", "Cache-Control": "no-cache"},
        )

    async def native(request: web.Request) -> web.Response:
        playlist = html.escape(_playlist(request))
        return _page(f'<video id="video" src="{playlist}" autoplay muted playsinline></video>')

    async def hls_js_page(request: web.Request) -> web.Response:
        constant = f"const PLAYLIST = {_playlist(request)!r};"
        return _page(
            '<video id="video" autoplay muted playsinline></video>\n'
            f'<script src="{HLS_JS_PATH}"></script>\n'
            f"<script>{constant}{HLS_JS_SCRIPT}</script>"
        )

    app.router.add_get(HLS_JS_PATH, script)
    app.router.add_get(NATIVE_PAGE + "/{video_id}", native)
    app.router.add_get(HLS_JS_PAGE + "/{video_id}", hls_js_page)


def _playlist(request: web.Request) -> str:
    """The job's playlist, or (`?rendition=live|preview`) that rendition's."""
    video_id = request.match_info["video_id"]
    rendition = request.query.get("rendition", "")
    if not VIDEO_ID.fullmatch(video_id) or rendition not in ("", "live", "preview"):
        raise web.HTTPNotFound()
    return f"/v1/videos/{video_id}/{rendition + '/' if rendition else ''}playlist.m3u8"


def _page(body: str) -> web.Response:
    return web.Response(
        text=f'<!doctype html>\n<meta charset="utf-8">\n<title>HLS player</title>\n{body}\n',
        content_type="text/html",
        headers={"Cache-Control": "no-cache"},
    )


class PlaylistGate:
    """While closed, every playlist request waits before the route sees it (so a
    request answered later reads the playlist as it is then); `waiting` counts them."""

    def __init__(self) -> None:
        self._open = asyncio.Event()
        self._open.set()
        self.waiting = 0

    def close(self) -> None:
        self._open.clear()

    def open(self) -> None:
        self._open.set()

    def add_to(self, app: web.Application) -> None:
        app.middlewares.append(self._middleware)

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path.endswith("/playlist.m3u8") and not self._open.is_set():
            self.waiting += 1
            try:
                await self._open.wait()
            finally:
                self.waiting -= 1
        return await handler(request)


PLAYLIST_GATE = web.AppKey("playlist_gate", PlaylistGate)


class MediaErrors:
    """Errors Chromium's media pipeline raises in one page, e.g.
    `PipelineStatus::DEMUXER_ERROR_COULD_NOT_PARSE <- HlsDemuxerStatus::Unsupported
    container`. Call `enable()` before the page loads its media."""

    def __init__(self, page: Page) -> None:
        self.page = page
        self.errors: list[str] = []
        self._raised = asyncio.Event()

    async def enable(self) -> None:
        self.page.connection.on("Media.playerErrorsRaised", self._on_errors, self.page.session_id)
        await self.page.send("Media.enable")

    async def reason(self, timeout_s: float = 5.0) -> str:
        """The errors so far; the media log reaches DevTools in batches, so wait a
        little for one first (for a failure message: a `<video>` in error has one)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._raised.wait(), timeout_s)
        return "; ".join(self.errors) or "(no media log error)"

    def _on_errors(self, params: dict[str, Any]) -> None:
        self.errors += [_cause_chain(error) for error in params["errors"]]
        self._raised.set()


def _cause_chain(error: dict[str, Any]) -> str:
    causes = error.get("cause") or []
    text = str(error.get("errorType"))
    return text if not causes else f"{text} <- {_cause_chain(causes[0])}"
