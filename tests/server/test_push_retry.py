"""Pushes that are safe to retry: block indices (`X-Push-Seq`) over real HTTP, and the
client's retries through a proxy that drops the answer of a block the server took."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
import torch

from tests.helpers import decode_mp4, safetensors_bytes, smooth_latents, until
from tests.helpers.server import Server, StartServer
from vaecast.client import AsyncPushSession, PushError, PushSession, retry_delay
from vaecast.errors import PreconditionRequiredError
from vaecast.push_ledger import PushGapError, PushLedger, parse_seq


def test_the_ledger_replays_taken_blocks_and_refuses_gaps_and_missing_indices() -> None:
    ledger = PushLedger()
    assert ledger.replay(None) is None  # index-free until a block carries one
    assert ledger.taken(None, {"latent_frames": 1}) == {"latent_frames": 1}
    assert ledger.replay(1) is None  # the next index: a new block
    assert ledger.taken(1, {"latent_frames": 3}) == {"latent_frames": 3, "seq": 1}
    assert ledger.replay(1) == {"latent_frames": 3, "seq": 1}  # a retry: the same answer
    assert ledger.replay(0) == {"latent_frames": 1}
    with pytest.raises(PushGapError) as gap:
        ledger.replay(5)
    assert (gap.value.status, gap.value.fields()) == (409, {"expected_seq": 2})
    with pytest.raises(PreconditionRequiredError, match="send X-Push-Seq: 2 with the next"):
        ledger.replay(None)  # numbered now: an index-less block could be a retry


@pytest.mark.parametrize("text", ["-1", "1.0", " ", "x", "٣", "9" * 13, "1e3", "0x10"])
def test_a_block_index_is_a_plain_whole_number(text: str) -> None:
    with pytest.raises(Exception, match="X-Push-Seq must be a block index"):
        parse_seq(text)
    assert parse_seq(" 7 ") == 7
    assert parse_seq(None) is None


def test_the_client_retries_connection_errors_and_overload_within_its_budget() -> None:
    dropped = PushError(0, "connection_error", "reset")
    assert retry_delay(dropped, 1, 0.0, 60.0) == 0.1
    assert retry_delay(dropped, 4, 0.0, 60.0) == 0.8
    assert retry_delay(dropped, 9, 0.0, 60.0) == 2.0  # capped
    assert retry_delay(dropped, 2, 59.9, 60.0) is None  # past the budget
    assert retry_delay(PushError(429, "rate_limited", "", retry_after_s=3.0), 1, 0, 60) == 3.0
    assert retry_delay(PushError(503, "busy", ""), 1, 0, 60) == 0.1
    assert retry_delay(PushError(0, "timeout", "no answer"), 1, 0, 60) is None
    assert retry_delay(PushError(422, "invalid_request", "bad block"), 1, 0, 60) is None
    assert retry_delay(dropped, 1, 0.0, 0.0) is None  # retry_s=0: never


async def open_session(server: Server) -> tuple[str, dict[str, str], str]:
    async with server.client.post("/v1/videos", json={"input": "push"}) as response:
        job = await response.json()
    return job["id"], {"X-Push-Token": job["push"]["token"]}, job["push"]["url"]


async def push(
    server: Server, url: str, headers: dict[str, str], body: bytes, **extra: str
) -> tuple[int, dict[str, Any]]:
    async with server.client.post(url, data=body, headers={**headers, **extra}) as response:
        return response.status, await response.json()


async def test_a_repeated_index_is_acknowledged_again_and_adds_nothing(
    start_server: StartServer,
) -> None:
    server = await start_server()
    job_id, headers, url = await open_session(server)
    block = safetensors_bytes(latents=smooth_latents(frames=2)[0])
    first = await push(server, url, headers, block, **{"X-Push-Seq": "0"})
    assert first == (202, {"latent_frames": 2, "seq": 0, "frames_done": first[1]["frames_done"]})
    again = await push(server, url, headers, block, **{"X-Push-Seq": "0"})
    assert again[0] == 202
    assert again[1]["latent_frames"] == 2  # the same block, counted once
    assert server.manager.get(job_id).feed.latent_frames == 2
    # A gap: block 2 before block 1.
    status, answer = await push(server, url, headers, block, **{"X-Push-Seq": "2"})
    assert (status, answer["error"]["type"], answer["error"]["expected_seq"]) == (
        409,
        "push_sequence_gap",
        1,
    )
    # No index, once the session numbers its blocks.
    status, answer = await push(server, url, headers, block)
    assert (status, answer["error"]["type"]) == (428, "precondition_required")
    status, answer = await push(server, url, headers, block, **{"X-Push-Seq": "1e9"})
    assert status == 422
    # The final mark is a block too, and its retry is answered after the end.
    final = await push(server, url + "?final=1", headers, b"", **{"X-Push-Seq": "1"})
    assert final[0] == 202
    again = await push(server, url + "?final=1", headers, b"", **{"X-Push-Seq": "1"})
    assert again[0] == 202 and again[1]["seq"] == 1
    status, answer = await push(server, url, headers, block, **{"X-Push-Seq": "2"})
    assert (status, answer["error"]["message"]) == (409, f"video {job_id} has had its final block")
    async with server.client.get(f"/v1/videos/{job_id}/content") as response:
        assert len(decode_mp4(await response.read())) == 5


async def test_a_session_without_indices_stays_index_free(start_server: StartServer) -> None:
    server = await start_server()
    _, headers, url = await open_session(server)
    block = safetensors_bytes(latents=smooth_latents(frames=1)[0])
    for expected in (1, 2):
        status, answer = await push(server, url, headers, block)
        assert (status, answer["latent_frames"]) == (202, expected)
        assert "seq" not in answer


class AnswerDroppingProxy:
    """A TCP proxy to the server that, for the first `drops` pushes of a block, lets the
    request through, waits for the server's whole answer, then resets the producer's
    connection instead of passing the answer on: the block was taken, and the producer
    cannot know it."""

    def __init__(self, upstream_port: int, drops: int) -> None:
        self.upstream_port = upstream_port
        self.drops = drops
        self.dropped_answers: list[bytes] = []
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def close(self) -> None:
        assert self._server is not None
        self._server.close()
        for handler in self._handlers:
            handler.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        await self._server.wait_closed()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        handler = asyncio.current_task()
        assert handler is not None
        self._handlers.add(handler)
        handler.add_done_callback(self._handlers.discard)
        upstream_reader, upstream_writer = await asyncio.open_connection(
            "127.0.0.1", self.upstream_port
        )
        head = await reader.readuntil(b"\r\n\r\n")
        sabotage = b"/latents" in head.split(b"\r\n", 1)[0] and self.drops > 0
        sabotage = sabotage and b"content-length: 0\r\n" not in head.lower()
        if sabotage:
            self.drops -= 1
        upstream_writer.write(head)

        async def forward_request() -> None:
            with contextlib.suppress(ConnectionError):
                while data := await reader.read(65536):
                    upstream_writer.write(data)
                    await upstream_writer.drain()

        forwarding = asyncio.create_task(forward_request())
        try:
            if sabotage:
                answer = await upstream_reader.readuntil(b"}")  # the 202's JSON, whole
                self.dropped_answers.append(answer)
                writer.transport.abort()  # RST: the producer sees a reset connection
                return
            while data := await upstream_reader.read(65536):
                writer.write(data)
                await writer.drain()
        finally:
            forwarding.cancel()
            await asyncio.gather(forwarding, return_exceptions=True)
            upstream_writer.close()
            writer.close()


@contextlib.asynccontextmanager
async def proxy_to(server: Server, drops: int) -> AsyncIterator[tuple[str, AnswerDroppingProxy]]:
    proxy = AnswerDroppingProxy(int(server.url.rsplit(":", 1)[1]), drops)
    url = await proxy.start()
    try:
        yield url, proxy
    finally:
        await proxy.close()


def blocks() -> list[torch.Tensor]:
    latents = smooth_latents(frames=5)[0]
    return [latents[:, :2], latents[:, 2:3], latents[:, 3:]]


async def pushed_video(server: Server, url: str, sync: bool) -> tuple[bytes, dict[str, Any]]:
    if sync:

        def produce() -> str:
            with PushSession(url, retry_s=20) as session:
                for block in blocks():
                    session.push(block)
                return session.id

        job_id = await asyncio.to_thread(produce)
    else:
        async with AsyncPushSession(url, retry_s=20) as session:
            for block in blocks():
                await session.push(block)
            job_id = session.id
    # The finished file (which states its duration): fetched while the job still ran,
    # one of the two videos compared would be the live one.
    await until(lambda: server.manager.get(job_id).record.is_final)
    async with server.client.get(f"/v1/videos/{job_id}/content") as response:
        data = await response.read()
    async with server.client.get(f"/v1/videos/{job_id}") as response:
        return data, await response.json()


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
async def test_a_push_whose_answer_is_lost_is_retried_and_the_video_is_unchanged(
    start_server: StartServer, sync: bool
) -> None:
    server = await start_server()
    clean, clean_job = await pushed_video(server, server.url, sync)
    async with proxy_to(server, drops=2) as (url, proxy):
        faulty, faulty_job = await pushed_video(server, url, sync)
    assert len(proxy.dropped_answers) == 2  # two blocks were taken and their answers lost
    assert all(b" 202 " in answer.split(b"\r\n", 1)[0] for answer in proxy.dropped_answers)
    assert faulty_job["status"] == "completed"
    assert faulty_job["frames"] == clean_job["frames"] == 17
    assert faulty == clean  # not a frame more: each retry was a replay
