"""A cancelled job's kept partial plays in Chromium to its last fragment, and states its
duration: `<video src>` of its `/content`, as a user opens it."""

from __future__ import annotations

import pytest

from tests.helpers import safetensors_bytes, smooth_latents, until
from tests.helpers.browser import VIDEO_FACTS, Server, assert_no_script_errors
from tests.helpers.cdp import Page

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

FPS = 8
PUSHED = smooth_latents(frames=5)  # tiny: 1 + 4 * 4 = 17 frames, then the cancel
FRAMES = 17


async def test_a_cancelled_jobs_partial_plays_to_its_end(server: Server, page: Page):
    async with server.client.post(
        "/v1/videos", json={"input": "push", "fps": FPS, "model": "tiny"}
    ) as response:
        session = await response.json()
    token = {"X-Push-Token": session["push"]["token"]}
    body = safetensors_bytes(latents=PUSHED)
    async with server.client.post(session["push"]["url"], data=body, headers=token) as response:
        assert response.status == 202, await response.text()
    job = server.job(session["id"])
    await until(lambda: job.record.frames_done == FRAMES)
    async with server.client.delete(session["urls"]["self"]) as response:
        assert (await response.json())["partial"] is True

    await page.navigate(f"{server.url}/healthz")  # any page of the server's origin
    await page.evaluate(
        f"""(() => {{
          const video = document.createElement("video");
          video.id = "video";
          video.muted = true;
          video.src = {session["urls"]["content"]!r};
          document.body.append(video);
          video.play();
        }})()"""
    )
    await page.wait_for("document.getElementById('video').ended", 30)
    facts = await page.evaluate(VIDEO_FACTS)
    seconds = FRAMES / FPS
    assert facts["error"] is None, facts
    assert facts["duration"] == pytest.approx(seconds, abs=0.01), facts
    assert facts["currentTime"] == pytest.approx(seconds, abs=0.2), facts
    assert facts["totalVideoFrames"] >= FRAMES - 2, facts
    assert_no_script_errors(page)
