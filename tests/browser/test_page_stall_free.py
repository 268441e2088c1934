"""The page's stall-free start in real headless Chromium, against a real server.

A decode slower than real time would stall a viewer who played its first fragment
at once. The server predicts `stall_free_start_s`, the earliest delay after the
first fragment from which the video plays to its end without a stall; the page
waits that long, then plays, and shows how far ahead of the playhead its buffer is.
A decode faster than real time starts at once.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from fractions import Fraction

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web

from tests.helpers import safetensors_bytes, smooth_latents
from tests.helpers.browser import PLAY_TIMEOUT_S, STATE, assert_no_script_errors
from tests.helpers.cdp import Page
from tests.helpers.server import serve_on_loopback
from vaecast.models.linear import LinearDecoder
from vaecast.server.app import create_app, runner_settings
from vaecast.server.config import ServerConfig

pytestmark = [pytest.mark.browser, pytest.mark.asyncio(loop_scope="module")]

FPS = 32  # a chunk of 4 frames is 0.125 s of video
CHUNK_DECODE_S = 0.2  # each made in 0.2 s: 0.625 of real time
LATENT_FRAMES = 13  # 49 frames (1 + 4 per latent after the first): 13 chunks, 1.53 s
FRAMES = 1 + 4 * (LATENT_FRAMES - 1)
# A start within 10% of the server's own stall-free start, give or take a chunk.
START_TOLERANCE = 0.10
BRISK_DECODE_S = 0.05  # 4 frames in 0.05 s: 2.5 times real time
FAST_START_MS = 250  # "at once": the first fragment, then the next chunk event
WAIT_TICK_MS = 100  # the page's timer while a start waits (vaecast/static/session.js)


class PacedDecoder(LinearDecoder):
    """`linear`, slowed to CHUNK_DECODE_S a chunk (as tests/server/test_playback_deadlines.py)."""

    name = "paced"
    pace_s = CHUNK_DECODE_S

    def decode_chunks(self, latents, on_chunk):  # type: ignore[no-untyped-def]
        def paced(chunk):  # type: ignore[no-untyped-def]
            time.sleep(self.pace_s)
            on_chunk(chunk)

        super().decode_chunks(latents, paced)


class BriskDecoder(PacedDecoder):
    """`linear` at BRISK_DECODE_S a chunk: 2.5 times real time, yet still decoding when
    the page joins."""

    name = "brisk"
    pace_s = BRISK_DECODE_S


@dataclass
class Server:
    url: str
    client: aiohttp.ClientSession


@pytest_asyncio.fixture(loop_scope="module")
async def server() -> AsyncIterator[Server]:
    """A vaecast server on 127.0.0.1: a decoder slower than real time, one faster, `linear`."""
    config = ServerConfig(default_model="paced", default_fps=Fraction(FPS))
    decoders = {"paced": PacedDecoder(), "brisk": BriskDecoder(), "linear": LinearDecoder()}
    app = create_app(config, decoders)
    runner = web.AppRunner(app, **runner_settings(config))
    url = await serve_on_loopback(app, runner)
    client = aiohttp.ClientSession(url, timeout=aiohttp.ClientTimeout(total=60))
    try:
        yield Server(url, client)
    finally:
        await client.close()
        await runner.cleanup()


async def upload(server: Server, model: str, latent_frames: int = LATENT_FRAMES) -> dict:
    form = aiohttp.FormData()
    latents = smooth_latents(frames=latent_frames, height=6, width=8)
    form.add_field("file", safetensors_bytes(latents=latents), filename="z.safetensors")
    async with server.client.post(f"/v1/videos?fps={FPS}&model={model}", data=form) as response:
        assert response.status == 201, await response.text()
        return await response.json()


async def job_json(server: Server, job_id: str) -> dict:
    async with server.client.get(f"/v1/videos/{job_id}") as response:
        assert response.status == 200, await response.text()
        return await response.json()


async def watch(page: Page, server: Server, job_id: str) -> None:
    await page.navigate(f"{server.url}/?video={job_id}")
    await page.wait_for("window.vaecast && window.vaecast.state.ready")


async def played_to_the_end(page: Page, job_id: str, frames: int = FRAMES) -> dict:
    await page.wait_for("document.getElementById('video').ended", PLAY_TIMEOUT_S)
    state = await page.wait_for(
        f"(s => s.status === 'completed' && s.streamEnded && s)({STATE})", PLAY_TIMEOUT_S
    )
    assert state["jobId"] == job_id
    assert state["errors"] == []
    assert state["framesShown"] > 0
    # Played to the end of all its frames: the clock reached the duration. The last
    # frame presented is the last frame, or the one before it: the presentation
    # callback of a video's final frame may not come before `ended` (seen once in
    # ~20 runs, with no frame dropped); with dropped frames (a busy machine), as many
    # more from the end.
    video = await page.evaluate(
        "(v => ({currentTime: v.currentTime, duration: v.duration,"
        " dropped: v.getVideoPlaybackQuality().droppedVideoFrames}))"
        "(document.getElementById('video'))"
    )
    assert video["duration"] == pytest.approx(frames / FPS, abs=1e-3), video
    assert video["currentTime"] == pytest.approx(video["duration"], abs=1e-3), video
    assert state["lastMediaTime"] >= (frames - 2 - video["dropped"]) / FPS - 1e-3, video
    return state


async def test_a_decode_below_real_time_starts_late_enough_to_never_stall(
    server: Server, page: Page
) -> None:
    job = await upload(server, "paced")
    await watch(page, server, job["id"])

    # Waiting, on the first frame, with the countdown shown.
    waiting = await page.wait_for(
        f"(s => s.startingInMs !== null && s.startingInMs > 0 && s)({STATE})", PLAY_TIMEOUT_S
    )
    assert waiting["status"] == "in_progress"
    assert waiting["startDelayMs"] is None
    assert waiting["stallFreeStartS"] > 0
    # The first frame is on screen, paused there.
    held = await page.wait_for(
        f"(s => s.firstFrameAt !== null && s.startDelayMs === null && s)({STATE})", PLAY_TIMEOUT_S
    )
    assert held["firstFrameAt"] >= held["firstFragmentAt"]
    assert await page.evaluate("document.getElementById('video').paused")
    assert (await page.evaluate("document.getElementById('ahead').textContent")).startswith(
        "starting in "
    )
    # Then playing while the decode runs on, its buffer shown.
    ahead = await page.wait_for(
        "(t => t.startsWith('live, ') && t)(document.getElementById('ahead').textContent)",
        PLAY_TIMEOUT_S,
    )
    assert ahead.endswith(" s ahead")
    assert (await page.evaluate(STATE))["status"] == "in_progress"

    state = await played_to_the_end(page, job["id"])
    final = await job_json(server, job["id"])
    expected_s = final["stall_free_start_s"]
    delay_s = state["startDelayMs"] / 1000
    print(
        f"waited {delay_s:.3f} s after the first fragment; the server's stall-free start "
        f"{expected_s:.3f} s (last heard {state['stallFreeStartS']:.3f} s); "
        f"stalls {state['stalls']}"
    )
    assert expected_s > 0.5  # slow enough that starting at once would have stalled
    # Not later than the server's stall-free start. Earlier is right when the page got
    # its first fragment late (a busy machine): the wait counts from the fragment's
    # arrival here, the server's start from its commit there, so the buffer was
    # already that far ahead. That it started late enough is what matters: no stall.
    assert delay_s <= expected_s + START_TOLERANCE * expected_s + CHUNK_DECODE_S
    assert state["stalls"] == []
    assert state["startingInMs"] is None
    assert await page.evaluate("document.getElementById('ahead').textContent") == "\N{EN DASH}"
    assert_no_script_errors(page)


async def test_a_decode_faster_than_real_time_starts_at_once(server: Server, page: Page) -> None:
    job = await upload(server, "linear")
    await watch(page, server, job["id"])
    state = await played_to_the_end(page, job["id"])
    final = await job_json(server, job["id"])
    print(f"waited {state['startDelayMs']:.0f} ms; stall-free start {final['stall_free_start_s']}")
    # Faster than real time: nothing to wait for but the first chunks' jitter.
    assert final["stall_free_start_s"] < FAST_START_MS / 1000
    assert state["startDelayMs"] is not None
    assert 0 <= state["startDelayMs"] < FAST_START_MS
    assert state["stalls"] == []
    assert_no_script_errors(page)


async def test_a_running_decode_faster_than_real_time_starts_at_once(
    server: Server, page: Page
) -> None:
    latent_frames = 25  # 97 frames, 25 chunks: decoding for 1.25 s
    job = await upload(server, "brisk", latent_frames)
    await watch(page, server, job["id"])
    started = await page.wait_for(f"(s => s.startDelayMs !== null && s)({STATE})", PLAY_TIMEOUT_S)
    assert started["status"] == "in_progress"  # still decoding when it started
    # At once: as soon as the page knew the rate (the next chunk event, on this page's
    # clock, however late a busy machine delivered it), or the stall-free start the
    # server said then (the first chunks' jitter), within one tick of the page's timer.
    known_ms = max(0.0, started["rateKnownAt"] - started["firstFragmentAt"])
    bound_ms = max(known_ms, started["startedAtStallFreeS"] * 1000) + WAIT_TICK_MS
    assert started["startDelayMs"] <= bound_ms, (started["startDelayMs"], bound_ms)
    state = await played_to_the_end(page, job["id"], 1 + 4 * (latent_frames - 1))
    final = await job_json(server, job["id"])
    print(f"waited {state['startDelayMs']:.0f} ms; stall-free start {final['stall_free_start_s']}")
    assert final["stall_free_start_s"] < FAST_START_MS / 1000
    assert state["stalls"] == []
    assert_no_script_errors(page)
