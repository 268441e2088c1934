"""The Python client of the whole jobs API (`vaecast.client.Client`, `AsyncClient`)
against a real server: upload, wait, download, cancel keeping or not, delete, list,
errors; and a push session with a preview, as the HTTP API takes it."""

from __future__ import annotations

import asyncio
import io
import stat
from pathlib import Path

import pytest
from PIL import Image

from tests.helpers import GatedDecoder, decode_mp4, safetensors_bytes, smooth_latents, until
from tests.helpers.server import StartServer
from vaecast.client import ApiError, AsyncClient, Client, PushSession
from vaecast.models.linear import LinearDecoder

LATENTS = smooth_latents(frames=4)  # linear: 13 frames
FRAMES = 13


async def test_upload_wait_download_and_delete(start_server: StartServer, tmp_path: Path):
    server = await start_server(decoders={"linear": LinearDecoder(), "preview": LinearDecoder()})
    latents = tmp_path / "z.safetensors"
    latents.write_bytes(safetensors_bytes(latents=LATENTS))
    client = Client(server.url)
    job = await asyncio.to_thread(client.upload, latents, fps=8, preview="preview")
    assert (job["status"] in ("queued", "in_progress"), job["fps"]) == (True, 8.0)
    assert "variants" in job  # the preview was taken
    done = await asyncio.to_thread(client.wait, job["id"], timeout=60)
    assert done["status"] == "completed" and done["frames"] == FRAMES
    video = tmp_path / "out" / "video.mp4"
    video.parent.mkdir()
    assert await asyncio.to_thread(client.download, job["id"], video) == video
    assert len(decode_mp4(video.read_bytes())) == FRAMES
    assert sorted(p.name for p in video.parent.iterdir()) == ["video.mp4"]  # no .part left
    assert stat.S_IMODE(video.stat().st_mode) == 0o666 & ~_umask()
    preview = tmp_path / "preview.mp4"
    await asyncio.to_thread(client.download, job["id"], preview, variant="preview")
    assert len(decode_mp4(preview.read_bytes())) == FRAMES
    live = tmp_path / "live.mp4"
    await asyncio.to_thread(client.download, job["id"], live, variant="live")
    assert len(decode_mp4(live.read_bytes())) == FRAMES
    assert [j["id"] for j in await asyncio.to_thread(client.jobs, 5)] == [job["id"]]
    assert client.page_url(job["id"]) == f"{server.url}/?video={job['id']}"
    await asyncio.to_thread(client.delete, job["id"])
    with pytest.raises(ApiError) as gone:
        await asyncio.to_thread(client.get, job["id"])
    assert (gone.value.status, gone.value.type) == (410, "gone")


def _umask() -> int:
    import os

    mask = os.umask(0o022)
    os.umask(mask)
    return mask


async def test_cancel_keeps_a_partial_unless_asked_and_errors_are_api_errors(
    start_server: StartServer, tmp_path: Path
):
    decoder = GatedDecoder(hold_at=2)
    server = await start_server(decoders={"linear": decoder})
    client = Client(server.url)
    body = safetensors_bytes(latents=LATENTS)
    for keep in (True, False):
        decoder.gate.clear()
        decoder.holding.clear()
        job = await asyncio.to_thread(client.upload, body)
        await asyncio.to_thread(decoder.holding.wait, 30)
        held = server.manager.get(job["id"])
        await until(lambda: held.record.frames_done == 5)  # noqa: B023 (chunks 0, 1 are in)
        cancelling = asyncio.create_task(asyncio.to_thread(client.cancel, job["id"], keep=keep))
        await until(lambda: held.error is not None)  # noqa: B023 (awaited here)
        decoder.gate.set()
        cancelled = await cancelling
        assert (cancelled["status"], cancelled["partial"]) == ("cancelled", keep)
        path = tmp_path / f"kept-{keep}.mp4"
        if keep:
            await asyncio.to_thread(client.download, job["id"], path)
            assert len(decode_mp4(path.read_bytes())) == 5  # chunks 0 and 1
        else:
            with pytest.raises(ApiError) as refused:
                await asyncio.to_thread(client.download, job["id"], path)
            assert (refused.value.status, refused.value.type) == (409, "conflict")
            assert not path.exists() and not list(tmp_path.glob(".kept-*"))
    with pytest.raises(ApiError) as unknown:
        await asyncio.to_thread(client.get, "video_" + "0" * 24)
    assert unknown.value.status == 404
    with pytest.raises(ApiError) as bad:
        await asyncio.to_thread(client.upload, b"hello")
    assert (bad.value.status, bad.value.type) == (415, "unsupported_media_type")


async def test_wait_times_out_while_a_job_runs(start_server: StartServer):
    decoder = GatedDecoder(hold_at=1)
    server = await start_server(decoders={"linear": decoder})
    client = Client(server.url)
    job = await asyncio.to_thread(client.upload, safetensors_bytes(latents=LATENTS))
    with pytest.raises(TimeoutError) as waited:
        await asyncio.to_thread(client.wait, job["id"], timeout=0.3)
    assert "is still" in str(waited.value)
    decoder.gate.set()


async def test_the_async_client_does_the_same(start_server: StartServer, tmp_path: Path):
    server = await start_server()
    async with AsyncClient(server.url) as client:
        job = await client.upload(safetensors_bytes(latents=LATENTS), fps="30000/1001")
        done = await asyncio.wait_for(client.wait(job["id"]), 60)
        assert (done["status"], done["fps"]) == ("completed", pytest.approx(29.97, abs=0.01))
        path = await client.download(job["id"], tmp_path / "video.mp4")
        assert len(decode_mp4(path.read_bytes())) == FRAMES
        assert [j["id"] for j in await client.jobs()] == [job["id"]]
        await client.delete(job["id"])
        with pytest.raises(ApiError) as gone:
            await client.get(job["id"])
        assert gone.value.status == 410
        async with client.push(fps=8) as session:
            await session.push(LATENTS)
        assert (await client.wait(session.id))["frames"] == FRAMES


async def test_a_push_session_takes_a_preview(start_server: StartServer):
    server = await start_server(decoders={"linear": LinearDecoder(), "fast": LinearDecoder()})

    def push_with_a_preview() -> str:
        with PushSession(server.url, fps=8, preview="fast") as session:
            assert session.job["variants"]["preview"]["status"] == "queued"
            session.push(LATENTS)
        return session.id

    video_id = await asyncio.to_thread(push_with_a_preview)
    done = await asyncio.to_thread(Client(server.url).wait, video_id, timeout=60)
    assert done["variants"]["preview"]["status"] == "completed"
    assert done["status"] == "completed"


async def test_thumbnails_and_spritesheets_sync_and_async(start_server: StartServer):
    decoder = GatedDecoder(hold_at=2)
    server = await start_server(decoders={"linear": decoder})
    client = Client(server.url)
    job = await asyncio.to_thread(client.upload, safetensors_bytes(latents=LATENTS), fps=8)
    await asyncio.to_thread(decoder.holding.wait, 30)  # running: chunks 0 and 1 are in
    await until(lambda: server.manager.get(job["id"]).record.frames_done == 5)
    running = await asyncio.to_thread(client.thumbnail, job["id"])
    assert (running.media_type, running.frame, running.final) == ("image/webp", 2, False)
    assert Image.open(io.BytesIO(running.data)).size == (job["width"], job["height"])
    decoder.gate.set()
    async with AsyncClient(server.url) as async_client:
        await asyncio.wait_for(async_client.wait(job["id"]), 60)
        final = await async_client.thumbnail(job["id"], image_format="jpeg")
        sheet = await async_client.spritesheet(job["id"])
    assert (final.media_type, final.frame, final.final) == ("image/jpeg", 6, True)
    assert sheet.layout is not None and "covered=13" in sheet.layout and sheet.final
    assert Image.open(io.BytesIO(sheet.data)).format == "JPEG"
    same = await asyncio.to_thread(client.spritesheet, job["id"])
    assert (same.etag, same.data) == (sheet.etag, sheet.data)
    with pytest.raises(ApiError) as refused:
        await asyncio.to_thread(client.thumbnail, job["id"], image_format="gif")
    assert (refused.value.status, refused.value.type) == (422, "invalid_request")


def test_a_url_that_is_not_http_is_refused_at_once():
    from vaecast.errors import InvalidRequestError

    with pytest.raises(InvalidRequestError):
        Client("ftp://127.0.0.1")
