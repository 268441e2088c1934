"""The polite side: an aiohttp client for setting up jobs and checking on the server."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

import aiohttp

from chaos.process import ServerUnderTest

HEALTH_TIMEOUT_S = 5.0
FINAL = frozenset({"completed", "failed", "cancelled"})


@dataclass(frozen=True, slots=True)
class Health:
    ok: bool
    seconds: float
    detail: str


class Client:
    def __init__(self, server: ServerUnderTest, session: aiohttp.ClientSession) -> None:
        self.server = server
        self.session = session
        self.host = server.url.removeprefix("http://")
        self.worst_health_s = 0.0  # the slowest /healthz round trip seen (a lag bound)

    async def health(self) -> Health:
        """Whether /healthz answers 200 within HEALTH_TIMEOUT_S."""
        started = time.monotonic()
        try:
            async with self.session.get(
                "/healthz", timeout=aiohttp.ClientTimeout(total=HEALTH_TIMEOUT_S)
            ) as response:
                await response.read()
                ok, detail = response.status == 200, f"/healthz {response.status}"
        except (aiohttp.ClientError, TimeoutError) as error:
            ok, detail = False, f"/healthz: {error!r}"
        seconds = time.monotonic() - started
        self.worst_health_s = max(self.worst_health_s, seconds)
        return Health(ok, seconds, detail)

    async def create_job(
        self, body: bytes, params: dict[str, str] | None = None, attempts: int = 40
    ) -> dict[str, Any] | None:
        """POST /v1/videos; waits out 429s (capacity, not refusal). None if refused."""
        for _ in range(attempts):
            async with self.session.post("/v1/videos", data=body, params=params) as response:
                if response.status == 429:
                    await asyncio.sleep(0.1)
                    continue
                if response.status != 201:
                    return None
                return dict(await response.json())
        return None

    async def job(self, job_id: str) -> tuple[int, dict[str, Any]]:
        async with self.session.get(f"/v1/videos/{job_id}") as response:
            text = await response.text()
            try:
                return response.status, dict(json.loads(text))
            except ValueError:
                return response.status, {"body": text[:200]}

    async def wait_final(self, job_id: str, timeout_s: float) -> tuple[int, dict[str, Any]]:
        """The job once it is final (or what it was when `timeout_s` ran out)."""
        deadline = time.monotonic() + timeout_s
        while True:
            status, job = await self.job(job_id)
            if status != 200 or job.get("status") in FINAL or time.monotonic() > deadline:
                return status, job
            await asyncio.sleep(0.05)

    async def metrics(self) -> dict[str, float]:
        """/metrics samples by name with labels, e.g. 'vaecast_jobs{status="failed"}'."""
        async with self.session.get("/metrics") as response:
            text = await response.text()
        samples = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                try:
                    samples[name] = float(value)
                except ValueError:
                    continue
        return samples

    async def collect(self) -> dict[str, Any]:
        """A full GC in the server (`/reliability/gc`): what only reference cycles held."""
        async with self.session.post("/reliability/gc") as response:
            return dict(await response.json())

    async def probe_lag(self) -> dict[str, float]:
        """The suite's own probe in the server (`/reliability/lag`), reset: the worst
        tick lateness and the longest garbage collection since the last call."""
        async with self.session.get("/reliability/lag", params={"reset": "1"}) as response:
            return dict(await response.json())


def client_session(url: str) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        url,
        connector=aiohttp.TCPConnector(limit=32, force_close=True),
        timeout=aiohttp.ClientTimeout(total=60),
    )
