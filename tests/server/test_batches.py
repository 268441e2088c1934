"""Batches: latents of B > 1 videos (`num_videos_per_prompt`) make B jobs in one request,
each video equal to its entry uploaded alone; admission counts all B."""

from __future__ import annotations

import asyncio

import torch

from tests.helpers import GatedDecoder, decode_mp4, safetensors_bytes, smooth_latents
from tests.helpers.mp4_duration import as_streamed
from tests.helpers.server import Server, StartServer
from vaecast.client import PushSession
from vaecast.server.config import Limits


async def content(server: Server, job_id: str) -> bytes:
    """A job's MP4 as it streamed, whether it is still running or finished (a finished
    file's init segment states the duration a live one could not; the rest is the same)."""
    async with server.client.get(f"/v1/videos/{job_id}/content") as response:
        assert response.status == 200
        return as_streamed(await response.read())


async def test_a_batch_of_two_makes_two_jobs_each_its_entry_alone(start_server: StartServer):
    server = await start_server()
    entries = [smooth_latents(frames=2, seed=seed) for seed in (1, 2)]
    batch = torch.cat(entries)
    audio = torch.stack([torch.full((1, 4000), 0.1), torch.full((1, 4000), -0.2)])
    body = safetensors_bytes({"audio_sample_rate": "16000"}, latents=batch, audio=audio)
    async with server.client.post("/v1/videos?fps=16", data=body) as response:
        assert response.status == 201, await response.text()
        answer = await response.json()
    assert answer["object"] == "list"
    jobs = answer["data"]
    assert len(jobs) == 2 and jobs[0]["id"] != jobs[1]["id"]
    assert all(job["audio"] == {"sample_rate": 16000, "channels": 1} for job in jobs)
    for job, entry, waveform in zip(jobs, entries, audio, strict=True):
        alone = safetensors_bytes({"audio_sample_rate": "16000"}, latents=entry, audio=waveform)
        async with server.client.post("/v1/videos?fps=16", data=alone) as response:
            single = await response.json()
        assert await content(server, job["id"]) == await content(server, single["id"])


async def test_one_soundtrack_for_all_and_one_stream_per_response(start_server: StartServer):
    server = await start_server()
    batch = torch.cat([smooth_latents(frames=2, seed=s) for s in (1, 2, 3)])
    body = safetensors_bytes(
        {"audio_sample_rate": "16000"}, latents=batch, audio=torch.zeros(1, 4000)
    )
    async with server.client.post("/v1/videos", data=body) as response:
        jobs = (await response.json())["data"]
    assert [job["audio"]["channels"] for job in jobs] == [1, 1, 1]
    async with server.client.post("/v1/videos/stream", data=body) as response:
        assert response.status == 422
        assert (await response.json())["error"]["message"] == (
            "one response streams one video; these latents hold 3: POST them to /v1/videos "
            "for a job each"
        )
    wrong = safetensors_bytes(
        {"audio_sample_rate": "16000"}, latents=batch, audio=torch.zeros(2, 1, 4000)
    )
    async with server.client.post("/v1/videos", data=wrong) as response:
        assert response.status == 422
        assert "is for 2 videos; the latents hold 3" in (await response.json())["error"]["message"]


async def test_a_batch_takes_a_place_per_video_or_none(start_server: StartServer):
    decoder = GatedDecoder(hold_at=0)  # the first job holds the one slot; one queues
    server = await start_server(
        decoders={"linear": decoder}, decode_slots=1, max_queued_jobs=2
    )  # 3 places in all
    batch = torch.cat([smooth_latents(frames=2, seed=s) for s in (1, 2)])
    one = safetensors_bytes(latents=smooth_latents(frames=2))
    async with server.client.post("/v1/videos", data=one) as response:
        assert response.status == 201
    async with server.client.post("/v1/videos", data=one) as response:
        assert response.status == 201
    # One place is left: a batch of two would need two.
    async with server.client.post("/v1/videos", data=safetensors_bytes(latents=batch)) as r:
        assert r.status == 429
        assert r.headers["Retry-After"]
        assert (await r.json())["error"]["message"].startswith(
            "a batch of 2 videos needs 2 job places; this server has 1 free now"
        )
    assert len(server.manager.jobs) == 2  # none of the batch was started
    decoder.gate.set()


async def push_alone(server: Server, blocks: list[torch.Tensor]) -> str:
    async with server.client.post("/v1/videos", json={"input": "push"}) as response:
        job = await response.json()
    headers = {"X-Push-Token": job["push"]["token"]}
    for block in blocks:
        async with server.client.post(
            job["push"]["url"], data=safetensors_bytes(latents=block.contiguous()), headers=headers
        ) as response:
            assert response.status == 202
    async with server.client.post(job["push"]["url"] + "?final=1", headers=headers) as r:
        assert r.status == 202
    return job["id"]


async def test_a_batch_push_session_splits_each_block_into_its_videos(start_server: StartServer):
    server = await start_server()
    entries = [smooth_latents(frames=3, seed=seed) for seed in (1, 2)]
    async with server.client.post("/v1/videos", json={"input": "push", "batch": 2}) as response:
        assert response.status == 201
        answer = await response.json()
    jobs, push = answer["data"], answer["push"]
    assert len(jobs) == 2 and push["url"] == f"/v1/videos/{jobs[0]['id']}/latents"
    headers = {"X-Push-Token": push["token"]}
    for seq, cut in enumerate(((0, 2), (2, 3))):
        block = torch.cat([entry[:, :, cut[0] : cut[1]] for entry in entries])
        async with server.client.post(
            push["url"],
            data=safetensors_bytes(latents=block),
            headers={**headers, "X-Push-Seq": str(seq)},
        ) as response:
            assert response.status == 202, await response.text()
    # A block of another batch size is refused with the reason.
    async with server.client.post(
        push["url"],
        data=safetensors_bytes(latents=entries[0][:, :, :1].contiguous()),
        headers=headers,
    ) as response:
        assert response.status == 428  # numbered: and without an index
    async with server.client.post(
        push["url"],
        data=safetensors_bytes(latents=entries[0][:, :, :1].contiguous()),
        headers={**headers, "X-Push-Seq": "2"},
    ) as response:
        assert response.status == 422
        assert (await response.json())["error"]["message"] == (
            "this session is a batch of 2 videos; the block holds 1"
        )
    async with server.client.post(
        push["url"] + "?final=1", headers={**headers, "X-Push-Seq": "2"}
    ) as response:
        assert response.status == 202
    for job, entry in zip(jobs, entries, strict=True):
        alone = await push_alone(server, [entry[:, :, :2], entry[:, :, 2:]])
        assert await content(server, job["id"]) == await content(server, alone)


async def test_a_cancelled_video_of_a_batch_push_lets_the_others_go_on(
    start_server: StartServer,
):
    server = await start_server()
    async with server.client.post("/v1/videos", json={"input": "push", "batch": 3}) as response:
        answer = await response.json()
    jobs, push = answer["data"], answer["push"]
    headers = {"X-Push-Token": push["token"]}
    block = torch.cat([smooth_latents(frames=1, seed=s) for s in (1, 2, 3)])
    async with server.client.delete(f"/v1/videos/{jobs[1]['id']}") as response:
        assert response.status == 200
    for _ in range(2):
        async with server.client.post(
            f"/v1/videos/{jobs[2]['id']}/latents",  # any video's URL takes the batch
            data=safetensors_bytes(latents=block),
            headers=headers,
        ) as response:
            assert response.status == 202, await response.text()
    async with server.client.post(push["url"] + "?final=1", headers=headers) as response:
        assert response.status == 202
    statuses = []
    for job in jobs:
        async with server.client.get(f"/v1/videos/{job['id']}/content") as response:
            await response.read()
        async with server.client.get(f"/v1/videos/{job['id']}") as response:
            statuses.append(((await response.json())["status"], (await response.json())["frames"]))
    assert statuses == [("completed", 5), ("cancelled", None), ("completed", 5)]


async def test_the_client_pushes_a_batch_of_latents_and_of_frames(start_server: StartServer):
    server = await start_server()
    latents = torch.cat([smooth_latents(frames=3, seed=s) for s in (1, 2)])
    frames = torch.rand(2, 3, 6, 16, 16)

    def produce() -> tuple[list[str], list[str]]:
        with PushSession(server.url, batch=2) as session:
            session.push(latents[:, :, :2])
            session.push(latents[:, :, 2:])
            latent_urls = session.content_urls
        with PushSession(server.url, batch=2, kind="frames") as session:
            session.push(frames[:, :, :3])
            session.push(frames[:, :, 3:])
            frame_urls = session.content_urls
        return latent_urls, frame_urls

    latent_urls, frame_urls = await asyncio.to_thread(produce)
    assert len(latent_urls) == len(frame_urls) == 2
    for url, expected in [*((u, 9) for u in latent_urls), *((u, 6) for u in frame_urls)]:
        async with server.client.get(url.removeprefix(server.url)) as response:
            assert len(decode_mp4(await response.read())) == expected


async def test_a_batch_longer_than_the_queue_decodes_with_one_slot(start_server: StartServer):
    """Video 1 waits for the slot video 0 holds: it takes its blocks past the queue's
    bound, so that video 0 gets the blocks it needs to finish."""
    server = await start_server(decode_slots=1, push_queue_blocks=1)
    entries = [smooth_latents(frames=6, seed=seed) for seed in (1, 2)]
    async with server.client.post("/v1/videos", json={"input": "push", "batch": 2}) as response:
        answer = await response.json()
    jobs, push = answer["data"], answer["push"]
    headers = {"X-Push-Token": push["token"]}

    async def produce() -> None:
        for t in range(6):
            block = torch.cat([entry[:, :, t : t + 1] for entry in entries]).contiguous()
            async with server.client.post(
                push["url"], data=safetensors_bytes(latents=block), headers=headers
            ) as response:
                assert response.status == 202, await response.text()
        async with server.client.post(push["url"] + "?final=1", headers=headers) as response:
            assert response.status == 202

    await asyncio.wait_for(produce(), timeout=60)
    for job, entry in zip(jobs, entries, strict=True):
        alone = await push_alone(server, [entry[:, :, t : t + 1] for t in range(6)])
        assert await content(server, job["id"]) == await content(server, alone)


async def test_what_a_waiting_video_holds_is_bounded(start_server: StartServer):
    block = torch.cat([smooth_latents(frames=1, seed=s) for s in (1, 2)]).contiguous()
    per_video = block[0].element_size() * block[0].nelement()
    server = await start_server(
        decode_slots=1,
        push_queue_blocks=1,
        limits=Limits(max_upload_bytes=3 * per_video),
    )
    async with server.client.post("/v1/videos", json={"input": "push", "batch": 2}) as response:
        answer = await response.json()
    jobs, push = answer["data"], answer["push"]
    headers = {"X-Push-Token": push["token"]}
    statuses = []
    for _ in range(6):
        async with server.client.post(
            push["url"], data=safetensors_bytes(latents=block), headers=headers
        ) as response:
            statuses.append(response.status)
            if response.status != 202:
                message = (await response.json())["error"]["message"]
                break
    assert statuses[-1] == 413 and len(statuses) > 1
    assert message.startswith(f"1 video(s) of this batch ({jobs[1]['id']}) wait for a decode slot")
    assert message.endswith("run the server with --decode-slots 2 to decode the batch at once")
    # The refused block went to neither video: the producer may end the session cleanly.
    async with server.client.post(push["url"] + "?final=1", headers=headers) as response:
        assert response.status == 202
    frames = []
    for job in jobs:
        async with server.client.get(f"/v1/videos/{job['id']}/content") as response:
            frames.append(len(decode_mp4(await response.read())))
    assert frames[0] == frames[1] > 0
