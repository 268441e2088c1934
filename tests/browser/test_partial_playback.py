"""Files of a video that did not finish, in Chromium: a cancelled job's kept partial
(`<video src>` of its `/content`, as a user opens it) states its duration and plays to
its last fragment; a file saved while a job runs states none, and Chromium plays
what it holds, to its end."""

from __future__ import annotations

import pytest

from tests.helpers import safetensors_bytes, smooth_latents, until
from tests.helpers.browser import VIDEO_FACTS, Server, assert_no_script_errors, until_set
from tests.helpers.cdp import Page

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

FPS = 8
PUSHED = smooth_latents(frames=5)  # tiny: 1 + 4 * 4 = 17 frames, then the cancel
FRAMES = 17


async def cancelled_with_a_partial(server: Server) -> dict:
    """A push session given PUSHED, decoded, then DELETEd (keeping it); its job object."""
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
    return session


async def test_a_cancelled_jobs_partial_plays_to_its_end(server: Server, page: Page):
    session = await cancelled_with_a_partial(server)

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


async def test_a_file_saved_while_the_job_runs_plays_what_it_holds(server: Server, page: Page):
    """The bytes committed so far (what `curl` has saved by then): their init segment
    states no length, and Chromium takes the fragments' own."""
    server.decoder.hold(at=3)  # chunks 0-2 (1 + 4 + 4 frames) are in, the rest held
    body = safetensors_bytes(latents=smooth_latents(frames=6))
    async with server.client.post("/v1/videos", params={"fps": str(FPS)}, data=body) as response:
        job = await response.json()
    await until_set(server.decoder.holding)
    await until(lambda: server.job(job["id"]).record.frames_done == 9)
    last = server.job(job["id"]).log.size - 1
    await page.navigate(f"{server.url}/healthz")
    await page.evaluate(
        f"""(async () => {{
          const range = {{headers: {{Range: "bytes=0-{last}"}}}};
          const answer = await fetch({job["urls"]["content"]!r}, range);
          const saved = await answer.blob();  // a 206 of the bytes committed so far
          const video = document.createElement("video");
          video.id = "video";
          video.muted = true;
          video.src = URL.createObjectURL(saved);
          document.body.append(video);
          video.play();
        }})()"""
    )
    await page.wait_for("document.getElementById('video').ended", 30)
    facts = await page.evaluate(VIDEO_FACTS)
    server.decoder.release()
    assert facts["error"] is None, facts
    assert facts["duration"] == pytest.approx(9 / FPS, abs=0.01), facts
    assert facts["currentTime"] == pytest.approx(9 / FPS, abs=0.2), facts
    assert_no_script_errors(page)


async def test_the_page_plays_a_partial_and_says_so(server: Server, page: Page):
    session = await cancelled_with_a_partial(server)
    await page.navigate(f"{server.url}/?video={session['id']}")
    await page.wait_for("document.getElementById('video').ended", 30)
    status = "document.getElementById('status').textContent"
    assert await page.wait_for(f"{status} === 'cancelled (partial)' && {status}", 10)
    facts = await page.evaluate(VIDEO_FACTS)
    assert facts["duration"] == pytest.approx(FRAMES / FPS, abs=0.01), facts
    state = await page.evaluate("window.vaecast.state")
    assert state["partial"] is True
