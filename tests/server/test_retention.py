"""Finished jobs are kept for a while and within a memory budget, then freed."""

from __future__ import annotations

import gc
import io
import tracemalloc
from pathlib import Path

from tests.helpers import safetensors_bytes, until
from tests.helpers.server import Server, StartServer, noisy_latents

SPILL_THRESHOLD = 32 * 1024


async def finished_job(server: Server, frames: int = 12) -> dict:
    body = io.BytesIO(safetensors_bytes(latents=noisy_latents(frames, 16, 16)))
    async with server.client.post("/v1/videos", data=body) as response:
        job = await response.json()
    await server.manager.get(job["id"]).wait()
    return job


def fragment_bytes_in_memory() -> int:
    """Bytes still allocated for a stream's segments: the init segment is born in the
    fMP4 writer, every fragment as a `codecs.fragment.Fragment`."""
    snapshot = tracemalloc.take_snapshot().filter_traces(
        [
            tracemalloc.Filter(True, "*vaecast/codecs/fmp4.py"),
            tracemalloc.Filter(True, "*vaecast/codecs/fragment.py"),
        ]
    )
    return sum(stat.size for stat in snapshot.statistics("filename"))


async def test_expired_job_is_evicted_its_memory_freed_and_spill_file_removed(
    start_server: StartServer, tmp_path: Path
):
    server = await start_server(
        retention_s=0.3, spill_threshold_bytes=SPILL_THRESHOLD, spill_dir=str(tmp_path)
    )
    tracemalloc.start()
    try:
        job = await finished_job(server)
        running = server.manager.get(job["id"])
        assert running.log.size > 2 * SPILL_THRESHOLD
        assert 0 < running.log.memory_bytes <= SPILL_THRESHOLD
        (spill_file,) = tmp_path.iterdir()
        assert spill_file.stat().st_size == running.log.size - running.log.memory_bytes
        async with server.client.get(job["urls"]["content"]) as response:
            assert len(await response.read()) == running.log.size  # RAM part + spill part
        held = fragment_bytes_in_memory()
        in_ram = running.log.memory_bytes
        assert held >= in_ram
        del running
        await until(lambda: job["id"] not in server.manager.jobs)
        gc.collect()
        freed = held - fragment_bytes_in_memory()
    finally:
        tracemalloc.stop()
    assert freed >= 0.95 * in_ram  # every fragment held in RAM is gone
    await until(lambda: not any(tmp_path.iterdir()))
    for url in (f"/v1/videos/{job['id']}", job["urls"]["content"]):
        async with server.client.get(url) as response:
            assert response.status == 410
            assert (await response.json())["error"] == {
                "type": "gone",
                "message": f"video {job['id']} is no longer kept (evicted 0.3 s after it ended)",
            }


async def test_memory_budget_evicts_the_oldest_finished_job(start_server: StartServer):
    server = await start_server(retention_memory_bytes=150_000, spill_threshold_bytes=None)
    first = await finished_job(server)
    first_size = server.manager.get(first["id"]).log.memory_bytes
    assert 75_000 < first_size <= 150_000  # one fits the budget, two do not
    second = await finished_job(server)
    await until(lambda: first["id"] not in server.manager.jobs)
    assert second["id"] in server.manager.jobs
    async with server.client.get(f"/v1/videos/{first['id']}") as response:
        assert response.status == 410
        assert "memory budget" in (await response.json())["error"]["message"]


async def test_a_cancelled_job_frees_its_bytes_and_spill_file_at_once(
    start_server: StartServer, tmp_path: Path
):
    from tests.helpers import GatedDecoder

    decoder = GatedDecoder(hold_at=6)
    server = await start_server(
        decoders={"linear": decoder}, spill_threshold_bytes=4096, spill_dir=str(tmp_path)
    )
    body = io.BytesIO(safetensors_bytes(latents=noisy_latents(12, 16, 16)))
    async with server.client.post("/v1/videos", data=body) as response:
        job_id = (await response.json())["id"]
    await until(lambda: any(tmp_path.iterdir()) and decoder.holding.is_set())
    job = server.manager.get(job_id)
    job.cancel("cancelled by request", keep_partial=False)  # kept: tests/server/test_partial.py
    decoder.gate.set()
    await job.wait()
    await until(lambda: job.log.released and not any(tmp_path.iterdir()))
    assert job.log.memory_bytes == 0
    async with server.client.get(f"/v1/videos/{job_id}") as response:
        assert (await response.json())["status"] == "cancelled"  # the record stays
