"""Injected faults, one job each: a decoder raising (or breaking its plan) at a random
chunk, the encoder raising, a spill write failing like a full disk, and clients
resetting their connections. Every job must end in the state its fault implies,
with an error when failed or cancelled, its viewers' streams cut rather than ended
as if whole, and the server healthy afterwards."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import aiohttp

from chaos import faults, files, wire
from chaos.client import Client
from chaos.results import Category, Finding

JOB_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class Injected:
    """A job started with a fault: what was done and which final states fit it."""

    what: str
    job_id: str | None
    expected: frozenset[str]
    verdict: str = "ok"  # or what was wrong with the viewer's stream
    viewer: str = ""  # how the viewer's stream ended: cut, whole, refused NNN


async def _viewer(client: Client, job_id: str) -> str:
    """Read the job's content to its end: 'cut' (truncated), 'whole', or 'refused NNN'."""
    try:
        async with client.session.get(f"/v1/videos/{job_id}/content") as response:
            if response.status != 200:
                return f"refused {response.status}"
            await response.read()
            return "whole"
    except aiohttp.ClientPayloadError:
        return "cut"


async def _failing_job(client: Client, what: str, body: bytes, model: str) -> Injected:
    job = await client.create_job(body, {"model": model})
    if job is None:
        return Injected(what, None, frozenset({"failed"}), "the upload was refused")
    viewer = await _viewer(client, job["id"])
    # A failed job's stream must not end as if the video were whole. Before its first
    # byte the server may still answer an error: 409 (it failed) or the failure's 5xx.
    refused = viewer.startswith("refused ") and (viewer == "refused 409" or viewer[8] == "5")
    verdict = "ok" if viewer == "cut" or refused else f"viewer saw {viewer}"
    return Injected(what, job["id"], frozenset({"failed"}), verdict, viewer)


async def decoder_fault(client: Client, rng: random.Random) -> Injected:
    kind = rng.choice(faults.DECODER_FAULT_KINDS)
    at = rng.randrange(faults.FAULT_CHUNKS)
    model = faults.decoder_fault_model(kind, at)
    body = files.decoder_fault_latents(rng.getrandbits(16))
    return await _failing_job(client, f"decoder {kind} at chunk {at}", body, model)


async def encoder_fault(client: Client, rng: random.Random) -> Injected:
    at = rng.randrange(-1, faults.FAULT_CHUNKS)
    where = "when built" if at < 0 else f"at chunk {at}"
    if client.server.encoder_faults == "absent":
        what = f"encoder raises {where}"
        return Injected(what, None, frozenset({"failed"}), "create_app takes no encoder factory")
    body = files.encoder_fault_latents(at, rng.getrandbits(16))
    return await _failing_job(client, f"encoder raises {where}", body, "linear")


async def disk_full(client: Client, rng: random.Random) -> Injected:
    body = files.disk_full_latents(rng.getrandbits(16))
    what = f"spill file past RLIMIT_FSIZE ({faults.DISK_FULL_FILE_BYTES} B): EFBIG"
    return await _failing_job(client, what, body, "linear")


async def client_reset(client: Client, rng: random.Random) -> Injected:
    """RST from the only client of a /v1/videos/stream: the decode is cancelled."""
    body = files.slow_job_latents(rng.getrandbits(16))
    path = f"/v1/videos/stream?model={faults.SLOW_MODEL}"
    read = rng.randint(0, 4000)
    async with wire.connection(client.server.port, abrupt=True) as (reader, writer):
        writer.write(wire.request_head("POST", path, client.host, [], len(body)) + body)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), JOB_TIMEOUT_S)
        _, headers = wire.parse_head(head)
        await wire.read_some(reader, read, 5.0)
    # It may have finished before the reset arrived: then completed is right.
    expected = frozenset({"cancelled", "completed"})
    return Injected(
        f"client RST after {read} bytes of its stream", headers.get("x-video-id"), expected
    )


async def viewer_reset(client: Client, rng: random.Random) -> Injected:
    """RST from one viewer of a job: the job goes on to complete."""
    job = await client.create_job(files.slow_job_latents(rng.getrandbits(16)), {"model": "slow"})
    if job is None:
        return Injected("viewer RST", None, frozenset({"completed"}), "the upload was refused")
    path = f"/v1/videos/{job['id']}/content"
    read = rng.randint(0, 4000)
    async with wire.connection(client.server.port, abrupt=True) as (reader, writer):
        writer.write(wire.request_head("GET", path, client.host, [], None))
        await wire.read_some(reader, read, 5.0)
    return Injected(f"viewer RST after {read} bytes", job["id"], frozenset({"completed"}))


FAULTS: dict[str, Callable[[Client, random.Random], Awaitable[Injected]]] = {
    "decoder": decoder_fault,
    "encoder": encoder_fault,
    "disk full": disk_full,
    "client reset": client_reset,
    "viewer reset": viewer_reset,
}


async def _judge(client: Client, kind: str, injected: Injected) -> Finding | None:
    if injected.job_id is None:
        return Finding(f"{kind}: no job", injected.what, injected.verdict, "a job")
    status, job = await client.wait_final(injected.job_id, JOB_TIMEOUT_S)
    state, error = job.get("status"), job.get("error")
    request = f"{injected.what} ({injected.job_id})"
    expected = " or ".join(sorted(injected.expected))
    if status != 200 or state not in injected.expected:
        answer = f"{status} {state}: {error}"
        return Finding(f"{kind}: ended {state}", request, answer, expected)
    if state in ("failed", "cancelled") and not error:
        return Finding(f"{kind}: {state} without an error", request, str(job)[:300], "an error")
    if injected.verdict != "ok":
        return Finding(f"{kind}: {injected.verdict}", request, injected.verdict, "a cut stream")
    health = await client.health()
    if not health.ok:
        return Finding(f"unhealthy after {kind}", request, health.detail, "/healthz 200")
    return None


async def run(client: Client, count: int, workers: int, seed: int) -> Category:
    category = Category("injected faults")
    states: Counter[str] = Counter()
    viewers: Counter[str] = Counter()
    kinds = sorted(FAULTS)
    next_index = 0

    async def worker() -> None:
        nonlocal next_index
        while next_index < count:
            index = next_index
            next_index += 1
            kind = kinds[index % len(kinds)]
            rng = random.Random(seed * 7_919 + index)
            try:
                injected = await FAULTS[kind](client, rng)
                viewers[f"{kind}: {injected.viewer}"] += bool(injected.viewer)
                finding = await _judge(client, kind, injected)
            except (OSError, TimeoutError, asyncio.IncompleteReadError, aiohttp.ClientError) as e:
                finding = Finding(f"{kind}: {type(e).__name__}", kind, repr(e), "no client error")
            states[f"{kind}: {'as expected' if finding is None else finding.key}"] += 1
            category.record(finding)

    await asyncio.gather(*(worker() for _ in range(workers)))
    category.figures = {
        "outcomes": dict(sorted(states.items())),
        "viewers_of_failing_jobs": {k: n for k, n in sorted(viewers.items()) if n},
    }
    return category
