"""The job manager: admission, decode slots, the FIFO queue, lookup, shutdown.

How jobs run is its `JobRunners`' (composition, not subclassing; the protocol and
`LocalRunners`, the default, are in `vaecast.server.stream.job_runners` and
re-exported here): `LocalRunners` decode them here, in this process's slots and
queue; Ray mode's (`vaecast.cluster.runners`) mirror jobs that run in the cluster.
The CLI builds the manager with the runners it wants and hands it to `create_app`.

Admission: `decode_slots` jobs decode at once; up to `max_queued_jobs` more wait in
FIFO order; past that a request is refused (429 with Retry-After). A request takes a
place before its body is read (`admit`), in a pool of its own while its body arrives,
apart from the decode queue (`vaecast.server.stream.admission` counts the places, by
kind). Queue positions are the manager's to compute: a job only knows that it waits
for a slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

from vaecast.errors import (
    JobStateError,
    NotFoundError,
    PayloadTooLargeError,
    ShuttingDownError,
    StoreError,
    UnknownModelError,
    VaecastError,
)
from vaecast.models.base import ChunkedDecoder, DecodePlan
from vaecast.models.crop import CroppedDecoder
from vaecast.models.frames import FramesDecoder
from vaecast.models.layouts import BCTHW, LatentLayout, layout_of
from vaecast.models.sound import SoundDecoder, sound_of
from vaecast.pipeline.encoder_spares import SpareEncoders
from vaecast.pipeline.run import Stages, Workers
from vaecast.server.config import ServerConfig
from vaecast.server.metrics import Metrics, ServerState
from vaecast.server.stream.admission import LOCAL_CLIENT, Admission, Places
from vaecast.server.stream.durable_jobs import DurableJobs
from vaecast.server.stream.job import Job
from vaecast.server.stream.job_requests import DecodeRequest, PushKind, PushRequest
from vaecast.server.stream.job_runners import JobRunners, LocalRunners
from vaecast.server.stream.previews import Previews
from vaecast.server.stream.rendition import RenditionHooks
from vaecast.server.stream.retention import EvictionReason, Retention
from vaecast.server.stream.segment_log import SegmentLog
from vaecast.server.stream.services import JobServices

DEFAULT_RETRY_AFTER_S = 5.0


class JobManager:
    def __init__(
        self,
        config: ServerConfig,
        decoders: Mapping[str, ChunkedDecoder],
        stages: Stages = Stages(),  # noqa: B008 (frozen, immutable)
        runners: JobRunners | None = None,
        preview_decoders: Mapping[str, ChunkedDecoder] | None = None,
    ) -> None:
        """`runners`: how jobs run (`LocalRunners()` by default). `preview_decoders`:
        those a job may name as its preview (by default the served ones and `linear`;
        `--preview-device` gives its own)."""
        self.config = config
        self.runners: JobRunners = runners or LocalRunners()
        self.decoders = dict(decoders)
        # Which preview decoder a new job gets, and the threads previews decode on.
        self.previews = Previews(config, self.decoders, preview_decoders)
        self.jobs: dict[str, Job] = {}
        self.draining = False
        self._waiting: list[Job] = []  # FIFO of jobs waiting for a slot
        # Requests being read and jobs not yet ended, by kind (fair admission).
        self.places = Places(config, self._retry_after_s, self._refused)
        self.metrics = Metrics(self._state_for_metrics)  # reads the state above
        self.retention = Retention(config, self.metrics, self.jobs)
        # The durable store (--store), opened by `open_store`; None: memory only.
        self.durable: DurableJobs | None = None
        # Each job's encoder comes ready-opened when it is like the previous job's
        # (encoder_spares: the open's CPU kept off the first chunk's decode).
        self._spares = SpareEncoders(stages.encoder_factory)
        self._stages = dataclasses.replace(stages, encoder_factory=self._spares)
        self._replenishing: asyncio.Future[None] | None = None
        self._slots = asyncio.Semaphore(config.decode_slots)
        # One encoder per running job, used by one thread at a time: one thread a slot.
        self._workers = Workers.for_slots(config.decode_slots)
        # What the configured faces attach to each new rendition (`RenditionHooks.add`).
        self.rendition_hooks = RenditionHooks()
        # Told of each job this server answers for: each one it makes, and each the
        # store gives back at its start (not another front end's, nor one found later
        # in a shared store). Faces add theirs in `start` (the webhooks face does).
        self.job_hooks: list[Callable[[Job], None]] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._sweeper: asyncio.Task[None] | None = None
        # What the runners, the store's side and retention are given: not the manager.
        self.services = JobServices(
            config,
            self.metrics,
            self._workers,
            self._stages,
            self.rendition_hooks,
            self.decoders,
            self.previews,
            self.new_log,
        )

    async def open_store(self) -> None:
        """Open the store `config.store_dir` names, and serve the jobs it kept (before
        the port opens); raises StoreError when the folder cannot be used."""
        if self.config.store_dir is None:
            return
        folder = Path(self.config.store_dir)
        try:
            self.durable = await DurableJobs.open(self.services, self.jobs, self.retention, folder)
        except OSError as error:
            raise StoreError(f"--store {folder}: {error.strerror or error}") from None
        self.retention.durable = self.durable
        for job in list(self.jobs.values()):  # the restored ones
            for hook in self.job_hooks:
                hook(job)

    def new_log(self, job_id: str) -> SegmentLog | None:
        """A new job's log: in the store's file for it, when there is a store (None:
        the job's own default, in memory)."""
        return None if self.durable is None else self.durable.new_log(job_id)

    def start(self) -> None:
        """Start the retention sweep (call on the running loop)."""
        self._sweeper = asyncio.create_task(
            self.retention.sweep_forever(), name="vaecast-retention"
        )
        self.runners.start(self)

    @property
    def workers(self) -> Workers:
        """The threads jobs decode and encode on."""
        return self._workers

    @property
    def stages(self) -> Stages:
        """What jobs convert and encode with (the encoder factory keeps a spare)."""
        return self._stages

    @property
    def spare_encoders(self) -> SpareEncoders:
        return self._spares

    def replenish_spare_encoder(self) -> None:
        """Open the next job's encoder ahead, on an encode thread, when no job runs."""
        if self.draining or self.places.busy or self._replenishing is not None:
            return
        loop = asyncio.get_running_loop()
        self._replenishing = loop.run_in_executor(self._workers.encode, self._spares.replenish)
        self._replenishing.add_done_callback(self._replenished)

    def _replenished(self, future: asyncio.Future[None]) -> None:
        self._replenishing = None  # replenish reports nothing: a failed open is retried

    # Admission.

    @property
    def queue_depth(self) -> int:
        return len(self._waiting)

    @property
    def capacity(self) -> int:
        """Jobs that may exist unfinished at once: the running ones and the queued ones."""
        return self.config.decode_slots + self.config.max_queued_jobs

    @property
    def capacity_left(self) -> int:
        """Jobs that could still be admitted now (requests being read take none)."""
        return self.places.decode_left

    def replica_health(self) -> dict[str, Any] | None:
        """Decoder replicas elsewhere (Ray mode); None: this process decodes."""
        return self.runners.replica_health()

    def queue_position(self, job: Job) -> int | None:
        """1 for the next job to start; None once started (or never queued, or queued
        elsewhere: Ray Serve's queue has no positions to show)."""
        return self._waiting.index(job) + 1 if job in self._waiting else None

    def admit(self, client: str = LOCAL_CLIENT) -> Admission:
        """Take a place for `client`'s request (its address) before reading it (see
        `admission.Admission`).

        Raises ShuttingDownError while draining and ServerBusyError (429) when every
        slot and queue place is taken, or every place for requests still pending, or
        the client's share of those.
        """
        if self.draining:
            self.metrics.jobs_rejected.labels("shutting_down").inc()
            raise ShuttingDownError("the server is shutting down and takes no new jobs")
        if self.durable is not None:
            self.durable.check_writable()  # 503 while the store cannot write
        return self.places.admit(self._start_job, self._checked_start, client)

    def submit(self, request: DecodeRequest) -> Job:
        """Start a job now, outside any admission (tools and tests)."""
        with self.admit() as admission:
            return admission.submit(request)

    def decoder_for(self, model: str | None) -> tuple[str, ChunkedDecoder]:
        name = model or self.config.default_model
        try:
            return name, self.decoders[name]
        except KeyError:
            served = ", ".join(sorted(self.decoders))
            raise UnknownModelError(
                f"model {name!r} is not served here; this server serves: {served}"
            ) from None

    def check_names(self, model: str | None, preview: str | None) -> None:
        """What a request names (its model, its preview) is served here: 404 before
        anything costly (a demo's render, an upload's read) is done for it."""
        self.decoder_for(model)
        self.previews.check_name(preview)

    def layout_for(self, model: str) -> LatentLayout:
        """The layout model `model`'s latents are uploaded in (BCTHW for a model not
        served here: the job's own model check then refuses it)."""
        decoder = self.decoders.get(model)
        return BCTHW if decoder is None else layout_of(decoder)

    def sound_for(self, model: str) -> SoundDecoder | None:
        """Model `model`'s sound decoder (its audio latents' waveform), if it has one."""
        return sound_of(self.decoders.get(model))

    def check_stream_shape(
        self, job: Job, latent_frames: int, block_shape: tuple[int, ...]
    ) -> None:
        """The limits on a push session that would hold `latent_frames` latent frames in
        all, of `block_shape`'s size (413 past them)."""
        shape = (1, block_shape[1], latent_frames, *block_shape[3:])
        what = "the session's frames are" if job.push_kind is PushKind.FRAMES else None
        self._within_limits(job.decoder.plan(shape), what or "the latents decode to")

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

    def _plan_within_limits(self, model: str | None, latent_shape: tuple[int, ...]) -> DecodePlan:
        _, decoder = self.decoder_for(model)
        return self._within_limits(decoder.plan(latent_shape))

    def _within_limits(self, plan: DecodePlan, what: str = "the latents decode to") -> DecodePlan:
        limits = self.config.limits
        if plan.frames > limits.max_frames:
            raise PayloadTooLargeError(
                f"{what} {plan.frames} frames; this server allows {limits.max_frames}"
            )
        if plan.width * plan.height > limits.max_pixels_per_frame:
            raise PayloadTooLargeError(
                f"{what} {plan.width}x{plan.height} frames; this server allows "
                f"{limits.max_pixels_per_frame} pixels per frame"
            )
        return plan

    def _checked_start(
        self, request: DecodeRequest | PushRequest
    ) -> tuple[DecodePlan | None, ChunkedDecoder, ChunkedDecoder | None]:
        """What every new job needs first: its plan within the limits (an upload; a push
        session's comes with its first block), a server still taking jobs, its decoder
        and its preview decoder, if any."""
        plan = None
        if isinstance(request, DecodeRequest):
            plan = self._plan_within_limits(request.model, tuple(request.latents.shape))
        if self.draining:
            raise ShuttingDownError("the server is shutting down and takes no new jobs")
        decoder: ChunkedDecoder
        if isinstance(request, PushRequest) and request.kind is PushKind.FRAMES:
            decoder = FramesDecoder(request.value_range, self.config.device)
        else:
            _, decoder = self.decoder_for(request.model)
        preview = self.previews.preview_for(request, decoder)
        if request.crop is not None:
            decoder = CroppedDecoder(decoder, *request.crop)
            if isinstance(request, DecodeRequest):  # refused now if larger than the video
                plan = decoder.plan(tuple(request.latents.shape))
            if preview is not None:
                preview = CroppedDecoder(preview, *request.crop)
        return plan, decoder, preview

    def _start_job(self, request: DecodeRequest | PushRequest) -> Job:
        plan, decoder, preview = self._checked_start(request)
        job = self.runners.new_job(self.services, request, plan, decoder, preview)
        if self.durable is not None and job.log.durable:
            self.durable.track(job)
        for hook in self.job_hooks:
            hook(job)
        self.places.hold(job)
        self._run(job, counted=True)
        return job

    def adopt(self, job: Job) -> None:
        """Serve `job`, created elsewhere (Ray mode: another front end's), from here too:
        it takes no place of this server's."""
        self._run(job, counted=False)

    def _run(self, job: Job, counted: bool) -> None:
        self.jobs[job.id] = job
        slot: contextlib.AbstractAsyncContextManager[None] = contextlib.nullcontext()
        if self.runners.decodes_here:
            # A push session joins the queue when its first block arrives (LocalRunner).
            if job.plan is not None:
                self._waiting.append(job)
            slot = self._slot(job, join_queue=job.plan is None)
        task = asyncio.create_task(job.run(slot), name=f"job-{job.id}")
        job.attach(task)
        self._tasks.add(task)
        task.add_done_callback(lambda task: self._job_ended(task, job, counted))

    async def find(self, job_id: str, reading: bool = False) -> None:
        """Before a route uses job `job_id`: adopt it if it runs elsewhere (Ray mode);
        `reading` (a GET): bring a running job here up to what its runner elsewhere has
        (`JobRunners.catch_up`)."""
        job = self.jobs.get(job_id)
        if job is not None:
            if reading and not job.record.is_final:
                await self.runners.catch_up(job)
            return
        if self.retention.gone(job_id) is not None or self.draining:
            return
        if self.durable is not None:  # finished, and stored by another front end?
            await self.durable.find(job_id)
        if job_id not in self.jobs and self.retention.gone(job_id) is None:
            await self.runners.find(self, job_id)

    async def settle(self) -> None:
        """Before an answer or an event: until what has happened to the jobs so far is
        committed to the store (if any), and the jobs created here can be found from
        elsewhere (Ray mode)."""
        if self.durable is not None:
            await self.durable.settle()
        await self.runners.settle()

    @contextlib.asynccontextmanager
    async def _slot(self, job: Job, join_queue: bool) -> AsyncIterator[None]:
        if join_queue:
            self._waiting.append(job)
        async with self._slots:
            self._waiting.remove(job)
            yield

    def _job_ended(self, task: asyncio.Task[None], job: Job, counted: bool) -> None:
        self._tasks.discard(task)
        if counted:
            self.places.release(job)
        if job in self._waiting:  # cancelled while it waited for a slot
            self._waiting.remove(job)
        if not self.draining:  # close() frees everything
            self.retention.job_ended(job)
            self.replenish_spare_encoder()

    def _refused(self, reason: str) -> None:
        self.metrics.jobs_rejected.labels(reason).inc()

    def _retry_after_s(self) -> int:
        """A guess at when a queue place frees up: when a running job ends, about
        one recent job's decode time divided among the slots."""
        recent = [
            seconds
            for job in list(self.jobs.values())[-20:]
            if (seconds := job.record.run_seconds) is not None
        ]
        per_job_s = sum(recent) / len(recent) if recent else DEFAULT_RETRY_AFTER_S
        return max(1, math.ceil(per_job_s / self.config.decode_slots))

    # Lookup and deletion.

    def get(self, job_id: str) -> Job:
        try:
            return self.jobs[job_id]
        except KeyError:
            gone = self.retention.gone(job_id)
            if gone is not None:
                raise gone from None
            raise NotFoundError(f"no video job with id {job_id!r}") from None

    async def delete(self, job: Job) -> None:
        """Delete a finished job: free its bytes now; its id answers 410 from then on.

        Viewers still reading it are cut, as a deleted file's readers would be.
        """
        if not job.record.is_final:
            raise JobStateError(f"video {job.id} is {job.record.status.value}: cancel it first")
        await self.runners.delete(job)
        await self.retention.evict(job, EvictionReason.DELETED)

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
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
        for job in list(self.jobs.values()):
            job.cancel("server shutting down", by_shutdown=True)
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.runners.close()
        await self.retention.close()
        for job in list(self.jobs.values()):
            await job.release()
        if self.durable is not None:  # after every job's last rows were handed over
            await self.durable.close()
        self._spares.close()  # a replenish still running closes what it opens
        await asyncio.to_thread(self._workers.shutdown)
        await asyncio.to_thread(self.previews.shutdown)

    def _state_for_metrics(self) -> ServerState:
        jobs = list(self.jobs.values())
        return ServerState(
            statuses=[j.record.status.value for j in jobs],
            queue_depth=len(self._waiting),
            readers=sum(j.viewers for j in jobs),
            places={kind.value: count for kind, count in self.places.counts().items()},
        )
