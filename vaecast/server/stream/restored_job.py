"""A finished job again, from the durable store: after a restart, or another front
end's (two front ends on one store).

Its record comes from its snapshot (`vaecast.job.snapshot`; one that was running
came back `interrupted`), its MP4 from its file, read where its fragment index says,
its fragments' facts from the same index, its events as they were: so `/content`, Range,
the ETag (the id and the size), the playlist and `/events` with `Last-Event-ID`
answer as they did before. It never runs again: its runner has nothing to do.
"""

from __future__ import annotations

import time
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any

from vaecast.codecs.fragment import FragmentFacts
from vaecast.errors import VaecastError
from vaecast.job.record import JobStatus
from vaecast.job.snapshot import from_snapshot
from vaecast.job.transitions import Variant
from vaecast.models.base import DecodePlan
from vaecast.server.stream.job import Job
from vaecast.server.stream.segment_log import SegmentLog
from vaecast.store import StoredJob

if TYPE_CHECKING:
    from vaecast.server.stream.services import JobServices


class RestoredRunner:
    """The runner of a job that ran in an earlier process: it has ended."""

    feed = None
    stop_error = None

    async def run(self, job: Job, slot: AbstractAsyncContextManager[Any]) -> None:
        pass

    def cancel(self, job: Job, reason: str, by_shutdown: bool) -> None:
        pass

    def abort(self, job: Job, error: VaecastError) -> None:
        pass

    def length_known(self, job: Job, plan: DecodePlan, preview_chunks: int | None) -> None:
        pass

    def cancel_variant(self, job: Job, variant: Variant, error: VaecastError) -> None:
        pass  # a restored job has ended

    def interrupted(self, job: Job) -> None:
        pass


def restored_job(stored: StoredJob, services: JobServices) -> Job:
    record = from_snapshot(stored.snapshot, stored.events)
    if stored.path is not None:  # its video is kept: a whole MP4, up to where it stopped
        spans = [(segment.offset, segment.length) for segment in stored.segments]
        log = SegmentLog.restored(stored.path, spans, None)
    else:
        error = record.error or VaecastError("the video was not kept")
        log = SegmentLog.restored(None, [], error)
    # A restored job never decodes: the decoder is only what the job's type holds.
    decoders, config = services.decoders, services.config
    decoder = decoders.get(record.model) or decoders[config.default_model]
    job = Job(
        record,
        decoder,
        None,
        config,
        services.metrics,
        RestoredRunner(),
        services.attach,
        log=log,
    )
    job.fragments.restore(
        [FragmentFacts(row.duration_s or 0.0, row.independent) for row in stored.segments[1:]]
    )
    job.events.finish()
    ended_ago = max(0.0, time.time() - stored.finished_at)
    job.finished_at = time.perf_counter() - ended_ago
    assert record.status in (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED)
    return job
