"""The job manager's durable store (`--store DIR`): restore, journal, find, evict.

At start (before the port opens) the store recovers what it holds
(`vaecast.store.recovery`) and every finished job it kept is served again
(`restored_job`): same id, bytes, ETag, HLS and events; a job that was running
comes back failed, `interrupted`. Each new job's MP4 is written into its file as
it is made, and its journal (`job_journal`) records the rest. A lookup of an id
this process does not hold asks the store, so two front ends on one store serve
each other's finished videos; and every GONE_SYNC_S each asks the store which jobs went
meanwhile (another server's DELETE or eviction), and stops serving those it holds:
servers that share a store agree within that bound. When the store's disk budget is
spent, the oldest finished videos nobody watches go first (retention's `make_room`),
as a running video needs the room. A running video that would take the store past its
budget with nothing left to evict streams on without the store (`VideoBudget`): it is
served from memory and spill files until it expires, its job object says so
(`not_stored`), and after a restart it is gone (410). No job is refused for the
budget (a video's size is not known before it is made), and the store's videos never
take more disk than the budget.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from pathlib import Path

from prometheus_client import Counter, Gauge

from vaecast.errors import StoreUnavailableError
from vaecast.job.record import NotStored
from vaecast.server.stream.job import Job
from vaecast.server.stream.job_journal import JobJournal
from vaecast.server.stream.restored_job import restored_job
from vaecast.server.stream.retention import EvictionReason, Retention
from vaecast.server.stream.segment_log import SegmentLog
from vaecast.server.stream.services import JobServices
from vaecast.store import Recovered, Store, StoredJob

log = logging.getLogger("vaecast.store")

JOB_ID = re.compile(r"video_[0-9a-f]{24}")
# How often the servers of one store learn which jobs went at the others.
GONE_SYNC_S = 1.0


class VideoBudget:
    """One running video's view of the store's budget (a segment log's `StoreBudget`)."""

    def __init__(self, durable: DurableJobs, job_id: str) -> None:
        self._durable = durable
        self._job_id = job_id

    def refuse(self, length: int) -> str | None:
        return self._durable.refuse(length)

    def left(self, reason: str) -> None:
        self._durable.not_stored(self._job_id, reason)


class DurableJobs:
    def __init__(
        self, store: Store, services: JobServices, jobs: dict[str, Job], retention: Retention
    ) -> None:
        self.store = store
        self._services, self._jobs, self._retention = services, jobs, retention
        self._gone_synced_at = time.time()  # what went before this was read at start
        self._gone_sync: asyncio.Task[None] | None = None
        registry = services.metrics.registry
        self.recovered = Counter(
            "vaecast_store_recovered",
            "Jobs the store held at start, by what became of them",
            ["outcome"],
            registry=registry,
        )
        self.videos_not_stored = Counter(
            "vaecast_store_videos_not_stored",
            "Running videos that outgrew the store's budget and went on without it",
            registry=registry,
        )
        Gauge("vaecast_store_bytes", "Video bytes in the store", registry=registry).set_function(
            lambda: store.bytes_used
        )
        Gauge(
            "vaecast_store_max_bytes", "The store's disk budget (--store-max-gb)", registry=registry
        ).set_function(lambda: store.max_bytes)
        Gauge(
            "vaecast_store_failed_writes",
            "Store transactions a database error rolled back",
            registry=registry,
        ).set_function(lambda: store.failed_writes)

    @classmethod
    async def open(
        cls, services: JobServices, jobs: dict[str, Job], retention: Retention, folder: Path
    ) -> DurableJobs:
        """The store in `folder`, its kept jobs put in `jobs` (the server's table)."""
        config = services.config
        retention_s = config.retention_s
        store, recovered = await Store.open(
            folder,
            config.store_max_bytes,
            expires=lambda finished_at: time.time() - finished_at >= retention_s,
            expired_reason=EvictionReason.AGE.describe(retention_s),
        )
        if store.database_note is not None:
            log.warning("store: %s", store.database_note)
        durable = cls(store, services, jobs, retention)
        durable._restore(recovered)
        durable._gone_sync = asyncio.create_task(durable._sync_gone(), name="vaecast-gone-sync")
        log.info(
            "store %s: %d job(s) kept, %.1f MB of video; %s",
            folder,
            len(recovered.jobs),
            store.bytes_used / 1e6,
            recovered.summary(),
        )
        return durable

    def _restore(self, recovered: Recovered) -> None:
        for job_id, reason in recovered.gone:
            self._retention.remember_gone(job_id, reason)
        for stored in recovered.jobs:
            self._jobs[stored.id] = restored_job(stored, self._services)
        for outcome, count in recovered.counts.items():
            self.recovered.labels(outcome).inc(count)

    def new_log(self, job_id: str) -> SegmentLog:
        """A new job's log, writing its MP4 into the store's file for it while the
        store's budget has room."""
        config = self._services.config
        return SegmentLog(
            config.spill_threshold_bytes,
            spill_dir=config.spill_dir,
            durable_path=self.store.video_path(job_id),
            budget=VideoBudget(self, job_id),
        )

    def not_stored(self, job_id: str, reason: str) -> None:
        """Job `job_id`'s video left the store: its record says why (and its journal
        tells the store)."""
        self.videos_not_stored.inc()
        job = self._jobs.get(job_id)
        if job is not None:
            job.apply(NotStored(reason))

    def refuse(self, length: int) -> str | None:
        """None when `length` more bytes of a running video fit the budget, once the
        oldest finished videos nobody watches are evicted as needed; else why not."""
        store = self.store
        if store.room_for(length):
            return None
        self._retention.make_room(lambda: not store.room_for(length))
        if store.room_for(length):
            return None
        return (
            f"the store's budget ({store.max_bytes / 1e9:.3g} GB, --store-max-gb) has no "
            "room for this video beside the videos being made or watched: it is served "
            "from memory until it expires, and not kept across a restart"
        )

    def track(self, job: Job) -> None:
        """Journal `job` (one whose log writes the store's file)."""
        JobJournal(self.store, job, self._services.config.retention_s)

    async def settle(self) -> None:
        """Before an answer or an event: until what has happened so far is committed,
        so that no job a client was told of (created, completed, deleted) is undone by a
        crash."""
        await self.store.settle()

    def check_writable(self) -> None:
        """Before a new job is read: 503 while the store cannot write (a job it could
        not keep would be answered as kept)."""
        failing = self.store.failing
        if failing is not None:
            self._services.metrics.jobs_rejected.labels("store_unavailable").inc()
            raise StoreUnavailableError(
                f"the store cannot save new videos right now ({failing}); try again later"
            )

    def forget(self, job: Job, reason: str) -> None:
        self.store.forget(job.id, reason)

    async def find(self, job_id: str) -> None:
        """Serve a finished job another process stored, or answer 410 for one it says
        is gone."""
        if not JOB_ID.fullmatch(job_id):
            return
        found = await self.store.load(job_id)
        if isinstance(found, str):
            self._retention.remember_gone(job_id, found)
        elif isinstance(found, StoredJob) and job_id not in self._jobs:
            self.store.adopted(found)
            self._jobs[job_id] = restored_job(found, self._services)

    async def _sync_gone(self) -> None:
        """Stop serving the jobs another server of this store deleted or evicted."""
        retention = self._retention
        while True:
            await asyncio.sleep(GONE_SYNC_S)
            try:
                gone = await self.store.gone_since(self._gone_synced_at)
            except Exception as error:  # a store that cannot read now: next time
                log.warning("store: which jobs went elsewhere is unknown for now: %s", error)
                continue
            for job_id, reason, gone_at in gone:
                self._gone_synced_at = max(self._gone_synced_at, gone_at)
                job = self._jobs.get(job_id)
                if job is not None and job.record.is_final:
                    await retention.gone_elsewhere(job, reason)

    async def close(self) -> None:
        if self._gone_sync is not None:
            self._gone_sync.cancel()
            await asyncio.gather(self._gone_sync, return_exceptions=True)
        await self.store.close()
