"""A server job's finished MP4 states its length; the bytes streamed live state none.

Read as players read them: mp4box.js (what a browser-side player takes a file's
duration from) and ffprobe, on /content once complete, on the HLS init segment, after
a restart on the store's file, with and without audio; the live stream's init segment
says "not known yet" and its bytes still decode.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import torch

from tests.helpers import GatedDecoder, decode_mp4, safetensors_bytes, smooth_latents
from tests.helpers.mp4_duration import as_streamed, ffprobe_seconds, mp4box_info
from tests.helpers.server import Server, StartServer
from tests.server.test_store import stored_server
from vaecast.codecs.fmp4_finish import read_durations
from vaecast.codecs.fmp4_reader import TopLevelBoxSplitter

# 4 latent frames: 13 frames; at the default 16 fps, 0.8125 s (812.5 ms: 813 in the
# movie's 1 ms clock, rounded up so the movie never ends before its last frame).
FRAMES, FPS = 13, 16
SECONDS = FRAMES / FPS


async def create(server: Server, audio: torch.Tensor | None = None, **fields: str) -> dict:
    tensors: dict[str, torch.Tensor] = {"latents": smooth_latents(frames=4)}
    metadata = None
    if audio is not None:
        tensors["audio"], metadata = audio, {"audio_sample_rate": "16000"}
    form = aiohttp.FormData()
    form.add_field("file", safetensors_bytes(metadata, **tensors), filename="z.safetensors")
    for name, value in fields.items():
        form.add_field(name, value)
    async with server.client.post("/v1/videos", data=form) as response:
        assert response.status == 201, await response.text()
        return await response.json()


async def get(server: Server, url: str) -> bytes:
    async with server.client.get(url) as response:
        assert response.status == 200, await response.text()
        return await response.read()


async def finished_file(server: Server, url: str) -> bytes:
    """The MP4 at `url` once the job is complete: a first GET streams it live to the
    end (its init segment says 0), a second gets the file as finished."""
    await get(server, url)
    async with server.client.get(url) as response:
        assert "Content-Length" in response.headers  # a plain file, not the live stream
        assert response.status == 200, await response.text()
        return await response.read()


def stated(tmp_path: Path, name: str, data: bytes) -> dict[str, Any]:
    """mp4box.js's reading of `data`, ffprobe's format duration beside it."""
    path = tmp_path / name
    path.write_bytes(data)
    return {**mp4box_info(path), "ffprobe": ffprobe_seconds(path)}


def init_of(data: bytes) -> bytes:
    """The init segment (ftyp + moov) at the start of an MP4."""
    ftyp, moov, *_ = TopLevelBoxSplitter().feed(data)
    return ftyp + moov


async def test_live_bytes_say_0_and_the_finished_file_its_length(
    start_server: StartServer, tmp_path: Path
) -> None:
    decoder = GatedDecoder(hold_at=2)
    server = await start_server(decoders={"linear": decoder})
    job = await create(server)
    live = await server.client.get(job["urls"]["content"])
    await asyncio.to_thread(decoder.holding.wait, 30)
    decoder.gate.set()
    streamed = await live.read()
    live.close()
    finished = await finished_file(server, job["urls"]["content"])

    # The same MP4 but for the init segment's duration fields: same length, same offsets.
    init = init_of(streamed)
    assert len(finished) == len(streamed)
    assert finished[len(init) :] == streamed[len(init) :]
    assert finished[: len(init)] != init
    assert as_streamed(finished) == streamed
    assert read_durations(init).fragment_duration is None  # live: no mehd, not known yet
    # Saved from the live stream: no length stated, and players sum the fragments.
    assert stated(tmp_path, "live.mp4", streamed) == {
        "duration": 0,
        "fragment_duration": SECONDS,
        "tracks": [["video", 0]],
        "ffprobe": SECONDS,
    }
    assert len(decode_mp4(streamed)) == len(decode_mp4(finished)) == FRAMES

    assert stated(tmp_path, "finished.mp4", finished) == {
        "duration": 0.813,
        "fragment_duration": 0.813,
        "tracks": [["video", SECONDS]],
        "ffprobe": SECONDS,
    }
    # The HLS init segment is the finished file's, too, and only that one may be cached.
    async with server.client.get(f"{job['urls']['self']}/hls/init.mp4") as response:
        assert response.headers["Cache-Control"] == "max-age=3600"
        assert await response.read() == finished[: len(init)]


async def test_a_running_jobs_hls_init_segment_is_not_cached(start_server: StartServer) -> None:
    """It is rewritten when the job finishes: a cache keeping the live one would say 0."""
    decoder = GatedDecoder(hold_at=2)
    server = await start_server(decoders={"linear": decoder})
    job = await create(server)
    await asyncio.to_thread(decoder.holding.wait, 30)
    async with server.client.get(f"{job['urls']['self']}/hls/init.mp4") as response:
        assert response.status == 200
        assert response.headers["Cache-Control"] == "no-cache"
        assert read_durations(await response.read()).fragment_duration is None
    decoder.gate.set()
    await asyncio.wait_for(server.manager.get(job["id"]).wait(), 30)


async def test_with_audio_both_tracks_state_the_videos_length(
    start_server: StartServer, tmp_path: Path
) -> None:
    server = await start_server()
    tone = torch.sin(torch.linspace(0, 4000, 16000)).unsqueeze(0) * 0.5  # 1 s: cut to the video
    job = await create(server, audio=tone)
    finished = await finished_file(server, job["urls"]["content"])
    assert stated(tmp_path, "audio.mp4", finished) == {
        "duration": 0.813,
        "fragment_duration": 0.813,
        "tracks": [["video", SECONDS], ["audio", SECONDS]],
        "ffprobe": SECONDS,
    }


async def test_each_rendition_of_a_job_with_a_preview_states_its_length(
    start_server: StartServer, tmp_path: Path
) -> None:
    server = await start_server()
    job = await create(server, preview="linear")
    final = await finished_file(server, job["urls"]["content"])
    preview = await finished_file(server, job["urls"]["preview_content"])
    for name, data in (("final.mp4", final), ("preview.mp4", preview)):
        assert stated(tmp_path, name, data)["tracks"] == [["video", SECONDS]], name


async def test_the_stores_file_states_it_from_disk_and_after_a_restart(tmp_path: Path) -> None:
    store = tmp_path / "store"
    # A memory budget of 1 byte: once finished, the video is served from its file alone.
    async with stored_server(store, retention_memory_bytes=1) as server:
        job = await create(server)
        await get(server, job["urls"]["content"])  # live, to its end
        stored = server.manager.jobs[job["id"]]
        for _ in range(500):
            if stored.log.memory_bytes == 0:
                break
            await asyncio.sleep(0.01)
        assert stored.log.memory_bytes == 0
        from_file = await finished_file(server, job["urls"]["content"])
    assert stated(tmp_path, "stored.mp4", from_file)["duration"] == 0.813
    async with stored_server(store) as server:
        assert await get(server, job["urls"]["content"]) == from_file
