"""Retention: how long finished videos stay, and what is freed when they go.

A finished job stays fetchable for `retention_s`, and while the bytes that finished
jobs hold in RAM fit `retention_memory_bytes` (oldest first out); a job with a
viewer attached is never evicted, and a failed or cancelled job's bytes (which can
never be served) are freed at once, unless it kept them as a partial video (a file,
kept as a completed one is). Evicted and deleted ids are remembered, so they
answer 410 with the reason rather than 404.

With a durable store (`durable`), the memory budget only drops a finished video's
copies in RAM: it is still served from its file until its retention ends. Eviction
(age, DELETE, room in the store) then removes it from both, and the store keeps
the id's reason across a restart.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Coroutine, MutableMapping
from enum import Enum
from typing import Any, Protocol

from vaecast.errors import GoneError
from vaecast.server.config import ServerConfig
from vaecast.server.metrics import Metrics
from vaecast.server.stream.job import Job

log = logging.getLogger("vaecast.retention")

SWEEP_MAX_INTERVAL_S = 10.0
# Evicted ids remembered for 410 answers; older ones fall back to 404.
EVICTED_IDS_KEPT = 10_000


class EvictionReason(Enum):
    """Why a job's video is no longer kept: the 410 message and the metric label."""

    AGE = "age"
    MEMORY = "memory"
    DELETED = "deleted"
    STORE = "store"

    def describe(self, retention_s: float) -> str:
        if self is EvictionReason.AGE:
            return f"evicted {retention_s:g} s after it ended"
        if self is EvictionReason.MEMORY:
            return "evicted to stay within the memory budget"
        if self is EvictionReason.STORE:
            return "evicted to make room in the store"
        return "deleted by request"


class ForgetsJobs(Protocol):
    """The durable store, as retention sees it: what an evicted job's rows become."""

    def forget(self, job: Job, reason: str) -> None: ...


class Retention:
    """Evicts finished jobs from `jobs` (the manager's table, shared by reference)."""

    def __init__(
        self, config: ServerConfig, metrics: Metrics, jobs: MutableMapping[str, Job]
    ) -> None:
        self._config = config
        self._metrics = metrics
        self._jobs = jobs
        self._evicted: OrderedDict[str, str] = OrderedDict()
        self._side_tasks: set[asyncio.Task[None]] = set()
        self.durable: ForgetsJobs | None = None  # the store, when there is one

    def remember_gone(self, job_id: str, reason: str) -> None:
        """Answer 410 for `job_id`, with `reason` (an id the store says is gone)."""
        self._evicted[job_id] = reason
        while len(self._evicted) > EVICTED_IDS_KEPT:
            self._evicted.popitem(last=False)

    def gone(self, job_id: str) -> GoneError | None:
        """The 410 for an evicted or deleted id, None for one never seen."""
        reason = self._evicted.get(job_id)
        return None if reason is None else GoneError(f"video {job_id} is no longer kept ({reason})")

    async def sweep_forever(self) -> None:
        retention_s = self._config.retention_s
        interval_s = max(0.05, min(retention_s / 4, SWEEP_MAX_INTERVAL_S))
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.sweep()
            except Exception:
                # One bad job (a spill file that cannot be removed, say) must not end
                # eviction for every later one: log it and sweep again next time.
                log.exception("retention sweep failed; retrying in %g s", interval_s)

    async def sweep(self) -> None:
        """Evict finished jobs past their retention time, then any over the memory budget."""
        now = time.perf_counter()
        for job in self._evictable():
            assert job.finished_at is not None
            await job.release_unservable()
            if now - job.finished_at >= self._config.retention_s:
                await self.evict(job, EvictionReason.AGE)
        self.evict_over_budget()

    def job_ended(self, job: Job) -> None:
        """A job just ended: free what it can never serve, and keep within the budget."""
        if job.viewers == 0:
            # A failed or cancelled rendition's bytes, unless kept as a partial file, can
            # never be served (409): free them now. With a viewer attached, the next sweep does it.
            self._in_background(job.release_unservable())
        self.evict_over_budget()

    def evict_over_budget(self) -> None:
        budget = self._config.retention_memory_bytes
        held = sum(j.memory_bytes for j in self._jobs.values() if j.record.is_final)
        for job in self._evictable():
            if held <= budget:
                break
            held -= job.memory_bytes
            if job.log.durable:  # still served from the store, until its retention ends
                job.log.drop_memory()
                if job.preview is not None:  # kept in memory only: it goes
                    self._in_background(job.preview.log.release())
            else:
                self._in_background(self.evict(job, EvictionReason.MEMORY))

    def make_room(self, full: Callable[[], bool]) -> None:
        """Evict the oldest finished videos nobody watches until `full()` is false."""
        for job in self._evictable():
            if not full():
                return
            if self._forget(job, EvictionReason.STORE):
                self._in_background(job.release())

    async def gone_elsewhere(self, job: Job, reason: str) -> None:
        """Another server of the store deleted or evicted `job`: it goes here too (the
        store already says so; nothing is written again)."""
        if self._jobs.pop(job.id, None) is not None:
            self.remember_gone(job.id, reason)
            await job.release()

    async def evict(self, job: Job, reason: EvictionReason) -> None:
        if self._forget(job, reason):
            await job.release()

    def _forget(self, job: Job, reason: EvictionReason) -> bool:
        if self._jobs.pop(job.id, None) is None:
            return False
        describe = reason.describe(self._config.retention_s)
        self.remember_gone(job.id, describe)
        self._metrics.jobs_evicted.labels(reason.value).inc()
        if self.durable is not None:
            self.durable.forget(job, describe)
        return True

    async def close(self) -> None:
        """Wait for evictions in flight (the manager frees every log after)."""
        await asyncio.gather(*self._side_tasks, return_exceptions=True)

    def _evictable(self) -> list[Job]:
        """Finished jobs nobody is watching, oldest first."""
        return sorted(
            (j for j in self._jobs.values() if j.finished_at is not None and j.viewers == 0),
            key=lambda j: j.finished_at or 0.0,
        )

    def _in_background(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coroutine)
        self._side_tasks.add(task)
        task.add_done_callback(self._side_tasks.discard)
