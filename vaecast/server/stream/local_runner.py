"""The runner that decodes a job in this process: `run_pipeline` into the job's log.

It waits for a decode slot (a push session first waits for its first block outside
the slot: a session takes a slot only once it has something to decode), runs the
pipeline with the job as its sink and itself as the observer, and applies to the
job's record what happens: started, the encoder's Content-Type, each chunk, and how
the run ended (completed, failed, cancelled). The latents and the waveform are
dropped when the job ends: a finished job keeps only its MP4, which retention
accounts for.

A job with a preview (`PreviewSetup`) runs two pipelines in its one slot, over the
same latents (a push session's blocks reach the preview through a `FeedTap`): the
preview decoder's into the job's preview rendition, on a decode thread of its own,
and the model's, the final, into the job's video. On one device the final yields
to the preview chunk by chunk (`vaecast.pipeline.preview_first`). Each rendition ends on its
own (`VariantEnded`; `cancel_variant` stops one); the job ends once both have, as
its final did. The final's observer sends `final_ready` once the final has passed
a viewer of the preview (`JobRecord.final_caught_up`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

from vaecast.errors import CancelledByShutdown, DecodeCancelled, DecodeFailedError, VaecastError
from vaecast.job.record import (
    FINAL,
    PREVIEW,
    ChunkEncoded,
    Completed,
    Encoding,
    FinalReady,
    Geometry,
    JobStatus,
    LengthKnown,
    Started,
    VariantEnded,
)
from vaecast.job.transitions import Variant
from vaecast.models.base import ChunkedDecoder, DecodePlan, StreamPlan
from vaecast.pipeline.latent_feed import LatentFeed
from vaecast.pipeline.preview_first import FinalSide, PreviewFirst, PreviewSide
from vaecast.pipeline.run import (
    FragmentDone,
    LatentSource,
    Stages,
    VideoOutput,
    WholeLatents,
    Workers,
    run_pipeline,
)
from vaecast.playback_deadlines import slack
from vaecast.server.config import ServerConfig
from vaecast.server.stream.finished_file import state_duration
from vaecast.server.stream.job import Job, plan_facts
from vaecast.server.stream.job_requests import DecodeRequest, PushRequest
from vaecast.server.stream.live_rendition import LiveRendition

log = logging.getLogger("vaecast.jobs")


@dataclass(frozen=True, slots=True)
class PreviewSetup:
    """A job's preview: its decoder, the threads it runs on (a decode thread of its
    own: a push session's preview waits there for blocks), and whether the final
    yields to it (`first`: both decode on one device)."""

    decoder: ChunkedDecoder
    workers: Workers
    first: bool


@dataclass(slots=True)
class _RenditionRun:
    """One rendition's pipeline in a job's run."""

    variant: Variant
    source: LatentSource
    output: VideoOutput
    workers: Workers
    stop: VaecastError | None = None  # why `cancel_variant` stopped it
    task: asyncio.Task[None] | None = None


class LocalRunner:
    """Decodes one job here (see the module docstring)."""

    def __init__(
        self,
        request: DecodeRequest | PushRequest,
        config: ServerConfig,
        workers: Workers,
        stages: Stages,
        preview: PreviewSetup | None = None,
    ) -> None:
        self._workers, self._stages = workers, stages
        self._queue_chunks = config.queue_chunks
        self._source: LatentSource | None
        self._output: VideoOutput | None
        if isinstance(request, DecodeRequest):
            self.feed: LatentFeed | None = None
            self._source = WholeLatents(request.latents)
            self._output = VideoOutput(request.fps, config.encoder, request.soundtrack)
        else:
            self.feed = self._source = LatentFeed(
                asyncio.get_running_loop(), config.push_queue_blocks
            )
            self._output = VideoOutput(
                request.fps, config.encoder, audio_format=request.audio_format
            )
        self._job: Job | None = None
        self.stop_error: VaecastError | None = None  # a cancel or abort on its way
        self._stop_status = JobStatus.CANCELLED  # how a cancelled task ends the job
        self._renditions: dict[str, _RenditionRun] = {}
        # The latents' shape (a push session's first block's, once it has come).
        self._latent_shape: tuple[int, ...] | None = (
            tuple(request.latents.shape) if isinstance(request, DecodeRequest) else None
        )
        if preview is not None:
            assert self._source is not None and self._output is not None
            # A push session's blocks, to each through a tap of its own: stopping one
            # rendition must not stop the feed the other reads, and the final, behind,
            # must not hold back the producer or the preview.
            final_source, preview_source = (
                (self._source, self._source) if self.feed is None else self.feed.split(2, lagging=0)
            )
            gate = PreviewFirst() if preview.first else None
            self._renditions = {
                PREVIEW: _RenditionRun(
                    PREVIEW,
                    preview_source if gate is None else PreviewSide(preview_source, gate),
                    self._output,
                    preview.workers,
                ),
                FINAL: _RenditionRun(
                    FINAL,
                    final_source if gate is None else FinalSide(final_source, gate),
                    self._output,
                    workers,
                ),
            }

    async def run(self, job: Job, slot: AbstractAsyncContextManager[Any]) -> None:
        self._job = job
        try:
            source, output = self._source, self._output
            assert source is not None and output is not None, "a job runs once"
            if self.feed is not None:
                first_shape = self._latent_shape = await self.feed.first_block_shape()
                job.stream_plan = job.decoder.plan_stream(first_shape)
                job.apply(Geometry(job.stream_plan.width, job.stream_plan.height))
            async with slot:
                job.apply(Started())
                started = time.perf_counter()
                plan = job.plan or job.stream_plan
                assert plan is not None
                if self._renditions:
                    await self._run_renditions(job, plan)
                else:
                    await self._pipeline(job, source, job.decoder, plan, output, self._workers)
                    await state_duration(job.final)
                    job.apply(Completed())
                    job.log.finish()
            if not job.record.is_final:  # a job with a preview ends as its final did
                final = job.record.final_ended
                if final is not None and final.error is not None:
                    job.end(final.status, final.error)
                else:
                    job.apply(Completed())
            job.metrics.decode_seconds.observe(time.perf_counter() - started)
        except asyncio.CancelledError:
            stop = self.stop_error or DecodeCancelled("cancelled")
            await job.end_keeping_partial(self._stop_status, stop)
            # Swallowed on purpose: a cancelled job is an outcome, recorded above,
            # and nothing awaits this task expecting the cancel to propagate.
        except VaecastError as error:
            await job.end_keeping_partial(JobStatus.FAILED, error)
        except Exception as error:
            log.exception("job %s failed", job.id)
            failed = DecodeFailedError(f"internal error: {error}")
            await job.end_keeping_partial(JobStatus.FAILED, failed)
        finally:
            self._source = self._output = None

    async def _pipeline(
        self,
        job: Job,
        source: LatentSource,
        decoder: ChunkedDecoder,
        plan: DecodePlan | StreamPlan,
        output: VideoOutput,
        workers: Workers,
        variant: Variant = FINAL,
        keyframes: Callable[[int], bool] | None = None,
    ) -> None:
        await run_pipeline(
            source,
            decoder,
            plan,
            output,
            job.sink(variant),  # the log, and the HLS parts
            workers,
            stages=self._stages,
            observer=self if variant == FINAL else _PreviewObserver(job),
            queue_chunks=self._queue_chunks,
            keyframes=keyframes,
        )

    async def _run_renditions(self, job: Job, plan: DecodePlan | StreamPlan) -> None:
        """Both renditions, each to its own end, and the live one spliced from them;
        cancelled, all stop."""
        assert job.preview is not None
        live = None if job.live is None else LiveRendition(job)
        runs = [run for run in self._renditions.values() if run.stop is None]
        for run in self._renditions.values():
            if run.stop is not None:  # stopped before it ran: it holds nothing back
                run.source.cancel()
        for run in runs:
            decoder = job.rendition(run.variant).decoder
            own_plan = plan if run.variant == FINAL else self._preview_plan(decoder)
            keyframes = None
            if live is not None:
                final = run.variant == FINAL
                keyframes = live.final_keyframe if final else live.preview_keyframe
            run.task = asyncio.create_task(self._rendition(job, run, decoder, own_plan, keyframes))
        tasks = [run.task for run in runs if run.task is not None]
        if live is not None:
            tasks.append(asyncio.create_task(live.run()))
        try:
            await asyncio.wait(tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _rendition(
        self,
        job: Job,
        run: _RenditionRun,
        decoder: ChunkedDecoder,
        plan: DecodePlan | StreamPlan,
        keyframes: Callable[[int], bool] | None,
    ) -> None:
        """One rendition's pipeline, and how it ended (`VariantEnded`)."""
        variant, log = run.variant, job.rendition(run.variant).log
        try:
            await self._pipeline(
                job, run.source, decoder, plan, run.output, run.workers, variant, keyframes
            )
            await state_duration(job.rendition(variant))
        except asyncio.CancelledError:
            if run.stop is None:
                raise  # the job is being stopped: it records how
            self._variant_ended(job, variant, JobStatus.CANCELLED, run.stop)
        except VaecastError as error:
            self._variant_ended(job, variant, JobStatus.FAILED, error)
        except Exception as error:
            log_message = "job %s: its %s rendition failed"
            log.exception(log_message, job.id, variant)
            failed = DecodeFailedError(f"internal error: {error}")
            self._variant_ended(job, variant, JobStatus.FAILED, failed)
        else:
            if variant == FINAL and job.record.final_caught_up():
                job.apply(FinalReady())
            job.apply(VariantEnded(variant, JobStatus.COMPLETED))
            log.finish()

    def _variant_ended(
        self, job: Job, variant: Variant, status: JobStatus, error: VaecastError
    ) -> None:
        error = error.detached()
        job.apply(VariantEnded(variant, status, error))
        job.rendition(variant).log.abort(error)

    def _preview_plan(self, decoder: ChunkedDecoder) -> DecodePlan | StreamPlan:
        """The preview decoder's plan of the job's latents (a push session's stream plan)."""
        assert self._latent_shape is not None
        if self.feed is not None:
            return decoder.plan_stream(self._latent_shape)
        return decoder.plan(self._latent_shape)

    def cancel_variant(self, job: Job, variant: Variant, error: VaecastError) -> None:
        """Stop one rendition (DELETE ?variant=); the other goes on. Stopping the
        last one running stops the job."""
        run = self._renditions[variant]
        other = self._renditions[PREVIEW if variant == FINAL else FINAL]
        other_ended = (
            job.record.final_ended is not None
            if other.variant == FINAL
            else job.record.preview is not None and job.record.preview.is_final
        )
        if other_ended or other.stop is not None:
            # A stopped rendition is dropped, whichever ends the job: no partial of it.
            job.keeps_partial = False
            self.cancel(job, error.message, by_shutdown=False)
            return
        if run.stop is not None:
            return
        run.stop = error
        if run.task is not None:
            run.task.cancel()
        elif job.record.status is JobStatus.QUEUED:  # it never starts
            self._variant_ended(job, variant, JobStatus.CANCELLED, error)

    def cancel(self, job: Job, reason: str, by_shutdown: bool) -> None:
        self.stop_error = CancelledByShutdown(reason) if by_shutdown else DecodeCancelled(reason)
        job.stop_task()

    def abort(self, job: Job, error: VaecastError) -> None:
        self.stop_error, self._stop_status = error, JobStatus.FAILED
        if self.feed is not None:
            self.feed.fail(error)
        job.stop_task()

    def length_known(self, job: Job, plan: DecodePlan, preview_chunks: int | None) -> None:
        job.plan = plan
        job.apply(LengthKnown(plan_facts(plan), preview_chunks))

    def interrupted(self, job: Job) -> None:
        job.end(self._stop_status, self.stop_error or DecodeCancelled("cancelled"))
        self._source = self._output = None

    # The pipeline's observer.

    def started(self, content_type: str) -> None:
        assert self._job is not None
        self._job.apply(Encoding(content_type))

    def fragment(self, done: FragmentDone) -> None:
        job = self._job
        assert job is not None
        metrics = job.metrics
        metrics.chunk_encode_seconds.observe(done.encode_s)
        now = time.perf_counter()
        if job.record.chunks_done == 0:
            assert job.record.created is not None
            metrics.time_to_first_fragment.observe(now - job.record.created)
            if job.preview is not None:
                metrics.variant_time_to_first_fragment.labels(FINAL).observe(
                    now - job.record.created
                )
        arrived = None if self.feed is None else self.feed.chunk_arrivals.pop(done.index, None)
        if arrived is not None:
            metrics.block_to_fragment_seconds.observe(now - arrived)
        latency_s = None if arrived is None else now - arrived
        job.apply(_chunk_encoded(done, now, FINAL, latency_s))
        commits = job.record.commits
        fragment_slack = slack(commits[0], commits[-1])
        metrics.fragment_slack.observe(fragment_slack)
        if fragment_slack < 0:
            metrics.predicted_stalls.inc()
        _check_final_ready(job)


class _PreviewObserver:
    """The preview rendition's pipeline observer: its chunks, as the preview's."""

    def __init__(self, job: Job) -> None:
        self._job = job

    def started(self, content_type: str) -> None:
        # The final's encoder has the same settings: the same Content-Type. The preview
        # usually opens first, and its viewers' answers name the codecs from then on.
        if "codecs=" not in self._job.record.content_type:
            self._job.apply(Encoding(content_type))

    def fragment(self, done: FragmentDone) -> None:
        job = self._job
        preview = job.record.preview
        assert preview is not None and job.record.created is not None
        now = time.perf_counter()
        if preview.chunks_done == 0:
            job.metrics.variant_time_to_first_fragment.labels(PREVIEW).observe(
                now - job.record.created
            )
        job.apply(_chunk_encoded(done, now, PREVIEW))
        _check_final_ready(job)


def _chunk_encoded(
    done: FragmentDone, at: float, variant: Variant, latency_s: float | None = None
) -> ChunkEncoded:
    return ChunkEncoded(
        index=done.index,
        total=done.total,
        frame_start=done.frame_start,
        frames=done.frames,
        bytes=done.bytes,
        encode_s=done.encode_s,
        decode_wait_s=done.decode_wait_s,
        latency_s=latency_s,
        at=at,
        variant=variant,
    )


def _check_final_ready(job: Job) -> None:
    record = job.record
    if record.final_caught_up():  # (never for a job without a preview)
        job.apply(FinalReady())
        assert record.preview is not None and record.preview.first_fragment is not None
        assert record.final_ready is not None
        job.metrics.final_ready_seconds.observe(record.final_ready - record.preview.first_fragment)
