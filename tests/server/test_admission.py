"""Decode slots and a bounded queue: the request past capacity gets 429."""

from __future__ import annotations

import asyncio

from tests.helpers import GatedDecoder, safetensors_bytes, smooth_latents
from tests.helpers.server import StartServer


async def test_one_slot_one_queue_place_then_429(start_server: StartServer):
    decoder = GatedDecoder(hold_at=1)
    server = await start_server(decoders={"linear": decoder}, decode_slots=1, max_queued_jobs=1)
    body = safetensors_bytes(latents=smooth_latents(frames=3))

    async def post() -> tuple[int, dict, dict]:
        async with server.client.post("/v1/videos", data=body) as response:
            return response.status, dict(response.headers), await response.json()

    first = await post()
    await asyncio.to_thread(decoder.holding.wait, 30)  # decoding, holding the only slot
    second = await post()
    third = await post()
    assert first[0] == 201
    assert server.manager.get(first[2]["id"]).record.status == "in_progress"
    assert (second[0], second[2]["status"], second[2]["queue_position"]) == (201, "queued", 1)
    assert third[0] == 429
    assert third[2]["error"] == {
        "type": "server_busy",
        "message": "all 1 decode slot(s) are busy and 1 job(s) are queued; try again later",
    }
    assert int(third[1]["Retry-After"]) >= 1
    # The stream endpoint is admitted the same way, before its upload is read.
    async with server.client.post("/v1/videos/stream", data=body) as response:
        assert response.status == 429
    decoder.gate.set()
    for job in (first[2], second[2]):
        await asyncio.wait_for(server.manager.get(job["id"]).wait(), 30)
        assert server.manager.get(job["id"]).record.status == "completed"
    async with server.client.get(f"/v1/videos/{second[2]['id']}") as response:
        assert (await response.json())["queue_position"] is None
    async with server.client.get("/metrics") as response:
        assert 'vaecast_jobs_rejected_total{reason="busy"} 2.0' in await response.text()


async def test_queue_positions_follow_fifo_order(start_server: StartServer):
    decoder = GatedDecoder(hold_at=1)
    server = await start_server(decoders={"linear": decoder}, max_queued_jobs=3)
    body = safetensors_bytes(latents=smooth_latents(frames=2))
    ids = []
    for _ in range(4):
        async with server.client.post("/v1/videos", data=body) as response:
            ids.append((await response.json())["id"])
    positions = [server.manager.queue_position(server.manager.get(job_id)) for job_id in ids]
    assert positions == [None, 1, 2, 3]
    async with server.client.delete(f"/v1/videos/{ids[2]}") as response:
        assert (await response.json())["status"] == "cancelled"
    assert [server.manager.queue_position(server.manager.get(i)) for i in ids] == [None, 1, None, 2]
    decoder.gate.set()
    await asyncio.wait_for(server.manager.get(ids[3]).wait(), 30)
