"""Fair admission over real HTTP: slow clients hold pending places for a bounded time,
and one client holds at most its share of them.

Nine uploads trickling at 1 byte/s, or nine push sessions with no block, once held
every place (1 decode slot + 8 queued) and every other POST got 429. Then 17 trickles
from one address held every pending place, and empty push sessions, fed later, took
the queue to 15 jobs against a limit of 8. Here a body under the minimum rate is
refused (408) after its grace, a session with no block fails after its first-block
timeout, one address holds at most `max_pending_per_client` pending places, and a push
session holds its queue place from the start. Clients on 127.0.0.2 and up are other
addresses of the loopback.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

import aiohttp

from tests.helpers import safetensors_bytes, smooth_latents, until
from tests.helpers.server import Server, StartServer

BODY = safetensors_bytes(latents=smooth_latents(frames=2))
SLOW_CLIENTS = 9
# Short, so the tests take seconds: a trickle is refused this long after its body began.
GRACE_S = 1.5
# Room for the slow clients and one more request.
MAX_PENDING = SLOW_CLIENTS + 1


async def read_answer(reader: asyncio.StreamReader) -> tuple[int, dict]:
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    return int(head.split(b" ")[1]), json.loads(await reader.readexactly(length))


async def trickle(
    server: Server, body: bytes = BODY, source: str = "127.0.0.1"
) -> tuple[int, dict]:
    """POST `body` to /v1/videos one byte a second over a raw socket from the address
    `source`; the answer."""
    host, port = server.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port), local_addr=(source, 0))
    head = f"POST /v1/videos HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(body)}\r\n\r\n"
    writer.write(head.encode() + body[:1])
    answer = asyncio.ensure_future(read_answer(reader))
    try:
        for position in range(1, min(len(body), 30)):  # bounded: refused long before
            done, _ = await asyncio.wait({answer}, timeout=1.0)
            if done:
                break
            with contextlib.suppress(ConnectionError):
                writer.write(body[position : position + 1])
                await writer.drain()
        return await asyncio.wait_for(answer, 10)
    finally:
        answer.cancel()
        writer.close()


@contextlib.asynccontextmanager
async def client_at(server: Server, source: str) -> AsyncIterator[aiohttp.ClientSession]:
    """A client of `server` whose connections come from the address `source`."""
    connector = aiohttp.TCPConnector(local_addr=(source, 0))
    async with aiohttp.ClientSession(
        server.url, connector=connector, timeout=aiohttp.ClientTimeout(total=60)
    ) as client:
        yield client


async def places(server: Server) -> dict:
    async with server.client.get("/healthz") as response:
        return (await response.json())["places"]


async def timed_upload(server: Server) -> tuple[int, float]:
    loop = asyncio.get_running_loop()
    started = loop.time()
    async with server.client.post("/v1/videos", data=BODY) as response:
        return response.status, loop.time() - started


async def test_trickling_uploads_leave_the_queue_to_others_and_end_with_408(
    start_server: StartServer,
):
    server = await start_server(
        max_pending=MAX_PENDING, max_pending_per_client=MAX_PENDING, body_rate_grace_s=GRACE_S
    )
    trickles = [asyncio.create_task(trickle(server)) for _ in range(SLOW_CLIENTS)]
    await until(lambda: server.manager.places.counts()["receiving"] == SLOW_CLIENTS, 10)
    assert await places(server) == {
        "receiving": SLOW_CLIENTS,
        "push_waiting": 0,
        "queued": 0,
        "decoding": 0,
        "max_pending": MAX_PENDING,
        "max_pending_per_client": MAX_PENDING,
    }
    async with server.client.get("/metrics") as response:
        assert f'vaecast_places{{kind="receiving"}} {SLOW_CLIENTS}.0' in await response.text()
    status, seconds = await timed_upload(server)
    assert status == 201
    assert seconds < 1.0
    answers = await asyncio.wait_for(asyncio.gather(*trickles), 30)
    for status, body in answers:
        assert status == 408
        assert body["error"]["type"] == "request_timeout"
        assert body["error"]["message"].endswith(
            "this server needs at least 65536 bytes/s after the first 1.5 s"
        )
    assert len(server.manager.jobs) == 1  # the normal upload's
    await until(lambda: server.manager.places.counts()["receiving"] == 0, 10)


async def test_past_max_pending_a_request_gets_429_until_a_slow_body_is_refused(
    start_server: StartServer,
):
    server = await start_server(max_pending=2, body_rate_grace_s=GRACE_S)
    trickles = [asyncio.create_task(trickle(server)) for _ in range(2)]
    await until(lambda: server.manager.places.counts()["receiving"] == 2, 10)
    async with server.client.post("/v1/videos", data=BODY) as response:
        assert response.status == 429
        assert int(response.headers["Retry-After"]) == 2  # the grace, rounded up
        assert (await response.json())["error"] == {
            "type": "server_busy",
            "message": "this server holds at most 2 pending requests and has 2 whose body is "
            "arriving and 0 push session(s) with no block yet; try again later",
        }
    assert [status for status, _ in await asyncio.wait_for(asyncio.gather(*trickles), 30)] == [
        408,
        408,
    ]
    status, _ = await timed_upload(server)
    assert status == 201
    async with server.client.get("/metrics") as response:
        assert 'vaecast_jobs_rejected_total{reason="pending"} 1.0' in await response.text()


async def test_seventeen_slow_uploads_from_one_address_leave_room_for_another(
    start_server: StartServer,
):
    """One address holds its share of the pending places (8 of 16 by default) and is
    refused past it at once; another address's upload gets its 201 meanwhile."""
    server = await start_server(body_rate_grace_s=600)  # they stay until the test ends
    share = server.manager.config.max_pending_per_client
    assert (share, server.manager.config.max_pending) == (8, 16)  # the defaults
    trickles = [asyncio.create_task(trickle(server, source="127.0.0.2")) for _ in range(17)]
    try:
        await until(lambda: sum(task.done() for task in trickles) == 17 - share, 30)
        for task in trickles:
            if task.done():
                status, body = task.result()
                assert status == 429
                assert body["error"] == {
                    "type": "server_busy",
                    "message": "one client may hold 8 pending requests (bodies still "
                    "arriving, push sessions with no block yet) (--max-pending-per-client), "
                    "and 127.0.0.2 holds them all; try again later",
                }
        await until(lambda: server.manager.places.counts()["receiving"] == share, 30)
        async with (
            client_at(server, "127.0.0.3") as other,
            other.post("/v1/videos", data=BODY) as response,
        ):
            assert response.status == 201, await response.text()
        # Still held when the other client got in: the share, not a timeout, let it.
        assert server.manager.places.counts()["receiving"] == share
        async with server.client.get("/metrics") as response:
            assert 'vaecast_jobs_rejected_total{reason="client"} 9.0' in await response.text()
    finally:
        for task in trickles:
            task.cancel()
        await asyncio.gather(*trickles, return_exceptions=True)
    await until(lambda: server.manager.places.counts()["receiving"] == 0, 30)


async def test_empty_push_sessions_hold_their_queue_place_and_one_client_its_share(
    start_server: StartServer,
):
    """Push sessions with no block take queue places from the start, so fed later they
    never take the queue past --max-queued; one address opens at most its share."""
    server = await start_server()  # 1 decode slot, 8 queued, 16 pending, 8 a client
    async with client_at(server, "127.0.0.2") as pusher:
        answers = []
        for _ in range(9):
            async with pusher.post("/v1/videos", json={"input": "push"}) as response:
                answers.append((response.status, await response.json()))
        sessions = [body for status, body in answers if status == 201]
        assert len(sessions) == 8
        status, refusal = answers[-1]
        assert status == 429
        assert refusal["error"]["message"].endswith("and 127.0.0.2 holds them all; try again later")
    assert await places(server) == {
        "receiving": 0,
        "push_waiting": 8,
        "queued": 0,
        "decoding": 0,
        "max_pending": 16,
        "max_pending_per_client": 8,
    }
    async with client_at(server, "127.0.0.3") as other:  # the ninth decode place
        async with other.post("/v1/videos", data=BODY) as response:
            assert response.status == 201, await response.text()
        async with other.post("/v1/videos", json={"input": "push"}) as response:
            assert response.status == 429  # every decode place is held: 1 + 8
            assert (await response.json())["error"]["message"].startswith(
                "all 1 decode slot(s) are busy and "
            )
    depths = []
    for session in sessions:  # each first block moves a session into the queue
        token = {"X-Push-Token": session["push"]["token"]}
        block = safetensors_bytes(latents=smooth_latents(frames=1))
        async with server.client.post(session["push"]["url"], data=block, headers=token) as r:
            assert r.status == 202, await r.text()
        async with server.client.get("/healthz") as response:
            depths.append((await response.json())["queue"]["depth"])
    assert max(depths) <= 8  # --max-queued
    counts = server.manager.places.counts()
    assert counts["push_waiting"] == 0
    assert counts["queued"] + counts["decoding"] <= 9


async def test_a_push_session_with_no_first_block_fails_and_frees_its_place(
    start_server: StartServer,
):
    server = await start_server(push_first_block_timeout_s=0.5, push_idle_timeout_s=60)
    async with server.client.post("/v1/videos", json={"input": "push"}) as response:
        session = await response.json()
    job = server.manager.get(session["id"])
    assert (await places(server))["push_waiting"] == 1
    await asyncio.wait_for(job.wait(), 10)
    async with server.client.get(session["urls"]["self"]) as response:
        answer = await response.json()
    assert answer["status"] == "failed"
    assert answer["error"] == {
        "type": "push_timeout",
        "message": "the push session received no block within 0.5 s",
    }
    assert (await places(server))["push_waiting"] == 0


async def test_viewers_of_a_session_that_timed_out_before_its_first_block_see_its_error(
    start_server: StartServer,
):
    """The producer timed out, not the viewers: they get the failed job's 409 (as for
    any failed job's content), or an event stream that ends with its error; never 408."""
    server = await start_server(push_first_block_timeout_s=0.5)
    async with server.client.post("/v1/videos", json={"input": "push"}) as response:
        session = await response.json()
    job = server.manager.get(session["id"])
    base = session["urls"]["self"]
    waiting = {
        path: asyncio.ensure_future(server.client.get(path))
        for path in (session["urls"]["content"], f"{base}/hls/init.mp4", f"{base}/hls/part/0.m4s")
    }
    events = await server.client.get(session["urls"]["events"])
    await asyncio.wait_for(job.wait(), 10)
    expected = {
        "type": "conflict",
        "message": f"video {job.id} has no content: failed: "
        "the push session received no block within 0.5 s",
    }
    for path, request in waiting.items():
        async with await asyncio.wait_for(request, 10) as response:
            assert (response.status, (await response.json())["error"]) == (409, expected), path
    async with events:
        assert events.status == 200
        text = await asyncio.wait_for(events.text(), 10)
    last = json.loads(text.strip().rsplit("data: ", 1)[1])
    assert (last["event"], last["error"]["type"]) == ("error", "push_timeout")
    async with server.client.get(f"{base}/playlist.m3u8?_HLS_msn=0") as response:
        assert (response.status, (await response.json())["error"]) == (409, expected)
