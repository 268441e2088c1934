"""Ray mode on a real local cluster: two `vaecast serve --ray auto` front ends, decoder
replicas on Ray Serve, and the faults the issue names (a replica killed, a front end
killed, no cluster at all)."""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from fractions import Fraction

import aiohttp
import pytest
import torch

from tests.cluster.conftest import FrontEnd, RayCluster, start_front_end, stop_front_end
from tests.helpers import decode_mp4, safetensors_bytes
from tests.helpers.fragment_audio import assert_aligned
from tests.helpers.mp4_duration import as_streamed
from tests.helpers.serve_process import vaecast_serve
from tests.server.test_push_audio_alignment import heard, loudness, tone, video_frames
from vaecast.codecs.aac import AAC_FRAME_SAMPLES, samples_for_duration

TIMEOUT = aiohttp.ClientTimeout(total=90)
# tiny: 8x the latent size, 1 + 4 (t - 1) frames, a chunk per latent frame.
SMALL = torch.rand(1, 16, 9, 6, 8, generator=torch.Generator().manual_seed(1)) * 2 - 1  # 33 frames
SMALL_FRAMES = 33


def test_without_ray_nothing_imports_ray():
    code = (
        "import sys, vaecast.cli, vaecast.server.app, vaecast.server.api.routes\n"
        "assert 'ray' not in sys.modules, sorted(m for m in sys.modules if m.startswith('ray'))\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.slow
def test_an_unreachable_cluster_is_one_clear_line_at_start():
    result = subprocess.run(
        [sys.executable, "-m", "vaecast.cli", "serve", "--ray", "ray://127.0.0.1:1", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("vaecast: error:")]
    assert errors == [
        "vaecast: error: cannot reach the Ray cluster at ray://127.0.0.1:1: "
        "ray client connection timeout"
    ], result.stderr


async def create(session: aiohttp.ClientSession, front_end: FrontEnd, **form: object) -> dict:
    if "latents" in form:
        data = aiohttp.FormData()
        body = io.BytesIO(safetensors_bytes(latents=form.pop("latents")))
        data.add_field("file", body, filename="z.safetensors")
        for name, value in form.items():
            data.add_field(name, str(value))
        request = session.post(f"{front_end.url}/v1/videos", data=data)
    else:
        request = session.post(f"{front_end.url}/v1/videos", json={"input": "push", **form})
    async with request as response:
        assert response.status == 201, await response.text()
        return await response.json()


async def push(
    session: aiohttp.ClientSession,
    front_end: FrontEnd,
    job: dict,
    block: torch.Tensor | None,
    final: bool = False,
) -> dict:
    body = b"" if block is None else safetensors_bytes(latents=block.contiguous())
    async with session.post(
        f"{front_end.url}{job['push']['url']}",
        data=body,
        headers={"X-Push-Token": job["push"]["token"]},
        params={"final": "1"} if final else {},
    ) as response:
        assert response.status == 202, await response.text()
        return await response.json()


async def get_json(session: aiohttp.ClientSession, url: str, status: int = 200) -> dict:
    async with session.get(url) as response:
        assert response.status == status, await response.text()
        return await response.json()


async def read_all(session: aiohttp.ClientSession, url: str, headers: dict | None = None) -> bytes:
    async with session.get(url, headers=headers or {}) as response:
        assert response.status in (200, 206), await response.text()
        return await response.read()


async def until_bytes(response: aiohttp.ClientResponse, count: int) -> bytes:
    data = b""
    while len(data) < count:
        piece = await response.content.readany()
        assert piece, "the stream ended early"
        data += piece
    return data


async def events(session: aiohttp.ClientSession, url: str) -> AsyncIterator[dict]:
    """A job's events after the first ("queued", id 0), as dicts; ends at done or error."""
    async with session.get(url, headers={"Last-Event-ID": "0"}) as response:
        assert response.status == 200
        name = None
        async for raw in response.content:
            line = raw.decode().rstrip("\n")
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: ") and name != "state":
                event = json.loads(line[6:])
                yield event
                if event["event"] in ("done", "error"):
                    return


async def until(predicate, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.2)


@pytest.mark.slow
@pytest.mark.timeout(700)  # the module's cluster and front ends start within it
async def test_a_job_of_one_front_end_is_served_by_both_byte_for_byte(front_ends):
    a, b = front_ends
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:

        async def both_replicas_healthy() -> bool:  # as Serve's controller last said
            health = await get_json(session, f"{b.url}/healthz")
            return health["replicas"] == {
                "count": 2, "healthy": 2, "states": {"RUNNING": 2}, "max_ongoing_requests": 1
            }  # fmt: skip

        await until(both_replicas_healthy)
        async with session.get(f"{a.url}/metrics") as response:
            assert 'vaecast_replicas{state="RUNNING"} 2.0' in await response.text()

        job = await create(session, a, latents=SMALL, fps=16)
        base = f"/v1/videos/{job['id']}"
        from_a, from_b = await asyncio.gather(
            read_all(session, a.url + base + "/content"),
            read_all(session, b.url + base + "/content"),
        )
        # Each live, or once complete the file, whose init segment states the duration.
        assert as_streamed(from_a) == as_streamed(from_b)
        assert len(decode_mp4(from_a)) == SMALL_FRAMES
        finished = await read_all(session, b.url + base + "/content")  # complete now
        assert as_streamed(finished) == as_streamed(from_a)
        assert finished != as_streamed(finished)  # it states the duration
        # Status, events, playlist, Range and DELETE from the front end that did not create it.
        on_b = await get_json(session, b.url + base)
        assert (on_b["status"], on_b["frames_done"], on_b["bytes"]) == (
            "completed",
            33,
            len(from_a),
        )
        assert (
            on_b["replica"]
            and on_b["replica"] == (await get_json(session, a.url + base))["replica"]
        )
        seen = [event async for event in events(session, b.url + base + "/events")]
        assert [e["event"] for e in seen] == ["started"] + ["chunk"] * 9 + ["done"]
        async with session.get(b.url + base + "/playlist.m3u8") as response:
            playlist = await response.text()
        assert playlist.count("#EXT-X-PART:") == 9 and "#EXT-X-ENDLIST" in playlist
        ranged = await read_all(session, b.url + base + "/content", {"Range": "bytes=100-199"})
        assert ranged == finished[100:200]
        async with session.delete(b.url + base) as response:
            assert (await response.json())["deleted"] is True

        async def gone_on_a() -> bool:
            async with session.get(a.url + base) as response:
                return response.status == 410

        await until(gone_on_a)


@pytest.mark.slow
async def test_a_push_session_is_pushed_through_both_front_ends(front_ends):
    a, b = front_ends
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        job = await create(session, a, fps=16)
        content = f"/v1/videos/{job['id']}/content"
        # A viewer of B, before any block: its answer starts with the first block.
        viewing = asyncio.create_task(session.get(b.url + content))
        first = await push(session, a, job, SMALL[:, :, :3])
        assert first["latent_frames"] == 3
        async with await viewing as viewer_b:
            live = await until_bytes(viewer_b, 1000)  # from B, while the session is open
            await push(session, b, job, SMALL[:, :, 3:6])
            await push(session, a, job, SMALL[:, :, 6:8])
            last = await push(session, b, job, SMALL[:, :, 8:], final=True)
            assert last["latent_frames"] == 9
            from_b = live + await viewer_b.read()
        from_a = await read_all(session, a.url + content)
        # (Live, or once complete the file: its init segment states the duration.)
        assert as_streamed(from_a) == from_b
        assert len(decode_mp4(from_a)) == SMALL_FRAMES
        done = await get_json(session, f"{a.url}/v1/videos/{job['id']}")
        assert (done["status"], done["input"], done["frames"]) == ("completed", "push", 33)


@pytest.mark.slow
async def test_each_fragment_of_a_ray_push_carries_its_own_audio(front_ends):
    # As tests/server/test_push_audio_alignment.py checks it locally: the replica's
    # feed is a live source, so each chunk's fragment waits for the audio that ends it.
    a, b = front_ends
    fps, rate, blocks = 8, 16_000, (1, 1, 2, 1, 1, 3)  # 2000 samples a video frame

    def sample(latent_frames: int) -> int:
        return samples_for_duration(Fraction(video_frames(latent_frames), fps), rate)

    sound = tone(sample(9), rate)
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        job = await create(session, a, fps=fps, audio_sample_rate=rate)
        pushed = 0
        for index, count in enumerate(blocks):
            audio = torch.from_numpy(sound[sample(pushed) : sample(pushed + count)])
            body = safetensors_bytes(
                {"audio_sample_rate": str(rate)},
                latents=SMALL[:, :, pushed : pushed + count].contiguous(),
                audio=audio.unsqueeze(0),
            )
            async with session.post(
                f"{(a, b)[index % 2].url}{job['push']['url']}",
                data=body,
                headers={"X-Push-Token": job["push"]["token"]},
                params={"final": "1"} if index == len(blocks) - 1 else {},
            ) as response:
                assert response.status == 202, await response.text()
            pushed += count
        data = await read_all(session, f"{b.url}/v1/videos/{job['id']}/content")
    line = assert_aligned(data)
    assert len(line.spans) == 9  # a fragment per chunk: none audio-only after them
    assert line.spans[-1].video is not None and line.spans[-1].video[1] == sample(9)
    assert line.spans[0].audio is not None and line.spans[0].audio[0] == 0
    heard_audio, heard_rate = heard(data)
    assert heard_rate == rate and abs(len(heard_audio) - sample(9)) < AAC_FRAME_SAMPLES
    assert loudness(heard_audio, 0, sample(9)) > 0.15  # the tone throughout


@pytest.mark.slow
async def test_delete_stops_the_replica_decode_at_its_next_chunk(front_ends):
    a, b = front_ends
    long = torch.rand(1, 16, 41, 30, 52, generator=torch.Generator().manual_seed(2)) * 2 - 1
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        job = await create(session, a, latents=long, fps=16)
        base = f"/v1/videos/{job['id']}"
        async with session.get(a.url + base + "/content") as viewer:
            await until_bytes(viewer, 2000)  # the init segment and a fragment or more
            seen = (await get_json(session, b.url + base))["chunks"]["done"]
            stopping = time.monotonic()
            async with session.delete(b.url + base) as response:
                assert response.status == 200, await response.text()
                cancelled = await response.json()
            took_s = time.monotonic() - stopping
            with pytest.raises(aiohttp.ClientPayloadError):
                await viewer.read()  # cut, not ended
        assert cancelled["status"] == "cancelled"
        assert cancelled["error"]["type"] == "cancelled"
        ended = [event async for event in events(session, a.url + base + "/events")][-1]
        # The replica reported how far its decoder got when its decode returned: past
        # what the viewer had by at most the chunks in flight (bridge queue, relay, one
        # being encoded) and the next one, and far from the 41 of the whole video.
        assert ended["event"] == "error" and "decoded_chunks" in ended, ended
        assert seen <= ended["decoded_chunks"] <= seen + 7, (seen, ended)
        assert took_s < 15


@pytest.mark.slow
async def test_a_killed_replica_fails_its_job_and_the_other_job_goes_on(front_ends):
    a, b = front_ends
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        doomed, other = await create(session, a, fps=16), await create(session, a, fps=16)
        pids = {}
        for job in (doomed, other):
            await push(session, a, job, SMALL[:, :, :2])
            async for event in events(session, f"{b.url}/v1/videos/{job['id']}/events"):
                if event["event"] == "started":
                    pids[job["id"]] = event["replica"]["pid"]
                    break
        # One job per replica (--max-ongoing 1): killing one's replica spares the other.
        assert pids[doomed["id"]] != pids[other["id"]]
        content = f"/v1/videos/{doomed['id']}/content"
        async with (
            session.get(a.url + content) as viewer_a,
            session.get(b.url + content) as viewer_b,
        ):
            await until_bytes(viewer_a, 500)
            await until_bytes(viewer_b, 500)
            os.kill(pids[doomed["id"]], signal.SIGKILL)
            for viewer in (viewer_a, viewer_b):
                with pytest.raises(aiohttp.ClientPayloadError):
                    await viewer.read()
        failed = await get_json(session, f"{b.url}/v1/videos/{doomed['id']}")
        assert failed["status"] == "failed"
        assert failed["error"]["type"] == "replica_failed", failed["error"]
        assert pids[doomed["id"]] and failed["replica"]

        await push(session, b, other, SMALL[:, :, 2:], final=True)
        video = await read_all(session, f"{a.url}/v1/videos/{other['id']}/content")
        assert len(decode_mp4(video)) == SMALL_FRAMES


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_a_preview_and_its_final_are_two_calls_on_the_replicas(front_ends):
    a, b = front_ends
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        job = await create(session, a, latents=SMALL, preview="linear")
        assert job["variants"]["preview"]["chunks"]["total"] == 9
        seen = [event async for event in events(session, f"{b.url}/v1/videos/{job['id']}/events")]
        chunks = [e["variant"] for e in seen if e["event"] == "chunk"]
        assert chunks.count("preview") == chunks.count("final") == 9
        names = [e["event"] for e in seen]
        assert "preview_done" in names and "final_done" in names and names[-1] == "done"
        base = f"/v1/videos/{job['id']}/content"
        preview = await read_all(session, f"{b.url}{base}?variant=preview")
        final = await read_all(session, b.url + base)
        assert final == await read_all(session, a.url + base)
        assert len(decode_mp4(preview)) == len(decode_mp4(final)) == SMALL_FRAMES
        alone = await create(session, a, latents=SMALL)
        await until_completed(session, a, alone)
        assert await read_all(session, f"{a.url}/v1/videos/{alone['id']}/content") == final


# How often the race below is run: each front end follows the job's host at its own
# pace, so one of them could still stream the live file after the other said completed.
SAME_BYTES_REPEATS = 20


@pytest.mark.slow
@pytest.mark.timeout(400)
async def test_once_a_front_end_says_completed_every_front_end_sends_the_finished_bytes(
    front_ends,
):
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        for attempt in range(SAME_BYTES_REPEATS):
            # The creator alternates; the other one reports the end, then the creator
            # is read at once (its own follow of the host may not have got there yet).
            creator, watcher = front_ends if attempt % 2 == 0 else front_ends[::-1]
            job = await create(session, creator, latents=SMALL)
            url = f"/v1/videos/{job['id']}"
            seen = [event async for event in events(session, f"{watcher.url}{url}/events")]
            assert seen[-1]["event"] == "done", seen[-1]
            from_creator = await read_all(session, f"{creator.url}{url}/content")
            state = await get_json(session, f"{creator.url}{url}")
            assert state["status"] == "completed", (attempt, state["status"])
            from_watcher = await read_all(session, f"{watcher.url}{url}/content")
            assert from_creator == from_watcher, f"attempt {attempt}: the bytes differ"
            assert as_streamed(from_creator) != from_creator  # it states its duration


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_a_ray_push_sessions_final_stopped_keeps_its_preview(front_ends):
    a, b = front_ends
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        job = await create(session, a, fps=16, preview="linear")
        await push(session, a, job, SMALL[:, :, :3])
        async with session.delete(
            f"{b.url}/v1/videos/{job['id']}", params={"variant": "final"}
        ) as response:
            assert response.status == 200, await response.text()
        await push(session, b, job, SMALL[:, :, 3:6])
        await push(session, a, job, SMALL[:, :, 6:], final=True)
        done = await until_completed(session, a, job, statuses=("cancelled",))
        assert done["variants"]["preview"]["status"] == "completed", done
        assert done["variants"]["final"]["status"] == "cancelled"
        preview = await read_all(session, f"{b.url}/v1/videos/{job['id']}/content?variant=preview")
        assert len(decode_mp4(preview)) == SMALL_FRAMES


async def until_completed(
    session: aiohttp.ClientSession,
    front_end: FrontEnd,
    job: dict,
    statuses: tuple[str, ...] = ("completed",),
) -> dict:
    found: dict = {}

    async def ended() -> bool:
        found.update(await get_json(session, f"{front_end.url}/v1/videos/{job['id']}"))
        return found["status"] in (*statuses, "failed")

    await until(ended)
    assert found["status"] in statuses, found
    return found


@pytest.mark.slow
async def test_a_killed_front_end_leaves_its_job_running_and_watchable(
    ray_cluster: RayCluster, front_ends
):
    a, b = front_ends
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        job = await create(session, a, fps=16)
        await push(session, a, job, SMALL[:, :, :4])
        content = f"/v1/videos/{job['id']}/content"
        async with session.get(b.url + content) as viewer_b:
            live = await until_bytes(viewer_b, 1000)
            a.kill()  # mid-stream, as a crash would
            await push(session, b, job, SMALL[:, :, 4:], final=True)
            video = live + await viewer_b.read()
        assert len(decode_mp4(video)) == SMALL_FRAMES
        done = await get_json(session, f"{b.url}/v1/videos/{job['id']}")
        assert done["status"] == "completed"


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_a_ray_job_outlives_its_cluster_in_the_store_and_an_empty_session_times_out(
    ray_cluster: RayCluster, tmp_path
):
    """The store (--store) holds a cluster job's video, so a server without Ray serves
    it later; and the job host applies --push-first-block-timeout as a local server does."""
    store = tmp_path / "store"
    c = start_front_end(ray_cluster, "--store", str(store), "--push-first-block-timeout", "2")
    try:
        async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
            empty = await create(session, c, fps=16)
            job = await create(session, c, latents=SMALL)

            async def ended(job_id: str, status: str) -> bool:
                found = await get_json(session, f"{c.url}/v1/videos/{job_id}")
                return found["status"] == status

            await until(lambda: ended(job["id"], "completed"))
            await until(lambda: ended(empty["id"], "failed"), timeout_s=20)
            failed = await get_json(session, f"{c.url}/v1/videos/{empty['id']}")
            assert failed["error"]["type"] == "push_timeout", failed
            assert "no block within 2 s" in failed["error"]["message"]
            video = await read_all(session, f"{c.url}/v1/videos/{job['id']}/content")
    finally:
        stop_front_end(c)
    assert len(decode_mp4(video)) == SMALL_FRAMES
    with vaecast_serve(["--model", "tiny", "--store", str(store)], tmp_path / "plain.log") as url:
        async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
            again = await read_all(session, f"{url.rstrip('/')}/v1/videos/{job['id']}/content")
            found = await get_json(session, f"{url.rstrip('/')}/v1/videos/{empty['id']}")
    assert again == video
    assert found["status"] == "failed" and found["error"]["type"] == "push_timeout"
