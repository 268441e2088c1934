"""The page's scrubbing preview: the job's spritesheet, growing while a push session
runs, shows the frame under the bar and seeks the video there."""

from __future__ import annotations

import pytest

from tests.helpers.browser import PLAY_TIMEOUT_S, STATE, Server, assert_no_script_errors
from tests.helpers.cdp import Page
from tests.server.test_push import push as push_block
from vaecast.codecs.stills import sprite_frames
from vaecast.demo.sources import SceneSpec, scene_latents

pytestmark = [pytest.mark.browser, pytest.mark.asyncio(loop_scope="module")]

SPEC = SceneSpec("shapes", frames=17, width=256, height=160)  # 5 latent frames
SCRUB = "window.vaecast.scrub()"


async def test_the_page_scrubs_through_a_growing_spritesheet(server: Server, page: Page) -> None:
    latents = scene_latents(SPEC)
    async with server.client.post("/v1/videos", json={"input": "push", "fps": 16}) as response:
        session = await response.json()

    async def push(first: int, last: int, final: bool = False) -> None:
        status, answer = await push_block(server, session, latents[:, :, first:last], final)
        assert status == 202, answer

    await push(0, 2)  # 1 + 4 frames
    await page.navigate(f"{server.url}/?video={session['id']}")
    await page.wait_for("window.vaecast && window.vaecast.state.ready")
    # The bar shows with the first chunk; its sheet is fetched once someone reaches for it.
    await page.wait_for("!document.getElementById('scrub').hidden")
    await page.evaluate("new Promise((ok) => setTimeout(ok, 300))")
    assert (await page.evaluate(SCRUB))["loads"] == 0
    await page.evaluate(
        "document.getElementById('scrub-bar').dispatchEvent(new PointerEvent('pointerenter'))"
    )
    first = await page.wait_for(f"(s => s.layout && s.layout.covered === 5 && s)({SCRUB})")
    assert (first["layout"]["columns"], first["layout"]["rows"]) == (4, 2)

    await push(2, 5, final=True)  # the sheet grows to the whole video
    grown = await page.wait_for(
        f"(s => s.layout && s.layout.covered === {SPEC.frames} && s)({SCRUB})", PLAY_TIMEOUT_S
    )
    assert grown["covered"][0] == 5 and grown["covered"][-1] == SPEC.frames
    assert grown["layout"]["frames"] == list(sprite_frames(SPEC.frames))
    tile = await page.evaluate(
        """(t => ({image: getComputedStyle(t).backgroundImage, width: t.style.width}))(
             document.querySelector('#scrub .tile'))"""
    )
    assert tile["image"].startswith('url("blob:') and tile["width"] == "160px"
    # The sheet decodes in the browser at the size its layout states.
    size = await page.evaluate(
        """new Promise((ok, fail) => { const i = new Image(); i.onload = () =>
             ok([i.naturalWidth, i.naturalHeight]); i.onerror = fail;
             i.src = getComputedStyle(document.querySelector('#scrub .tile'))
               .backgroundImage.slice(5, -2); })"""
    )
    assert size == [4 * 160, 4 * 100]

    # Move to three quarters: the tile nearest frame 12 shows; let go: the video is there.
    await page.evaluate(
        """(b => { b.value = 0.75; b.dispatchEvent(new Event('input'));
                   b.dispatchEvent(new Event('change')); })(document.getElementById('scrub-bar'))"""
    )
    frames = grown["layout"]["frames"]
    nearest = min(range(len(frames)), key=lambda i: abs(frames[i] - 12))
    assert (await page.evaluate(SCRUB))["shown"] == nearest
    position = await page.evaluate(
        "document.querySelector('#scrub .tile').style.backgroundPosition"
    )
    assert position == f"-{(nearest % 4) * 160}px -{(nearest // 4) * 100}px"
    await page.wait_for(f"(s => s.status === 'completed')({STATE})")
    current = await page.wait_for(
        "(v => Math.abs(v.currentTime - 12 / 16) < 1e-3 && v.currentTime)("
        "document.getElementById('video'))"
    )
    assert current == pytest.approx(12 / 16, abs=1e-3)
    assert_no_script_errors(page)
