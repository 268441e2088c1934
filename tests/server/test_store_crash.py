"""Crashes with real processes: `vaecast serve --model tiny --store DIR`, SIGKILLed
mid-decode and started again on the same store."""

from __future__ import annotations

import hashlib
import io
import json
import random
import time
from pathlib import Path

import av
import pytest

from tests.helpers.store_process import (
    create,
    job_of,
    killable_server,
    latents,
    request,
    wait_for,
)

pytestmark = pytest.mark.slow


def decoded_frames(data: bytes) -> int:
    with av.open(io.BytesIO(data)) as container:
        return sum(1 for _ in container.decode(video=0))


def test_sigkill_mid_decode_keeps_finished_videos_and_interrupts_the_running_one(tmp_path: Path):
    store, log = tmp_path / "store", tmp_path / "server.log"
    with killable_server(store, log) as (base, _):
        finished = [create(base, 3, 8, seed) for seed in range(2)]
        for job in finished:
            wait_for(lambda job=job: job_of(base, job["id"])[1]["status"] == "completed")
        before = {job["id"]: request(f"{base}{job['urls']['content']}") for job in finished}
        running = create(base, 200, 32, 7)  # hundreds of 256x256 frames: seconds of decode
        status, _, body = request(
            f"{base}/v1/videos", "POST", json.dumps({"input": "push", "fps": 16}).encode(),
            {"Content-Type": "application/json"},
        )  # fmt: skip
        assert status == 201, body
        push = json.loads(body)["push"]
        pushed = request(
            f"{base}{push['url']}", "POST", latents(1, 8, 9),
            {"X-Push-Token": push["token"], "X-Push-Seq": "0"},
        )  # fmt: skip
        assert pushed[0] == 202, pushed
        wait_for(lambda: job_of(base, running["id"])[1]["chunks"]["done"] >= 3)
        assert job_of(base, running["id"])[1]["status"] == "in_progress"
        # SIGKILL on leaving the block.
    with killable_server(store, log) as (base, _):
        for job_id, (status, headers, data) in before.items():
            again_status, again_headers, again = request(f"{base}/v1/videos/{job_id}/content")
            assert again_status == status == 200
            assert hashlib.sha256(again).hexdigest() == hashlib.sha256(data).hexdigest()
            assert again_headers["ETag"] == headers["ETag"]
            ranged = request(f"{base}/v1/videos/{job_id}/content", headers={"Range": "bytes=10-99"})
            assert ranged[0] == 206 and ranged[2] == data[10:100]
        status, job = job_of(base, running["id"])
        assert status == 200
        assert job["status"] == "failed" and job["error"]["type"] == "interrupted"
        status, _, partial = request(f"{base}{running['urls']['content']}")
        assert status == 200
        # The partial MP4 decodes to its last committed frame, no further.
        assert decoded_frames(partial) >= job["frames_done"] > 0
        status, _, playlist = request(f"{base}{running['urls']['playlist']}")
        assert status == 200 and b"#EXT-X-ENDLIST" in playlist
        # The open push session was failed the same way: its producer hears why.
        status, _, body = request(
            f"{base}{push['url']}", "POST", latents(1, 8, 10),
            {"X-Push-Token": push["token"], "X-Push-Seq": "1"},
        )  # fmt: skip
        assert status == 409 and json.loads(body)["error"]["type"] == "interrupted"
        _, _, events = request(f"{base}{running['urls']['events']}", headers={"Last-Event-ID": "0"})
        assert b'"type": "interrupted"' in events
    assert "interrupted=2" in log.read_text()  # the decode and the push session


def test_sigkill_at_random_moments_never_leaves_a_short_completed_file(tmp_path: Path):
    store, log = tmp_path / "store", tmp_path / "server.log"
    rng = random.Random(1234)
    made: list[str] = []
    while len(made) < 50:
        with killable_server(store, log) as (base, _):
            # What the last start recovered: every completed job is whole.
            for job_id in made:
                status, job = job_of(base, job_id)
                if status == 200 and job["status"] == "completed":
                    code, _, data = request(f"{base}/v1/videos/{job_id}/content")
                    assert code == 200 and len(data) == job["bytes"]
                    assert decoded_frames(data) == job["frames"]
            # A few jobs, then a kill at a random moment after them.
            quota, deadline = len(made) + rng.randint(3, 10), time.monotonic() + 10
            while len(made) < min(quota, 50) and time.monotonic() < deadline:
                body = latents(rng.randint(2, 12), 8, len(made))
                status, _, answer = request(f"{base}/v1/videos", "POST", body)
                if status == 429:  # the queue is full: let it drain a little
                    time.sleep(0.05)
                    continue
                assert status == 201, answer
                made.append(json.loads(answer)["id"])
            time.sleep(rng.uniform(0.0, 0.3))
        # SIGKILL, wherever the jobs were.
    with killable_server(store, log) as (base, _):
        completed = 0
        for job_id in made:
            status, job = job_of(base, job_id)
            assert status == 200, job
            assert job["status"] in ("completed", "failed")
            if job["status"] == "completed":
                completed += 1
                code, _, data = request(f"{base}/v1/videos/{job_id}/content")
                assert code == 200 and len(data) == job["bytes"]
            else:
                assert job["error"]["type"] == "interrupted"
        assert completed > 0
