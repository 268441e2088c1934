"""The runner that decodes a job in this process: `run_pipeline` into the job's log.

It waits for a decode slot (a push session first waits for its first block outside
the slot: a session takes a slot only once it has something to decode), runs the
pipeline with the job as its sink and itself as the observer, and applies to the
job's record what happens: started, the encoder's Content-Type, each chunk, and how
the run ended (completed, failed, cancelled). The latents and the waveform are
dropped when the job ends: a finished job keeps only its MP4, which retention
accounts for.
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import AbstractAsyncContextManager
from typing import Any

from vaecast.errors import CancelledByShutdown, DecodeCancelled, DecodeFailedError, VaecastError
from vaecast.job_record import (
    ChunkEncoded,
    Completed,
    Encoding,
    Geometry,
    JobStatus,
    LengthKnown,
    Started,
)
from vaecast.latent_feed import LatentFeed
from vaecast.models.base import DecodePlan
from vaecast.pipeline import (
    FragmentDone,
    LatentSource,
    Stages,
    VideoOutput,
    WholeLatents,
    Workers,
    run_pipeline,
)
from vaecast.server.config import ServerConfig
from vaecast.server.stream.job import Job, plan_facts
from vaecast.server.stream.job_requests import DecodeRequest, PushRequest

log = logging.getLogger("vaecast.jobs")


class LocalRunner:
    """Decodes one job here (see the module docstring)."""

    def __init__(
        self,
        request: DecodeRequest | PushRequest,
        config: ServerConfig,
        workers: Workers,
        stages: Stages,
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

    async def run(self, job: Job, slot: AbstractAsyncContextManager[Any]) -> None:
        self._job = job
        try:
            source, output = self._source, self._output
            assert source is not None and output is not None, "a job runs once"
            if self.feed is not None:
                first_shape = await self.feed.first_block_shape()
                job.stream_plan = job.decoder.plan_stream(first_shape)
                job.apply(Geometry(job.stream_plan.width, job.stream_plan.height))
            async with slot:
                job.apply(Started())
                started = time.perf_counter()
                plan = job.plan or job.stream_plan
                assert plan is not None
                await run_pipeline(
                    source,
                    job.decoder,
                    plan,
                    output,
                    job,  # the sink: the log, and the HLS parts
                    self._workers,
                    stages=self._stages,
                    observer=self,
                    queue_chunks=self._queue_chunks,
                )
            job.apply(Completed())
            job.log.finish()
            job.metrics.decode_seconds.observe(time.perf_counter() - started)
        except asyncio.CancelledError:
            job.end(self._stop_status, self.stop_error or DecodeCancelled("cancelled"))
            # Swallowed on purpose: a cancelled job is an outcome, recorded above,
            # and nothing awaits this task expecting the cancel to propagate.
        except VaecastError as error:
            job.end(JobStatus.FAILED, error)
        except Exception as error:
            log.exception("job %s failed", job.id)
            job.end(JobStatus.FAILED, DecodeFailedError(f"internal error: {error}"))
        finally:
            self._source = self._output = None

    def cancel(self, job: Job, reason: str, by_shutdown: bool) -> None:
        self.stop_error = CancelledByShutdown(reason) if by_shutdown else DecodeCancelled(reason)
        job.stop_task()

    def abort(self, job: Job, error: VaecastError) -> None:
        self.stop_error, self._stop_status = error, JobStatus.FAILED
        if self.feed is not None:
            self.feed.fail(error)
        job.stop_task()

    def length_known(self, job: Job, plan: DecodePlan) -> None:
        job.plan = plan
        job.apply(LengthKnown(plan_facts(plan)))

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
        if job.chunks_done == 0:
            assert job.record.created is not None
            metrics.time_to_first_fragment.observe(now - job.record.created)
        arrived = None if self.feed is None else self.feed.chunk_arrivals.pop(done.index, None)
        if arrived is not None:
            metrics.block_to_fragment_seconds.observe(now - arrived)
        job.apply(
            ChunkEncoded(
                index=done.index,
                total=done.total,
                frame_start=done.frame_start,
                frames=done.frames,
                bytes=done.bytes,
                encode_s=done.encode_s,
                decode_wait_s=done.decode_wait_s,
                latency_s=None if arrived is None else now - arrived,
                at=now,
            )
        )
