"""Clients that leave at random points, mixed with DELETEs of running and finished
jobs; afterwards every job they started must have ended, with a recorded state."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable

import aiohttp

from chaos import files, wire
from chaos.client import FINAL, Client
from chaos.faults import SLOW_MODEL
from chaos.results import Category, Finding

READ_TIMEOUT_S = 10.0
VIEWER_TIMEOUT_S = 20.0
SETTLE_TIMEOUT_S = 60.0


class Ctx:
    """What the actions share: the client, the upload they send, the jobs they made."""

    def __init__(self, client: Client, made: set[str]) -> None:
        self.client = client
        self.port = client.server.port
        self.body = files.slow_job_latents()
        self.recent: deque[str] = deque(maxlen=12)
        self.made = made

    async def new_job(self) -> str | None:
        job = await self.client.create_job(self.body, {"model": SLOW_MODEL}, attempts=3)
        if job is None:
            return None
        self.remember(job["id"])
        return str(job["id"])

    def remember(self, job_id: str | None) -> None:
        if job_id:
            self.made.add(job_id)
            self.recent.append(job_id)

    async def some_job(self, rng: random.Random) -> str:
        """A recent job, running or finished; a new one now and then."""
        if len(self.recent) < 4 or rng.random() < 0.3:
            await self.new_job()
        return rng.choice(self.recent) if self.recent else "video_none"

    def head(self, method: str, target: str, headers: list[tuple[str, str]], length: int) -> bytes:
        return wire.request_head(method, target, self.client.host, headers, length)


Action = Callable[[Ctx, random.Random, bool], Awaitable[Finding | None]]


async def _send(writer: asyncio.StreamWriter, data: bytes) -> None:
    with contextlib.suppress(ConnectionError):
        writer.write(data)
        await writer.drain()


async def _read_head(
    reader: asyncio.StreamReader, what: str
) -> tuple[int | None, dict[str, str], Finding | None]:
    """The response head; a finding if it is a 5xx or never comes."""
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT_S)
    except (TimeoutError, asyncio.IncompleteReadError, ConnectionError) as error:
        return None, {}, Finding(f"{what}: no answer", what, repr(error), "an answer")
    status, headers = wire.parse_head(head)
    if status is None or status >= 500:
        excerpt = head[:200].decode(errors="replace")
        return status, headers, Finding(f"{what}: {status}", what, excerpt, "not a 5xx")
    return status, headers, None


async def cut_upload(ctx: Ctx, rng: random.Random, abrupt: bool) -> Finding | None:
    """Leave anywhere in the request, head or body."""
    route = rng.choice(["/v1/videos/stream", "/v1/videos"]) + f"?model={SLOW_MODEL}"
    data = ctx.head("POST", route, [], len(ctx.body)) + ctx.body
    async with wire.connection(ctx.port, abrupt) as (_, writer):
        await _send(writer, data[: rng.randrange(len(data))])
        await asyncio.sleep(rng.uniform(0, 0.03))
    return None


async def cut_chunked_upload(ctx: Ctx, rng: random.Random, abrupt: bool) -> Finding | None:
    head = ctx.head("POST", "/v1/videos/stream", [("Transfer-Encoding", "chunked")], 0)
    head = head.replace(b"Content-Length: 0\r\n", b"")
    async with wire.connection(ctx.port, abrupt) as (_, writer):
        await _send(writer, head)
        sent = 0
        for _ in range(rng.randint(0, 4)):
            size = rng.randint(1, 200)
            chunk = ctx.body[sent : sent + size]
            await _send(writer, f"{size:x}\r\n".encode() + chunk + b"\r\n")
            sent += size
            await asyncio.sleep(rng.uniform(0, 0.01))
    return None


async def cut_multipart(ctx: Ctx, rng: random.Random, abrupt: bool) -> Finding | None:
    body = (
        b'--b\r\nContent-Disposition: form-data; name="model"\r\n\r\nslow\r\n'
        b'--b\r\nContent-Disposition: form-data; name="file"; filename="z"\r\n\r\n'
        + ctx.body
        + b"\r\n--b--\r\n"
    )
    head = ctx.head(
        "POST", "/v1/videos", [("Content-Type", "multipart/form-data; boundary=b")], len(body)
    )
    async with wire.connection(ctx.port, abrupt) as (_, writer):
        await _send(writer, head + body[: rng.randrange(len(body))])
    return None


async def _stream_then_leave(
    ctx: Ctx, rng: random.Random, abrupt: bool, read_bytes: int
) -> Finding | None:
    route = f"/v1/videos/stream?model={SLOW_MODEL}"
    async with wire.connection(ctx.port, abrupt) as (reader, writer):
        await _send(writer, ctx.head("POST", route, [], len(ctx.body)) + ctx.body)
        _, headers, finding = await _read_head(reader, "POST /v1/videos/stream")
        ctx.remember(headers.get("x-video-id"))
        if read_bytes:
            await wire.read_some(reader, read_bytes, READ_TIMEOUT_S)
    return finding


async def cut_after_head(ctx: Ctx, rng: random.Random, abrupt: bool) -> Finding | None:
    return await _stream_then_leave(ctx, rng, abrupt, 0)


async def cut_mid_stream(ctx: Ctx, rng: random.Random, abrupt: bool) -> Finding | None:
    return await _stream_then_leave(ctx, rng, abrupt, rng.randint(1, 30_000))


async def _view_then_leave(
    ctx: Ctx, rng: random.Random, abrupt: bool, path: str, headers: list[tuple[str, str]]
) -> Finding | None:
    async with wire.connection(ctx.port, abrupt) as (reader, writer):
        await _send(writer, ctx.head("GET", path, headers, 0))
        _, _, finding = await _read_head(reader, f"GET {path.split('/')[-1]} {headers}")
        await wire.read_some(reader, rng.randint(0, 20_000), rng.uniform(0, 0.5))
    return finding


async def cut_content(ctx: Ctx, rng: random.Random, abrupt: bool) -> Finding | None:
    headers = rng.choice([[], [("Range", "bytes=0-")], [("Range", "bytes=100-")]])
    job_id = await ctx.some_job(rng)
    return await _view_then_leave(ctx, rng, abrupt, f"/v1/videos/{job_id}/content", headers)


async def cut_events(ctx: Ctx, rng: random.Random, abrupt: bool) -> Finding | None:
    headers = rng.choice([[], [("Last-Event-ID", str(rng.randint(0, 20)))]])
    job_id = await ctx.some_job(rng)
    return await _view_then_leave(ctx, rng, abrupt, f"/v1/videos/{job_id}/events", headers)


async def delete_running(ctx: Ctx, rng: random.Random, abrupt: bool) -> Finding | None:
    """DELETE a running job while a viewer follows it: both must end, the job cancelled."""
    job_id = await ctx.new_job()
    if job_id is None:
        return None
    viewer = asyncio.ensure_future(_watch(ctx.client, job_id))
    await asyncio.sleep(rng.uniform(0, 0.4))
    what = f"DELETE of running {job_id}"
    async with ctx.client.session.delete(f"/v1/videos/{job_id}") as response:
        status, text = response.status, await response.text()
    finding = None
    if status >= 500:
        finding = Finding(f"DELETE of a running job: {status}", what, text[:200], "200")
    try:
        await asyncio.wait_for(viewer, VIEWER_TIMEOUT_S)
    except TimeoutError:
        return Finding(
            "a viewer of a deleted job never ended", what, "still open", "its stream ends"
        )
    return finding


async def _watch(client: Client, job_id: str) -> None:
    with contextlib.suppress(aiohttp.ClientError):
        async with client.session.get(f"/v1/videos/{job_id}/content") as response:
            await response.read()


async def delete_any(ctx: Ctx, rng: random.Random, abrupt: bool) -> Finding | None:
    job_id = await ctx.some_job(rng)
    async with ctx.client.session.delete(f"/v1/videos/{job_id}") as response:
        status, text = response.status, await response.text()
    if status >= 500:
        return Finding(f"DELETE: {status}", f"DELETE {job_id}", text[:200], "not a 5xx")
    return None


async def cut_delete(ctx: Ctx, rng: random.Random, abrupt: bool) -> Finding | None:
    """Send a DELETE and leave before its answer (it waits for the decoder to stop)."""
    job_id = await ctx.some_job(rng)
    async with wire.connection(ctx.port, abrupt) as (_, writer):
        await _send(writer, ctx.head("DELETE", f"/v1/videos/{job_id}", [], 0))
        await asyncio.sleep(rng.uniform(0, 0.05))
    return None


async def idle(ctx: Ctx, rng: random.Random, abrupt: bool) -> Finding | None:
    """Connect, send a piece of a head (or nothing), leave."""
    data = ctx.head("GET", "/v1/videos", [], 0)
    async with wire.connection(ctx.port, abrupt) as (_, writer):
        await _send(writer, data[: rng.randrange(len(data))])
        await asyncio.sleep(rng.uniform(0, 0.05))
    return None


ACTIONS: dict[str, Action] = {
    "upload cut": cut_upload,
    "chunked upload cut": cut_chunked_upload,
    "multipart upload cut": cut_multipart,
    "stream left after its head": cut_after_head,
    "stream left midway": cut_mid_stream,
    "content left midway": cut_content,
    "events left midway": cut_events,
    "DELETE of a watched running job": delete_running,
    "DELETE of a running or finished job": delete_any,
    "DELETE left before its answer": cut_delete,
    "idle or partial head": idle,
}


async def run(
    client: Client, count: int, workers: int, seed: int, made: set[str] | None = None
) -> Category:
    """`count` actions; the ids of the jobs they start are added to `made`."""
    category = Category("abrupt disconnects")
    ctx = Ctx(client, set() if made is None else made)
    tally: Counter[str] = Counter()
    next_index = 0

    async def worker() -> None:
        nonlocal next_index
        while next_index < count:
            rng = random.Random(seed * 1_000_003 + next_index)
            next_index += 1
            name = rng.choice(sorted(ACTIONS))
            abrupt = rng.random() < 0.5
            tally[f"{name} ({'RST' if abrupt else 'FIN'})"] += 1
            finding = await _attempt(ctx, rng, abrupt, name)
            health = await client.health()
            if finding is None and not health.ok:
                finding = Finding(f"unhealthy after {name}", name, health.detail, "/healthz 200")
            category.record(finding)

    started = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(workers)))
    category.figures = {
        "actions": dict(sorted(tally.items())),
        "jobs_started": len(ctx.made),
        "seconds": round(time.monotonic() - started, 1),
    }
    return category


async def _attempt(ctx: Ctx, rng: random.Random, abrupt: bool, name: str) -> Finding | None:
    try:
        return await ACTIONS[name](ctx, rng, abrupt)
    except (OSError, TimeoutError, aiohttp.ClientError) as error:
        return Finding(f"{name}: {type(error).__name__}", name, repr(error), "no client error")


async def settle(client: Client, timeout_s: float = SETTLE_TIMEOUT_S) -> dict[str, float]:
    """Wait until no job is queued or running and no viewer is counted; what is left."""
    deadline = time.monotonic() + timeout_s
    while True:
        samples = await client.metrics()
        left = {
            name: value
            for name, value in samples.items()
            if value
            and (
                name in ('vaecast_jobs{status="queued"}', 'vaecast_jobs{status="in_progress"}')
                or name == "vaecast_active_readers"
            )
        }
        if not left or time.monotonic() > deadline:
            return left
        await asyncio.sleep(0.2)


async def check_jobs(client: Client, job_ids: set[str], category: Category) -> None:
    """Nothing left running, then every job in a final state, with an error when
    failed or cancelled (an evicted or deleted one answers 404/410 and is fine)."""
    left = await settle(client)
    category.record(
        Finding(
            "jobs or viewers never ended",
            f"{len(job_ids)} jobs started by the disconnect clients",
            str(left),
            f"none left {SETTLE_TIMEOUT_S:g} s after the last client",
        )
        if left
        else None
    )
    for job_id in sorted(job_ids):
        category.record(await _job_finding(client, job_id))


async def _job_finding(client: Client, job_id: str) -> Finding | None:
    status, job = await client.job(job_id)
    if status in (404, 410):
        return None
    state = job.get("status")
    if status != 200 or state not in FINAL:
        return Finding("job without a final state", job_id, f"{status} {state}", "a final state")
    if state in ("failed", "cancelled") and not job.get("error"):
        return Finding(f"{state} job without an error", job_id, str(job)[:300], "an error")
    return None
