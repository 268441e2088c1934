"""The durable store in one process: a server stopped and started again on the same
`store_dir` serves what the first one finished, the same way; deletes, eviction,
a full store, a corrupt database, a lost file and two servers on one store."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import shutil
import sqlite3
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tests.helpers import GatedDecoder, decode_mp4, safetensors_bytes, smooth_latents, until
from tests.helpers.serve_process import vaecast_serve_process
from tests.helpers.server import TEST_CONFIG, Server, noisy_latents, serve_on_loopback
from vaecast.errors import StoreError
from vaecast.models.linear import LinearDecoder
from vaecast.server.app import create_app, runner_settings
from vaecast.server.stream.durable_jobs import GONE_SYNC_S
from vaecast.store.database import JobDatabase


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


async def until_async(predicate: Callable[[], Awaitable[bool]], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.1)


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


def videos_on_disk(store: Path) -> int:
    return sum(path.stat().st_size for path in (store / "videos").iterdir())


async def test_past_its_budget_the_store_evicts_the_oldest_then_streams_a_video_unkept(
    tmp_path: Path,
):
    """The budget is what the store's disk holds: the oldest finished video goes for
    room, and a video that still does not fit streams whole without being kept, says
    so in its job object, and is gone (410) after a restart. No job is refused."""
    async with stored_server(tmp_path / "measure") as server:
        small = max([(await finished_job(server, seed=seed))["bytes"] for seed in (1, 2)])
    budget = small * 3 // 2  # one small video fits, two do not
    store = tmp_path / "store"
    decoder = GatedDecoder(hold_at=2)
    decoder.gate.set()
    async with stored_server(store, decoder, store_max_bytes=budget) as server:
        oldest = await finished_job(server, seed=1)
        newer = await finished_job(server, seed=2)  # made room: the oldest went
        status, body = await status_of(server, oldest)
        assert status == 410 and "make room in the store" in body["error"]["message"]
        assert (await status_of(server, newer))[1]["not_stored"] is None
        assert videos_on_disk(store) <= budget
        # A video larger than the whole budget, watched live from its start.
        decoder.gate.clear()
        latents = noisy_latents(frames=6, height=12, width=16)
        async with server.client.post("/v1/videos", data=safetensors_bytes(latents=latents)) as r:
            assert r.status == 201, await r.text()
            large = await r.json()
        await until(decoder.holding.is_set)
        live = await server.client.get(large["urls"]["content"])
        decoder.gate.set()
        async with live:
            live_bytes = await live.read()
        status, large = await status_of(server, large)
        assert (status, large["status"]) == (200, "completed")
        assert large["bytes"] > budget
        assert "--store-max-gb" in large["not_stored"]
        assert "not kept across a restart" in large["not_stored"]
        assert (await status_of(server, newer))[0] == 410  # evicted for it first
        assert videos_on_disk(store) <= budget
        assert server.manager.durable is not None
        assert server.manager.durable.store.bytes_used <= budget
        finished, _ = await whole(server, large)
        frames = len(decode_mp4(finished))
        assert frames == 1 + 4 * 5  # linear: every frame of 6 latent frames
        assert len(decode_mp4(live_bytes)) == frames
        async with server.client.get("/metrics") as response:
            assert "vaecast_store_videos_not_stored_total 1.0" in await response.text()
    async with stored_server(store, store_max_bytes=budget) as server:
        status, body = await status_of(server, large)
        assert status == 410
        assert "not stored: the store's budget" in body["error"]["message"]
        assert videos_on_disk(store) == 0


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
        # As DELETE ?keep=false does (a kept partial: tests/server/test_partial.py).
        held.cancel("cancelled by request", keep_partial=False)
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
        assert (await status_of(second, job))[0] == 410
        # The first, which made it and holds it, stops serving it within the sync bound.

        async def gone_at_first() -> bool:
            return (await status_of(first, job))[0] == 410

        await until_async(gone_at_first, timeout_s=10 * GONE_SYNC_S)
        _, body = await status_of(first, job)
        assert "deleted by request" in body["error"]["message"]
        async with first.client.get(job["urls"]["content"]) as response:
            assert response.status == 410


async def test_a_job_with_a_preview_keeps_its_final_across_a_restart(tmp_path: Path):
    body = safetensors_bytes(latents=smooth_latents(frames=4))
    async with stored_server(tmp_path) as server:
        async with server.client.post("/v1/videos?preview=linear", data=body) as response:
            assert response.status == 201, await response.text()
            job = await response.json()
        await until(lambda: server.manager.jobs[job["id"]].record.is_final)
        final, etag = await whole(server, job)
        assert list((tmp_path / "videos").iterdir()) == [tmp_path / "videos" / f"{job['id']}.mp4"]
    async with stored_server(tmp_path) as server:
        assert await whole(server, job) == (final, etag)
        _, again = await status_of(server, job)
        assert again["variants"]["preview"]["status"] == "completed"
        for variant in ("preview", "live"):
            params = {"variant": variant}
            async with server.client.get(job["urls"]["content"], params=params) as r:
                assert r.status == 410
                assert "not kept across a restart" in (await r.json())["error"]["message"]
        assert again["variants"]["live"]["status"] == "completed"
        assert len(again["variants"]["live"]["sources"]) == again["chunks"]["done"]


# Each kind of damage a job row may have: what the `jobs` row's columns are set to.
BAD_ROWS: dict[str, dict[str, Any]] = {
    "not JSON": {"snapshot": "{not json"},
    "an empty object": {"snapshot": "{}"},
    "a list": {"snapshot": "[1, 2, 3]"},
    "a record lacking its counts": {"snapshot": None},  # filled in below
    "an absolute file": {"file": None},  # a path outside the store, below
    "a file up the tree": {"file": "../outside.mp4"},
}


async def test_a_store_with_unreadable_rows_starts_quarantines_them_and_touches_nothing_outside(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    store = tmp_path / "store"
    jobs: dict[str, dict[str, Any]] = {}
    async with stored_server(store) as server:
        good = await finished_job(server, seed=99)
        for seed, damage in enumerate(BAD_ROWS):
            jobs[damage] = await finished_job(server, seed=seed)
    outside = tmp_path / "outside.mp4"
    outside.write_bytes(b"not the store's" * 100)
    absolute = tmp_path / "absolute.mp4"
    absolute.write_bytes(b"not the store's either" * 100)
    with sqlite3.connect(store / "jobs.db") as db:
        for damage, changes in BAD_ROWS.items():
            job_id = jobs[damage]["id"]
            if damage == "a record lacking its counts":
                (text,) = db.execute("SELECT snapshot FROM jobs WHERE id = ?", (job_id,)).fetchone()
                record = json.loads(text)
                del record["counts"]
                changes = {"snapshot": json.dumps(record)}
            if damage == "an absolute file":
                changes = {"file": str(absolute)}
            for column, value in changes.items():
                db.execute(f"UPDATE jobs SET {column} = ? WHERE id = ?", (value, job_id))
    with caplog.at_level(logging.WARNING, logger="vaecast.store"):
        async with stored_server(store) as server:
            assert (await status_of(server, good))[0] == 200
            for damage, job in jobs.items():
                assert (await status_of(server, job))[0] == 404, damage
            async with server.client.get("/metrics") as response:
                metrics = await response.text()
            assert (await finished_job(server, seed=100))["status"] == "completed"
    assert f'vaecast_store_recovered_total{{outcome="quarantined"}} {len(BAD_ROWS)}.0' in metrics
    warnings = [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and "cannot be read" in r.getMessage()
    ]
    assert len(warnings) == len(BAD_ROWS), warnings
    for job in jobs.values():
        assert sum(job["id"] in line for line in warnings) == 1, (job["id"], warnings)
    with sqlite3.connect(store / "jobs.db") as db:
        kept = dict(db.execute("SELECT id, reason FROM quarantine").fetchall())
    assert set(kept) == {job["id"] for job in jobs.values()}
    assert "outside the store" in kept[jobs["an absolute file"]["id"]]
    assert "outside the store" in kept[jobs["a file up the tree"]["id"]]
    assert "lacks 'counts'" in kept[jobs["a record lacking its counts"]["id"]]
    assert "not JSON" in kept[jobs["not JSON"]["id"]]
    # Nothing outside the store was opened, cut or removed.
    assert outside.read_bytes() == b"not the store's" * 100
    assert absolute.read_bytes() == b"not the store's either" * 100


async def test_a_store_that_cannot_write_says_so_refuses_new_jobs_and_recovers_by_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    broken = threading.Event()
    real_transaction = JobDatabase.transaction

    @contextlib.contextmanager
    def transaction(self: JobDatabase) -> Iterator[None]:
        with real_transaction(self):
            yield
            if broken.is_set():  # as a full disk or a failing device answers a commit
                raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(JobDatabase, "transaction", transaction)
    async with stored_server(tmp_path) as server:
        kept = await finished_job(server, seed=1)
        deleted = await finished_job(server, seed=2)
        broken.set()
        # Nothing is answered as saved that was not: not a delete, not a new job.
        async with server.client.delete(deleted["urls"]["self"]) as response:
            assert response.status == 503, await response.text()
            assert (await response.json())["error"]["type"] == "store_unavailable"
        async with server.client.get("/healthz") as response:
            health = await response.json()
            assert response.status == 503
        assert (health["status"], health["ready"], health["store"]) == ("failing", False, "failing")
        assert "disk I/O error" in health["store_error"]
        body = safetensors_bytes(latents=smooth_latents(frames=3, seed=3))
        async with server.client.post("/v1/videos", data=body) as response:
            assert response.status == 503
            error = (await response.json())["error"]
            assert error["type"] == "store_unavailable" and "disk I/O error" in error["message"]
        # The disk comes back: the writes held are committed, and the store says so.
        broken.clear()

        async def healthy() -> bool:
            async with server.client.get("/healthz") as response:
                return response.status == 200 and (await response.json())["store"] == "ok"

        await until_async(healthy)
        assert (await status_of(server, deleted))[0] == 410  # the delete held, now on disk
        fresh = await finished_job(server, seed=4)
    async with stored_server(tmp_path) as server:
        assert (await status_of(server, kept))[0] == 200
        assert (await status_of(server, fresh))[0] == 200
        assert (await status_of(server, deleted))[0] == 410


@pytest.mark.skipif(shutil.which("chattr") is None or os.geteuid() != 0, reason="chattr as root")
async def test_a_store_file_that_cannot_be_written_is_refused_at_start(tmp_path: Path):
    """SQLite maps jobs.db-shm: one it cannot write used to end the server with SIGBUS
    (exit 135, no log line) at its first write."""
    async with stored_server(tmp_path) as server:
        await finished_job(server)
    shm = tmp_path / "jobs.db-shm"
    shm.write_bytes(b"\0" * 32768)
    made = await asyncio.to_thread(
        subprocess.run, ["chattr", "+i", str(shm)], capture_output=True, text=True
    )
    if made.returncode != 0:
        pytest.skip(f"this filesystem keeps no immutable flag: {made.stderr.strip()}")
    try:
        with pytest.raises(StoreError) as refused:
            async with stored_server(tmp_path):
                pass
        assert str(shm) in refused.value.message and "cannot be written" in refused.value.message
    finally:
        await asyncio.to_thread(subprocess.run, ["chattr", "-i", str(shm)], check=True)


def _chattr(flag: str, paths: list[Path]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["chattr", flag, *map(str, paths)], capture_output=True, text=True)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("chattr") is None or os.geteuid() != 0, reason="chattr as root")
async def test_a_store_made_immutable_under_a_running_server_fails_then_recovers(tmp_path: Path):
    """`chattr +i` on the database under a real `vaecast serve`: the process lives (WAL's
    mapped -shm made that a SIGBUS, exit 135, at the next write), new jobs get 503
    `store_unavailable` and /healthz says failing; `chattr -i`, and it recovers."""
    store = tmp_path / "store"
    arguments = ["--model", "linear", "--store", str(store), "--shutdown-grace", "1"]
    body = safetensors_bytes(latents=smooth_latents(frames=3))
    with vaecast_serve_process(arguments, tmp_path / "serve.log") as (url, process):
        async with aiohttp.ClientSession(url, timeout=aiohttp.ClientTimeout(total=60)) as client:
            async with client.post("/v1/videos", data=body) as response:
                assert response.status == 201, await response.text()
            files = [path for path in store.iterdir() if path.name.startswith("jobs.db")]
            assert not [path for path in files if path.name.endswith(("-shm", "-wal"))]
            made = await asyncio.to_thread(_chattr, "+i", files)
            if made.returncode != 0:
                pytest.skip(f"this filesystem keeps no immutable flag: {made.stderr.strip()}")
            try:
                async with client.post("/v1/videos", data=body) as response:
                    assert response.status == 503, await response.text()
                    assert (await response.json())["error"]["type"] == "store_unavailable"
                async with client.get("/healthz") as response:
                    assert response.status == 503
                    assert (await response.json())["store"] == "failing"
                assert process.poll() is None
            finally:
                await asyncio.to_thread(_chattr, "-i", files)

            async def healthy() -> bool:
                async with client.get("/healthz") as response:
                    return response.status == 200

            await until_async(healthy)
            async with client.post("/v1/videos", data=body) as response:
                assert response.status == 201, await response.text()
        process.terminate()
        assert await asyncio.to_thread(process.wait, 30) == 0
