"""A push session in the page: it plays while the producer is still generating."""

from __future__ import annotations

import pytest

from tests.helpers import safetensors_bytes
from tests.helpers.browser import (
    PLAY_TIMEOUT_S,
    STATE,
    VIDEO_FACTS,
    Server,
    assert_no_script_errors,
)
from tests.helpers.cdp import Page
from vaecast.demo.sources import SceneSpec, scene_latents

pytestmark = [pytest.mark.browser, pytest.mark.asyncio(loop_scope="module")]

SPEC = SceneSpec("shapes", frames=17, width=256, height=160)  # 5 latent frames


async def test_the_page_plays_a_push_session_before_its_last_block(
    server: Server, page: Page
) -> None:
    latents = scene_latents(SPEC)
    async with server.client.post("/v1/videos", json={"input": "push", "fps": 16}) as response:
        session = await response.json()
    token = {"X-Push-Token": session["push"]["token"]}

    async def push(first: int, last: int, final: bool = False) -> None:
        body = safetensors_bytes(latents=latents[:, :, first:last].contiguous())
        params = {"final": "1"} if final else {}
        async with server.client.post(
            session["push"]["url"], data=body, headers=token, params=params
        ) as response:
            assert response.status == 202, await response.text()

    await push(0, 2)  # 1 + 4 frames
    await page.navigate(f"{server.url}/?video={session['id']}")
    await page.wait_for("window.vaecast && window.vaecast.state.ready")
    # The producer has not finished, and the page shows the video already.
    playing = await page.wait_for(f"(f => f.totalVideoFrames > 0 && f)({VIDEO_FACTS})")
    assert playing["buffered"] and playing["buffered"][0][1] > 0
    assert not server.manager.get(session["id"]).feed.ended
    await push(2, 4)
    await push(4, 5, final=True)
    await page.wait_for("document.getElementById('video').ended", PLAY_TIMEOUT_S)
    ended = await page.evaluate(VIDEO_FACTS)
    assert ended["totalVideoFrames"] == SPEC.frames
    state = await page.wait_for(f"(s => s.status === 'completed' && s)({STATE})")
    assert state["framesDone"] == SPEC.frames
    assert_no_script_errors(page)
