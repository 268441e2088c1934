"""A webhook owed when the process dies: `vaecast serve` SIGKILLed after a job completed
and before its receiver took the `video.completed`, then started again on the same
store, delivers it (the same `webhook-id`, a valid signature)."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlencode

import pytest
from standardwebhooks import Webhook

from tests.helpers.store_process import job_of, killable_server, latents, request, wait_for
from tests.helpers.webhook_receiver import SECRET, receiving

pytestmark = pytest.mark.slow


def test_a_kill_between_completion_and_delivery_still_delivers(tmp_path: Path):
    store, log = tmp_path / "store", tmp_path / "server.log"
    options = ("--webhook-allow-private",)
    secret = {"VAECAST_WEBHOOK_SECRET": SECRET}  # as a deployment passes it: not in `ps`
    ends = {"status": 503}
    answer = lambda kind, tries: 200 if kind == "video.started" else ends["status"]  # noqa: E731
    with receiving(answer) as receiver:
        with killable_server(store, log, options=options, environment=secret) as (base, _):
            status, _, body = _post_with_webhook(base, receiver.url)
            assert status == 201, body
            job = json.loads(body)
            wait_for(lambda: job_of(base, job["id"])[1]["status"] == "completed")
            wait_for(lambda: len(receiver.of("video.completed")) >= 1)
            # SIGKILL on leaving the block: the end is owed (its receiver said 503).
        ends["status"] = 200
        tried_before = len(receiver.of("video.completed"))
        with killable_server(store, log, options=options, environment=secret) as (base, _):
            wait_for(lambda: len(receiver.of("video.completed")) == tried_before + 1)
            last = receiver.of("video.completed")[-1]
            assert last.status == 200
            assert last.headers["webhook-id"] == f"msg_{job['id']}_completed"
            end = Webhook(SECRET).verify(last.body, last.headers)
            assert (end["data"]["id"], end["data"]["status"]) == (job["id"], "completed")
            assert len(receiver.of("video.started")) == 1
    assert "owed from before the restart" in log.read_text()


def _post_with_webhook(base: str, url: str) -> tuple[int, dict[str, str], bytes]:
    query = urlencode({"webhook_url": url})
    return request(f"{base}/v1/videos?{query}", "POST", latents(3, 8, 0))
