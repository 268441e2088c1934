"""The durable store in one process: a server stopped and started again on the same
`store_dir` serves what the first one finished, the same way; deletes, eviction,
a full store, a corrupt database, a lost file and two servers on one store."""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tests.helpers import GatedDecoder, decode_mp4, safetensors_bytes, smooth_latents, until
from tests.helpers.server import TEST_CONFIG, Server, serve_on_loopback
from vaecast.models.linear import LinearDecoder
from vaecast.server.app import create_app, runner_settings


@contextlib.asynccontextmanager
async def stored_server(store: Path, decoder: Any = None, **changes: Any) -> AsyncIterator[Server]:
    """A server on `store`, stopped (cleanly: as a deploy would) on exit."""
    config = replace(TEST_CONFIG, store_dir=str(store), **changes)
    app = create_app(config, {"linear": decoder or LinearDecoder()})
    runner = web.AppRunner(app, **runner_settings(config))
    url = await serve_on_loopback(app, runner)
    client = aiohttp.ClientSession(url, timeout=aiohttp.ClientTimeout(total=60))
    try:
        yield Server(url, client, app, runner)
    finally:
        await client.close()
        await runner.cleanup()


async def finished_job(server: Server, frames: int = 4, seed: int = 0) -> dict[str, Any]:
    body = safetensors_bytes(latents=smooth_latents(frames=frames, seed=seed))
    async with server.client.post("/v1/videos", data=body) as response:
        assert response.status == 201, await response.text()
        job = await response.json()
    async with server.client.get(job["urls"]["content"]) as response:
        await response.read()  # until it is complete
    async with server.client.get(job["urls"]["self"]) as response:
        return await response.json()


async def whole(server: Server, job: dict[str, Any]) -> tuple[bytes, str]:
    async with server.client.get(job["urls"]["content"]) as response:
        assert response.status == 200, await response.text()
        return await response.read(), response.headers["ETag"]


async def status_of(server: Server, job: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    async with server.client.get(job["urls"]["self"]) as response:
        return response.status, await response.json()


async def test_a_restart_serves_the_same_bytes_etag_ranges_hls_and_events(tmp_path: Path):
    async with stored_server(tmp_path) as server:
        jobs = [await finished_job(server, seed=seed) for seed in range(2)]
        before = [await whole(server, job) for job in jobs]
        async with server.client.get(jobs[0]["urls"]["playlist"]) as response:
            playlist = await response.text()
        async with server.client.get(f"{jobs[0]['urls']['self']}/hls/part/1.m4s") as response:
            part = await response.read()
    async with stored_server(tmp_path) as server:
        for job, (data, etag) in zip(jobs, before, strict=True):
            status, again = await status_of(server, job)
            assert status == 200
            assert again["status"] == "completed"
            assert {k: again[k] for k in ("bytes", "frames", "chunks", "timings")} == {
                k: job[k] for k in ("bytes", "frames", "chunks", "timings")
            }
            restored, restored_etag = await whole(server, job)
            assert hashlib.sha256(restored).digest() == hashlib.sha256(data).digest()
            assert restored_etag == etag
            async with server.client.get(
                job["urls"]["content"], headers={"Range": "bytes=100-199"}
            ) as response:
                assert response.status == 206
                assert await response.read() == data[100:200]
            async with server.client.get(
                job["urls"]["content"], headers={"If-None-Match": etag}
            ) as response:
                assert response.status == 304
        assert len(decode_mp4(before[0][0])) == 13
        async with server.client.get(jobs[0]["urls"]["playlist"]) as response:
            assert await response.text() == playlist
        async with server.client.get(f"{jobs[0]['urls']['self']}/hls/part/1.m4s") as response:
            assert await response.read() == part
        # /events resumes from Last-Event-ID: the events after it, with their ids.
        async with server.client.get(
            jobs[0]["urls"]["events"], headers={"Last-Event-ID": "2"}
        ) as response:
            text = await response.text()
        ids = [int(line[4:]) for line in text.splitlines() if line.startswith("id: ")]
        assert ids[0] == 3 and "event: done" in text
        async with server.client.get(
            jobs[0]["urls"]["events"], headers={"Last-Event-ID": str(ids[-1])}
        ) as response:
            assert response.status == 204  # nothing after the last: EventSource stops


async def test_deleted_stays_deleted_across_a_restart(tmp_path: Path):
    async with stored_server(tmp_path) as server:
        job = await finished_job(server)
        async with server.client.delete(job["urls"]["self"]) as response:
            assert response.status == 200
    assert list((tmp_path / "videos").iterdir()) == []  # removed from the disk at once
    async with stored_server(tmp_path) as server:
        status, body = await status_of(server, job)
        assert status == 410
        assert "deleted by request" in body["error"]["message"]


async def test_retention_ends_in_the_store_too(tmp_path: Path):
    async with stored_server(tmp_path, retention_s=0.2) as server:
        job = await finished_job(server)
        await until(lambda: job["id"] not in server.manager.jobs, timeout_s=10)
        await server.manager.durable.store.flush()
        assert list((tmp_path / "videos").iterdir()) == []
    async with stored_server(tmp_path, retention_s=0.2) as server:
        status, body = await status_of(server, job)
        assert status == 410 and "after it ended" in body["error"]["message"]


async def test_a_video_past_the_memory_budget_is_served_from_its_file(tmp_path: Path):
    async with stored_server(tmp_path, retention_memory_bytes=1) as server:
        job = await finished_job(server)
        stored = server.manager.jobs[job["id"]]
        await until(lambda: stored.log.memory_bytes == 0)
        data, _ = await whole(server, job)
        assert len(data) == job["bytes"]
        assert len(decode_mp4(data)) == 13


async def test_a_full_store_evicts_the_oldest_finished_then_answers_507(tmp_path: Path):
    decoder = GatedDecoder(hold_at=1)
    decoder.gate.set()
    async with stored_server(tmp_path, decoder, store_max_bytes=1) as server:
        oldest = await finished_job(server, seed=1)
        newer = await finished_job(server, seed=2)  # made room: the oldest went
        status, body = await status_of(server, oldest)
        assert status == 410 and "make room in the store" in body["error"]["message"]
        assert (await status_of(server, newer))[0] == 200
        decoder.gate.clear()
        body_bytes = safetensors_bytes(latents=smooth_latents(frames=4, seed=3))
        async with server.client.post("/v1/videos", data=body_bytes) as response:
            running = await response.json()
        await until(decoder.holding.is_set)
        # The newer one goes for room; the running one cannot: 507.
        async with server.client.post("/v1/videos", data=body_bytes) as response:
            assert response.status == 507
            error = (await response.json())["error"]
            assert error["type"] == "insufficient_storage" and "--store-max-gb" in error["message"]
        assert (await status_of(server, newer))[0] == 410
        decoder.gate.set()
        async with server.client.get(running["urls"]["content"]) as response:
            await response.read()


async def test_a_corrupt_database_is_moved_aside_and_the_server_starts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    async with stored_server(tmp_path) as server:
        job = await finished_job(server)
    (tmp_path / "jobs.db").write_bytes(b"this is not a database" * 100)
    (tmp_path / "jobs.db-wal").unlink(missing_ok=True)
    with caplog.at_level(logging.INFO, logger="vaecast.store"):
        async with stored_server(tmp_path) as server:
            assert (await status_of(server, job))[0] == 404  # its record went aside
            assert (await finished_job(server, seed=5))["status"] == "completed"
            async with server.client.get("/metrics") as response:
                metrics = await response.text()
    moved = [r.getMessage() for r in caplog.records if "moved it to" in r.getMessage()]
    assert len(moved) == 1 and "could not be used" in moved[0]
    assert list(tmp_path.glob("jobs.db.corrupt-*"))
    # The video no record names any more was removed, and counted.
    assert 'vaecast_store_recovered_total{outcome="orphan_files"} 1.0' in metrics


async def test_a_completed_job_whose_file_was_cut_short_is_dropped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    async with stored_server(tmp_path) as server:
        cut, kept = await finished_job(server, seed=1), await finished_job(server, seed=2)
    path = tmp_path / "videos" / f"{cut['id']}.mp4"
    path.write_bytes(path.read_bytes()[:-100])
    with caplog.at_level(logging.INFO, logger="vaecast.store"):
        async with stored_server(tmp_path) as server:
            status, body = await status_of(server, cut)
            assert status == 410 and "lost" in body["error"]["message"]
            assert (await status_of(server, kept))[0] == 200
            async with server.client.get("/metrics") as response:
                metrics = await response.text()
    assert 'vaecast_store_recovered_total{outcome="dropped"} 1.0' in metrics
    assert 'vaecast_store_recovered_total{outcome="completed"} 1.0' in metrics
    assert any(
        "completed=1" in r.getMessage() and "dropped=1" in r.getMessage() for r in caplog.records
    )


async def test_a_failed_job_keeps_its_record_not_its_video(tmp_path: Path):
    decoder = GatedDecoder(hold_at=1)
    async with stored_server(tmp_path, decoder) as server:
        body = safetensors_bytes(latents=smooth_latents(frames=4))
        async with server.client.post("/v1/videos", data=body) as response:
            job = await response.json()
        await until(decoder.holding.is_set)
        held = server.manager.jobs[job["id"]]
        held.cancel("cancelled by request")  # as DELETE does; it stops at its next chunk
        decoder.gate.set()
        await held.wait()
        await server.manager.durable.store.flush()
    async with stored_server(tmp_path) as server:
        status, body = await status_of(server, job)
        assert status == 200 and body["status"] == "cancelled"
        assert body["error"]["type"] == "cancelled"
        async with server.client.get(job["urls"]["content"]) as response:
            assert response.status == 409
    assert list((tmp_path / "videos").iterdir()) == []


async def test_two_servers_on_one_store_serve_each_others_finished_videos(tmp_path: Path):
    async with stored_server(tmp_path) as first, stored_server(tmp_path) as second:
        job = await finished_job(first)
        data, etag = await whole(first, job)
        await first.manager.durable.store.flush()
        assert await whole(second, job) == (data, etag)
        async with second.client.delete(job["urls"]["self"]) as response:
            assert response.status == 200
        await second.manager.durable.store.flush()
        assert (await status_of(second, job))[0] == 410


async def test_a_job_with_a_preview_keeps_its_final_across_a_restart(tmp_path: Path):
    body = safetensors_bytes(latents=smooth_latents(frames=4))
    async with stored_server(tmp_path) as server:
        async with server.client.post("/v1/videos?preview=linear", data=body) as response:
            assert response.status == 201, await response.text()
            job = await response.json()
        await until(lambda: server.manager.jobs[job["id"]].finished)
        final, etag = await whole(server, job)
        assert list((tmp_path / "videos").iterdir()) == [tmp_path / "videos" / f"{job['id']}.mp4"]
    async with stored_server(tmp_path) as server:
        assert await whole(server, job) == (final, etag)
        _, again = await status_of(server, job)
        assert again["variants"]["preview"]["status"] == "completed"
        async with server.client.get(job["urls"]["content"], params={"variant": "preview"}) as r:
            assert r.status == 410
            assert "not kept across a restart" in (await r.json())["error"]["message"]
