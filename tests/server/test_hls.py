"""Low-Latency HLS over a job's own fragments: the playlist, its media, FFmpeg reading it."""

from __future__ import annotations

import asyncio
import shutil

import m3u8
import pytest

from tests.helpers import GatedDecoder, decode_mp4, safetensors_bytes, smooth_latents, until
from tests.helpers.hls_checks import apple_rules, strict_errors
from tests.helpers.server import Server, StartServer
from vaecast.server.faces.hls.playlist import (
    Part,
    has_complete_segment,
    listed_parts,
    media_playlist,
    part_position,
    segments,
)

LATENTS = smooth_latents(frames=20)  # linear: 1 + 4 * 19 = 77 frames, 20 chunks
FPS = 16


def parts_of(durations: list[float], independent: set[int]) -> list[Part]:
    return [Part(d, i in independent) for i, d in enumerate(durations)]


def test_parts_group_into_segments_at_keyframes():
    # As the encoder cuts them: the first chunk alone (the second starts with an IDR),
    # then a keyframe at the first chunk past each interval.
    parts = parts_of([0.0625] + [0.25] * 9, {0, 1, 6})
    grouped = segments(parts, ended=False)
    assert [(s.first_part, len(s.parts), s.complete) for s in grouped] == [
        (0, 1, True),
        (1, 5, True),
        (6, 4, False),  # the running segment: complete only at the next keyframe or the end
    ]
    assert segments(parts, ended=True)[-1].complete
    assert not has_complete_segment(parts[:1], ended=False)  # no second part yet
    assert has_complete_segment(parts[:2], ended=False)
    assert has_complete_segment(parts[:1], ended=True)  # a one-chunk video that ended


def test_a_running_playlist_by_the_rules_of_ll_hls():
    parts = parts_of([0.0625] + [0.25] * 9, {0, 1, 6})
    text = media_playlist(parts, ended=False, target_duration_s=1.0, part_target_s=0.25)
    playlist = m3u8.loads(text)
    assert playlist.playlist_type == "event" and not playlist.is_endlist
    assert playlist.target_duration == 1  # round(1.25) for segment 1
    assert playlist.part_inf.part_target == 0.25
    assert playlist.server_control.can_block_reload == "YES"
    assert playlist.server_control.part_hold_back >= 3 * playlist.part_inf.part_target
    assert playlist.segment_map[0].uri == "hls/init.mp4"
    # The running segment (its parts, no URI of its own yet) comes last.
    assert [s.uri for s in playlist.segments] == ["hls/segment/0.m4s", "hls/segment/1.m4s", None]
    assert [p.uri for p in playlist.segments[2].parts] == [
        f"hls/part/{i}.m4s" for i in range(6, 10)
    ]
    listed = [p.uri for s in playlist.segments[:2] for p in s.parts]
    assert listed == [f"hls/part/{i}.m4s" for i in range(6)]
    assert 'URI="hls/part/6.m4s",INDEPENDENT=YES' in text  # the running segment's part
    assert playlist.preload_hint.uri == "hls/part/10.m4s"
    for segment in playlist.segments[:2]:
        assert abs(segment.duration - sum(p.duration for p in segment.parts)) < 1e-4
        assert round(segment.duration) <= playlist.target_duration
        assert segment.parts[0].independent == "YES"
    assert all(
        p.duration <= playlist.part_inf.part_target for s in playlist.segments for p in s.parts
    )
    assert apple_rules(text) == []


def test_a_finished_playlist_ends_and_hints_nothing():
    parts = parts_of([0.0625, 0.25, 0.25], {0, 1})
    playlist = m3u8.loads(
        media_playlist(parts, ended=True, target_duration_s=2.0, part_target_s=0.25)
    )
    assert playlist.is_endlist and playlist.preload_hint is None
    assert [s.uri for s in playlist.segments] == ["hls/segment/0.m4s", "hls/segment/1.m4s"]


def test_parts_are_listed_for_the_last_three_segments_only():
    # Nine segments of four parts: the first six are listed by their EXTINF alone.
    parts = parts_of([0.25] * 36, set(range(0, 36, 4)))
    for ended in (False, True):
        playlist = m3u8.loads(
            media_playlist(parts, ended=ended, target_duration_s=1.0, part_target_s=0.25)
        )
        assert [len(s.parts) for s in playlist.segments] == [0] * 6 + [4] * 3
        assert len(playlist.segments) == 9 and playlist.segments[0].duration == 1.0


def test_an_audio_only_part_ends_the_segment_before_it():
    """A push session's last fragment holds the sound after its last frame: it joins the
    last segment, which then ends on it; no segment without a picture."""
    parts = [*parts_of([0.0625, 0.25, 0.25], {0, 1}), Part(0.1, keyframe=False)]
    text = media_playlist(parts, ended=True, target_duration_s=2.0, part_target_s=0.25)
    playlist = m3u8.loads(text)
    assert [len(s.parts) for s in playlist.segments] == [1, 3]
    assert abs(playlist.segments[1].duration - 0.6) < 1e-4
    assert apple_rules(text) == []


async def test_every_playlist_shape_passes_hls_parsers_strict_mode():
    cases = [
        (parts_of([0.0625], {0}), False),  # one part: no segment complete yet
        (parts_of([0.0625], {0}), True),  # a one-chunk video
        (parts_of([0.0625] + [0.25] * 9, {0, 1, 6}), False),
        (parts_of([0.0625] + [0.25] * 9, {0, 1, 6}), True),
        (parts_of([0.25] * 36, set(range(0, 36, 4))), False),
        ([*parts_of([0.0625, 0.25, 0.25], {0, 1}), Part(0.1, False)], True),  # audio tail
        (parts_of([1.0625] * 7 + [0.5625], {0, 1, 3, 5, 7}), True),  # tiler-sized chunks
        ([], False),  # nothing decoded yet
    ]
    texts = [
        media_playlist(
            listed_parts(parts, ended, 0.25), ended=ended, target_duration_s=2.0, part_target_s=0.25
        )
        for parts, ended in cases
    ]
    assert await strict_errors(texts) == [None] * len(texts)
    assert [apple_rules(text) for text in texts] == [[]] * len(texts)


def test_a_short_last_part_is_listed_once_it_ends_its_segment():
    one_frame = parts_of([0.0625], {0})
    assert listed_parts(one_frame, False, 0.25) == []  # the next part may join it
    assert listed_parts(one_frame, True, 0.25) == one_frame  # nothing will
    two = parts_of([0.0625, 0.25], {0, 1})
    assert listed_parts(two, False, 0.25) == two
    short_tail = parts_of([0.0625, 0.25, 0.125], {0, 1})
    assert listed_parts(short_tail, False, 0.25) == short_tail[:2]


@pytest.mark.parametrize(
    ("msn", "part", "needed"),
    [(0, 0, None), (0, None, None), (1, 3, None), (1, None, 11), (1, 5, 11), (2, 0, 11)],
)
def test_what_a_blocking_reload_waits_for(msn: int, part: int | None, needed: int | None):
    parts = parts_of([0.0625] + [0.25] * 9, {0, 5})  # segment 1 has parts 5..9 so far
    assert part_position(parts, False, msn, part) == needed


async def start_job(server: Server, model: str | None = None) -> dict:
    body = safetensors_bytes(latents=LATENTS)
    params = {"fps": str(FPS), **({} if model is None else {"model": model})}
    async with server.client.post("/v1/videos", data=body, params=params) as r:
        assert r.status == 201
        return await r.json()


async def playlist_text(server: Server, job: dict, **params: str) -> str:
    async with server.client.get(job["urls"]["playlist"], params=params) as response:
        assert response.status == 200, await response.text()
        assert response.headers["Content-Type"].startswith("application/vnd.apple.mpegurl")
        return await response.text()


async def playlist_of(server: Server, job: dict, **params: str) -> m3u8.M3U8:
    return m3u8.loads(await playlist_text(server, job, **params))


async def test_a_running_jobs_playlist_grows_and_blocking_reload_waits(
    start_server: StartServer,
):
    decoder = GatedDecoder(hold_at=12)
    server = await start_server(decoders={"linear": decoder})
    job = await start_job(server)
    assert job["urls"]["playlist"] == f"/v1/videos/{job['id']}/playlist.m3u8"
    await asyncio.to_thread(decoder.holding.wait, 30)
    await until(lambda: len(server.manager.get(job["id"]).fragments.facts) == 12)
    held = await playlist_of(server, job)
    assert not held.is_endlist and held.preload_hint.uri == "hls/part/12.m4s"
    # Part 12 is in the running segment (the last that began); it does not exist yet:
    # the reload waits.
    parts = server.manager.get(job["id"]).fragments.facts
    starts = [i for i, part in enumerate(parts) if part.keyframe]
    assert starts[:2] == [0, 1]  # the first chunk is a segment alone
    waiting = asyncio.create_task(
        playlist_text(server, job, _HLS_msn=str(len(starts) - 1), _HLS_part=str(12 - starts[-1]))
    )
    part_12 = asyncio.create_task(server.client.get(f"/v1/videos/{job['id']}/hls/part/12.m4s"))
    await asyncio.sleep(0)
    assert not waiting.done() and not part_12.done()
    decoder.gate.set()
    reloaded = await asyncio.wait_for(waiting, 30)
    assert 'URI="hls/part/12.m4s"' in reloaded.split("#EXT-X-PRELOAD-HINT")[0]
    response = await asyncio.wait_for(part_12, 30)
    assert response.status == 200 and len(await response.read()) > 0
    async with server.client.get(job["urls"]["playlist"], params={"_HLS_msn": "9"}) as r:
        assert r.status == 400  # far past the last segment
    await asyncio.wait_for(server.manager.get(job["id"]).wait(), 30)
    assert (await playlist_of(server, job)).is_endlist


async def test_the_parts_are_the_content_exactly_and_segments_their_parts(
    start_server: StartServer,
):
    server = await start_server()
    job = await start_job(server)
    await asyncio.wait_for(server.manager.get(job["id"]).wait(), 30)
    playlist = await playlist_of(server, job)
    base = f"/v1/videos/{job['id']}/"

    async def get(uri: str) -> bytes:
        async with server.client.get(base + uri) as response:
            assert response.status == 200, uri
            return await response.read()

    init = await get(playlist.segment_map[0].uri)
    # The playlist lists the parts of its last three segments; all of them are served.
    all_parts = server.manager.get(job["id"]).fragments.facts
    parts = [await get(f"hls/part/{i}.m4s") for i in range(len(all_parts))]
    listed = [p.uri for s in playlist.segments for p in s.parts]
    assert listed == [f"hls/part/{i}.m4s" for i in range(len(parts) - len(listed), len(parts))]
    async with server.client.get(job["urls"]["content"]) as response:
        content = await response.read()
    assert init + b"".join(parts) == content
    assert [s.uri for s in playlist.segments] == [
        f"hls/segment/{n}.m4s" for n in range(len(playlist.segments))
    ]
    for segment, grouped in zip(playlist.segments, segments(all_parts, True), strict=True):
        whole = await get(segment.uri)
        first = grouped.first_part
        assert whole == b"".join(parts[first : first + len(grouped.parts)])
        assert abs(segment.duration - grouped.duration_s) < 1e-4
    durations = sum(s.duration for s in playlist.segments)
    assert abs(durations - len(decode_mp4(content)) / FPS) < 1e-3


async def test_a_failed_jobs_playlist_is_its_contents(start_server: StartServer):
    from tests.helpers import FailingDecoder

    server = await start_server(
        decoders={"linear": FailingDecoder(fail_at=3), "at_once": FailingDecoder(fail_at=0)}
    )
    # Failed at its chunk 3: its video so far is kept, and its playlist ends there.
    job = await start_job(server)
    await asyncio.wait_for(server.manager.get(job["id"]).wait(), 30)
    async with server.client.get(f"/v1/videos/{job['id']}/playlist.m3u8") as response:
        assert response.status == 200
        playlist = await response.text()
    assert playlist.count("#EXT-X-PART:") == 3 and playlist.rstrip().endswith("#EXT-X-ENDLIST")
    # Failed before its first fragment: nothing is kept (/content is a 409), and the
    # playlists say so, with the reason.
    job = await start_job(server, model="at_once")
    await asyncio.wait_for(server.manager.get(job["id"]).wait(), 30)
    for path in ("playlist.m3u8", "master.m3u8", "content"):
        async with server.client.get(f"/v1/videos/{job['id']}/{path}") as response:
            assert response.status == 409, path
            assert "has no content: failed" in (await response.json())["error"]["message"]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("ffmpeg") is None, reason="tools/install-test-deps installs it")
async def test_ffmpegs_hls_demuxer_reads_a_running_job_to_the_end(start_server: StartServer):
    decoder = GatedDecoder(hold_at=12)  # segment 0 (parts 0-8) is complete, the rest held
    server = await start_server(decoders={"linear": decoder})
    job = await start_job(server)
    await asyncio.to_thread(decoder.holding.wait, 30)
    # FFmpeg starts a live playlist near its end unless told to start at its beginning.
    ffprobe = await asyncio.create_subprocess_exec(
        "ffprobe", "-v", "error", "-live_start_index", "0", "-count_frames",
        "-select_streams", "v:0", "-show_entries", "stream=nb_read_frames", "-of", "csv=p=0",
        server.url + job["urls"]["playlist"],
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    # It reads the live playlist and its first segment while the decode is held...
    assert server.runner.server is not None
    asked = server.runner.server.requests_count
    await until(lambda: server.runner.server.requests_count >= asked + 3)  # type: ignore[union-attr]
    assert ffprobe.returncode is None
    # ... then follows it to the end.
    decoder.gate.set()
    out, err = await asyncio.wait_for(ffprobe.communicate(), 90)
    assert ffprobe.returncode == 0, err.decode()
    assert out.decode().split()[0] == "77"  # every frame (ffprobe prints it per program too)


async def test_a_push_sessions_playlist_is_served_before_its_length_is_known(
    start_server: StartServer,
):
    """While a session runs its chunk sizes come from the stream plan (its length is not
    known until the last block): the playlist is a running EVENT playlist, then ends."""
    server = await start_server()
    async with server.client.post("/v1/videos", json={"input": "push"}) as response:
        job = await response.json()
    headers = {"X-Push-Token": job["push"]["token"]}
    latents = smooth_latents(frames=4)
    async with server.client.post(
        job["push"]["url"],
        data=safetensors_bytes(latents=latents[:, :, :2].contiguous()),
        headers=headers,
    ) as response:
        assert response.status == 202
    running = server.manager.get(job["id"])
    await until(lambda: running.fragments.facts)
    async with server.client.get(f"/v1/videos/{job['id']}/playlist.m3u8") as response:
        assert response.status == 200, await response.text()
        text = await response.text()
    assert "#EXT-X-PLAYLIST-TYPE:EVENT" in text and "#EXT-X-ENDLIST" not in text
    async with server.client.post(
        job["push"]["url"] + "?final=1",
        data=safetensors_bytes(latents=latents[:, :, 2:].contiguous()),
        headers=headers,
    ) as response:
        assert response.status == 202
    await asyncio.wait_for(running.wait(), 30)
    async with server.client.get(f"/v1/videos/{job['id']}/playlist.m3u8") as response:
        assert response.status == 200
        assert "#EXT-X-ENDLIST" in await response.text()


async def test_a_blocking_reload_for_a_segment_not_begun_waits_for_that_part(
    start_server: StartServer,
):
    # Asked while segment 0 is still open, _HLS_msn=1&_HLS_part=2 is answered once
    # segment 1 has its part 2, not at the next part (a later segment's first need).
    from tests.server.test_playback_deadlines import PacedDecoder

    server = await start_server(decoders={"paced": PacedDecoder()}, default_model="paced")
    job = await start_job(server)
    text = await playlist_text(server, job, _HLS_msn="1", _HLS_part="2")
    playlist = m3u8.loads(text)
    parts = server.manager.get(job["id"]).fragments.facts
    second = next(i for i, part in enumerate(parts) if i and part.keyframe)
    assert f'URI="hls/part/{second + 2}.m4s"' in text.split("#EXT-X-PRELOAD-HINT")[0], text
    assert playlist.segments and not playlist.is_endlist
