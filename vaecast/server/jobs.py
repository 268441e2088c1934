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
import logging
import secrets
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import StrEnum
from fractions import Fraction
from typing import Any

import torch

from vaecast.codecs.stream import VideoStreamEncoder
from vaecast.errors import (
    DecodeCancelled,
    DecodeFailedError,
    NotFoundError,
    PayloadTooLargeError,
    UnknownModelError,
    VaecastError,
)
from vaecast.models.base import ChunkedDecoder, DecodePlan
from vaecast.server.bridge import ChunkBridge, DecodeEnded, DecodeRaised, HostChunk
from vaecast.server.config import ServerConfig
from vaecast.server.segment_log import SegmentLog

log = logging.getLogger("vaecast.jobs")


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


class Job:
    def __init__(
        self,
        request: DecodeRequest,
        decoder: ChunkedDecoder,
        plan: DecodePlan,
        config: ServerConfig,
    ) -> None:
        self.id = "video_" + secrets.token_hex(12)
        self.request = request
        self.decoder = decoder
        self.plan = plan
        self.config = config
        self.status = JobStatus.QUEUED
        self.error: VaecastError | None = None
        self.log = SegmentLog()
        self.content_type = "video/mp4"
        self.chunks_done = 0
        self.frames_done = 0
        self.created_at = time.time()
        self._created = time.perf_counter()
        self._started: float | None = None
        self._first_fragment: float | None = None
        self._finished: float | None = None
        self.decode_wait_s = 0.0  # loop time spent waiting for the decoder's next chunk
        self.encode_s = 0.0
        self._bridge: ChunkBridge | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def finished(self) -> bool:
        return self.status in FINAL_STATUSES

    def cancel(self, reason: str = "cancelled") -> None:
        """Stop the job: a queued one never starts, a running one stops at its next chunk."""
        if self.finished:
            return
        self.error = DecodeCancelled(reason)
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
            "model": self.request.model,
            "status": self.status.value,
            "progress": round(100 * self.chunks_done / plan.chunks),
            "created_at": int(self.created_at),
            "frames": plan.frames,
            "width": plan.width,
            "height": plan.height,
            "fps": float(self.request.fps),
            "seconds": round(float(plan.frames / self.request.fps), 3),
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

    async def run(
        self,
        slots: asyncio.Semaphore,
        decode_pool: ThreadPoolExecutor,
        encode_pool: ThreadPoolExecutor,
    ) -> None:
        """The job task: wait for a decode slot, then decode, encode and log every chunk."""
        try:
            async with slots:
                self.status = JobStatus.IN_PROGRESS
                self._started = time.perf_counter()
                await self._decode_and_encode(decode_pool, encode_pool)
            self.status = JobStatus.COMPLETED
            self.log.finish()
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
            self._finished = time.perf_counter()
            log.info("job %s", self._summary())

    def _end(self, status: JobStatus, error: VaecastError) -> None:
        self.status = status
        self.error = error
        self.log.abort(error)

    async def _decode_and_encode(
        self, decode_pool: ThreadPoolExecutor, encode_pool: ThreadPoolExecutor
    ) -> None:
        loop = asyncio.get_running_loop()
        plan, request = self.plan, self.request
        encoder = await loop.run_in_executor(
            encode_pool,
            VideoStreamEncoder,
            plan.width,
            plan.height,
            request.fps,
            self.config.encoder,
        )
        bridge = self._bridge = ChunkBridge(
            loop, self.decoder.value_range, max_chunks=self.config.queue_chunks
        )
        latents = request.latents

        def decode(on_chunk: Any) -> None:
            self.decoder.decode_chunks(latents.to(self.decoder.device), on_chunk)

        decoding = loop.run_in_executor(decode_pool, bridge.run, decode)
        try:
            self.content_type = encoder.content_type
            self.log.append(encoder.init_segment)
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
                self.encode_s += time.perf_counter() - encode_from
                self.log.append(fragment)
                self.chunks_done += 1
                self.frames_done += item.frame_count
                if self._first_fragment is None:
                    self._first_fragment = time.perf_counter()
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
            f"id={self.id} model={self.request.model} status={self.status.value} "
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


class JobManager:
    """Creates jobs, runs them in a bounded number of decode slots, finds them by id."""

    def __init__(self, config: ServerConfig, decoders: Mapping[str, ChunkedDecoder]) -> None:
        self.config = config
        self.decoders = dict(decoders)
        self.jobs: dict[str, Job] = {}
        self._slots = asyncio.Semaphore(config.decode_slots)
        self._decode_pool = ThreadPoolExecutor(
            config.decode_slots, thread_name_prefix="vaecast-decode"
        )
        # One encoder per running job, used by one thread at a time: one thread a slot.
        self._encode_pool = ThreadPoolExecutor(
            config.decode_slots, thread_name_prefix="vaecast-encode"
        )
        self._tasks: set[asyncio.Task[None]] = set()

    def decoder_for(self, model: str | None) -> tuple[str, ChunkedDecoder]:
        name = model or self.config.default_model
        try:
            return name, self.decoders[name]
        except KeyError:
            served = ", ".join(sorted(self.decoders))
            raise UnknownModelError(
                f"model {name!r} is not served here; this server serves: {served}"
            ) from None

    def plan_for(self, request: DecodeRequest) -> DecodePlan:
        """Check a request against its model and the limits, before any work starts."""
        _, decoder = self.decoder_for(request.model)
        plan = decoder.plan(request.latents.shape)
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

    def submit(self, request: DecodeRequest) -> Job:
        plan = self.plan_for(request)
        _, decoder = self.decoder_for(request.model)
        job = Job(request, decoder, plan, self.config)
        self.jobs[job.id] = job
        task = asyncio.create_task(
            job.run(self._slots, self._decode_pool, self._encode_pool), name=f"job-{job.id}"
        )
        job._task = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return job

    def get(self, job_id: str) -> Job:
        try:
            return self.jobs[job_id]
        except KeyError:
            raise NotFoundError(f"no video job with id {job_id!r}") from None

    async def close(self) -> None:
        """Cancel every job, wait for their threads, then stop the pools."""
        for job in list(self.jobs.values()):
            job.cancel("server shutting down")
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        for pool in (self._decode_pool, self._encode_pool):
            await asyncio.to_thread(pool.shutdown)
