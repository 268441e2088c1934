"""A job: one video's state, progress events and viewers, and the run of its pipeline.

The job runs `vaecast.pipeline.run_pipeline` with its SegmentLog as the sink, so
every fragment lands in a log that any number of viewers follow, each at its own
pace (`async with job.viewer()` counts them, so retention never evicts a video
someone is reading). It records how the run ended (completed, failed, cancelled)
and publishes progress as events. Where it waits for a decode slot, and when it is
evicted, is the manager's and retention's business, not its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from enum import StrEnum
from fractions import Fraction
from typing import Any

import torch

from vaecast.codecs.stream import Soundtrack
from vaecast.errors import CancelledByShutdown, DecodeCancelled, DecodeFailedError, VaecastError
from vaecast.latent_feed import LatentFeed
from vaecast.models.base import ChunkedDecoder, DecodePlan, StreamPlan
from vaecast.pipeline import (
    AudioFormat,
    FragmentDone,
    LatentSource,
    Stages,
    VideoOutput,
    WholeLatents,
    Workers,
    run_pipeline,
)
from vaecast.server.broadcast import Broadcast
from vaecast.server.config import ServerConfig
from vaecast.server.fanout_sender import FanoutSender
from vaecast.server.hls import PartIndex
from vaecast.server.job_timings import (
    chunk_event,
    job_timings,
    progress_percent,
    realtime_factor,
)
from vaecast.server.metrics import Metrics
from vaecast.server.segment_log import FollowableLog, SegmentLog

log = logging.getLogger("vaecast.jobs")


class JobStatus(StrEnum):
    QUEUED = "queued"
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


FINAL_STATUSES = frozenset({JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED})


class PushKind(enum.Enum):
    """What a push session's blocks are."""

    LATENTS = "latents"
    FRAMES = "frames"


@dataclass(frozen=True, slots=True)
class DecodeRequest:
    """A whole video's latents, uploaded or rendered."""

    latents: torch.Tensor  # BCTHW float32, checked by vaecast.latent_files
    model: str
    fps: Fraction
    soundtrack: Soundtrack | None = None
    crop: tuple[int, int] | None = None  # (width, height): the decoded frames' top-left


@dataclass(frozen=True, slots=True)
class BatchRequest:
    """An upload of B > 1 videos (a pipeline's `num_videos_per_prompt`): a job each."""

    videos: tuple[DecodeRequest, ...]


@dataclass(frozen=True, slots=True)
class PushRequest:
    """A push session: latents (or, `kind` "frames", frames a producer decoded) will
    arrive in blocks, with audio of this format if any."""

    model: str
    fps: Fraction
    audio_format: AudioFormat | None = None
    kind: PushKind = PushKind.LATENTS
    value_range: tuple[float, float] = (0.0, 1.0)  # of float frames
    crop: tuple[int, int] | None = None
    batch: int = 1  # videos pushed together (a job each)


class Job:
    def __init__(
        self,
        request: DecodeRequest | PushRequest,
        decoder: ChunkedDecoder,
        plan: DecodePlan | None,
        config: ServerConfig,
        metrics: Metrics,
        fanout: FanoutSender | None = None,
    ) -> None:
        """`plan` is None for a push session: its length is known at its last block.
        `fanout`: the server's thread for its viewers' sends (None: the loop sends)."""
        self._init_state(
            "video_" + secrets.token_hex(12),
            request.model,
            request.fps,
            decoder,
            plan,
            config,
            metrics,
            fanout,
        )
        # The latents and the waveform are dropped when the job ends: a finished job
        # keeps only its MP4, which retention accounts for.
        self._source: LatentSource | None
        self._output: VideoOutput | None
        if isinstance(request, DecodeRequest):
            self.feed: LatentFeed | None = None
            self._source = WholeLatents(request.latents)
            self._output = VideoOutput(request.fps, config.encoder, request.soundtrack)
            audio = request.soundtrack
            self.audio = (
                None
                if audio is None
                else {"sample_rate": audio.sample_rate, "channels": audio.channels}
            )
        else:
            self.push_kind = request.kind
            self.feed = self._source = LatentFeed(
                asyncio.get_running_loop(), config.push_queue_blocks
            )
            self._output = VideoOutput(
                request.fps, config.encoder, audio_format=request.audio_format
            )
            audio_format = request.audio_format
            self.audio = (
                None
                if audio_format is None
                else {"sample_rate": audio_format.sample_rate, "channels": audio_format.channels}
            )
        self._emit("queued")

    def _init_state(
        self,
        job_id: str,
        model: str,
        fps: Fraction,
        decoder: ChunkedDecoder,
        plan: DecodePlan | None,
        config: ServerConfig,
        metrics: Metrics,
        fanout: FanoutSender | None = None,
    ) -> None:
        """What every job has, whatever runs it (a mirror of a job in a Ray cluster too)."""
        self.id = job_id
        self.decoder = decoder
        self.push_kind: PushKind | None = None  # what a push session's blocks are
        self.plan = plan
        self.config = config
        self.metrics = metrics
        self.model = model
        self.fps = fps
        # The frame size, before the length is known (a push session's first block).
        self.stream_plan: StreamPlan | None = None
        self.status = JobStatus.QUEUED
        self.error: VaecastError | None = None
        self.log = SegmentLog(config.spill_threshold_bytes, config.spill_dir)
        # Its caught-up live viewers, sent each segment in one batch.
        self.broadcast = Broadcast(self.log, metrics.bytes_sent, fanout)
        # Each part's duration and keyframe, for the HLS playlist of the same bytes.
        self.parts = PartIndex()
        # Progress as events (queued, started, chunk..., then done or error), for
        # GET /v1/videos/{id}/events; closed when the job ends.
        self.events: FollowableLog[dict[str, Any]] = FollowableLog()
        self.content_type = "video/mp4"
        self.chunks_done = 0
        self.frames_done = 0
        self.created_at = time.time()
        self._created = time.perf_counter()
        self._started: float | None = None
        self._first_fragment: float | None = None
        self._finished: float | None = None
        self.finished_at: float | None = None  # monotonic, for retention
        self.decode_wait_s = 0.0  # loop time spent waiting for the decoder's next chunk
        self.encode_s = 0.0
        self._viewers = 0
        self._abort_status = JobStatus.CANCELLED  # how a cancelled task ends the job
        self._task: asyncio.Task[None] | None = None

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

    # State.

    @property
    def finished(self) -> bool:
        return self.status in FINAL_STATUSES

    @property
    def progress(self) -> int | None:
        """Percent of chunks decoded and encoded; None while the length is unknown."""
        return progress_percent(self.chunks_done, None if self.plan is None else self.plan.chunks)

    @property
    def realtime_factor(self) -> float | None:
        """Seconds of video made per second of decoding: above 1, faster than real time."""
        return realtime_factor(self.frames_done, self.fps, self._started, self._finished)

    @property
    def run_seconds(self) -> float | None:
        """From the start of decoding to the end; None unless both happened."""
        if self._started is None or self._finished is None:
            return None
        return self._finished - self._started

    def to_json(self) -> dict[str, Any]:
        """The job as the API shows it, less what the routes add (URLs, queue place)."""
        plan = self.plan
        geometry = plan or self.stream_plan
        return {
            "id": self.id,
            "object": "video",
            "input": "latents" if self.feed is None else "push",
            "model": self.model,
            "status": self.status.value,
            "progress": self.progress,
            "created_at": int(self.created_at),
            "frames": None if plan is None else plan.frames,
            "width": None if geometry is None else geometry.width,
            "height": None if geometry is None else geometry.height,
            "fps": float(self.fps),
            "audio": self.audio,
            "seconds": None if plan is None else round(float(plan.frames / self.fps), 3),
            "chunks": {"done": self.chunks_done, "total": None if plan is None else plan.chunks},
            "frames_done": self.frames_done,
            "bytes": self.log.size,
            "content_type": self.content_type,
            "timings": self._timings(),
            "realtime_factor": self.realtime_factor,
            "error": (
                {"type": self.error.type, "message": self.error.message}
                if self.error is not None and self.status is not JobStatus.COMPLETED
                else None
            ),
            "replica": None,  # the decoder replica's id in Ray mode (vaecast.cluster)
        }

    # Running.

    def attach(self, task: asyncio.Task[None]) -> None:
        """The task that runs this job (the manager's): cancelled by `cancel`."""
        self._task = task
        task.add_done_callback(self._after_task)

    def cancel(self, reason: str = "cancelled", *, by_shutdown: bool = False) -> None:
        """Stop the job: a queued one never starts, a running one stops at its next chunk.

        A job stopped by shutdown records CancelledByShutdown (503: try again
        elsewhere), any other cancel DecodeCancelled (409).
        """
        if self.finished:
            return
        self.error = CancelledByShutdown(reason) if by_shutdown else DecodeCancelled(reason)
        if self._task is not None:
            self._task.cancel()

    def on_end(self, callback: Callable[[], None]) -> None:
        """Call `callback` once the job has ended (at once if it has)."""
        if self._task is None or self._task.done():
            callback()
        else:
            self._task.add_done_callback(lambda _: callback())

    async def wait(self) -> None:
        if self._task is not None:
            await asyncio.shield(self._task)

    def abort(self, error: VaecastError) -> None:
        """End the job as failed with `error` (a push session gone idle, say)."""
        if self.finished:
            return
        self.error = error
        self._abort_status = JobStatus.FAILED
        if self.feed is not None:
            self.feed.fail(error)
        if self._task is not None:
            self._task.cancel()

    def length_known(self, plan: DecodePlan) -> None:
        """A push session's last block came: the whole video's plan."""
        self.plan = plan
        self._emit("length", frames=plan.frames, chunks=plan.chunks)

    async def run(
        self, slot: AbstractAsyncContextManager[Any], workers: Workers, stages: Stages
    ) -> None:
        """Wait for `slot`, then run the pipeline into the log; record how it ended.

        A push session first waits for its first block outside the slot: a session
        takes a decode slot only once it has something to decode.
        """
        try:
            source, output = self._source, self._output
            assert source is not None and output is not None, "a job runs once"
            if self.feed is not None:
                first_shape = await self.feed.first_block_shape()
                self.stream_plan = self.decoder.plan_stream(first_shape)
            async with slot:
                self.status = JobStatus.IN_PROGRESS
                self._started = time.perf_counter()
                self._emit("started")
                plan = self.plan or self.stream_plan
                assert plan is not None
                await run_pipeline(
                    source,
                    self.decoder,
                    plan,
                    output,
                    self,  # the sink: the log, and the HLS parts
                    workers,
                    stages=stages,
                    observer=self,
                    queue_chunks=self.config.queue_chunks,
                )
            self.status = JobStatus.COMPLETED
            self.log.finish()
            self.metrics.decode_seconds.observe(time.perf_counter() - self._started)
            self._emit("done", job=self.to_json())
        except asyncio.CancelledError:
            self._end(self._abort_status, self.error or DecodeCancelled("cancelled"))
            # Swallowed on purpose: a cancelled job is an outcome, recorded above,
            # and nothing awaits this task expecting the cancel to propagate.
        except VaecastError as error:
            self._end(JobStatus.FAILED, error)
        except Exception as error:
            log.exception("job %s failed", self.id)
            self._end(JobStatus.FAILED, DecodeFailedError(f"internal error: {error}"))
        finally:
            self._close_out()

    # The pipeline's sink and observer.

    async def append(self, segment: bytes) -> None:
        await self.log.append(segment)
        self.parts.add(segment)

    def started(self, content_type: str) -> None:
        self.content_type = content_type

    def fragment(self, done: FragmentDone) -> None:
        self.decode_wait_s += done.decode_wait_s
        self.encode_s += done.encode_s
        self.metrics.chunk_encode_seconds.observe(done.encode_s)
        self.chunks_done += 1
        self.frames_done += done.frames
        now = time.perf_counter()
        if self._first_fragment is None:
            self._first_fragment = now
            self.metrics.time_to_first_fragment.observe(self._first_fragment - self._created)
        arrived = None if self.feed is None else self.feed.chunk_arrivals.pop(done.index, None)
        if arrived is not None:
            self.metrics.block_to_fragment_seconds.observe(now - arrived)
        self._emit(
            "chunk",
            **chunk_event(
                index=done.index,
                total=done.total,
                frame_start=done.frame_start,
                frames=done.frames,
                chunk_bytes=done.bytes,
                frames_done=self.frames_done,
                total_bytes=self.log.size,
                progress=self.progress,
                latency_s=None if arrived is None else now - arrived,
            ),
        )

    # Endings.

    def _after_task(self, task: asyncio.Task[None]) -> None:
        # A task cancelled before its first step never enters `run`, so nothing
        # there closed the logs: do it here, or readers would wait forever.
        if not self.finished:
            self._end(self._abort_status, self.error or DecodeCancelled("cancelled"))
        self._close_out()

    def _end(self, status: JobStatus, error: VaecastError) -> None:
        self.status = status
        self.error = error = error.detached()
        self.log.abort(error)
        self._emit("error", error={"type": error.type, "message": error.message})

    def _close_out(self) -> None:
        """Bookkeeping of a job that ended, however it ended; runs once."""
        if self.finished_at is not None:
            return
        self._finished = self.finished_at = time.perf_counter()
        self._source = self._output = None
        self.events.finish()
        self.metrics.jobs_finished.labels(self.status.value).inc()
        log.info("job %s", self._summary())

    def _emit(self, event: str, **fields: Any) -> None:
        self.events.append({"event": event, "status": self.status.value, **fields})

    def _timings(self) -> dict[str, float | None]:
        return job_timings(
            self._created,
            self._started,
            self._first_fragment,
            self._finished,
            self.decode_wait_s,
            self.encode_s,
        )

    def _summary(self) -> str:
        timings = self._timings()
        error = self.error.message if self.error and self.status is not JobStatus.COMPLETED else ""
        return (
            f"id={self.id} model={self.model} status={self.status.value} "
            f"frames={self.frames_done}/{None if self.plan is None else self.plan.frames} "
            f"chunks={self.chunks_done}/{None if self.plan is None else self.plan.chunks} "
            f"bytes={self.log.size} "
            f"ttff_s={timings['time_to_first_fragment_s']} total_s={timings['total_s']} "
            f"encode_s={timings['encode_s']} error={error!r}"
        )
