"""HLS that any player opens at any moment: FFmpeg's demuxer (whole segments only) from
the instant a job exists, and every playlist of every kind of job, in every state,
through the rules of Apple's validator, hls-parser's strict mode, an IDR at the start of
every segment and a clean FFprobe read (tests/helpers/hls_checks.py)."""

from __future__ import annotations

import asyncio
import shutil

import m3u8
import pytest

from tests.helpers import FailingDecoder, GatedDecoder, safetensors_bytes, smooth_latents, until
from tests.helpers.hls_checks import check_playlist
from tests.helpers.server import Server, StartServer
from tests.server.test_playback_deadlines import PacedDecoder
from tests.server.test_preview import tiny_and_linear, upload
from tests.server.test_push_audio_alignment import Producer, video_frames
from vaecast.server.faces.hls.playlist import segments

pytestmark = pytest.mark.skipif(
    shutil.which("ffprobe") is None or shutil.which("node") is None,
    reason="tools/install-test-deps installs ffmpeg, node and hls-parser",
)

LATENTS = smooth_latents(frames=20)  # linear: 1 + 4 * 19 = 77 frames, 20 chunks
FRAMES = 77
FPS = 16


async def start_job(server: Server, latents=LATENTS) -> dict:  # type: ignore[no-untyped-def]
    body = safetensors_bytes(latents=latents)
    async with server.client.post("/v1/videos", data=body, params={"fps": str(FPS)}) as r:
        assert r.status == 201, await r.text()
        return await r.json()


async def start_ffprobe(url: str) -> asyncio.subprocess.Process:
    """FFprobe counting every frame it reads of each stream of a playlist, from its start."""
    return await asyncio.create_subprocess_exec(
        "ffprobe", "-v", "error", "-live_start_index", "0", "-count_frames",
        "-show_entries", "stream=codec_type,nb_read_frames", "-of", "csv=p=0", url,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip


async def frames_read(probe: asyncio.subprocess.Process) -> dict[str, int]:
    out, err = await asyncio.wait_for(probe.communicate(), 90)
    assert probe.returncode == 0, err.decode()
    assert not err, err.decode()  # no "Empty segment", no "matches no streams"
    # One line a stream (ffprobe prints each again per program: the first ones count).
    counts: dict[str, int] = {}
    for line in out.decode().split():
        kind, count = line.split(",")
        counts.setdefault(kind, int(count))
    return counts


@pytest.mark.slow
async def test_ffmpeg_reads_an_upload_from_the_instant_the_job_exists(start_server: StartServer):
    server = await start_server(decoders={"paced": PacedDecoder()}, default_model="paced")
    job = await start_job(server)
    assert server.manager.get(job["id"]).fragments.facts == []  # not a frame decoded yet
    probe = await start_ffprobe(server.url + job["urls"]["playlist"])
    assert await frames_read(probe) == {"video": FRAMES}


@pytest.mark.slow
async def test_ffmpeg_reads_a_push_session_with_sound_from_before_its_first_block(
    start_server: StartServer,
):
    server = await start_server()
    producer = await Producer(server, fps=16, rate=16_000, latent_frames=6).open()
    probe = await start_ffprobe(server.url + producer.session["urls"]["playlist"])
    await asyncio.sleep(0.3)  # FFmpeg has asked, and waits for a segment
    for _ in range(5):
        await producer.push(1)
        await asyncio.sleep(0.1)
    await producer.push(1, final=True)
    counts = await frames_read(probe)
    assert counts["video"] == video_frames(6)
    assert counts["audio"] > 0


async def test_a_plain_playlist_request_waits_for_the_first_segment(start_server: StartServer):
    decoder = GatedDecoder(hold_at=1)  # the first chunk out, the second held
    server = await start_server(decoders={"linear": decoder})
    job = await start_job(server)
    await asyncio.to_thread(decoder.holding.wait, 30)
    await until(lambda: len(server.manager.get(job["id"]).fragments.facts) == 1)
    waiting = asyncio.create_task(server.client.get(job["urls"]["playlist"]))
    await asyncio.sleep(0.3)
    assert not waiting.done()  # one part: no segment a player could start on yet
    decoder.gate.set()
    async with await asyncio.wait_for(waiting, 30) as response:
        playlist = m3u8.loads(await response.text())
    assert playlist.segments[0].uri == "hls/segment/0.m4s"  # the first chunk, alone
    assert abs(playlist.segments[0].duration - 1 / FPS) < 1e-4


async def test_the_multivariant_playlist_waits_for_its_codecs(start_server: StartServer):
    server = await start_server(decoders={"paced": PacedDecoder()}, default_model="paced")
    job = await start_job(server)
    master = f"/v1/videos/{job['id']}/master.m3u8"  # any job has one, a preview or not
    async with server.client.get(master) as response:
        text = await response.text()
    assert 'CODECS="avc1.' in text
    await check_playlist(server.client, server.url + master)


@pytest.mark.slow
async def test_an_uploads_playlists_running_and_finished(start_server: StartServer):
    decoder = GatedDecoder(hold_at=12)
    server = await start_server(decoders={"linear": decoder})
    job = await start_job(server)
    url = server.url + job["urls"]["playlist"]
    await asyncio.to_thread(decoder.holding.wait, 30)
    running = m3u8.loads(await check_playlist(server.client, url))
    assert not running.is_endlist and running.segments[0].uri == "hls/segment/0.m4s"
    decoder.gate.set()
    await asyncio.wait_for(server.manager.get(job["id"]).wait(), 30)
    finished = m3u8.loads(await check_playlist(server.client, url))
    assert finished.is_endlist and all(s.uri for s in finished.segments)
    assert await frames_read(await start_ffprobe(url)) == {"video": FRAMES}


@pytest.mark.slow
async def test_a_push_with_sound_running_and_finished(start_server: StartServer):
    server = await start_server()
    producer = await Producer(server, fps=16, rate=16_000, latent_frames=6).open()
    url = server.url + producer.session["urls"]["playlist"]
    await producer.push(2)
    await producer.push(2)
    await until(lambda: len(producer.job.fragments.facts) >= 4)
    assert not m3u8.loads(await check_playlist(server.client, url)).is_endlist
    await producer.push(2)
    await producer.end()  # its length known last: the sound after the last frame follows
    await asyncio.wait_for(producer.job.wait(), 30)
    finished = m3u8.loads(await check_playlist(server.client, url))
    assert finished.is_endlist
    parts = producer.job.fragments.facts
    # Whatever the tail holds, it is no segment of its own: every segment has video.
    assert len(finished.segments) == len(segments(parts, True))
    counts = await frames_read(await start_ffprobe(url))
    assert counts["video"] == video_frames(6) and counts["audio"] > 0
    await check_playlist(
        server.client, f"{server.url}/v1/videos/{producer.session['id']}/master.m3u8"
    )


@pytest.mark.slow
async def test_a_cancelled_push_and_a_failed_upload_answer_their_playlist_as_their_content(
    start_server: StartServer,
):
    """A failed job that kept its video so far: its playlist is that video, ended. A
    cancel that kept nothing (/content is a 409): the playlist is the same 409, with the
    reason, not a playlist of an empty video that ended well."""
    server = await start_server(decoders={"linear": FailingDecoder(fail_at=7)})
    failed = await start_job(server)
    await asyncio.wait_for(server.manager.get(failed["id"]).wait(), 30)
    for name in ("playlist", "content"):
        async with server.client.get(failed["urls"][name]) as response:
            assert response.status == 200
            assert response.headers.get("X-Video-Partial", "true") == "true"
            if name == "playlist":
                assert (await response.text()).rstrip().endswith("#EXT-X-ENDLIST")

    producer = await Producer(server, fps=16, rate=16_000, latent_frames=6).open()
    await producer.push(3)
    await until(lambda: len(producer.job.fragments.facts) >= 3)
    url = producer.session["urls"]["self"]
    async with server.client.delete(url, params={"keep": "false"}) as response:
        assert response.status == 200, await response.text()
    await asyncio.wait_for(producer.job.wait(), 30)
    for name in ("playlist", "content"):
        async with server.client.get(producer.session["urls"][name]) as response:
            assert response.status == 409
            assert (await response.json())["error"]["type"] == "conflict"


@pytest.mark.slow
async def test_a_preview_jobs_multivariant_and_media_playlists(start_server: StartServer):
    server = await start_server(
        decoders=tiny_and_linear(), default_model="tiny", previews=(("tiny", "linear"),)
    )
    job = await upload(server)
    await asyncio.wait_for(server.manager.get(job["id"]).wait(), 60)
    base = f"{server.url}/v1/videos/{job['id']}/"
    for uri in ("master.m3u8", "playlist.m3u8", "preview/playlist.m3u8", "live/playlist.m3u8"):
        await check_playlist(server.client, base + uri)
    # FFmpeg reads the live rendition's playlist whole, past each fragment's emsg.
    probe = await start_ffprobe(base + "live/playlist.m3u8")
    assert await frames_read(probe) == {"video": 21}  # test_preview's latents: 21 frames
