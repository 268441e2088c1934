"""An answer is a promise: `vaecast serve --store DIR` SIGKILLed the instant after it
answered, then started again on the same store, keeps what the answer said.

Each test kills the server 20 times, each time right after one answer; each start
that follows checks every answer given so far. A SIGKILL loses nothing the kernel
already has, so what these catch is an answer sent before its write was even made
(the store's writer thread had not committed it yet).
"""

from __future__ import annotations

import hashlib
import signal
from pathlib import Path

import pytest

from tests.helpers.mp4_duration import as_streamed
from tests.helpers.store_process import create, job_of, killable_server, request, wait_for

# 21 starts of `vaecast serve` a test: about 90 s on 2 idle cores, minutes on busy ones.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

KILLS = 20
# `linear`: the cheapest start and decode (no demo warm-up): what is tested is the store.
MODEL = "linear"


def test_a_delete_answered_stays_deleted_through_a_sigkill_at_once(tmp_path: Path):
    store, log = tmp_path / "store", tmp_path / "server.log"
    deleted: list[str] = []
    for attempt in range(KILLS + 1):
        with killable_server(store, log, MODEL) as (base, process):
            for job_id in deleted:
                status, body = job_of(base, job_id)
                assert status == 410, (deleted.index(job_id), body)
            if attempt == KILLS:
                break
            job = create(base, 2, 8, attempt)
            wait_for(lambda job=job: job_of(base, job["id"])[1]["status"] == "completed")
            status, _, body = request(f"{base}/v1/videos/{job['id']}", "DELETE")
            process.send_signal(signal.SIGKILL)  # the instant the answer is in
            assert status == 200, body
            deleted.append(job["id"])


def test_a_completion_a_client_saw_stays_completed_through_a_sigkill_at_once(tmp_path: Path):
    store, log = tmp_path / "store", tmp_path / "server.log"
    seen: dict[str, str] = {}  # job id: the sha256 of the MP4 the client got
    for attempt in range(KILLS + 1):
        with killable_server(store, log, MODEL) as (base, process):
            for number, (job_id, digest) in enumerate(seen.items()):
                status, job = job_of(base, job_id)
                assert (status, job["status"]) == (200, "completed"), (number, job)
                status, _, data = request(f"{base}/v1/videos/{job_id}/content")
                assert status == 200
                assert hashlib.sha256(data).hexdigest() == digest
            if attempt == KILLS:
                break
            job = create(base, 3, 8, attempt)
            content = f"{base}/v1/videos/{job['id']}/content"
            # The client follows the MP4 live to its end, asks (completed), and fetches
            # the finished file, which states its duration (the one change from live).
            status, _, live = request(content)
            state = job_of(base, job["id"])[1]
            finished_status, _, finished = request(content)
            process.send_signal(signal.SIGKILL)  # the instant the answer is in
            assert status == finished_status == 200 and state["status"] == "completed", state
            # (A job done before the first request began sends the finished file at once.)
            assert live in (as_streamed(finished), finished)
            seen[job["id"]] = hashlib.sha256(finished).hexdigest()
