"""Batches: latents of B > 1 videos (`num_videos_per_prompt`) make B jobs in one request,
each video equal to its entry uploaded alone; admission counts all B."""

from __future__ import annotations

import torch

from tests.helpers import GatedDecoder, safetensors_bytes, smooth_latents
from tests.helpers.server import Server, StartServer


async def content(server: Server, job_id: str) -> bytes:
    async with server.client.get(f"/v1/videos/{job_id}/content") as response:
        assert response.status == 200
        return await response.read()


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
