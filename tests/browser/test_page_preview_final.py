"""The page's preview-then-final playback in real headless Chromium, against a real server.

By default the page plays a job's live rendition (one stream, nothing to switch: the
last test here); with `?play=switch`, a demo asked for with a fast preview
(`"preview": "linear"`) plays its preview at once; once the server says the final has
caught up (`final_ready`), the page loads the final into a second, invisible <video>
and swaps it in at the same playback time. "Stop full decode" stops the final and
keeps the preview playing to its end.

The final is the gated `tiny` decoder (tests/helpers/browser.py): holding it back
while the ungated `linear` preview runs makes both orders deterministic, the
preview on screen first and `final_ready` arriving live, after the page listens.
"""

from __future__ import annotations

import pytest

from tests.helpers.browser import (
    PLAY_TIMEOUT_S,
    STATE,
    Server,
    assert_no_script_errors,
    start_demo,
    until_set,
)
from tests.helpers.cdp import Page
from vaecast.demo.sources import SceneSpec

pytestmark = [pytest.mark.browser, pytest.mark.asyncio(loop_scope="module")]

DEMO = SceneSpec("showcase", frames=49, width=256, height=160)
DEMO_FPS = 16
FRAME_S = 1 / DEMO_FPS
CHUNK_MS = 1000 * 4 / 16  # one of tiny's chunks at DEMO_FPS
HOLD_AT = 0  # the final publishes nothing (so cannot be ready) until the test says

# What Chromium reports about a <video>, by id.
FACTS = """(v => ({
  id: v.id,
  front: !v.classList.contains("behind"),
  currentTime: v.currentTime,
  paused: v.paused,
  ended: v.ended,
  duration: v.duration,
  error: v.error && v.error.message,
  totalVideoFrames: v.getVideoPlaybackQuality().totalVideoFrames,
  src: v.getAttribute("src"),
}))(document.getElementById(%r))"""
FRONT = "document.querySelector('.screen video:not(.behind)')"
BADGE = "document.getElementById('rendition').textContent"


async def open_page(page: Page, server: Server, play: str = "switch") -> None:
    await page.navigate(server.url + f"/?play={play}")
    await page.wait_for("window.vaecast && window.vaecast.state.ready")


async def start_with_preview(page: Page, preview: str = "linear") -> None:
    offered = await page.evaluate(
        "Array.from(document.getElementById('demo-form').preview.options, (o) => o.value)"
    )
    assert {"", "none", "linear"} <= set(offered)
    await page.evaluate(f"document.getElementById('demo-form').preview.value = {preview!r}")
    await start_demo(page, DEMO, DEMO_FPS)


async def preview_playing(page: Page) -> dict:
    """The state once the preview shows frames and has played a little, in front."""
    return await page.wait_for(
        f"""(s => s.rendition === 'preview' && s.firstFrameAt !== null && s.framesShown > 2
              && document.getElementById('video').currentTime > 0.1
              && !document.getElementById('video').classList.contains('behind') && s)({STATE})""",
        PLAY_TIMEOUT_S,
    )


async def job_json(server: Server, job_id: str) -> dict:
    async with server.client.get(f"/v1/videos/{job_id}") as response:
        assert response.status == 200, await response.text()
        return await response.json()


def stall_halt_ms(stall: dict) -> float:
    """How long the video's clock stood still in a wait between two presented frames."""
    return max(0.0, stall["ms"] - stall["mediaMs"])


async def test_the_preview_plays_first_then_the_final_takes_over_in_place(
    server: Server, page: Page
) -> None:
    server.decoder.hold(HOLD_AT)
    await open_page(page, server)
    await start_with_preview(page)

    await until_set(server.decoder.holding)
    state = await preview_playing(page)
    # The final is held: what plays is the preview alone.
    assert not server.decoder.gate.is_set()
    assert state["renditions"]["preview"]["decoder"] == "linear"
    assert state["renditions"]["final"]["decoder"] == "tiny"
    assert (state["finalReady"], state["switchedAt"]) == (False, None)
    assert state["renditions"]["final"]["loading"] is False
    assert (await page.evaluate(BADGE)).startswith("preview")
    job = server.job(state["jobId"])
    assert job.record.status.value == "in_progress"

    released_at = await page.evaluate("performance.now()")
    server.decoder.release()
    state = await page.wait_for(f"(s => s.switchedAt !== null && s)({STATE})", PLAY_TIMEOUT_S)
    assert state["finalReady"]
    assert state["finalReadyAt"] <= state["switchedAt"]
    assert [s["reason"] for s in state["switches"]] == ["final_ready"]
    assert state["rendition"] == "final"
    print(
        f"switched {state['timeBefore']:.3f} s -> {state['timeAfter']:.3f} s, "
        f"{state['switchedAt'] - state['finalReadyAt']:.0f} ms after final_ready"
    )
    # No jump back (half a frame at most, inside the same frame), and not far ahead.
    assert state["timeAfter"] >= state["timeBefore"] - FRAME_S
    assert state["timeAfter"] - state["timeBefore"] <= FRAME_S
    assert state["timeAfter"] > 0.1  # no second start from 0
    final = await page.evaluate(FACTS % "video-final")
    assert final["front"]
    assert (await page.evaluate(FACTS % "video"))["front"] is False
    assert (await page.evaluate(BADGE)) == "final · tiny"

    await page.wait_for(f"{FRONT}.ended", PLAY_TIMEOUT_S)
    final = await page.evaluate(FACTS % "video-final")
    state = await page.wait_for(f"(s => s.status === 'completed' && s)({STATE})")
    assert final["error"] is None
    assert final["front"]
    assert final["duration"] == pytest.approx(DEMO.frames / DEMO_FPS, abs=0.05)
    assert final["currentTime"] == pytest.approx(final["duration"], abs=1e-3)
    # Every frame presented in front came after the one before: the swap included.
    assert state["backwardSteps"] == 0
    # From the final's release to the end, the switch included: the video's clock never
    # halts longer than a chunk (4 frames). A wait between two presented frames while
    # the clock ran on is a busy machine skipping frames, not a stall of playback; what
    # the same page saw of that jitter while the preview played alone widens the bound.
    # The preview running out of data is its decode falling behind real time once the
    # final shares the CPU (a busy machine): not the page's doing, and reported. The
    # final never runs out (the page swaps to it only when it is ahead), and no halt
    # the page causes may pass the bound.
    after = [stall for stall in state["stalls"] if stall["at"] > released_at]
    starved = [s for s in after if s["starved"] and s["rendition"] == "preview"]
    halts = [stall_halt_ms(stall) for stall in after if stall not in starved]
    jitter = [stall_halt_ms(stall) for stall in state["stalls"] if stall["at"] <= released_at]
    bound = CHUNK_MS + max(jitter, default=0.0)
    print(
        f"halts after the release: {halts} ms; before it: {jitter} ms; bound {bound:.0f} ms; "
        f"the preview starved: {[stall_halt_ms(s) for s in starved]} ms"
    )
    assert all(halt <= bound for halt in halts), (halts, bound)
    assert state["lastMediaTime"] >= (DEMO.frames - 1) / DEMO_FPS - 1e-3
    assert state["rendition"] == "final"
    assert state["renditions"]["final"]["status"] == "completed"
    assert state["renditions"]["preview"]["status"] == "completed"
    assert state["renditions"]["final"]["streamEnded"]
    assert state["streamEnded"]
    # The preview, no longer needed once the final is complete, is unloaded.
    assert (await page.evaluate(FACTS % "video"))["src"] is None
    assert state["errors"] == []
    assert await page.evaluate("document.getElementById('error').hidden")
    assert await page.evaluate("document.getElementById('stop-final').disabled")
    assert_no_script_errors(page)


async def test_stop_full_decode_keeps_the_preview_playing_to_its_end(
    server: Server, page: Page
) -> None:
    server.decoder.hold(HOLD_AT)
    await open_page(page, server)
    await start_with_preview(page)
    await until_set(server.decoder.holding)
    state = await preview_playing(page)
    assert await page.evaluate("!document.getElementById('stop-final').disabled")

    await page.evaluate("document.getElementById('stop-final').click()")
    await page.wait_for(f"{STATE}.finalStopped")
    # The final's decode thread notices the stop when it publishes its next chunk.
    server.decoder.release()

    await page.wait_for(f"{FRONT}.ended", PLAY_TIMEOUT_S)
    state = await page.wait_for(f"(s => s.status === 'cancelled' && s)({STATE})", PLAY_TIMEOUT_S)
    job = await job_json(server, state["jobId"])
    assert job["status"] == "cancelled"
    assert job["variants"]["preview"]["status"] == "completed"
    assert job["variants"]["final"]["status"] == "cancelled"

    preview = await page.evaluate(FACTS % "video")
    assert preview["front"]
    assert preview["error"] is None
    assert preview["totalVideoFrames"] == DEMO.frames  # played from its start to its end
    assert preview["duration"] == pytest.approx(DEMO.frames / DEMO_FPS, abs=0.05)
    assert state["rendition"] == "preview"
    assert (state["switchedAt"], state["switches"]) == (None, [])
    assert state["renditions"]["preview"]["status"] == "completed"
    assert state["renditions"]["final"]["status"] == "cancelled"
    assert state["backwardSteps"] == 0
    assert "full decode stopped" in await page.evaluate(BADGE)
    assert state["errors"] == []
    assert await page.evaluate("document.getElementById('error').hidden")
    assert await page.evaluate("document.getElementById('stop-final').disabled")
    assert_no_script_errors(page)


async def test_a_demo_without_a_preview_shows_no_rendition(server: Server, page: Page) -> None:
    await open_page(page, server)
    await start_with_preview(page, "none")
    state = await page.wait_for(
        f"(s => s.status === 'completed' && s.streamEnded && s)({STATE})", PLAY_TIMEOUT_S
    )
    assert (state["rendition"], state["renditions"]) == (None, None)
    assert await page.evaluate("document.getElementById('rendition').hidden")
    assert await page.evaluate("document.getElementById('stop-final').hidden")
    assert (await job_json(server, state["jobId"])).get("variants") is None
    assert_no_script_errors(page)


async def test_by_default_the_page_plays_the_live_rendition_at_once_to_its_end(
    server: Server, page: Page
) -> None:
    """The final held back, the live rendition carries the preview's chunks in time; once
    released, the final's. One <video>, never swapped, plays it all from its start."""
    server.decoder.hold(HOLD_AT)
    await open_page(page, server, play="live")
    await start_with_preview(page)
    state = await page.wait_for(
        f"(s => s.playsLive && s.firstFrameAt !== null && s.framesShown > 2 && s)({STATE})",
        PLAY_TIMEOUT_S,
    )
    assert state["renditions"] is None and state["rendition"] is None
    assert (await page.evaluate(BADGE)).startswith("live · 0 of")
    server.decoder.release()
    await page.wait_for(f"{FRONT}.ended", PLAY_TIMEOUT_S)
    state = await page.wait_for(f"(s => s.status === 'completed' && s)({STATE})")
    video = await page.evaluate(FACTS % "video")
    assert video["front"] and video["error"] is None
    assert video["totalVideoFrames"] == DEMO.frames  # one stream, from its start to its end
    job = await job_json(server, state["jobId"])
    sources = job["variants"]["live"]["sources"]
    assert state["liveSources"] == sources and sources[0] == "preview"
    assert state["switches"] == [] and state["errors"] == []
    assert_no_script_errors(page)
