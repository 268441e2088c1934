"""A job: its record, its MP4 and viewers, and the runner that makes it.

A job is four things composed:
- its `JobRecord` (`vaecast.job.record`): status, counters, timings, the API's job
  object and the progress events, changed only through `apply`;
- its renditions (`rendition.py`): the final one, and a preview where it has one.
  Each holds a `SegmentLog`, which any number of viewers follow at their own pace
  (`async with job.viewer()` counts them, so retention never evicts a video someone
  is reading), the `FragmentIndex` of the same bytes (each fragment's facts, as the
  encoder gave them), and what the faces attached to it;
- `events`, the record's events as a log that SSE readers follow;
- its runner, which makes the video and applies what happens to the record: the
  `LocalRunner` decodes here (`vaecast.server.stream.local_runner`); Ray mode's mirrors a
  job that runs in the cluster (`vaecast.cluster.mirror`).
Where a job waits for a decode slot, and when it is evicted, is the manager's and
retention's business, not its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

from vaecast.errors import (
    DecodeCancelled,
    GoneError,
    InvalidRequestError,
    NotFoundError,
    VaecastError,
)
from vaecast.job.record import (
    FINAL,
    FINAL_STATUSES,
    LIVE,
    PREVIEW,
    Ended,
    JobRecord,
    JobStatus,
    PlanFacts,
    SegmentAdded,
    Transition,
)
from vaecast.job.transitions import Variant
from vaecast.job.views import summary_line, with_job
from vaecast.models.base import ChunkedDecoder, DecodePlan, StreamPlan
from vaecast.server.config import ServerConfig
from vaecast.server.metrics import Metrics
from vaecast.server.stream.finished_file import state_duration
from vaecast.server.stream.job_requests import (
    BatchRequest,
    DecodeRequest,
    PushKind,
    PushRequest,
)
from vaecast.server.stream.rendition import Rendition, RenditionHooks
from vaecast.server.stream.segment_log import FollowableLog, SegmentLog
from vaecast.server.stream.viewers import JobViewers

__all__ = [
    "FINAL_STATUSES",
    "BatchRequest",
    "DecodeRequest",
    "Job",
    "JobRunner",
    "JobStatus",
    "PushKind",
    "PushRequest",
    "Rendition",
    "plan_facts",
]

log = logging.getLogger("vaecast.jobs")


class JobRunner(Protocol):
    """What makes a job's video and tells its record what happened."""

    # Where a push session's blocks go (a LatentFeed here); None for an upload.
    feed: Any

    async def run(self, job: Job, slot: AbstractAsyncContextManager[Any]) -> None:
        """The job's task: make the video into `job`, ending it (`job.end`, or a
        `Completed` applied) however it ends; never raises."""

    def cancel(self, job: Job, reason: str, by_shutdown: bool) -> None:
        """Stop the job (DELETE, a client gone, shutdown)."""

    def abort(self, job: Job, error: VaecastError) -> None:
        """End the job as failed with `error` (a push session gone idle, say)."""

    def length_known(self, job: Job, plan: DecodePlan, preview_chunks: int | None) -> None:
        """A push session's last block came through this process (`preview_chunks`:
        the preview's chunk count, for a job with a preview)."""

    def cancel_variant(self, job: Job, variant: Variant, error: VaecastError) -> None:
        """Stop one rendition of a running job with a preview (DELETE ?variant=)."""

    def interrupted(self, job: Job) -> None:
        """The job's task ended without ending the job (cancelled before it ran)."""


def plan_facts(plan: DecodePlan) -> PlanFacts:
    return PlanFacts(plan.frames, plan.chunks, plan.width, plan.height)


class Job:
    def __init__(
        self,
        record: JobRecord,
        decoder: ChunkedDecoder,
        plan: DecodePlan | None,
        config: ServerConfig,
        metrics: Metrics,
        runner: JobRunner,
        attach: RenditionHooks | None = None,
        push_kind: PushKind | None = None,
        log: SegmentLog | None = None,
        preview: ChunkedDecoder | None = None,
        live: bool = False,
    ) -> None:
        """`plan` is None for a push session: its length is known at its last block.
        `attach`: what each new rendition is shown to (the faces' hooks; None: none).
        `log`: its MP4's log when it has one already (a durable store's file, or a
        restored video); by default a new one in memory, spilling to a temp file.
        `preview`: the preview decoder of a job with two renditions (its record has
        a `preview`); its MP4 is kept in memory and a temp file, not in the store.
        `live`: such a job also has the live rendition spliced from those two (its
        record has a `live`; `vaecast.server.stream.live_rendition`), kept likewise."""
        self.record = record
        self.id = record.id
        self.decoder = decoder
        self.plan = plan
        # The frame size, before the length is known (a push session's first block).
        self.stream_plan: StreamPlan | None = None
        self.config = config
        self.metrics = metrics
        self.runner = runner
        self.push_kind = push_kind  # what a push session's blocks are
        attach = attach or RenditionHooks()
        # The video: the final rendition, the model's own decode. Its log and fragment
        # index are the job's (`log`, `fragments`).
        self.final = attach(
            Rendition(
                FINAL,
                decoder,
                log
                if log is not None
                else SegmentLog(config.spill_threshold_bytes, config.spill_dir),
            )
        )
        self.log, self.fragments = self.final.log, self.final.fragments
        # A job with a preview: the preview decoder's rendition of the same latents.
        self.preview = (
            None
            if preview is None
            else attach(
                Rendition(
                    PREVIEW, preview, SegmentLog(config.spill_threshold_bytes, config.spill_dir)
                )
            )
        )
        # The live rendition: each chunk the preview's or the final's fragment.
        self.live = (
            None
            if not live or self.preview is None
            else attach(
                Rendition(LIVE, decoder, SegmentLog(config.spill_threshold_bytes, config.spill_dir))
            )
        )
        # The record's events (queued, started, chunk..., then done or error), for
        # GET /v1/videos/{id}/events; closed when the job ends.
        self.events: FollowableLog[dict[str, Any]] = FollowableLog()
        for event in record.events:
            self.events.append(with_job(record, event))
        self.finished_at: float | None = None  # monotonic here, for retention
        # Told of every transition applied, after its event (the store's journal).
        self._observers: list[Callable[[Transition, dict[str, Any] | None], None]] = []
        self._viewers = 0
        # Each live viewer's pictured playout (vaecast.server.stream.viewers), fed by
        # the faces that send it media; the job object's `viewers`.
        self.playouts = JobViewers(self._viewer_sent)
        self._viewer_slack: dict[str, Any] = {}
        self._task: asyncio.Task[None] | None = None
        # Whether a failed or cancelled end keeps the final's fragments so far as a
        # playable file (`end_keeping_partial`); a cancel may ask not to.
        self.keeps_partial = True

    # The record.

    def apply(self, transition: Transition) -> None:
        """Record `transition`; its event, if any, goes to the event readers."""
        event = self.record.apply(transition)
        if event is not None:
            event = with_job(self.record, event)
            self.events.append(event)
        for observer in self._observers:
            observer(transition, event)

    def observe(self, observer: Callable[[Transition, dict[str, Any] | None], None]) -> None:
        """Call `observer(transition, event)` after each transition from now on; it
        must neither await nor raise (it runs inside `apply`)."""
        self._observers.append(observer)

    def _viewer_sent(self, face: str, slack_s: float, new_stall: bool) -> None:
        # Called per viewer per fragment: the labelled child is looked up once a face.
        slack = self._viewer_slack.get(face)
        if slack is None:
            slack = self._viewer_slack[face] = self.metrics.viewer_slack.labels(face)
        slack.observe(slack_s)
        if new_stall:
            self.metrics.viewer_stalls.labels(face).inc()

    @property
    def error(self) -> VaecastError | None:
        """Why the job ended, or why it is being stopped (a cancel or abort on its way)."""
        return self.record.error or getattr(self.runner, "stop_error", None)

    @property
    def feed(self) -> Any:
        """A push session's block feed (None for an upload)."""
        return self.runner.feed

    # Viewers.

    @property
    def viewers(self) -> int:
        """Viewers being streamed to right now."""
        return self._viewers

    @contextlib.asynccontextmanager
    async def viewer(self) -> AsyncIterator[None]:
        """Count a viewer for as long as the block runs (retention keeps its video)."""
        self._viewers += 1
        try:
            yield
        finally:
            self._viewers -= 1

    # Running.

    async def run(self, slot: AbstractAsyncContextManager[Any]) -> None:
        """The job's task (the manager's): its runner, in `slot`."""
        try:
            await self.runner.run(self, slot)
        finally:
            self.close_out()

    def attach(self, task: asyncio.Task[None]) -> None:
        """The task that runs this job (the manager's): cancelled by `cancel`."""
        self._task = task
        task.add_done_callback(self._after_task)

    def stop_task(self) -> None:
        """Cancel the job's task (its runner records how it ended)."""
        if self._task is not None:
            self._task.cancel()

    def cancel(
        self, reason: str = "cancelled", *, by_shutdown: bool = False, keep_partial: bool = True
    ) -> None:
        """Stop the job: a queued one never starts, a running one stops at its next chunk.

        A job stopped by shutdown records CancelledByShutdown (503: try again
        elsewhere), any other cancel DecodeCancelled (409). `keep_partial`: what it
        made so far stays a playable file (not for a shutdown: the store keeps that).
        """
        if not self.record.is_final:
            self.keeps_partial = keep_partial and not by_shutdown
            self.runner.cancel(self, reason, by_shutdown)

    def abort(self, error: VaecastError) -> None:
        """End the job as failed with `error` (a push session gone idle, say)."""
        if not self.record.is_final:
            self.runner.abort(self, error)

    def length_known(self, plan: DecodePlan, latent_shape: tuple[int, ...]) -> None:
        """A push session's last block came: the whole video's plan, of latents of
        `latent_shape` in all."""
        preview = None if self.preview is None else self.preview.decoder.plan(latent_shape)
        self.runner.length_known(self, plan, None if preview is None else preview.chunks)

    def cancel_variant(self, variant: Variant, reason: str) -> None:
        """Stop one rendition of a job with a preview; the other goes on (stopping the
        last one still running stops the job)."""
        self.rendition(variant)  # raises for one the job does not have
        if self.preview is not None and not self.record.is_final:
            self.runner.cancel_variant(self, variant, DecodeCancelled(reason))

    def on_end(self, callback: Callable[[], None]) -> None:
        """Call `callback` once the job has ended (at once if it has)."""
        if self._task is None or self._task.done():
            callback()
        else:
            self._task.add_done_callback(lambda _: callback())

    async def wait(self) -> None:
        if self._task is not None:
            await asyncio.shield(self._task)

    # The renditions.

    def rendition(self, variant: Variant) -> Rendition:
        """`final` (the video) or, on a job with a preview, `preview`."""
        if variant == FINAL:
            return self.final
        if variant == PREVIEW and self.preview is not None:
            return self.preview
        if variant == LIVE and self.live is not None:
            return self.live
        if variant == LIVE and self.record.live is not None:  # restored from the store
            raise GoneError(f"the live rendition of {self.id} is not kept across a restart")
        if variant == LIVE:
            raise NotFoundError(
                f"video {self.id} has no live rendition (a job has one when it has a preview "
                "whose chunks line up with its final's)"
            )
        if variant == PREVIEW and self.record.preview is not None:  # restored from the store
            raise GoneError(f"the preview of {self.id} is not kept across a restart; its final is")
        if variant == PREVIEW:
            raise NotFoundError(f"video {self.id} has no preview rendition")
        shown = variant if len(variant) <= 20 else f"{variant[:20]}..."
        raise InvalidRequestError(f"variant must be preview, final or live, got {shown!r}")

    @property
    def renditions(self) -> list[Rendition]:
        extra = [r for r in (self.preview, self.live) if r is not None]
        return [*extra, self.final]

    @property
    def memory_bytes(self) -> int:
        """What the job's videos hold in memory."""
        return sum(rendition.log.memory_bytes for rendition in self.renditions)

    async def release(self) -> None:
        """Free every rendition's bytes (the job is being evicted, or cannot be served)."""
        for rendition in self.renditions:
            await rendition.log.release()

    def status_of(self, rendition: Rendition) -> JobStatus:
        """A rendition's status: the preview's own, or the final's (the job's, unless
        the final ended while the job went on)."""
        preview, live = self.record.preview, self.record.live
        if rendition.variant == PREVIEW and preview is not None:
            return preview.status
        if rendition.variant == LIVE and live is not None:
            return live.status
        return self.record.final_status()

    def error_of(self, rendition: Rendition) -> VaecastError | None:
        """Why a rendition ended without completing (or is being stopped)."""
        preview, live = self.record.preview, self.record.live
        if rendition.variant == PREVIEW and preview is not None:
            return preview.error
        if rendition.variant == LIVE and live is not None:
            return live.error
        final = self.record.final_ended
        return final.error if final is not None and final.error is not None else self.error

    async def release_unservable(self) -> None:
        """Free the bytes of each rendition that ended without completing and without a
        file of its own: they can never be served (a stopped final's job keeps its
        completed preview; a kept partial is a file)."""
        for rendition in self.renditions:
            broken = self.status_of(rendition) in (JobStatus.FAILED, JobStatus.CANCELLED)
            if broken and not rendition.log.complete and not rendition.log.released:
                await rendition.log.release()

    # The pipeline's sink.

    async def append(self, segment: bytes) -> None:
        await self.sink(FINAL).append(segment)

    def sink(self, variant: Variant) -> _RenditionSink:
        """Where the fragments of rendition `variant` go."""
        return _RenditionSink(self, self.rendition(variant))

    # Endings.

    def end(self, status: JobStatus, error: VaecastError) -> None:
        """End the job failed or cancelled with `error`; its logs' readers hear why."""
        error = error.detached()
        self.apply(Ended(status, error))
        for rendition in self.renditions:
            if not rendition.log.closed:
                rendition.log.abort(error)

    async def end_keeping_partial(self, status: JobStatus, error: VaecastError) -> None:
        """End the job failed or cancelled, keeping what its final made so far.

        A final with at least one fragment, whose log is sound, becomes a playable file:
        its init segment rewritten to state the fragments' duration (as a completed
        file's is), the record `partial`, the log finished rather than aborted (its
        viewers get a whole file; the store keeps it as a completed video). Otherwise,
        and where the job was asked not to keep it, it ends as `end` does. A preview
        ends as it would have: only the final is kept.
        """
        final = self.final
        keep = self.keeps_partial and len(final.log) > 1
        if not keep or final.log.closed or final.log.error is not None:
            self.end(status, error)
            return
        try:
            await state_duration(final)
        except VaecastError:  # its file cannot be written: nothing to keep
            self.end(status, error)
            return
        error = error.detached()
        self.apply(Ended(status, error, partial=True))
        final.log.finish()
        for rendition in self.renditions:
            if not rendition.log.closed:
                rendition.log.abort(error)

    def _after_task(self, task: asyncio.Task[None]) -> None:
        # A task cancelled before its first step never enters `run`, so nothing
        # there closed the logs: do it here, or readers would wait forever.
        if not self.record.is_final:
            self.runner.interrupted(self)
        self.close_out()

    def close_out(self) -> None:
        """Bookkeeping of a job that ended, however it ended; runs once."""
        if self.finished_at is not None:
            return
        self.finished_at = time.perf_counter()
        self.events.finish()
        self.metrics.jobs_finished.labels(self.record.status.value).inc()
        log.info("job %s", summary_line(self.record))


class _RenditionSink:
    """A rendition's fragments: into its log and its fragment index, counted in the
    job's record as that rendition's."""

    def __init__(self, job: Job, rendition: Rendition) -> None:
        self._job, self._rendition = job, rendition

    async def append(self, segment: bytes) -> None:
        await self._rendition.log.append(segment)
        self._rendition.fragments.add(segment)
        self._job.apply(SegmentAdded(len(segment), self._rendition.variant))
