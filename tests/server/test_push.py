"""Push sessions: latents pushed while they are generated, watched from the first block."""

from __future__ import annotations

import asyncio
import io

import aiohttp
import pytest
import torch

from tests.helpers import (
    GatedDecoder,
    decode_mp4,
    safetensors_bytes,
    smooth_latents,
    split_stream,
    until,
)
from tests.helpers.server import Server, StartServer
from vaecast.job.views import job_object
from vaecast.server.config import Limits

LATENTS = smooth_latents(frames=6)  # linear: 1 + 4 * 5 = 21 frames, 6 chunks


async def create_session(server: Server, **fields: object) -> dict:
    async with server.client.post("/v1/videos", json={"input": "push", **fields}) as response:
        assert response.status == 201, await response.text()
        return await response.json()


async def push(
    server: Server, session: dict, block: torch.Tensor | None, final: bool = False, **headers: str
) -> tuple[int, dict]:
    token = {"X-Push-Token": session["push"]["token"], **headers}
    body = b"" if block is None else safetensors_bytes(latents=block.contiguous())
    params = {"final": "1"} if final else {}
    async with server.client.post(
        session["push"]["url"], data=body, headers=token, params=params
    ) as response:
        return response.status, await response.json()


async def test_a_session_streams_from_its_first_block_and_ends_a_whole_mp4(
    start_server: StartServer,
):
    server = await start_server()
    session = await create_session(server, fps=8)
    assert session["status"] == "queued"
    assert (session["frames"], session["chunks"]["total"], session["progress"]) == (
        None,
        None,
        None,
    )
    assert session["push"]["url"] == f"/v1/videos/{session['id']}/latents"
    # A viewer may come before any latents: its answer starts with the first block.
    viewing = asyncio.create_task(server.client.get(session["urls"]["content"]))
    status, answer = await push(server, session, LATENTS[:, :, :2])
    assert (status, answer["latent_frames"]) == (202, 2)
    viewer = await asyncio.wait_for(viewing, 30)
    # The viewer has the first chunks while the producer still holds the rest.
    first = await asyncio.wait_for(viewer.content.read(1), 30)
    assert first
    job = server.manager.get(session["id"])
    await until(lambda: job.record.chunks_done == 2)
    assert job_object(job.record)["status"] == "in_progress"
    late = await server.client.get(session["urls"]["content"])  # a late joiner
    for start in (2, 4):
        status, _ = await push(server, session, LATENTS[:, :, start : start + 2], final=start == 4)
        assert status == 202
    streamed = first + await asyncio.wait_for(viewer.read(), 30)
    joined = await asyncio.wait_for(late.read(), 30)
    assert streamed == joined
    await asyncio.wait_for(job.wait(), 30)
    assert job_object(job.record)["frames"] == 21 and job_object(job.record)["chunks"]["total"] == 6
    # The same pixels as one upload of the whole tensor.
    async with server.client.post(
        "/v1/videos/stream", data=safetensors_bytes(latents=LATENTS), params={"fps": "8"}
    ) as response:
        whole = await response.read()
    assert [f.tobytes() for f in decode_mp4(streamed)] == [f.tobytes() for f in decode_mp4(whole)]
    _, fragments = split_stream(streamed)
    assert len(fragments) == 6
    # Finished, it is an ordinary file: Range and ETag.
    async with server.client.get(
        session["urls"]["content"], headers={"Range": "bytes=0-9"}
    ) as response:
        assert response.status == 206 and "ETag" in response.headers


async def test_chunk_events_carry_the_block_to_fragment_latency(start_server: StartServer):
    server = await start_server()
    session = await create_session(server)
    await push(server, session, LATENTS[:, :, :3], final=True)
    job = server.manager.get(session["id"])
    await asyncio.wait_for(job.wait(), 30)
    chunks = [e for e in job.events.items() if e["event"] == "chunk"]
    assert len(chunks) == 3 and all(0 <= e["latency_s"] < 30 for e in chunks)
    assert job_object(job.record)["realtime_factor"] > 0
    async with server.client.get("/metrics") as response:
        text = await response.text()
    assert "vaecast_push_block_to_fragment_seconds_count 3.0" in text


async def test_bad_pushes_get_their_error_and_disturb_nothing(start_server: StartServer):
    server = await start_server(limits=Limits(max_frames=9))  # 3 latent frames
    session = await create_session(server)
    url = session["push"]["url"]
    async with server.client.post(
        url, data=safetensors_bytes(latents=LATENTS[:, :, :1].contiguous())
    ) as r:
        assert (r.status, (await r.json())["error"]["type"]) == (401, "unauthorized")
    status, answer = await push(server, session, LATENTS[:, :, :1], **{"X-Push-Token": "nope"})
    assert (status, answer["error"]["type"]) == (403, "forbidden")
    assert (await push(server, session, LATENTS[:, :, :1]))[0] == 202
    status, answer = await push(server, session, LATENTS[:, :, :1, :4])
    assert status == 422
    assert answer["error"]["message"] == (
        "this block's latents are 16x4x8 (C x H x W); the session's first block fixed 16x6x8"
    )
    status, answer = await push(server, session, LATENTS[:, :, :1].to(torch.float16))
    assert status == 422
    assert answer["error"]["message"] == (
        "this block's latents are float16; the session's first block was float32"
    )
    status, answer = await push(server, session, LATENTS[:, :, :3])  # 4 latent frames in all
    assert (status, answer["error"]["type"]) == (413, "payload_too_large")
    status, _ = await push(server, session, None)
    assert status == 422  # empty without final
    assert (await push(server, session, LATENTS[:, :, :2], final=True))[0] == 202
    status, answer = await push(server, session, LATENTS[:, :, :1])
    assert (status, answer["error"]["type"]) == (409, "conflict")
    job = server.manager.get(session["id"])
    await asyncio.wait_for(job.wait(), 30)
    assert job_object(job.record)["status"] == "completed" and job_object(job.record)["frames"] == 9


async def test_an_idle_session_fails_and_its_viewers_are_cut(start_server: StartServer):
    server = await start_server(push_idle_timeout_s=0.3)
    session = await create_session(server)
    await push(server, session, LATENTS[:, :, :1])
    async with server.client.get(session["urls"]["content"]) as viewer:
        with pytest.raises(aiohttp.ClientPayloadError):
            await asyncio.wait_for(viewer.read(), 30)
    job = server.manager.get(session["id"])
    await asyncio.wait_for(job.wait(), 30)
    assert job_object(job.record)["status"] == "failed"
    assert job_object(job.record)["error"] == {
        "type": "push_timeout",
        "message": "the push session received nothing for 0.3 s",
    }
    status, _ = await push(server, session, LATENTS[:, :, :1])
    assert status == 409


async def test_a_full_block_queue_makes_the_producer_wait(start_server: StartServer):
    decoder = GatedDecoder(hold_at=0)
    server = await start_server(decoders={"linear": decoder}, push_queue_blocks=1)
    session = await create_session(server)
    assert (await push(server, session, LATENTS[:, :, :1]))[0] == 202
    await asyncio.to_thread(decoder.holding.wait, 30)  # the decoder holds block 1
    assert (await push(server, session, LATENTS[:, :, 1:2]))[0] == 202  # queued
    waiting = asyncio.create_task(push(server, session, LATENTS[:, :, 2:3]))
    await until(lambda: server.manager.get(session["id"]).feed.latent_frames == 3)
    assert not waiting.done()  # the queue is full: this push waits for the decoder
    decoder.gate.set()
    assert (await asyncio.wait_for(waiting, 30))[0] == 202
    await push(server, session, None, final=True)
    await asyncio.wait_for(server.manager.get(session["id"]).wait(), 30)


async def test_a_session_takes_a_decode_slot_only_with_its_first_block(
    start_server: StartServer,
):
    server = await start_server(decode_slots=1, max_queued_jobs=1)
    idle = await create_session(server)
    # The idle session holds no slot: a whole upload decodes at once.
    async with server.client.post(
        "/v1/videos/stream", data=safetensors_bytes(latents=LATENTS)
    ) as r:
        assert r.status == 200
        assert len(decode_mp4(await r.read())) == 21
    await push(server, idle, LATENTS[:, :, :1], final=True)
    await asyncio.wait_for(server.manager.get(idle["id"]).wait(), 30)


async def test_delete_cancels_a_session(start_server: StartServer):
    server = await start_server()
    session = await create_session(server)
    await push(server, session, LATENTS[:, :, :1])
    async with server.client.delete(f"/v1/videos/{session['id']}") as response:
        assert (await response.json())["status"] == "cancelled"
    assert (await push(server, session, LATENTS[:, :, 1:2]))[0] == 409


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"fps": "fast"}, "fps must be a number or a ratio like 30000/1001, got 'fast'"),
        (
            {"audio_sample_rate": 8000},
            "audio_sample_rate must be an integer from 16000 to 48000, got '8000'",
        ),
        (
            {"audio_sample_rate": 16000, "audio_channels": 3},
            "audio_channels must be an integer from 1 to 2, got '3'",
        ),
        (
            {"frames": 5},
            "unknown field(s) frames; a push session takes: "
            "audio_channels, audio_sample_rate, batch, expected_frames, fps, height, input, "
            "kind, model, preview, value_range, webhook_url, width",
        ),
        ({"expected_frames": 0}, "expected_frames must be an integer from 1 to 2001, got '0'"),
        (
            {"expected_frames": "9" * 10_000},
            "expected_frames must be an integer from 1 to 2001, got "
            f"'{'9' * 40}'... (10000 characters)",
        ),
    ],
)
async def test_bad_session_requests(start_server: StartServer, fields: dict, message: str):
    server = await start_server()
    async with server.client.post("/v1/videos", json={"input": "push", **fields}) as response:
        assert response.status == 422
        assert (await response.json())["error"]["message"] == message


async def test_audio_pushed_with_the_blocks_is_muxed_to_the_videos_length(
    start_server: StartServer,
):
    import av

    rate, fps = 16000, 8
    server = await start_server()
    session = await create_session(server, fps=fps, audio_sample_rate=rate, audio_channels=1)
    assert session["audio"] == {"sample_rate": rate, "channels": 1}
    token = {"X-Push-Token": session["push"]["token"]}
    # latent frame 0 is 1 video frame, each later one 4: the audio of each block's span.
    spans = [(0, 2, 5), (2, 4, 8), (4, 6, 8)]
    for first, last, frames in spans:
        audio = torch.full((1, frames * rate // fps), 0.25)
        body = safetensors_bytes(
            {"audio_sample_rate": str(rate)},
            latents=LATENTS[:, :, first:last].contiguous(),
            audio=audio,
        )
        params = {"final": "1"} if last == 6 else {}
        async with server.client.post(
            session["push"]["url"], data=body, headers=token, params=params
        ) as response:
            assert response.status == 202, await response.text()
    job = server.manager.get(session["id"])
    await asyncio.wait_for(job.wait(), 30)
    assert job_object(job.record)["status"] == "completed", job_object(job.record)["error"]
    async with server.client.get(session["urls"]["content"]) as response:
        data = await response.read()
    assert response.headers["Content-Type"].endswith(', mp4a.40.2"')
    with av.open(io.BytesIO(data)) as container:
        heard = sum(frame.samples for frame in container.decode(audio=0))
    assert abs(heard - 21 * rate // fps) <= 1024  # within one AAC frame of 21 frames


async def test_audio_longer_than_its_block_is_refused(start_server: StartServer):
    server = await start_server()
    session = await create_session(server, fps=8, audio_sample_rate=16000)
    body = safetensors_bytes(
        {"audio_sample_rate": "16000"},
        latents=LATENTS[:, :, :1].contiguous(),
        audio=torch.zeros(1, 16000 * 3600),  # an hour for one frame
    )
    token = {"X-Push-Token": session["push"]["token"]}
    url = session["push"]["url"]
    async with server.client.post(url, data=io.BytesIO(body), headers=token) as response:
        assert response.status == 422
        assert (await response.json())["error"]["message"] == (
            "this block's audio has 57600000 samples; its 1 video frames last 2000 at 16000 Hz"
        )


@pytest.mark.parametrize("split", [(1, 2, 3), (3, 1, 2), (6,)])
async def test_any_split_gives_the_pixels_of_one_upload_with_tiny(
    start_server: StartServer, split: tuple[int, ...]
):
    from vaecast.models.tiny import TinyDecoder

    server = await start_server(decoders={"linear": TinyDecoder()})
    session = await create_session(server, fps=8)
    first = 0
    for count in split:
        last = first + count
        assert (await push(server, session, LATENTS[:, :, first:last], final=last == 6))[0] == 202
        first = last
    job = server.manager.get(session["id"])
    await asyncio.wait_for(job.wait(), 60)
    async with server.client.get(session["urls"]["content"]) as response:
        pushed = decode_mp4(await response.read())
    body = safetensors_bytes(latents=LATENTS)
    async with server.client.post("/v1/videos/stream", data=body, params={"fps": "8"}) as r:
        whole = decode_mp4(await r.read())
    assert len(pushed) == len(whole) == 21
    assert all((a == b).all() for a, b in zip(pushed, whole, strict=True))
