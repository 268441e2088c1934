"""Preview, then final, in one job: real HTTP, real encodes. A job names a preview
decoder beside its model; the preview's fragments come first, both renditions decode
to the full video, the final is byte for byte the job without a preview, and
`final_ready` comes once the final has passed a viewer of the preview."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import torch

from tests.helpers import (
    GatedDecoder,
    decode_mp4,
    psnr,
    safetensors_bytes,
    smooth_latents,
    until,
)
from tests.helpers.server import Server, StartServer
from tests.server.test_push import create_session, push
from vaecast.models.linear import LinearDecoder
from vaecast.models.registry import get_decoder

LATENTS = smooth_latents(frames=6, height=6, width=8)  # 21 frames of 64x48
FRAMES = 21


def tiny_and_linear() -> dict[str, Any]:
    return {"tiny": get_decoder("tiny"), "linear": LinearDecoder()}


async def upload(server: Server, latents: torch.Tensor = LATENTS, **fields: str) -> dict:
    form = aiohttp.FormData()
    form.add_field("file", safetensors_bytes(latents=latents), filename="z.safetensors")
    for name, value in fields.items():
        form.add_field(name, value)
    async with server.client.post("/v1/videos", data=form) as response:
        assert response.status == 201, await response.text()
        return await response.json()


async def events_of(server: Server, job_id: str) -> list[dict]:
    """Every event of a job after its first (`queued`), to its end (`done` or `error`):
    replayed from the start, so a job that ended already gives them all too."""
    events, name = [], None
    headers = {"Last-Event-ID": "0"}
    async with server.client.get(f"/v1/videos/{job_id}/events", headers=headers) as response:
        assert response.status == 200
        async for raw in response.content:
            line = raw.decode().rstrip("\n")
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: ") and name != "state":
                event = json.loads(line[6:])
                events.append(event)
                if event["event"] in ("done", "error"):
                    return events
    return events


async def ended(server: Server, job_id: str) -> dict:
    """The job object once the job has ended (bounded)."""
    for _ in range(1500):
        async with server.client.get(f"/v1/videos/{job_id}") as response:
            job = await response.json()
        if job["status"] not in ("queued", "in_progress"):
            return job
        await asyncio.sleep(0.02)
    raise AssertionError(f"video {job_id} did not end: {job}")


async def content(server: Server, job_id: str, variant: str | None = None) -> bytes:
    params = {} if variant is None else {"variant": variant}
    async with server.client.get(f"/v1/videos/{job_id}/content", params=params) as response:
        assert response.status == 200, await response.text()
        return await response.read()


async def test_the_preview_plays_first_and_the_final_is_the_job_without_one(
    start_server: StartServer,
):
    server = await start_server(decoders=tiny_and_linear(), default_model="tiny")
    job = await upload(server, preview="linear")
    assert job["variants"]["preview"]["decoder"] == "linear"
    assert job["variants"]["final"]["decoder"] == "tiny"
    assert job["urls"]["preview_content"] == f"/v1/videos/{job['id']}/content?variant=preview"
    events = await events_of(server, job["id"])
    names = [(e["event"], e.get("variant")) for e in events]
    chunks = [e for e in events if e["event"] == "chunk"]
    first_preview = next(i for i, e in enumerate(chunks) if e["variant"] == "preview")
    first_final = next(i for i, e in enumerate(chunks) if e["variant"] == "final")
    assert first_preview < first_final  # the preview's first fragment came first
    assert ("preview_done", "preview") in names and ("final_done", "final") in names
    assert names.count(("final_ready", "final")) == 1
    ready = names.index(("final_ready", "final"))
    assert ready < names.index(("final_done", "final")) < names.index(("done", None))
    done = events[-1]["job"]
    assert done["status"] == "completed"
    assert done["variants"]["preview"]["status"] == "completed"
    assert done["variants"]["final"]["ready_after_preview_s"] is not None
    preview = await content(server, job["id"], "preview")
    final = await content(server, job["id"], "final")
    assert final == await content(server, job["id"])  # the default is the final
    async with server.client.get(job["urls"]["preview_content"]) as response:
        assert 'codecs="avc1.' in response.headers["Content-Type"]
    assert len(decode_mp4(preview)) == len(decode_mp4(final)) == FRAMES
    # The same latents without a preview, and decoded by the preview's decoder alone.
    alone = await upload(server, preview="none")
    assert "variants" not in alone
    await events_of(server, alone["id"])
    assert await content(server, alone["id"]) == final
    # The preview is the preview decoder's video; it has a keyframe at every chunk
    # (where the live rendition may switch down to it), so its bytes are its own.
    linear = await upload(server, model="linear")
    await events_of(server, linear["id"])
    alone_frames = decode_mp4(await content(server, linear["id"]))
    assert min(map(psnr, decode_mp4(preview), alone_frames)) > 40
    metrics = await (await server.client.get("/metrics")).text()
    assert 'vaecast_variant_time_to_first_fragment_seconds_count{variant="preview"} 1.0' in metrics
    assert "vaecast_preview_to_final_ready_seconds_count 1.0" in metrics


async def test_a_server_default_preview_and_each_rendition_over_hls(start_server: StartServer):
    server = await start_server(
        decoders=tiny_and_linear(), default_model="tiny", previews=(("tiny", "linear"),)
    )
    job = await upload(server)
    assert job["variants"]["preview"]["decoder"] == "linear"
    await events_of(server, job["id"])
    async with server.client.get(job["urls"]["master_playlist"]) as response:
        master = await response.text()
    assert master.index("playlist.m3u8") < master.index("preview/playlist.m3u8")
    assert 'STABLE-VARIANT-ID="final"' in master and "SCORE=2" in master
    for playlist, variant in (("playlist.m3u8", "final"), ("preview/playlist.m3u8", "preview")):
        async with server.client.get(f"/v1/videos/{job['id']}/{playlist}") as response:
            text = await response.text()
        assert text.rstrip().endswith("#EXT-X-ENDLIST")
        base = f"/v1/videos/{job['id']}/{playlist.removesuffix('playlist.m3u8')}"
        # Each whole segment (a preview with a keyframe at every chunk has a segment per
        # chunk, and a playlist lists parts only for its last segments).
        lines = text.splitlines()
        segments = [lines[i + 1] for i, line in enumerate(lines) if line.startswith("#EXTINF")]
        body = await (await server.client.get(base + "hls/init.mp4")).read()
        for uri in segments:
            async with server.client.get(base + uri) as response:
                assert response.status == 200
                body += await response.read()
        assert body == await content(server, job["id"], variant)


async def test_stopping_the_final_keeps_the_preview_complete_and_playable(
    start_server: StartServer,
):
    gated = GatedDecoder(hold_at=1)
    server = await start_server(decoders={"gated": gated, "linear": LinearDecoder()})
    job = await upload(server, model="gated", preview="linear")
    await asyncio.to_thread(gated.holding.wait, 30)  # the final holds at its chunk 1

    async def preview_done() -> bool:
        async with server.client.get(f"/v1/videos/{job['id']}") as response:
            return (await response.json())["variants"]["preview"]["status"] == "completed"

    for _ in range(300):
        if await preview_done():
            break
        await asyncio.sleep(0.02)
    stopping = asyncio.create_task(
        server.client.delete(f"/v1/videos/{job['id']}", params={"variant": "final"})
    )
    await asyncio.sleep(0.2)
    gated.gate.set()
    async with await stopping as response:
        assert response.status == 200, await response.text()
        stopped = await response.json()
    assert stopped["status"] == "cancelled"
    assert stopped["variants"]["final"]["status"] == "cancelled"
    assert stopped["variants"]["preview"]["status"] == "completed"
    assert "stopped by request" in stopped["error"]["message"]
    preview = await content(server, job["id"], "preview")
    assert len(decode_mp4(preview)) == FRAMES
    async with server.client.get(f"/v1/videos/{job['id']}/content") as response:
        assert response.status == 409
        assert (await response.json())["error"]["type"] == "conflict"


async def test_a_push_session_feeds_both_renditions(start_server: StartServer):
    server = await start_server(decoders=tiny_and_linear(), default_model="tiny")
    session = await create_session(server, fps=8, preview="linear")
    assert session["variants"]["preview"]["chunks"]["total"] is None
    for start, end in ((0, 2), (2, 5), (5, 6)):
        status, _ = await push(server, session, LATENTS[:, :, start:end], final=end == 6)
        assert status == 202
    events = await events_of(server, session["id"])
    done = events[-1]["job"]
    assert done["status"] == "completed", done
    assert done["variants"]["preview"]["chunks"]["total"] == 6
    preview = await content(server, session["id"], "preview")
    final = await content(server, session["id"])
    assert len(decode_mp4(preview)) == len(decode_mp4(final)) == FRAMES
    # The final is what the same blocks make without a preview.
    alone = await create_session(server, fps=8)
    for start, end in ((0, 2), (2, 5), (5, 6)):
        await push(server, alone, LATENTS[:, :, start:end], final=end == 6)
    await events_of(server, alone["id"])
    assert await content(server, alone["id"]) == final


@pytest.mark.parametrize(
    ("fields", "status", "message"),
    [
        ({"preview": "mochi"}, 404, "preview decoder 'mochi' is not served here"),
        ({"preview": "tiny", "model": "linear"}, 201, None),
        ({"preview": "x" * 500}, 422, "preview must name a decoder (at most 200 characters)"),
        ({"preview": "x" * 5000}, 413, "form field 'preview' is over 1024 bytes"),
    ],
)
async def test_a_preview_the_server_cannot_use_is_refused(
    start_server: StartServer, fields: dict, status: int, message: str | None
):
    server = await start_server(decoders=tiny_and_linear(), default_model="tiny")
    form = aiohttp.FormData()
    form.add_field("file", safetensors_bytes(latents=LATENTS), filename="z.safetensors")
    for name, value in fields.items():
        form.add_field(name, value)
    async with server.client.post("/v1/videos", data=form) as response:
        body = await response.json()
        assert response.status == status, body
    if message is not None:
        assert message in body["error"]["message"]


async def test_a_preview_of_another_latent_space_names_both(start_server: StartServer):
    decoders = {**tiny_and_linear(), "gated": GatedDecoder()}
    server = await start_server(decoders=decoders, default_model="tiny")
    form = aiohttp.FormData()
    form.add_field("file", safetensors_bytes(latents=LATENTS), filename="z.safetensors")
    form.add_field("preview", "gated")
    async with server.client.post("/v1/videos", data=form) as response:
        body = await response.json()
    assert response.status == 422
    assert body["error"]["message"] == (
        "the preview decoder 'gated' cannot preview model 'tiny': it reads gated's latent "
        "space, the model tiny's"
    )
    variant = await server.client.get("/v1/videos/nope/content", params={"variant": "x"})
    assert variant.status == 404


async def test_variant_requests_on_a_job_without_a_preview(start_server: StartServer):
    server = await start_server()
    job = await upload(server)
    await events_of(server, job["id"])
    async with server.client.get(job["urls"]["content"], params={"variant": "preview"}) as r:
        assert r.status == 404
    async with server.client.get(job["urls"]["content"], params={"variant": "best"}) as r:
        assert r.status == 422
    async with server.client.delete(f"/v1/videos/{job['id']}", params={"variant": "final"}) as r:
        assert r.status == 422


@pytest.mark.slow
async def test_wan_with_a_taehv_preview_on_random_tiny_weights(
    start_server: StartServer, tmp_path: Path
):
    from tests.server.test_real_decoders import load_decoders

    decoders = load_decoders(tmp_path)
    server = await start_server(decoders=decoders, default_model="wan2.1")
    latents = torch.randn(1, 16, 3, 4, 4, generator=torch.Generator().manual_seed(3))
    job = await upload(server, latents, preview="taehv")
    events = await events_of(server, job["id"])
    chunks = [e["variant"] for e in events if e["event"] == "chunk"]
    assert chunks.index("preview") < chunks.index("final")
    assert events[-1]["job"]["status"] == "completed"
    preview = await content(server, job["id"], "preview")
    final = await content(server, job["id"])
    assert len(decode_mp4(preview)) == len(decode_mp4(final)) == 9
    alone = await upload(server, latents, preview="none")
    await events_of(server, alone["id"])
    assert await content(server, alone["id"]) == final
    # MiniMax's 4 latent channels cannot be previewed by a 16-channel TAEHV: named both.
    refused = aiohttp.FormData()
    minimax_latents = torch.randn(1, 4, 3, 4, 4)
    refused.add_field("file", safetensors_bytes(latents=minimax_latents), filename="z.safetensors")
    refused.add_field("model", "minimax-h3")
    refused.add_field("preview", "taehv")
    async with server.client.post("/v1/videos", data=refused) as response:
        body = await response.json()
    assert response.status == 422, body
    assert body["error"]["message"] == (
        "the preview decoder 'taehv' cannot preview model 'minimax-h3': it takes 16 latent "
        "channels, the model 4"
    )


async def test_a_live_demo_takes_a_preview(start_server: StartServer):
    server = await start_server(decoders=tiny_and_linear(), default_model="tiny")
    demo = {"scene": "gradient", "frames": 9, "width": 64, "height": 64, "sound": False}
    async with server.client.post(
        "/v1/videos", json={**demo, "live": True, "preview": "linear"}
    ) as response:
        assert response.status == 201, await response.text()
        job = await response.json()
    assert job["input"] == "push" and job["variants"]["preview"]["decoder"] == "linear"
    events = await events_of(server, job["id"])
    assert events[-1]["job"]["variants"]["preview"]["status"] == "completed"
    assert len(decode_mp4(await content(server, job["id"], "preview"))) == 9


async def test_a_push_sessions_preview_never_waits_for_its_final_and_outlives_its_stop(
    start_server: StartServer,
):
    # The final holds at its chunk 1; the producer and the preview go on to the end
    # (the final's blocks wait for it), and stopping the final keeps the preview.
    gated = GatedDecoder(hold_at=1)
    server = await start_server(
        decoders={"gated": gated, "linear": LinearDecoder()}, push_queue_blocks=1
    )
    session = await create_session(server, model="gated", preview="linear", fps=8)
    for i in range(6):
        status, _ = await push(server, session, LATENTS[:, :, i : i + 1], final=i == 5)
        assert status == 202
    job = server.manager.jobs[session["id"]]
    await until(lambda: job.record.preview.is_final)
    assert job.record.preview.status.value == "completed"
    assert gated.holding.is_set() and not gated.gate.is_set()  # the final still held
    stopping = asyncio.create_task(
        server.client.delete(f"/v1/videos/{session['id']}", params={"variant": "final"})
    )
    await asyncio.sleep(0.2)
    gated.gate.set()
    async with await stopping as response:
        assert response.status == 200, await response.text()
        stopped = await response.json()
    assert stopped["status"] == "cancelled", stopped
    assert stopped["variants"]["final"]["status"] == "cancelled"
    assert stopped["variants"]["preview"]["status"] == "completed"
    assert len(decode_mp4(await content(server, session["id"], "preview"))) == FRAMES


async def test_stopping_a_push_sessions_preview_lets_its_held_producer_go(
    start_server: StartServer,
):
    # Now the preview holds (its chunk 1) and its full queue holds the producer back;
    # once it is stopped, the waiting block goes to the final alone.
    gated = GatedDecoder(hold_at=1)
    server = await start_server(
        decoders={"linear": LinearDecoder(), "gated": gated}, push_queue_blocks=1
    )
    session = await create_session(server, model="linear", preview="gated", fps=8)

    async def produce() -> list[int]:
        statuses = []
        for i in range(6):
            statuses.append(
                (await push(server, session, LATENTS[:, :, i : i + 1], final=i == 5))[0]
            )
        return statuses

    pushing = asyncio.create_task(produce())
    feed = server.manager.jobs[session["id"]].feed
    await until(lambda: feed.feed_state().held_back)
    stopping = asyncio.create_task(
        server.client.delete(f"/v1/videos/{session['id']}", params={"variant": "preview"})
    )
    await asyncio.sleep(0.2)
    gated.gate.set()
    async with await stopping as response:
        assert response.status == 200, await response.text()
    assert await asyncio.wait_for(pushing, 30) == [202] * 6
    done = await ended(server, session["id"])
    assert done["status"] == "completed", done
    assert done["variants"]["preview"]["status"] == "cancelled"
    assert len(decode_mp4(await content(server, session["id"]))) == FRAMES


async def test_a_job_says_what_plays_and_every_face_of_a_stopped_rendition_agrees(
    start_server: StartServer,
):
    """After DELETE ?variant=final the job's `plays` names its preview, while it runs
    and once it has ended `cancelled` (as its final did); a stopped rendition's
    playlist is 409, as its content is, and the master lists only what plays."""
    server = await start_server(push_idle_timeout_s=60)

    async def statuses(job_id: str) -> dict[str, int]:
        answers = {}
        for path in ("content?variant=preview", "preview/playlist.m3u8", "content"):
            async with server.client.get(f"/v1/videos/{job_id}/{path}") as response:
                answers[path] = response.status  # a running preview's stream: not read
        for path in ("playlist.m3u8", "master.m3u8"):
            async with server.client.get(f"/v1/videos/{job_id}/{path}") as response:
                answers[path] = response.status
        return answers

    async def job_object(job_id: str) -> dict[str, Any]:
        async with server.client.get(f"/v1/videos/{job_id}") as response:
            return await response.json()

    session = await create_session(server, preview="linear", fps=8)
    assert session["plays"] == ["live", "preview", "final"]
    for i in range(2):
        assert (await push(server, session, LATENTS[:, :, i : i + 1]))[0] == 202
    async with server.client.delete(
        f"/v1/videos/{session['id']}", params={"variant": "final"}
    ) as response:
        assert response.status == 200
    running = await job_object(session["id"])
    # The live rendition plays on: the preview's fragments from now on.
    assert (running["status"], running["plays"]) == ("in_progress", ["live", "preview"])
    assert await statuses(session["id"]) == {
        "content?variant=preview": 200,
        "preview/playlist.m3u8": 200,
        "content": 409,
        "playlist.m3u8": 409,
        "master.m3u8": 200,
    }
    async with server.client.get(f"/v1/videos/{session['id']}/master.m3u8") as response:
        master = await response.text()
    assert "preview/playlist.m3u8" in master and "\nplaylist.m3u8" not in master
    for i in range(2, 6):
        assert (await push(server, session, LATENTS[:, :, i : i + 1], final=i == 5))[0] == 202
    job = server.manager.jobs[session["id"]]
    await asyncio.wait_for(job.wait(), 30)
    ended = await job_object(session["id"])
    assert (ended["status"], ended["plays"]) == ("cancelled", ["live", "preview"])
    assert ended["variants"]["preview"]["status"] == "completed"
    assert ended["variants"]["live"]["status"] == "completed"
    assert ended["variants"]["live"]["sources"][-1] == "preview"
    assert len(decode_mp4(await content(server, session["id"], "preview"))) == FRAMES
    assert (await statuses(session["id"]))["playlist.m3u8"] == 409

    # Both stopped: nothing plays, and no face says otherwise.
    session = await create_session(server, preview="linear", fps=8)
    assert (await push(server, session, LATENTS[:, :, :2]))[0] == 202
    for variant in ("final", "preview"):
        async with server.client.delete(
            f"/v1/videos/{session['id']}", params={"variant": variant}
        ) as response:
            assert response.status == 200
    stopped = await job_object(session["id"])
    assert (stopped["status"], stopped["plays"]) == ("cancelled", [])
    assert set((await statuses(session["id"])).values()) == {409}
