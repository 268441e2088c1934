"""Jobs: one decode each, from queued to a finished (or broken) fragmented MP4.

A job owns, for its lifetime: a ChunkBridge (decoder thread -> loop), one
VideoStreamEncoder (used by one executor thread at a time), and a SegmentLog that
any number of viewers follow. The job task on the event loop takes each chunk
off the bridge, encodes it in an executor, and appends exactly one fragment.

Whatever ends the job (done, decoder error, cancel, shutdown), the task does not
finish before the decoder thread has returned and the encoder is closed, so no
thread, codec or queued chunk outlives it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Coroutine, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import Enum, StrEnum
from fractions import Fraction
from typing import Any

import torch

from vaecast.codecs.stream import Soundtrack, VideoStreamEncoder
from vaecast.errors import (
    CancelledByShutdown,
    DecodeCancelled,
    DecodeFailedError,
    GoneError,
    JobStateError,
    NotFoundError,
    PayloadTooLargeError,
    ServerBusyError,
    ShuttingDownError,
    UnknownModelError,
    VaecastError,
)
from vaecast.models.base import ChunkedDecoder, DecodePlan
from vaecast.server.bridge import ChunkBridge, DecodeEnded, DecodeRaised, HostChunk
from vaecast.server.config import ServerConfig
from vaecast.server.metrics import Metrics
from vaecast.server.segment_log import FollowableLog, SegmentLog

log = logging.getLogger("vaecast.jobs")

DEFAULT_RETRY_AFTER_S = 5.0
RETENTION_SWEEP_MAX_S = 10.0

# What builds a job's encoder: VideoStreamEncoder's signature. Injected so a caller
# can wrap or replace it (fault injection, measurements) without monkeypatching.
EncoderFactory = Callable[..., VideoStreamEncoder]


class JobStatus(StrEnum):
    QUEUED = "queued"
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


FINAL_STATUSES = frozenset({JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED})


@dataclass(frozen=True, slots=True)
class DecodeRequest:
    latents: torch.Tensor  # BCTHW float32, checked by vaecast.latent_files
    model: str
    fps: Fraction
    soundtrack: Soundtrack | None = None


class EvictionReason(Enum):
    """Why a job's video is no longer kept: the 410 message and the metric label."""

    AGE = "age"
    MEMORY = "memory"
    DELETED = "deleted"

    def describe(self, retention_s: float) -> str:
        if self is EvictionReason.AGE:
            return f"evicted {retention_s:g} s after it ended"
        if self is EvictionReason.MEMORY:
            return "evicted to stay within the memory budget"
        return "deleted by request"


class Job:
    def __init__(
        self,
        request: DecodeRequest,
        decoder: ChunkedDecoder,
        plan: DecodePlan,
        config: ServerConfig,
        metrics: Metrics,
        queue: list[Job],
        encoder_factory: EncoderFactory = VideoStreamEncoder,
    ) -> None:
        self.id = "video_" + secrets.token_hex(12)
        self.metrics = metrics
        # The manager's FIFO of jobs waiting for a slot, shared: our place in it is
        # our queue position.
        self._queue = queue
        self.readers = 0  # viewers being streamed to right now
        # The latents and the waveform are dropped when the job ends: a finished job
        # keeps only its MP4, which retention accounts for.
        self._request: DecodeRequest | None = request
        self.model = request.model
        self.fps = request.fps
        soundtrack = request.soundtrack
        self.audio = (
            None
            if soundtrack is None
            else {"sample_rate": soundtrack.sample_rate, "channels": soundtrack.channels}
        )
        self._encoder_factory = encoder_factory
        self.decoder = decoder
        self.plan = plan
        self.config = config
        self.status = JobStatus.QUEUED
        self.error: VaecastError | None = None
        self.log = SegmentLog(config.spill_threshold_bytes, config.spill_dir)
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
        self._bridge: ChunkBridge | None = None
        self._task: asyncio.Task[None] | None = None
        self._emit("queued")

    def start(
        self,
        slots: asyncio.Semaphore,
        decode_pool: ThreadPoolExecutor,
        encode_pool: ThreadPoolExecutor,
    ) -> asyncio.Task[None]:
        """Run the job in a task of its own: wait for a decode slot, then decode."""
        self._task = asyncio.create_task(
            self._run(slots, decode_pool, encode_pool), name=f"job-{self.id}"
        )
        self._task.add_done_callback(self._after_task)
        return self._task

    def _after_task(self, task: asyncio.Task[None]) -> None:
        # A task cancelled before its first step never enters `run`, so nothing
        # there closed the logs: do it here, or readers would wait forever.
        if not self.finished:
            self._end(JobStatus.CANCELLED, self.error or DecodeCancelled("cancelled"))
        self._close_out()

    def _close_out(self) -> None:
        """Bookkeeping of a job that ended, however it ended; runs once."""
        if self.finished_at is not None:
            return
        self._finished = self.finished_at = time.perf_counter()
        self._request = None
        if self in self._queue:
            self._queue.remove(self)
        self.events.finish()
        self.metrics.jobs_finished.labels(self.status.value).inc()
        log.info("job %s", self._summary())

    @property
    def queue_position(self) -> int | None:
        """1 for the next job to start; None once started."""
        return self._queue.index(self) + 1 if self in self._queue else None

    @property
    def progress(self) -> int:
        """Percent of chunks decoded and encoded."""
        return round(100 * self.chunks_done / self.plan.chunks)

    @property
    def finished(self) -> bool:
        return self.status in FINAL_STATUSES

    @property
    def run_seconds(self) -> float | None:
        """From the start of decoding to the end; None unless both happened."""
        if self._started is None or self._finished is None:
            return None
        return self._finished - self._started

    def cancel(self, reason: str = "cancelled", *, by_shutdown: bool = False) -> None:
        """Stop the job: a queued one never starts, a running one stops at its next chunk.

        A job stopped by shutdown records CancelledByShutdown (503: try again
        elsewhere), any other cancel DecodeCancelled (409).
        """
        if self.finished:
            return
        self.error = CancelledByShutdown(reason) if by_shutdown else DecodeCancelled(reason)
        if self._bridge is not None:
            self._bridge.cancel()
        if self._task is not None:
            self._task.cancel()

    async def wait(self) -> None:
        if self._task is not None:
            await asyncio.shield(self._task)

    def to_json(self) -> dict[str, Any]:
        plan = self.plan
        return {
            "id": self.id,
            "object": "video",
            "model": self.model,
            "status": self.status.value,
            "queue_position": self.queue_position,
            "progress": self.progress,
            "created_at": int(self.created_at),
            "frames": plan.frames,
            "width": plan.width,
            "height": plan.height,
            "fps": float(self.fps),
            "audio": self.audio,
            "seconds": round(float(plan.frames / self.fps), 3),
            "chunks": {"done": self.chunks_done, "total": plan.chunks},
            "frames_done": self.frames_done,
            "bytes": self.log.size,
            "content_type": self.content_type,
            "timings": self._timings(),
            "error": (
                {"type": self.error.type, "message": self.error.message}
                if self.error is not None and self.status is not JobStatus.COMPLETED
                else None
            ),
            "urls": {"self": f"/v1/videos/{self.id}", "content": f"/v1/videos/{self.id}/content"},
        }

    def _timings(self) -> dict[str, float | None]:
        def since_created(moment: float | None) -> float | None:
            return None if moment is None else round(moment - self._created, 4)

        return {
            "queued_s": since_created(self._started),
            "time_to_first_fragment_s": since_created(self._first_fragment),
            "total_s": since_created(self._finished),
            "decode_wait_s": round(self.decode_wait_s, 4),
            "encode_s": round(self.encode_s, 4),
        }

    async def _run(
        self,
        slots: asyncio.Semaphore,
        decode_pool: ThreadPoolExecutor,
        encode_pool: ThreadPoolExecutor,
    ) -> None:
        """The job task: wait for a decode slot, then decode, encode and log every chunk."""
        try:
            async with slots:
                self._queue.remove(self)
                self.status = JobStatus.IN_PROGRESS
                self._started = time.perf_counter()
                self._emit("started")
                await self._decode_and_encode(decode_pool, encode_pool)
            self.status = JobStatus.COMPLETED
            self.log.finish()
            self.metrics.decode_seconds.observe(time.perf_counter() - self._started)
            self._emit("done", job=self.to_json())
        except asyncio.CancelledError:
            self._end(JobStatus.CANCELLED, self.error or DecodeCancelled("cancelled"))
            # Swallowed on purpose: a cancelled job is an outcome, recorded above,
            # and nothing awaits this task expecting the cancel to propagate.
        except VaecastError as error:
            self._end(JobStatus.FAILED, error)
        except Exception as error:
            log.exception("job %s failed", self.id)
            self._end(JobStatus.FAILED, DecodeFailedError(f"internal error: {error}"))
        finally:
            self._close_out()

    def _end(self, status: JobStatus, error: VaecastError) -> None:
        self.status = status
        self.error = error
        self.log.abort(error)
        self._emit("error", error={"type": error.type, "message": error.message})

    def _emit(self, event: str, **fields: Any) -> None:
        self.events.append({"event": event, "status": self.status.value, **fields})

    async def _decode_and_encode(
        self, decode_pool: ThreadPoolExecutor, encode_pool: ThreadPoolExecutor
    ) -> None:
        loop = asyncio.get_running_loop()
        plan, request = self.plan, self._request
        assert request is not None, "a job runs once"
        encoder = await loop.run_in_executor(
            encode_pool,
            functools.partial(
                self._encoder_factory,
                plan.width,
                plan.height,
                request.fps,
                self.config.encoder,
                soundtrack=request.soundtrack,
                total_frames=plan.frames,
            ),
        )
        bridge = self._bridge = ChunkBridge(
            loop, self.decoder.value_range, max_chunks=self.config.queue_chunks
        )
        latents = request.latents
        del request  # the job's reference goes at close-out; keep no other

        def decode(on_chunk: Any) -> None:
            self.decoder.decode_chunks(latents.to(self.decoder.device), on_chunk)

        decoding = loop.run_in_executor(decode_pool, bridge.run, decode)
        try:
            self.content_type = encoder.content_type
            await self._append(encoder.init_segment)
            while True:
                waited_from = time.perf_counter()
                item = await bridge.get()
                self.decode_wait_s += time.perf_counter() - waited_from
                if isinstance(item, DecodeEnded):
                    break
                if isinstance(item, DecodeRaised):
                    raise DecodeFailedError(f"the decoder failed: {item.error}") from item.error
                self._check_against_plan(item)
                encode_from = time.perf_counter()
                fragment = await loop.run_in_executor(
                    encode_pool, encoder.encode_chunk, item.pixels
                )
                encode_s = time.perf_counter() - encode_from
                self.encode_s += encode_s
                self.metrics.chunk_encode_seconds.observe(encode_s)
                await self._append(fragment)
                self.chunks_done += 1
                self.frames_done += item.frame_count
                if self._first_fragment is None:
                    self._first_fragment = time.perf_counter()
                    self.metrics.time_to_first_fragment.observe(
                        self._first_fragment - self._created
                    )
                self._emit(
                    "chunk",
                    index=item.index,
                    total=item.total,
                    frame_start=item.frame_start,
                    frames=item.frame_count,
                    bytes=len(fragment),
                    frames_done=self.frames_done,
                    total_bytes=self.log.size,
                    progress=self.progress,
                )
            if self.chunks_done != plan.chunks:
                raise DecodeFailedError(
                    f"the decoder published {self.chunks_done} chunks, its plan said {plan.chunks}"
                )
        finally:
            bridge.cancel()  # a no-op after a clean end; stops the thread otherwise
            # Join the decoder thread and close the codec even if this task is
            # being cancelled: nothing of the job may outlive it.
            with contextlib.suppress(DecodeCancelled):
                await _join(decoding)
            await _join(loop.run_in_executor(encode_pool, encoder.close))

    async def _append(self, segment: bytes) -> None:
        try:
            await self.log.append(segment)
        except OSError as error:  # the spill file: disk full, file too large, I/O error
            raise DecodeFailedError(f"the video could not be stored: {error}") from error

    def _check_against_plan(self, chunk: HostChunk) -> None:
        plan, index = self.plan, self.chunks_done
        expected = (
            (index, plan.chunk_starts[index], plan.chunk_frames[index], plan.height, plan.width)
            if index < plan.chunks
            else None
        )
        got = (chunk.index, chunk.frame_start, chunk.frame_count, *chunk.pixels.shape[1:3])
        if got != expected:
            raise DecodeFailedError(
                f"the decoder broke its plan at chunk {index}: got (index, frame_start, frames, "
                f"height, width) = {got}, planned {expected}"
            )

    def _summary(self) -> str:
        timings = self._timings()
        error = self.error.message if self.error and self.status is not JobStatus.COMPLETED else ""
        return (
            f"id={self.id} model={self.model} status={self.status.value} "
            f"frames={self.frames_done}/{self.plan.frames} "
            f"chunks={self.chunks_done}/{self.plan.chunks} bytes={self.log.size} "
            f"ttff_s={timings['time_to_first_fragment_s']} total_s={timings['total_s']} "
            f"encode_s={timings['encode_s']} error={error!r}"
        )


async def _join(future: asyncio.Future[Any]) -> Any:
    """Wait for `future` to finish even if this task is cancelled meanwhile.

    A cancel that arrives while waiting is re-raised once the future is done, so a
    job task never ends while its executor work is still running.
    """
    cancelled = False
    while True:
        try:
            await asyncio.wait([future])
            break
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
    return future.result()


class Admission:
    """A place reserved for one job while its request is still being read.

    Taken before the body is read (`JobManager.admit`), so a burst of large uploads
    or demo renders is refused at once instead of being read into memory first;
    `submit` turns it into a job, and leaving the `with` block without submitting
    gives the place back.
    """

    def __init__(self, manager: JobManager) -> None:
        self._manager: JobManager | None = manager

    def __enter__(self) -> Admission:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._give_back()

    def submit(self, request: DecodeRequest) -> Job:
        manager = self._manager
        if manager is None:
            raise RuntimeError("an admission is used once")
        job = manager._start_job(request)
        self._give_back()
        return job

    def _give_back(self) -> None:
        if self._manager is not None:
            self._manager._reserved -= 1
            self._manager = None


class JobManager:
    """Admits jobs, runs them in a bounded number of decode slots, keeps and evicts them.

    Admission: `decode_slots` jobs decode at once; up to `max_queued_jobs` more
    wait in FIFO order; past that a request is refused (429 with Retry-After).
    Requests still being read count as queued (see Admission).
    Retention: a finished job stays fetchable for `retention_s` while the bytes
    that finished jobs hold in RAM fit `retention_memory_bytes` (oldest first out);
    a job with a viewer attached is never evicted. Evicted ids answer 410.
    """

    # Evicted ids remembered for 410 answers; older ones fall back to 404.
    EVICTED_IDS_KEPT = 10_000

    def __init__(
        self,
        config: ServerConfig,
        decoders: Mapping[str, ChunkedDecoder],
        encoder_factory: EncoderFactory = VideoStreamEncoder,
    ) -> None:
        self.config = config
        self.decoders = dict(decoders)
        self.jobs: dict[str, Job] = {}
        self.draining = False
        self._encoder_factory = encoder_factory
        self._queue: list[Job] = []
        self._unfinished = 0  # jobs submitted and not yet ended
        self._reserved = 0  # admissions whose request is still being read
        self.metrics = Metrics(self._state_for_metrics)
        self._evicted: OrderedDict[str, str] = OrderedDict()
        self._slots = asyncio.Semaphore(config.decode_slots)
        self._decode_pool = ThreadPoolExecutor(
            config.decode_slots, thread_name_prefix="vaecast-decode"
        )
        # One encoder per running job, used by one thread at a time: one thread a slot.
        self._encode_pool = ThreadPoolExecutor(
            config.decode_slots, thread_name_prefix="vaecast-encode"
        )
        self._tasks: set[asyncio.Task[None]] = set()
        self._tasks_side: set[asyncio.Task[None]] = set()  # evictions in flight
        self._reaper: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start the retention sweep (call on the running loop)."""
        self._reaper = asyncio.create_task(self._sweep_forever(), name="vaecast-retention")

    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    def decoder_for(self, model: str | None) -> tuple[str, ChunkedDecoder]:
        name = model or self.config.default_model
        try:
            return name, self.decoders[name]
        except KeyError:
            served = ", ".join(sorted(self.decoders))
            raise UnknownModelError(
                f"model {name!r} is not served here; this server serves: {served}"
            ) from None

    @property
    def capacity(self) -> int:
        """Jobs that may exist unfinished at once: the running ones and the queued ones."""
        return self.config.decode_slots + self.config.max_queued_jobs

    @property
    def capacity_left(self) -> int:
        """Jobs that could still be admitted now."""
        return max(0, self.capacity - self._unfinished - self._reserved)

    def admit(self) -> Admission:
        """Reserve a place for a job before reading its request (see Admission).

        Raises ShuttingDownError while draining and ServerBusyError (429) when every
        slot and queue place is taken, counting requests still being read.
        """
        if self.draining:
            self.metrics.jobs_rejected.labels("shutting_down").inc()
            raise ShuttingDownError("the server is shutting down and takes no new jobs")
        if self.capacity_left == 0:
            self.metrics.jobs_rejected.labels("busy").inc()
            waiting = max(0, self._unfinished + self._reserved - self.config.decode_slots)
            raise ServerBusyError(
                f"all {self.config.decode_slots} decode slot(s) are busy and "
                f"{waiting} job(s) are queued; try again later",
                retry_after_s=self._retry_after_s(),
            )
        self._reserved += 1
        return Admission(self)

    def plan_for(self, request: DecodeRequest) -> DecodePlan:
        """Check a request against its model and the limits, before any work starts."""
        return self._plan_within_limits(request.model, tuple(request.latents.shape))

    def _plan_within_limits(self, model: str | None, latent_shape: tuple[int, ...]) -> DecodePlan:
        _, decoder = self.decoder_for(model)
        plan = decoder.plan(latent_shape)
        limits = self.config.limits
        if plan.frames > limits.max_frames:
            raise PayloadTooLargeError(
                f"the latents decode to {plan.frames} frames; "
                f"this server allows {limits.max_frames}"
            )
        if plan.width * plan.height > limits.max_pixels_per_frame:
            raise PayloadTooLargeError(
                f"the latents decode to {plan.width}x{plan.height} frames; this server allows "
                f"{limits.max_pixels_per_frame} pixels per frame"
            )
        return plan

    def check_latent_shape(self, model: str | None, latent_shape: tuple[int, ...]) -> None:
        """The size limits on a latent shape as declared, before the tensor is converted.

        With the model known, its plan decides. Without it (it may still come from
        the file's metadata), the shape passes if any served model would take it:
        this check only bounds the cost of reading the file; the job's own plan
        check runs again on the model finally chosen.
        """
        names = [model] if model else list(self.decoders)
        too_large: PayloadTooLargeError | None = None
        for name in names:
            try:
                self._plan_within_limits(name, latent_shape)
                return
            except PayloadTooLargeError as error:
                too_large = too_large or error
            except VaecastError:
                if model:
                    raise
        if too_large is not None:
            raise too_large

    def submit(self, request: DecodeRequest) -> Job:
        """Start a job now, outside any admission (tools and tests)."""
        with self.admit() as admission:
            return admission.submit(request)

    def _start_job(self, request: DecodeRequest) -> Job:
        plan = self.plan_for(request)
        if self.draining:
            raise ShuttingDownError("the server is shutting down and takes no new jobs")
        _, decoder = self.decoder_for(request.model)
        job = Job(
            request, decoder, plan, self.config, self.metrics, self._queue, self._encoder_factory
        )
        self._unfinished += 1
        self._queue.append(job)
        self.jobs[job.id] = job
        task = job.start(self._slots, self._decode_pool, self._encode_pool)
        self._tasks.add(task)
        task.add_done_callback(lambda task: self._job_task_done(task, job))
        return job

    def get(self, job_id: str) -> Job:
        try:
            return self.jobs[job_id]
        except KeyError:
            if job_id in self._evicted:
                raise GoneError(
                    f"video {job_id} is no longer kept ({self._evicted[job_id]})"
                ) from None
            raise NotFoundError(f"no video job with id {job_id!r}") from None

    def _job_task_done(self, task: asyncio.Task[None], job: Job) -> None:
        self._tasks.discard(task)
        self._unfinished -= 1
        if self.draining:
            return  # close() frees everything
        if job.status is not JobStatus.COMPLETED and job.readers == 0:
            # A failed or cancelled job's bytes can never be served (409): free them
            # now. With a viewer attached, the next sweep does it.
            self._in_background(job.log.release())
        self._evict_over_budget()

    def _in_background(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coroutine)
        self._tasks_side.add(task)
        task.add_done_callback(self._tasks_side.discard)

    def _retry_after_s(self) -> int:
        """A guess at when a queue place frees up: when a running job ends, about
        one recent job's decode time divided among the slots."""
        recent = [
            seconds
            for job in list(self.jobs.values())[-20:]
            if (seconds := job.run_seconds) is not None
        ]
        per_job_s = sum(recent) / len(recent) if recent else DEFAULT_RETRY_AFTER_S
        return max(1, math.ceil(per_job_s / self.config.decode_slots))

    # Retention.

    async def _sweep_forever(self) -> None:
        interval_s = max(0.05, min(self.config.retention_s / 4, RETENTION_SWEEP_MAX_S))
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
            if job.status is not JobStatus.COMPLETED and not job.log.released:
                await job.log.release()
            if now - job.finished_at >= self.config.retention_s:
                await self._evict(job, EvictionReason.AGE)
        self._evict_over_budget()

    def _evictable(self) -> list[Job]:
        """Finished jobs nobody is watching, oldest first."""
        return sorted(
            (j for j in self.jobs.values() if j.finished_at is not None and j.readers == 0),
            key=lambda j: j.finished_at or 0.0,
        )

    def _evict_over_budget(self) -> None:
        budget = self.config.retention_memory_bytes
        held = sum(j.log.memory_bytes for j in self.jobs.values() if j.finished)
        for job in self._evictable():
            if held <= budget:
                break
            held -= job.log.memory_bytes
            self._in_background(self._evict(job, EvictionReason.MEMORY))

    async def delete(self, job: Job) -> None:
        """Delete a finished job: free its bytes now; its id answers 410 from then on.

        Viewers still reading it are cut, as a deleted file's readers would be.
        """
        if not job.finished:
            raise JobStateError(f"video {job.id} is {job.status.value}: cancel it first")
        await self._evict(job, EvictionReason.DELETED)

    async def _evict(self, job: Job, reason: EvictionReason) -> None:
        if self.jobs.pop(job.id, None) is None:
            return
        self._evicted[job.id] = reason.describe(self.config.retention_s)
        while len(self._evicted) > self.EVICTED_IDS_KEPT:
            self._evicted.popitem(last=False)
        self.metrics.jobs_evicted.labels(reason.value).inc()
        await job.log.release()

    # Shutdown.

    async def drain(self, grace_s: float) -> None:
        """Stop admitting; give running and queued jobs `grace_s` to finish, then
        cancel what is left (its viewers' streams end, cut)."""
        self.draining = True
        running = [t for t in self._tasks if not t.done()]
        if running:
            await asyncio.wait(running, timeout=grace_s)
        for job in list(self.jobs.values()):
            job.cancel("server shutting down", by_shutdown=True)
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def close(self) -> None:
        """Cancel every job, wait for their threads, free every log, stop the pools."""
        self.draining = True
        if self._reaper is not None:
            self._reaper.cancel()
            await asyncio.gather(self._reaper, return_exceptions=True)
        for job in list(self.jobs.values()):
            job.cancel("server shutting down", by_shutdown=True)
        await asyncio.gather(*self._tasks, *self._tasks_side, return_exceptions=True)
        for job in list(self.jobs.values()):
            await job.log.release()
        for pool in (self._decode_pool, self._encode_pool):
            await asyncio.to_thread(pool.shutdown)

    def _state_for_metrics(self) -> tuple[list[str], int, int]:
        jobs = list(self.jobs.values())
        return [j.status.value for j in jobs], len(self._queue), sum(j.readers for j in jobs)
