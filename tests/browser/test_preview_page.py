"""The preview page in real headless Chromium against a real server on 127.0.0.1.

The page is driven the way a user drives it (fill the form, click), and checked
through what Chromium reports about the <video> element and through the page's
read-only `window.vaecast.state`.
"""

from __future__ import annotations

import asyncio
import struct
from importlib.resources import files
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from tests.helpers.browser import (
    NO_MEDIA_SOURCE_NOR_HLS,
    PLAY_TIMEOUT_S,
    STATE,
    VIDEO_FACTS,
    Server,
    assert_no_script_errors,
    start_demo,
    until_set,
)
from tests.helpers.cdp import Browser, CDPError, Page
from vaecast.codecs.quantize import quantize_to_host
from vaecast.demo.sources import SceneSpec, scene_latents
from vaecast.models.tiny import TinyDecoder

pytestmark = [pytest.mark.browser, pytest.mark.asyncio(loop_scope="module")]

DEMO = SceneSpec("showcase", frames=33, width=256, height=160)
DEMO_FPS = 16
DEMO_CHUNKS = 9  # tiny: 1 frame for the first latent, then 4 per latent
HOLD_AT = 3  # chunks 0-2 are published, then the decode waits for the test
AAC_FRAME_S = 1024 / 48000
FRAMES_BEFORE_HOLD = 1 + 4 + 4
# A frame read back from the browser against the same frame decoded here: the
# largest per-channel difference of 4x4 region means, in 8-bit levels. Measured
# 0.8-1.4 after H.264 (at CRF 23, before the default became QP 21, of the same
# quality) and the BT.601 round trip; neighbouring frames of this scene differ by
# 40 and more around the frame compared.
COLOUR_TOLERANCE = 4.0
GRID = 4


# Seek to `t`, draw the frame shown to a canvas, and return its RGBA bytes.
READ_FRAME = """(async (t) => {
  const v = document.getElementById("video");
  v.pause();
  // After 'seeked' alone, drawImage can still draw the frame from before the seek:
  // wait for the new frame to be presented as well.
  const presented = new Promise((resolve) => v.requestVideoFrameCallback(resolve));
  v.currentTime = t;
  await new Promise((resolve) => v.addEventListener("seeked", resolve, {once: true}));
  await presented;
  const canvas = document.createElement("canvas");
  canvas.width = v.videoWidth;
  canvas.height = v.videoHeight;
  const context = canvas.getContext("2d", {willReadFrequently: true});
  context.drawImage(v, 0, 0);
  return Array.from(context.getImageData(0, 0, canvas.width, canvas.height).data);
})(%r)"""


async def open_preview(page: Page, server: Server) -> None:
    await page.navigate(server.url + "/")
    await page.wait_for("window.vaecast && window.vaecast.state.ready")


def region_means(image: np.ndarray) -> np.ndarray:
    """Mean RGB of each cell of a GRID x GRID split of an (H, W, 3) image."""
    h, w = image.shape[:2]
    return np.array(
        [
            [
                image[i * h // GRID : (i + 1) * h // GRID, j * w // GRID : (j + 1) * w // GRID]
                .astype(np.float64)
                .mean(axis=(0, 1))
                for j in range(GRID)
            ]
            for i in range(GRID)
        ]
    )


def source_frames(spec: SceneSpec) -> np.ndarray:
    """The frames the server encodes for `spec`: (T, H, W, 3) uint8."""
    video = TinyDecoder().decode(scene_latents(spec))
    return quantize_to_host(video, TinyDecoder.value_range)


async def test_the_page_plays_a_decode_while_it_is_held_then_to_the_end(
    server: Server, page: Page
) -> None:
    server.decoder.hold(HOLD_AT)
    await open_preview(page, server)
    await start_demo(page, DEMO, DEMO_FPS)

    await until_set(server.decoder.holding)
    state = await page.wait_for(
        f"(s => s.fragmentsAppended === {HOLD_AT} && s.firstFrameAt !== null && s)({STATE})",
        PLAY_TIMEOUT_S,
    )
    held = await page.evaluate(VIDEO_FACTS)
    job = server.job(state["jobId"])
    # Still held: everything below was played from the first chunks alone.
    assert not server.decoder.gate.is_set()
    assert (job.record.status.value, job.record.chunks_done) == ("in_progress", HOLD_AT)
    # The demo is live: its AAC track ends at the last whole AAC frame inside the video
    # so far (a packet never crosses the end), and MSE buffers where both tracks are.
    ((start, end),) = held["buffered"]
    assert start == 0
    assert 0 <= FRAMES_BEFORE_HOLD / DEMO_FPS - end <= AAC_FRAME_S
    # HAVE_CURRENT_DATA: a frame is there to show; or, on a busy machine that took long
    # to look, it played all it has and waits at its end for the next chunk.
    assert held["readyState"] >= 2 or held["currentTime"] >= end - 1 / DEMO_FPS, held
    assert held["totalVideoFrames"] > 0
    assert state["framesShown"] > 0  # requestVideoFrameCallback saw a frame on screen
    assert held["error"] is None
    assert (state["playback"], state["status"], state["errors"]) == ("mse", "in_progress", [])

    server.decoder.release()
    await page.wait_for("document.getElementById('video').ended", PLAY_TIMEOUT_S)
    ended = await page.evaluate(VIDEO_FACTS)
    state = await page.wait_for(f"(s => s.status === 'completed' && s)({STATE})")
    print(
        f"time to first frame {state['timeToFirstFrameMs']:.0f} ms; frames decoded by Chromium "
        f"{ended['totalVideoFrames']} (dropped {ended['droppedVideoFrames']}), "
        f"requestVideoFrameCallback {state['framesShown']}"
    )
    assert ended["error"] is None
    assert ended["totalVideoFrames"] == DEMO.frames
    assert ended["duration"] == DEMO.frames / DEMO_FPS
    assert ended["buffered"] == [[0, DEMO.frames / DEMO_FPS]]
    assert (ended["videoWidth"], ended["videoHeight"]) == (DEMO.width, DEMO.height)
    # One fragment per chunk, each with its own span of the soundtrack: the last chunk's
    # carries the rest of the audio, so no audio-only fragment follows it.
    assert state["fragmentsAppended"] == DEMO_CHUNKS
    assert state["bytesReceived"] == job.log.size
    assert state["streamEnded"]
    assert (state["chunksDone"], state["framesDone"]) == (DEMO_CHUNKS, DEMO.frames)
    assert state["timeToFirstFrameMs"] > 0
    assert state["errors"] == []
    bars = await page.evaluate(
        "['decode-bar', 'buffer-bar'].map((id) => document.getElementById(id).value)"
    )
    assert bars == [1, 1]

    index = DEMO.frames // 2
    rgba = await page.evaluate(READ_FRAME % ((index + 0.5) / DEMO_FPS))
    shown = np.array(rgba, dtype=np.uint8).reshape(DEMO.height, DEMO.width, 4)[..., :3]
    expected = await asyncio.to_thread(source_frames, DEMO)
    errors = [np.abs(region_means(shown) - region_means(frame)).max() for frame in expected]
    print(f"colour error of frame {index}: {errors[index]:.2f} levels")
    assert errors[index] <= COLOUR_TOLERANCE
    assert int(np.argmin(errors)) == index  # the frame for that time, not a neighbour
    assert_no_script_errors(page)


async def test_cancel_stops_the_decode_without_an_error(server: Server, page: Page) -> None:
    server.decoder.hold(2)
    await open_preview(page, server)
    await start_demo(page, DEMO, DEMO_FPS)
    await until_set(server.decoder.holding)
    await page.wait_for(f"{STATE}.fragmentsAppended === 2")
    await page.evaluate("document.getElementById('cancel').click()")
    # The decoder thread notices the cancel when it publishes its next chunk.
    server.decoder.release()
    state = await page.wait_for(f"(s => s.status === 'cancelled' && s)({STATE})")
    assert server.job(state["jobId"]).record.status.value == "cancelled"
    assert state["errors"] == []
    assert await page.evaluate("document.getElementById('error').hidden")
    assert await page.evaluate("document.getElementById('cancel').disabled")
    assert_no_script_errors(page)


async def test_a_decode_that_fails_midway_shows_why(server: Server, page: Page) -> None:
    server.decoder.hold(2)
    await open_preview(page, server)
    await start_demo(page, DEMO, DEMO_FPS)
    await until_set(server.decoder.holding)
    await page.wait_for(f"{STATE}.fragmentsAppended === 2")
    server.decoder.release(RuntimeError("out of memory (simulated)"))
    state = await page.wait_for(f"(s => s.status === 'failed' && s.streamEnded && s)({STATE})")
    message = "the decoder failed: out of memory (simulated)"
    assert state["errors"] == [message]
    assert await page.evaluate("document.getElementById('error').textContent") == message
    # What was decoded before the failure stays playable: its 5 frames (the ended
    # stream's buffered range runs to the end of its audio, a little further).
    facts = await page.evaluate(VIDEO_FACTS)
    ((start, end),) = facts["buffered"]
    assert start == 0
    assert 5 / DEMO_FPS <= end < 5 / DEMO_FPS + 4 * 1024 / 48_000
    assert facts["error"] is None
    assert_no_script_errors(page)


async def test_recent_jobs_list_links_finished_videos(server: Server, page: Page) -> None:
    job = await server.create_demo(scene="shapes", frames=5, width=64, height=48, fps=8)
    await server.job(job["id"]).wait()
    await open_preview(page, server)
    rows = await page.evaluate(
        """Array.from(document.querySelectorAll("#jobs tr"), (row) => ({
          id: row.cells[0].title,
          cells: Array.from(row.cells, (cell) => cell.textContent),
          links: Array.from(row.querySelectorAll("a"), (a) => [a.href, a.download, a.textContent]),
        }))"""
    )
    assert len(rows) == 1
    assert rows[0]["id"] == job["id"]
    assert rows[0]["cells"][1:4] == ["completed", "5 @ 8", "64\N{MULTIPLICATION SIGN}48"]
    assert rows[0]["links"] == [
        [f"{server.url}/v1/videos/{job['id']}/content", f"{job['id']}.mp4", "Download"],
        [f"{server.url}/v1/videos/{job['id']}/playlist.m3u8", "", "HLS"],
    ]
    assert_no_script_errors(page)


async def test_an_upload_plays_and_a_bad_one_shows_the_servers_message(
    server: Server, page: Page, tmp_path: Path
) -> None:
    spec = SceneSpec("gradient", frames=17, width=128, height=96)
    good = tmp_path / "z.safetensors"
    bad = tmp_path / "wrong-name.safetensors"
    latents = await asyncio.to_thread(scene_latents, spec)
    save_file({"latents": latents}, good)
    save_file({"z": latents}, bad)
    await open_preview(page, server)

    async def upload(path: Path) -> None:
        document = await page.send("DOM.getDocument")
        node = await page.send(
            "DOM.querySelector", nodeId=document["root"]["nodeId"], selector="#upload-form input"
        )
        await page.send("DOM.setFileInputFiles", nodeId=node["nodeId"], files=[str(path)])
        await page.evaluate("document.querySelector('#upload-form button').click()")

    await upload(bad)
    message = await page.wait_for("document.getElementById('error').textContent")
    assert message == "the safetensors file has no tensor named 'latents' (found: z)"
    assert (await page.evaluate(STATE))["errors"] == [message]

    await upload(good)
    await page.wait_for("document.getElementById('video').ended", PLAY_TIMEOUT_S)
    facts = await page.evaluate(VIDEO_FACTS)
    state = await page.evaluate(STATE)
    assert facts["error"] is None
    assert facts["totalVideoFrames"] == spec.frames
    assert (facts["videoWidth"], facts["videoHeight"]) == (spec.width, spec.height)
    assert state["errors"] == []
    assert await page.evaluate("document.getElementById('error').hidden")
    assert_no_script_errors(page)


async def test_a_video_with_sound_plays_with_its_audio_decoded(
    server: Server, page: Page, tmp_path: Path
) -> None:
    spec = SceneSpec("shapes", frames=17, width=128, height=96)
    latents = await asyncio.to_thread(scene_latents, spec)
    seconds = spec.frames / 16
    t = torch.arange(round(48_000 * seconds)) / 48_000
    tone = (torch.sin(2 * torch.pi * 440 * t) * 0.3).repeat(2, 1)
    path = tmp_path / "with-sound.safetensors"
    save_file({"latents": latents, "audio": tone}, path, metadata={"audio_sample_rate": "48000"})
    await open_preview(page, server)
    document = await page.send("DOM.getDocument")
    node = await page.send(
        "DOM.querySelector", nodeId=document["root"]["nodeId"], selector="#upload-form input"
    )
    await page.send("DOM.setFileInputFiles", nodeId=node["nodeId"], files=[str(path)])
    await page.evaluate("document.querySelector('#upload-form button').click()")
    await page.wait_for("document.getElementById('video').ended", PLAY_TIMEOUT_S)
    facts = await page.evaluate(VIDEO_FACTS)
    assert facts["error"] is None
    assert facts["totalVideoFrames"] == spec.frames
    assert await page.evaluate("document.getElementById('video').webkitAudioDecodedByteCount") > 0
    assert (await page.evaluate(STATE))["errors"] == []
    assert_no_script_errors(page)


async def test_without_media_source_the_page_falls_back_to_video_src(
    server: Server, page: Page
) -> None:
    await page.send(
        "Page.addScriptToEvaluateOnNewDocument",
        source=NO_MEDIA_SOURCE_NOR_HLS,
    )
    spec = SceneSpec("fade", frames=17, width=256, height=160)
    await open_preview(page, server)
    await start_demo(page, spec, DEMO_FPS)
    await page.wait_for("document.getElementById('video').ended", PLAY_TIMEOUT_S)
    facts = await page.evaluate(VIDEO_FACTS)
    state = await page.evaluate(STATE)
    assert state["playback"] == "src"
    assert facts["error"] is None
    assert facts["totalVideoFrames"] == spec.frames
    assert state["firstFrameAt"] is not None
    assert state["errors"] == []
    assert_no_script_errors(page)


async def test_no_request_leaves_127_0_0_1(server: Server, browser: Browser) -> None:
    page = await browser.new_page()  # fresh, so its request log starts before the page loads
    try:
        await open_preview(page, server)
        await start_demo(page, SceneSpec("text", frames=17, width=256, height=160), 8)
        state = await page.wait_for(
            f"(s => s.status === 'completed' && s.streamEnded && s)({STATE})", PLAY_TIMEOUT_S
        )
        requests = list(page.requests)
    finally:
        await browser.close_page(page)
    paths = {urlsplit(url).path for url in requests if url.startswith("http")}
    job_url = f"/v1/videos/{state['jobId']}"
    assert {"/", "/static/app.js", "/static/style.css", "/v1/videos"} <= paths
    assert {f"{job_url}/content", f"{job_url}/events"} <= paths
    # data: URLs (Chromium's own media-control icons) are in memory, not on a network.
    leaving = [url for url in requests if not _local(url)]
    assert leaving == []


# The WHATWG "JavaScript MIME type essence match" list holds both; Chromium refuses
# a module script served as anything else (text/plain, application/octet-stream).
JAVASCRIPT_TYPES = {"text/javascript", "application/javascript"}


async def test_every_page_module_is_served_as_javascript(server: Server) -> None:
    names = sorted(p.name for p in Path(str(files("vaecast.static"))).glob("*.js"))
    assert {"app.js", "boxes.js"} <= set(names)
    for name in names:
        async with server.client.get(f"/static/{name}") as response:
            assert response.status == 200, name
            assert response.content_type in JAVASCRIPT_TYPES, (name, response.content_type)


def _local(url: str) -> bool:
    parts = urlsplit(url)
    return parts.scheme in ("data", "blob") or (
        parts.scheme in ("http", "https", "ws") and parts.hostname == "127.0.0.1"
    )


def _box(fourcc: bytes, payload: bytes, largesize: bool = False) -> bytes:
    if largesize:  # size 1, then a 64-bit size after the type
        return struct.pack(">I4sQ", 1, fourcc, 16 + len(payload)) + payload
    return struct.pack(">I4s", 8 + len(payload), fourcc) + payload


# boxes.js is a module, so its splitter is imported (the page already loaded it:
# the same module instance, no new request), not read from a global.
SPLIT = """(async (bytes, step) => {
  const { BoxSplitter } = await import("/static/boxes.js");
  const splitter = new BoxSplitter();
  const boxes = [];
  for (let i = 0; i < bytes.length; i += step) {
    for (const box of splitter.push(new Uint8Array(bytes.slice(i, i + step)))) {
      boxes.push([box.type, Array.from(box.bytes)]);
    }
  }
  return {boxes, left: splitter.length};
})(%s, %d)"""


async def test_the_page_splits_the_stream_at_top_level_boxes(server: Server, page: Page) -> None:
    boxes = [
        _box(b"ftyp", b"isom" * 2),
        _box(b"moov", _box(b"mvhd", bytes(range(20))), largesize=True),
        _box(b"moof", b""),
        _box(b"mdat", bytes(range(256)) * 3, largesize=True),
    ]
    stream = b"".join(boxes)
    expected = [[box[4:8].decode(), list(box)] for box in boxes]
    await open_preview(page, server)
    for step in (1, 7, 16, len(stream)):
        split = await page.evaluate(SPLIT % (list(stream), step))
        assert split == {"boxes": expected, "left": 0}, step
    # A trailing partial box stays held back until its bytes arrive.
    split = await page.evaluate(SPLIT % (list(stream + boxes[0][:9]), 5))
    assert split == {"boxes": expected, "left": 9}
    with pytest.raises(CDPError, match="an MP4 box has a bad size: 4"):
        await page.evaluate(SPLIT % (list(struct.pack(">I4s", 4, b"free")), 8))
