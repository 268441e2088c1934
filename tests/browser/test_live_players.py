"""The live rendition in real players in headless Chromium: hls.js on its LL-HLS
playlist, while the job decodes with a final 1.5x slower than real time.

The server decodes the demo (a push session, with its sound) with `tiny` held to 1.5x
real time (`benchmarks.paced`) and previews it with `linear`. hls.js opens the live
rendition's playlist as soon as the job exists, plays from its start, and never waits
for data once it plays; the live rendition carries some of the final's chunks.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from aiohttp import web

from benchmarks.paced import PacedDecoder
from tests.helpers.browser import PLAY_TIMEOUT_S, VIDEO_FACTS, Server, serving
from tests.helpers.cdp import Page
from tests.helpers.hls_players import HLS_JS, HLS_JS_PAGE, PLAYOUT_WATCH, add_player_pages
from vaecast.models.tiny import TinyDecoder

pytestmark = [pytest.mark.browser, pytest.mark.asyncio(loop_scope="module")]

FPS = 16
DEMO = {
    "scene": "shapes",
    "frames": 49,
    # Small, so that `tiny` itself runs far faster than its 1.5x pace even on a busy
    # machine: the pace, not the machine, decides what comes in time.
    "width": 128,
    "height": 80,
    "fps": FPS,
    "preview": "linear",
}
# A wait for data longer than this, once playing, is a stall (shorter ones are the
# media pipeline's own hand-offs: a frame at 25 fps).
STALL_MS = 40

SOURCE = "vaecast_source"  # the ID3 TXXX frame each live fragment's emsg holds
# The timed metadata hls.js turned into cues: each ID3 frame's key, description, value.
METADATA_CUES = """Array.from(document.getElementById("video").textTracks)
  .filter((track) => track.kind === "metadata")
  .flatMap((track) => Array.from(track.cues || []))
  .map((cue) => ({start: cue.startTime, key: cue.value && cue.value.key,
                  info: cue.value && cue.value.info, data: cue.value && cue.value.data}))"""


@pytest_asyncio.fixture(loop_scope="module")
async def server() -> AsyncIterator[Server]:
    if not HLS_JS.exists():
        pytest.fail(f"{HLS_JS} is missing: run tools/install-test-deps")

    def extend(app: web.Application) -> None:
        add_player_pages(app, HLS_JS)

    decoder = PacedDecoder(TinyDecoder(), pace=1.5, fps=FPS)
    async with serving(decoder, extend=extend) as server:  # type: ignore[arg-type]
        yield server


async def test_hls_js_plays_the_live_rendition_of_a_slow_final_without_a_stall(
    server: Server, page: Page
) -> None:
    await page.send("Page.addScriptToEvaluateOnNewDocument", source=PLAYOUT_WATCH)
    job = await server.create_demo(**DEMO)
    assert job["urls"]["live_playlist"] == f"/v1/videos/{job['id']}/live/playlist.m3u8"
    await page.navigate(f"{server.url}{HLS_JS_PAGE}/{job['id']}?rendition=live")
    ended = await page.wait_for(
        f"(f => (f.ended || f.error || window.hlsErrors.some(e => e.fatal)) && f)({VIDEO_FACTS})",
        PLAY_TIMEOUT_S,
    )
    errors = await page.evaluate("window.hlsErrors")
    assert ended["error"] is None and not [e for e in errors if e["fatal"]], errors
    assert ended["totalVideoFrames"] == DEMO["frames"]
    playout = await page.evaluate("window.playout")
    assert playout["playingAt"] is not None
    assert [wait for wait in playout["waits"] if wait > STALL_MS] == [], playout
    async with server.client.get(f"/v1/videos/{job['id']}") as response:
        done = await response.json()
    sources = done["variants"]["live"]["sources"]
    assert "final" in sources and "preview" in sources, sources
    # Each fragment's emsg, as hls.js shows it: a cue on a metadata track, per chunk.
    cues = await page.evaluate(METADATA_CUES)
    named = {round(cue["start"] * FPS): cue["data"] for cue in cues if cue["info"] == SOURCE}
    starts = [0] + [1 + 4 * k for k in range(len(sources) - 1)]  # each chunk's first frame
    expected = dict(zip(starts, sources, strict=True))
    assert named == {start: expected[start] for start in named}, cues
    # (hls.js 1.7.4 shows no cue for the first fragment here: the others must all be.)
    assert set(named) >= set(starts[1:]), cues
    assert any("/live/hls/part/" in url for url in page.requests)
