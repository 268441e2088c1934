"""A cancelled or failed job keeps what it made: its fragments so far as a playable file
whose init segment states their duration, marked partial, until it is deleted or
retention removes it; a live viewer of it is still told it ended short."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.helpers import decode_mp4, smooth_latents, until
from tests.helpers.mp4_duration import ffprobe_seconds, mp4box_info
from tests.helpers.server import Server, StartServer
from tests.server.test_push import create_session, push
from tests.server.test_store import stored_server
from vaecast.codecs.fmp4_boxes import iter_boxes
from vaecast.codecs.fmp4_finish import read_durations

FPS = 8
LATENTS = smooth_latents(frames=9)  # linear: 1 + 4 * 8 = 33 frames, a chunk a latent frame
PUSHED = 5  # latent frames pushed before the cancel: 1 + 4 * 4 = 17 frames
PUSHED_FRAMES = 17


async def cancelled_halfway(server: Server, query: str = "") -> dict[str, Any]:
    """A push session given PUSHED latent frames, decoded, then DELETEd; its job."""
    session = await create_session(server, fps=FPS)
    status, _ = await push(server, session, LATENTS[:, :, :PUSHED])
    assert status == 202
    job = server.manager.get(session["id"])
    await until(lambda: job.record.frames_done == PUSHED_FRAMES)
    async with server.client.delete(f"/v1/videos/{session['id']}{query}") as response:
        assert response.status == 200, await response.text()
        answer = await response.json()
    assert answer["status"] == "cancelled"
    return answer


async def content(server: Server, job: dict[str, Any]) -> tuple[int, bytes, Any]:
    async with server.client.get(job["urls"]["content"]) as response:
        return response.status, await response.read(), response.headers


def stated_seconds(mp4: bytes) -> float:
    init_end = next(box.end for box in iter_boxes(mp4) if box.type == "moov")
    return read_durations(mp4[:init_end]).seconds


async def test_a_cancelled_job_keeps_a_playable_file_of_what_it_made(
    start_server: StartServer, tmp_path: Path
):
    server = await start_server()
    session = await create_session(server, fps=FPS)
    # A viewer from the start: answered once the first block is in.
    viewing = asyncio.create_task(server.client.get(session["urls"]["content"]))
    await push(server, session, LATENTS[:, :, :PUSHED])
    live = await viewing
    job = server.manager.get(session["id"])
    await until(lambda: job.record.frames_done == PUSHED_FRAMES)
    async with server.client.delete(f"/v1/videos/{session['id']}") as response:
        cancelled = await response.json()
    assert (cancelled["status"], cancelled["partial"]) == ("cancelled", True)
    assert cancelled["error"] == {"type": "cancelled", "message": "cancelled by request"}
    # Who watched it live is told it ended short: the transfer is cut.
    with pytest.raises(aiohttp.ClientPayloadError):
        await live.read()
    live.close()

    status, mp4, headers = await content(server, cancelled)
    assert (status, headers["X-Video-Partial"]) == (200, "true")
    assert headers["ETag"] and int(headers["Content-Length"]) == len(mp4)
    assert len(decode_mp4(mp4)) == PUSHED_FRAMES
    seconds = PUSHED_FRAMES / FPS
    assert stated_seconds(mp4) == pytest.approx(seconds)  # its init says so
    path = tmp_path / "partial.mp4"
    path.write_bytes(mp4)
    assert ffprobe_seconds(path) == pytest.approx(seconds, abs=0.01)
    assert mp4box_info(path)["duration"] == pytest.approx(seconds)
    # Its events say it was kept; its playlist ends where it does.
    assert job.record.events[-1]["partial"] is True
    async with server.client.get(cancelled["urls"]["playlist"]) as response:
        assert (await response.text()).rstrip().endswith("#EXT-X-ENDLIST")

    # A second DELETE deletes it, as it would a finished video.
    async with server.client.delete(cancelled["urls"]["self"]) as response:
        assert (await response.json())["deleted"] is True
    assert (await content(server, cancelled))[0] == 410


async def test_its_playlist_plays_to_its_last_fragment_in_ffmpeg(start_server: StartServer):
    server = await start_server()
    cancelled = await cancelled_halfway(server)
    playlist = f"{server.url}{cancelled['urls']['playlist']}"
    done = await asyncio.to_thread(
        subprocess.run,
        ["ffmpeg", "-v", "warning", "-i", playlist, "-f", "null", "-"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and done.stderr == "", done.stderr


async def test_a_cancel_that_asks_keeps_nothing(start_server: StartServer):
    server = await start_server()
    cancelled = await cancelled_halfway(server, "?keep=false")
    assert cancelled["partial"] is False
    status, body, _ = await content(server, cancelled)
    assert status == 409 and b"has no content: cancelled" in body
    job = server.manager.get(cancelled["id"])
    await until(lambda: job.log.released)  # its bytes freed at once


async def test_keep_is_true_or_false(start_server: StartServer):
    server = await start_server()
    session = await create_session(server, fps=FPS)
    async with server.client.delete(f"/v1/videos/{session['id']}?keep=maybe") as response:
        assert response.status == 422
        assert (await response.json())["error"]["message"] == "keep is true or false, got 'maybe'"
    assert server.manager.get(session["id"]).record.status == "queued"  # not cancelled


async def test_a_job_cancelled_before_its_first_fragment_has_no_partial(
    start_server: StartServer,
):
    server = await start_server()
    session = await create_session(server, fps=FPS)
    async with server.client.delete(f"/v1/videos/{session['id']}") as response:
        cancelled = await response.json()
    assert (cancelled["status"], cancelled["partial"]) == ("cancelled", False)
    assert (await content(server, cancelled))[0] == 409


async def test_a_partial_is_evicted_as_a_finished_video_is(start_server: StartServer):
    server = await start_server(retention_s=0.5)
    cancelled = await cancelled_halfway(server)
    assert (await content(server, cancelled))[0] == 200
    await until(lambda: cancelled["id"] not in server.manager.jobs)
    status, body, _ = await content(server, cancelled)
    assert status == 410 and b"evicted" in body


async def test_a_kept_partial_survives_a_restart(tmp_path: Path):
    store = tmp_path / "store"
    async with stored_server(store) as server:
        cancelled = await cancelled_halfway(server)
        status, before, headers = await content(server, cancelled)
        assert status == 200
    async with stored_server(store) as server:
        async with server.client.get(cancelled["urls"]["self"]) as response:
            restored = await response.json()
        assert (restored["status"], restored["partial"]) == ("cancelled", True)
        status, after, again = await content(server, cancelled)
        assert (status, again["X-Video-Partial"], again["ETag"]) == (200, "true", headers["ETag"])
        assert after == before
        assert stated_seconds(after) == pytest.approx(PUSHED_FRAMES / FPS)


async def test_store_file_of_a_cancel_that_keeps_nothing_is_gone(tmp_path: Path):
    store = tmp_path / "store"
    async with stored_server(store) as server:
        cancelled = await cancelled_halfway(server, "?keep=false")
        path = store / "videos"
        await until(lambda: not any(path.glob(f"{cancelled['id']}*")))
