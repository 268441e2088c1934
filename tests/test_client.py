"""The push client (`vaecast.client`) and `vaecast push`, against a stub of the push API.

The stub implements the documented API (create, token check, 202, final, 409 after
final, DELETE) over real HTTP on 127.0.0.1 and records every request, so the tests
assert what the client sends. End-to-end tests against the real server live with it.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest
import torch
from aiohttp import web
from safetensors.torch import load as load_safetensors

from tests.helpers import safetensors_bytes, smooth_latents, until
from tests.helpers.server import serve_on_loopback
from vaecast.cli import main
from vaecast.cli.push_file import plan_blocks, video_frames
from vaecast.client import AsyncPushSession, PushError, PushSession, encode_block
from vaecast.errors import InvalidRequestError, VaecastError
from vaecast.latent_files import load_latents

T = TypeVar("T")


@dataclass
class Seen:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes


@dataclass
class Stub:
    """The push API as documented; `api_key`, `busy` and `hold` change its behaviour."""

    url: str = ""
    api_key: str | None = None
    busy: bool = False  # creation answers 429
    hold: asyncio.Event | None = None  # while unset, pushes wait (a full block queue)
    requests: list[Seen] = field(default_factory=list)
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    tokens: dict[str, str] = field(default_factory=dict)

    def pushes(self) -> list[Seen]:
        return [seen for seen in self.requests if seen.path.endswith("/latents")]

    @web.middleware
    async def middleware(self, request: web.Request, handler: Callable) -> web.StreamResponse:
        headers = dict(request.headers)
        seen = Seen(request.method, request.path, dict(request.query), headers, b"")
        self.requests.append(seen)
        seen.body = await request.read()
        if self.api_key is not None and headers.get("Authorization") != f"Bearer {self.api_key}":
            return error(401, "unauthorized", "send Authorization: Bearer KEY")
        return await handler(request)

    async def create(self, request: web.Request) -> web.Response:
        body = await request.json()
        if self.busy:
            return error(429, "server_busy", "every slot is taken", {"Retry-After": "3"})
        if body.get("input") != "push":
            return error(422, "invalid_request", "not a push request")
        video_id = f"video_{len(self.jobs)}"
        base = f"/v1/videos/{video_id}"
        self.jobs[video_id] = {
            "id": video_id,
            "status": "in_progress",
            "latent_frames": 0,
            "urls": {"self": base, "content": f"{base}/content", "events": f"{base}/events"},
        }
        self.tokens[video_id] = secrets.token_hex(8)
        push = {"url": f"{base}/latents", "token": self.tokens[video_id]}
        return web.json_response({**self.jobs[video_id], "push": push}, status=201)

    async def push(self, request: web.Request) -> web.Response:
        job = self.jobs[request.match_info["id"]]
        token = request.headers.get("X-Push-Token")
        if token is None:
            return error(401, "unauthorized", "no push token")
        if token != self.tokens[job["id"]]:
            return error(403, "forbidden", "wrong push token")
        if job["status"] != "in_progress":
            return error(409, "conflict", f"the job is {job['status']}")
        body = await request.read()
        if body:
            try:
                job["latent_frames"] += load_latents(body).latents.shape[2]
            except VaecastError as refused:
                return error(refused.status, refused.type, refused.message)
        if self.hold is not None:
            await self.hold.wait()
        if request.query.get("final") == "1":
            job["status"] = "completed"
        frames = video_frames(job["latent_frames"])
        return web.json_response(
            {"latent_frames": job["latent_frames"], "frames_done": frames}, status=202
        )

    async def delete(self, request: web.Request) -> web.Response:
        job = self.jobs[request.match_info["id"]]
        job["status"] = "cancelled"
        return web.json_response(job)

    async def get(self, request: web.Request) -> web.Response:
        return web.json_response(self.jobs[request.match_info["id"]])


def error(
    status: int, error_type: str, message: str, headers: dict[str, str] | None = None
) -> web.Response:
    body = {"error": {"type": error_type, "message": message}}
    return web.json_response(body, status=status, headers=headers)


@pytest.fixture
async def stub() -> AsyncIterator[Stub]:
    stub = Stub()
    app = web.Application(middlewares=[stub.middleware])
    app.router.add_post("/v1/videos", stub.create)
    app.router.add_post("/v1/videos/{id}/latents", stub.push)
    app.router.add_delete("/v1/videos/{id}", stub.delete)
    app.router.add_get("/v1/videos/{id}", stub.get)
    runner = web.AppRunner(app, shutdown_timeout=5)
    stub.url = await serve_on_loopback(app, runner)
    yield stub
    if stub.hold is not None:
        stub.hold.set()
    await runner.cleanup()


async def in_thread(function: Callable[[], T]) -> T:
    """The sync client in a thread, while the stub serves on the test's loop."""
    return await asyncio.to_thread(function)


def tensors(seen: Seen) -> dict[str, torch.Tensor]:
    return load_safetensors(seen.body)


async def test_a_session_creates_the_job_pushes_blocks_and_sends_final_on_exit(stub: Stub):
    stub.api_key = "key-1"
    first = torch.randn(16, 1, 6, 8)
    second = torch.randn(1, 16, 2, 6, 8).to(torch.float16)
    sound = np.linspace(-1, 1, 8000)  # float64: sent as float32

    def run() -> tuple[list[dict[str, Any]], PushSession]:
        with PushSession(
            stub.url, fps=16, model="tiny", api_key="key-1", audio_sample_rate=16000
        ) as session:
            answers = [session.push(first), session.push(second, audio=sound)]
        return answers, session

    answers, session = await in_thread(run)
    assert answers == [
        {"latent_frames": 1, "frames_done": 1},
        {"latent_frames": 3, "frames_done": 9},
    ]
    create, *pushes, final = stub.requests
    assert json.loads(create.body) == {
        "input": "push",
        "fps": 16,
        "model": "tiny",
        "audio_sample_rate": 16000,
    }
    assert all(seen.headers["Authorization"] == "Bearer key-1" for seen in stub.requests)
    token = stub.tokens[session.id]
    assert [(seen.method, seen.path, seen.headers["X-Push-Token"]) for seen in pushes] == [
        ("POST", f"/v1/videos/{session.id}/latents", token)
    ] * 2
    assert tensors(pushes[0]).keys() == {"latents"}
    assert torch.equal(tensors(pushes[0])["latents"], first)  # shape and dtype as given
    assert torch.equal(tensors(pushes[1])["latents"], second)
    audio = tensors(pushes[1])["audio"]
    assert audio.dtype == torch.float32 and torch.equal(audio, torch.from_numpy(sound).float())
    assert (final.method, final.path, final.query, final.body) == (
        "POST",
        f"/v1/videos/{session.id}/latents",
        {"final": "1"},
        b"",
    )
    assert final.headers["X-Push-Token"] == token
    assert stub.jobs[session.id]["status"] == "completed"
    base = f"{stub.url}/v1/videos/{session.id}"
    assert (session.watch_url, session.content_url, session.events_url) == (
        f"{base}/content",
        f"{base}/content",
        f"{base}/events",
    )
    assert session.page_url == f"{stub.url}/?video={session.id}"
    assert "push" not in session.job and token not in json.dumps(session.job)
    with pytest.raises(RuntimeError, match="closed"):
        session.push(first)


async def test_an_error_in_the_body_cancels_the_job_and_is_raised(stub: Stub):
    def run() -> PushSession:
        with PushSession(stub.url + "/", fps=Fraction(30000, 1001)) as session:
            session.push(np.zeros((4, 1, 2, 2), np.float32))
            raise ValueError("the generator broke")

    with pytest.raises(ValueError, match="the generator broke"):
        await in_thread(run)
    (video_id,) = stub.jobs
    assert [(seen.method, seen.path, seen.query) for seen in stub.requests] == [
        ("POST", "/v1/videos", {}),
        ("POST", f"/v1/videos/{video_id}/latents", {}),
        ("DELETE", f"/v1/videos/{video_id}", {}),
    ]
    assert json.loads(stub.requests[0].body)["fps"] == "30000/1001"
    assert stub.jobs[video_id]["status"] == "cancelled"


async def test_a_block_the_server_refuses_raises_its_error_and_cancels(stub: Stub):
    def run() -> None:
        with PushSession(stub.url) as session:
            session.push(torch.full((4, 1, 2, 2), float("nan")))

    with pytest.raises(PushError) as raised:
        await in_thread(run)
    assert (raised.value.status, raised.value.type) == (422, "invalid_request")
    assert "NaN" in raised.value.message and str(raised.value).startswith("HTTP 422 invalid_req")
    assert [seen.method for seen in stub.requests] == ["POST", "POST", "DELETE"]


async def test_a_push_after_final_is_a_conflict_and_nothing_is_cancelled(stub: Stub):
    def run() -> None:
        with PushSession(stub.url) as session:
            session.push(torch.zeros(4, 2, 2, 2), final=True)
            session.push(torch.zeros(4, 1, 2, 2))

    with pytest.raises(PushError) as raised:
        await in_thread(run)
    assert (raised.value.status, raised.value.type) == (409, "conflict")
    assert [(seen.method, seen.query) for seen in stub.requests] == [
        ("POST", {}),
        ("POST", {"final": "1"}),
        ("POST", {}),
    ]
    assert stub.jobs["video_0"]["status"] == "completed"


async def test_refusals_and_failures_are_push_errors(stub: Stub):
    stub.api_key = "right"
    with pytest.raises(PushError) as unauthorized:
        await in_thread(PushSession(stub.url, api_key="wrong").open)
    assert (unauthorized.value.status, unauthorized.value.type) == (401, "unauthorized")

    stub.api_key, stub.busy = None, True
    with pytest.raises(PushError) as busy:
        await in_thread(PushSession(stub.url).open)
    assert (busy.value.status, busy.value.type, busy.value.retry_after_s) == (429, "server_busy", 3)

    with pytest.raises(PushError) as not_vaecast:  # aiohttp's plain-text 404
        await in_thread(PushSession(stub.url + "/elsewhere").open)
    assert (not_vaecast.value.status, not_vaecast.value.type) == (404, "http_error")

    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        closed_port = unused.getsockname()[1]
    with pytest.raises(PushError) as refused:
        await in_thread(PushSession(f"http://127.0.0.1:{closed_port}").open)
    assert (refused.value.status, refused.value.type) == (0, "connection_error")
    assert not stub.jobs


async def test_a_push_waits_while_the_server_holds_it_up_to_the_timeout(stub: Stub):
    stub.hold = asyncio.Event()
    session = await in_thread(PushSession(stub.url, timeout=5).open)
    pushing = asyncio.ensure_future(in_thread(lambda: session.push(torch.zeros(4, 1, 2, 2))))
    await until(lambda: len(stub.pushes()) == 1)
    await asyncio.sleep(0.1)
    assert not pushing.done()  # backpressure reaches the generator
    stub.hold.set()
    assert (await pushing)["latent_frames"] == 1

    stub.hold.clear()
    session = await in_thread(PushSession(stub.url, timeout=0.2).open)
    with pytest.raises(PushError) as late:
        await in_thread(lambda: session.push(torch.zeros(4, 1, 2, 2)))
    assert (late.value.status, late.value.type) == (0, "timeout")
    stub.hold.set()


async def test_the_async_session_sends_the_same_requests(stub: Stub):
    block = torch.randn(16, 2, 6, 8, dtype=torch.bfloat16)
    async with AsyncPushSession(stub.url, fps=8, api_key="k", audio_channels=2) as session:
        assert session.watch_url == f"{stub.url}/v1/videos/{session.id}/content"
        answer = await session.push(block, audio=torch.zeros(2, 100))
        assert (await session.refresh())["latent_frames"] == 2
    assert answer == {"latent_frames": 2, "frames_done": 5}
    create, push, _refresh, final = stub.requests
    assert json.loads(create.body) == {"input": "push", "fps": 8, "audio_channels": 2}
    assert push.headers["Authorization"] == "Bearer k"
    assert push.headers["X-Push-Token"] == stub.tokens[session.id]
    assert torch.equal(tensors(push)["latents"], block)
    assert tensors(push)["audio"].shape == (2, 100)
    assert (final.query, final.body) == ({"final": "1"}, b"")

    with pytest.raises(KeyError):
        async with AsyncPushSession(stub.url) as cancelled:
            await cancelled.push(block)
            raise KeyError("boom")
    assert stub.requests[-1].method == "DELETE"
    assert stub.jobs[cancelled.id]["status"] == "cancelled"


def test_blocks_are_serialized_as_given_and_checked_cheaply():
    read_only = np.arange(24, dtype=np.float16).reshape(1, 2, 3, 2, 2)
    read_only.setflags(write=False)  # torch.from_numpy would warn on it
    assert torch.equal(
        load_safetensors(encode_block(read_only))["latents"], torch.from_numpy(read_only.copy())
    )
    for bad in (torch.zeros(2, 3, 4), torch.zeros(4, 1, 2, 2).int(), torch.zeros(0, 4, 1, 2, 2)):
        with pytest.raises(InvalidRequestError):
            encode_block(bad)
    # A batch's block (B, C, t, H, W) goes as it is: the server knows the session's B.
    batch = torch.zeros(2, 4, 1, 2, 2)
    assert torch.equal(load_safetensors(encode_block(batch))["latents"], batch)


def test_push_cuts_a_file_into_blocks_with_their_audio_and_pacing():
    blocks = plan_blocks(21, 4, latent_fps=4, fps=Fraction(16), audio_sample_rate=16000)
    starts = [0, 4, 8, 12, 16, 20]
    assert [(b.start, b.stop) for b in blocks] == [*zip(starts, [*starts[1:], 21], strict=True)]
    assert [b.generate_s for b in blocks] == [1.0] * 5 + [0.25]
    # 1 video frame for latent frame 0, 4 for each later one; 1000 samples a frame.
    assert [(b.audio_start, b.audio_stop) for b in blocks[:2]] == [(0, 13000), (13000, 29000)]
    assert blocks[-1].audio_stop == video_frames(21) * 1000 == 81000

    ntsc = plan_blocks(3, 1, latent_fps=0, fps=Fraction(30000, 1001), audio_sample_rate=48000)
    assert [b.generate_s for b in ntsc] == [0.0] * 3
    assert [b.audio_stop for b in ntsc] == [1601, 8008, 14414]  # floor(n * 48000 * 1001 / 30000)
    assert [b.audio_start for b in plan_blocks(2, 1, 1, Fraction(16))] == [0, 0]  # no audio
    with pytest.raises(InvalidRequestError, match="block-frames"):
        plan_blocks(3, 0, 1, Fraction(16))


async def test_vaecast_push_sends_the_file_in_paced_blocks_with_its_audio(
    stub: Stub, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    latents = smooth_latents(5)
    audio = torch.linspace(-1, 1, 17 * 2000).unsqueeze(0)  # 17 video frames at 8 fps, 16 kHz
    path = tmp_path / "z.safetensors"
    metadata = {"fps": "8", "audio_sample_rate": "16000", "model": "tiny"}
    path.write_bytes(safetensors_bytes(metadata=metadata, latents=latents, audio=audio))
    argv = ["push", str(path), "--url", stub.url, "--latent-fps", "500", "--block-frames", "2"]
    assert await in_thread(lambda: main(argv)) == 0

    (video_id,) = stub.jobs
    assert json.loads(stub.requests[0].body) == {
        "input": "push",
        "fps": 8,
        "model": "tiny",
        "audio_sample_rate": 16000,
        "audio_channels": 1,
    }
    *blocks, final = [tensors(seen) if seen.body else None for seen in stub.pushes()]
    assert final is None and stub.pushes()[-1].query == {"final": "1"}
    assert [block["latents"].shape[2] for block in blocks] == [2, 2, 1]
    assert torch.equal(torch.cat([block["latents"] for block in blocks], dim=2), latents)
    assert [block["audio"].shape[1] for block in blocks] == [10000, 16000, 8000]
    assert torch.equal(torch.cat([block["audio"] for block in blocks], dim=1), audio)
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == [
        f"watch: {stub.url}/v1/videos/{video_id}/content",
        f"page:  {stub.url}/?video={video_id}",
    ]
    assert lines[2] == "block 1/3: latent frame(s) 0-1 -> 2 received, 5 frames done"
    assert lines[4] == "block 3/3: latent frame(s) 4 -> 5 received, 17 frames done"
    assert lines[5] == "done: 5 latent frames in 3 blocks, final sent"


async def test_vaecast_push_reports_the_servers_refusal(
    stub: Stub, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    stub.api_key = "right"
    path = tmp_path / "z.safetensors"
    path.write_bytes(safetensors_bytes(latents=smooth_latents(1)))
    argv = ["push", str(path), "--url", stub.url, "--api-key", "wrong", "--latent-fps", "0"]
    assert await in_thread(lambda: main(argv)) == 2
    assert "vaecast: error: HTTP 401 unauthorized: send Authorization" in capsys.readouterr().err
