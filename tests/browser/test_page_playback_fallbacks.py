"""Where the page plays, and how it recovers: ManagedMediaSource where MediaSource is
missing, the browser's own HLS where neither exists (both chosen by feature detection:
the tests rename or remove the globals), and a watchdog that moves a playhead frozen
with data ahead of it. No Safari was available: ManagedMediaSource is Chromium's
MediaSource under that name here, and native HLS is checked as far as the URL chosen."""

from __future__ import annotations

import pytest

from tests.browser.test_preview_page import open_preview
from tests.helpers.browser import (
    PLAY_TIMEOUT_S,
    STATE,
    VIDEO_FACTS,
    Server,
    assert_no_script_errors,
    start_demo,
)
from tests.helpers.cdp import Page
from vaecast.demo.sources import SceneSpec

pytestmark = [pytest.mark.browser, pytest.mark.asyncio(loop_scope="module")]

SMALL = SceneSpec("shapes", frames=17, width=256, height=160)


async def test_only_a_managed_media_source_is_used_as_one(server: Server, page: Page) -> None:
    await page.send(
        "Page.addScriptToEvaluateOnNewDocument",
        source="window.ManagedMediaSource = window.MediaSource; delete window.MediaSource;",
    )
    await open_preview(page, server)
    await start_demo(page, SMALL, 8)
    await page.wait_for("document.getElementById('video').ended", PLAY_TIMEOUT_S)
    state = await page.evaluate(STATE)
    facts = await page.evaluate(VIDEO_FACTS)
    assert (state["playback"], state["errors"]) == ("mms", [])
    assert facts["totalVideoFrames"] == SMALL.frames
    assert await page.evaluate("document.getElementById('video').disableRemotePlayback")
    assert_no_script_errors(page)


async def test_without_any_media_source_a_browser_that_plays_hls_gets_the_playlist(
    server: Server, page: Page
) -> None:
    await page.send(
        "Page.addScriptToEvaluateOnNewDocument",
        source="""delete window.MediaSource; delete window.ManagedMediaSource;
          const plays = HTMLMediaElement.prototype.canPlayType;
          HTMLMediaElement.prototype.canPlayType = function (type) {
            return type === "application/vnd.apple.mpegurl" ? "maybe" : plays.call(this, type);
          };""",
    )
    await open_preview(page, server)
    await start_demo(page, SMALL, 8)
    state = await page.wait_for(f"(s => s.playback && s)({STATE})")
    source = await page.evaluate("document.getElementById('video').src")
    assert state["playback"] == "hls"
    assert source.endswith(f"/v1/videos/{state['jobId']}/playlist.m3u8")


# Every SourceBuffer the page makes, kept where the test can reach it (the page keeps
# its own out of reach).
KEEP_SOURCE_BUFFERS = """window.__sourceBuffers = [];
  const add = MediaSource.prototype.addSourceBuffer;
  MediaSource.prototype.addSourceBuffer = function (type) {
    const buffer = add.call(this, type);
    window.__sourceBuffers.push(buffer);
    return buffer;
  };"""

# Takes [t + 0.5, t + 1.5] out of the buffered video, ahead of its playhead: the
# playhead stops at the hole with data after it. (MSE removes video up to the next
# keyframe after the end: the test waits for one to be buffered, keyframes being 2 s
# apart.)
MAKE_A_HOLE = """(async () => {
  const video = document.getElementById("video");
  const buffer = window.__sourceBuffers[0];
  const t = video.currentTime;
  while (buffer.updating) await new Promise((r) => setTimeout(r, 5));
  buffer.remove(t + 0.5, t + 1.5);
  await new Promise((r) => buffer.addEventListener("updateend", r, { once: true }));
  return t;
})()"""


async def test_a_playhead_frozen_before_a_hole_is_moved_on(server: Server, page: Page) -> None:
    await page.send("Page.addScriptToEvaluateOnNewDocument", source=KEEP_SOURCE_BUFFERS)
    await open_preview(page, server)
    spec = SceneSpec("shapes", frames=81, width=256, height=160)  # 10 s at 8 fps
    await start_demo(page, spec, 8)
    # Playing, every segment appended (an append after a removal would wait for a
    # keyframe), more than a keyframe interval buffered past the hole's end.
    await page.wait_for(f"{STATE}.streamEnded", PLAY_TIMEOUT_S)
    await page.wait_for(
        """(v => !v.paused && v.currentTime > 0.3 && v.buffered.length
              && v.buffered.end(0) > v.currentTime + 4.5)(document.getElementById('video'))""",
        PLAY_TIMEOUT_S,
    )
    holed_at = await page.evaluate(MAKE_A_HOLE)
    ranges = await page.evaluate(
        """(b => [...Array(b.length).keys()].map(i => [b.start(i), b.end(i)]))(
             document.getElementById('video').buffered)"""
    )
    assert len(ranges) == 2 and ranges[0][1] == pytest.approx(holed_at + 0.5, abs=0.2)
    state = await page.wait_for(f"(s => s.nudges > 0 && s)({STATE})", PLAY_TIMEOUT_S)
    assert state["nudges"] == 1
    # It plays on past the hole. (Not to `ended`: a removal reopens an ended
    # MediaSource, as the spec says, and nothing ends it again.)
    await page.wait_for(
        f"document.getElementById('video').currentTime > {ranges[1][0] + 1.0}", PLAY_TIMEOUT_S
    )
    assert (await page.evaluate(STATE))["nudges"] == 1
    assert_no_script_errors(page)
