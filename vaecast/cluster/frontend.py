"""A front end in Ray mode: the same routes, with jobs that live in the cluster.

`ClusterJobManager` is the JobManager the routes talk to when `vaecast serve --ray`
runs: admission and size checks as ever, but a job lives in the cluster, kept by a
named job host (vaecast.cluster.job_host) that drives a decoder replica; what this process
holds of it is a `ClusterJob`: a local mirror (a Job with its SegmentLog, PartIndex
and events) that follows the shared job and copies each fragment and event as it comes.
So `/content` (live, finished, Range), `/events`, the HLS playlist and parts read
what they always read, and two front ends following one job send the same bytes.

A request for a job this process never saw (`mirror_jobs`, a middleware) looks up
the job's host by name and starts a mirror before the route runs; a push to such a
job opens the session here, with the token and block state kept in the cluster. A
front end going down cancels only its mirrors: the jobs go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import secrets
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import asdict
from typing import Any

import ray
import torch
from aiohttp import web

from vaecast.cluster.job_host import JobHost, JobSettings
from vaecast.cluster.records import (
    GONE_AGE,
    JOB_HOST_NAMES,
    NAMESPACE,
    Audio,
    DecodeCall,
    JobRef,
    JobSpec,
    PushState,
    ReplicaOptions,
    Snapshot,
    host_name,
)
from vaecast.cluster.replica import replica_states
from vaecast.errors import (
    CancelledByShutdown,
    ClusterUnavailableError,
    DecodeCancelled,
    GoneError,
    VaecastError,
)
from vaecast.models.base import ChunkedDecoder, DecodePlan, StreamPlan
from vaecast.pipeline import TimedAudio
from vaecast.server.config import ServerConfig
from vaecast.server.fanout_sender import FanoutSender
from vaecast.server.job import FINAL_STATUSES, DecodeRequest, Job, JobStatus, PushRequest
from vaecast.server.manager import JobManager
from vaecast.server.metrics import Metrics
from vaecast.server.push import PushSession, PushSessions, dtype_name
from vaecast.server.retention import EvictionReason
from vaecast.server.routes import MANAGER

log = logging.getLogger("vaecast.cluster")

# Restarted by Ray if it dies (empty: its jobs are lost); many long polls at once.
# Pinned to the head node: left to Ray, the hosts land on the node of the front end that
# created them, and across machines losing that front end's node would lose every job
# (Ray Train pins its own detached state actor the same way).
JOB_HOST = ray.remote(JobHost)
HOST_OPTIONS: dict[str, Any] = {
    "namespace": NAMESPACE,
    "lifetime": "detached",
    "num_cpus": 0,
    "resources": {"node:__internal_head__": 0.001},
    "max_restarts": -1,
    "max_concurrency": 10_000,
}
JOB_ID = re.compile(r"video_[0-9a-f]{24}")
# A mirror's long poll: the host answers at once when something is new.
FOLLOW_WAIT_S = 10.0
# How long a request for a job seen first here waits for the job's state.
LOOKUP_TIMEOUT_S = 15.0
HEALTH_POLL_S = 2.0


class ActorFeed:
    """A push session's feed as a front end sees it: each block goes to the job's
    shared job, whose state (blocks so far, the first block's shape) is the session's."""

    def __init__(self, job: JobRef, decoder: ChunkedDecoder) -> None:
        self._job = job
        self._decoder = decoder
        self.latent_frames = 0
        self.ended = False
        self.block_shape: tuple[int, ...] | None = None
        self.dtype: str | None = None
        self.next_dtype = "float32"  # the dtype of the block being pushed
        self.final_plan: DecodePlan | None = None

    def take(self, state: PushState) -> None:
        self.latent_frames, self.ended = state.latent_frames, state.ended
        self.block_shape, self.dtype = state.block_shape, state.dtype

    async def refresh(self) -> None:
        state = await self._job.push_state()
        if state is not None:
            self.take(state)

    async def put(self, latents: torch.Tensor, audio: TimedAudio | None = None) -> None:
        """Queue a block in the shared job (waits while its queue is full)."""
        stream_plan = None
        if self.block_shape is None:
            stream_plan = asdict(self._decoder.plan_stream(tuple(latents.shape)))
        answer = await self._job.push_block(
            latents.detach().contiguous().numpy(),
            None if audio is None else Audio(audio.samples, audio.first_frame),
            self.latent_frames,
            self.next_dtype,
            stream_plan,
        )
        self.take(_raise_if_error(answer))

    async def end(self) -> None:
        plan = None if self.final_plan is None else asdict(self.final_plan)
        self.take(_raise_if_error(await self._job.end_feed(plan)))


class ClusterJob(Job):
    """A job of the cluster, mirrored here: see the module docstring."""

    def __init__(
        self,
        spec: JobSpec,
        shared: JobRef,
        decoder: ChunkedDecoder,
        config: ServerConfig,
        metrics: Metrics,
        created: Any = None,
        fanout: FanoutSender | None = None,
    ) -> None:
        """`created`: the ObjectRef of the job's creation at its host, for a job created
        here (None: found there). `fanout`: as for Job."""
        plan = None if spec.plan is None else DecodePlan(**spec.plan)
        self._init_state(spec.job_id, spec.model, spec.fps, decoder, plan, config, metrics, fanout)
        self.created_at = spec.created_at
        self.spec = spec
        self.shared = shared
        self.created_here = created is not None
        self._creation = created
        self.audio = spec.audio
        self.push_token = spec.push_token
        self.feed: Any = ActorFeed(shared, decoder) if spec.input == "push" else None
        self._source = self._output = None
        self.replica: str | None = None
        self.synced = asyncio.Event()  # the first answer of the host is applied
        self.on_gone: Callable[[ClusterJob, EvictionReason], None] | None = None
        self._job_object: dict[str, Any] | None = None
        self._calls: set[asyncio.Task[Any]] = set()

    def to_json(self) -> dict[str, Any]:
        if self._job_object is not None:
            return dict(self._job_object)
        return {**super().to_json(), "replica": self.replica}

    def _timings(self) -> dict[str, float | None]:
        """The shared job's (measured where it runs), once known."""
        if self._job_object is not None:
            return dict(self._job_object["timings"])
        return super()._timings()

    # What the routes ask of a job, done by the shared job.

    def cancel(self, reason: str = "cancelled", *, by_shutdown: bool = False) -> None:
        """Cancel the job in the cluster; at this front end's shutdown, only stop
        mirroring it (the job goes on, other front ends serve it)."""
        if self.finished:
            return
        if by_shutdown:
            self.error = CancelledByShutdown(reason)
            if self._task is not None:
                self._task.cancel()
            return
        self._in_background(self.shared.cancel(DecodeCancelled(reason)))

    def abort(self, error: VaecastError) -> None:
        if not self.finished:
            self._in_background(self.shared.fail(error.detached()))

    def length_known(self, plan: DecodePlan) -> None:
        """A push session's last block came through here: the shared job gets the plan
        with the end of the feed."""
        self.plan = plan
        self.feed.final_plan = plan

    async def close_calls(self) -> None:
        for task in list(self._calls):
            task.cancel()
        await asyncio.gather(*self._calls, return_exceptions=True)

    # Mirroring.

    async def mirror(self) -> None:
        """Copy the shared job's fragments, events and state here until the job ends."""
        fragments = events = 0
        try:
            if self._creation is not None:  # calls of other handles may overtake it
                await self._creation
            while True:
                update = await self.shared.follow(fragments, events, FOLLOW_WAIT_S)
                if update is None:  # its host lost it (restarted)
                    raise ClusterUnavailableError(f"the cluster lost video {self.id}")
                if update.deleted is not None:
                    raise GoneError(f"video {self.id} is no longer kept")
                # The Content-Type names the codecs: known before the init segment is.
                self.content_type = update.snapshot.content_type
                for ref in update.fragments:
                    await self.append(await ref)
                fragments += len(update.fragments)
                for event in update.events:
                    self.events.append(event)
                events += len(update.events)
                self._take(update.snapshot, update.final)
                self.synced.set()
                if update.final:
                    break
            if self.status is JobStatus.COMPLETED:
                self.log.finish()
            else:
                self.log.abort(self.error or DecodeCancelled("cancelled"))
        except asyncio.CancelledError:
            self._lose(self.error or CancelledByShutdown("this front end is shutting down"))
        except VaecastError as error:
            self._lose(error)
        except Exception as error:
            log.warning("job %s: its host is gone: %s", self.id, error)
            self._lose(
                ClusterUnavailableError(f"the cluster lost video {self.id}: {type(error).__name__}")
            )
        else:
            self._in_background(self._until_gone(fragments, events))
        finally:
            self.synced.set()
            self._close_out()

    def _take(self, snapshot: Snapshot, final: bool) -> None:
        self._job_object = snapshot.job
        self.replica = snapshot.job["replica"]
        self.chunks_done = snapshot.job["chunks"]["done"]
        self.frames_done = snapshot.job["frames_done"]
        if snapshot.plan is not None and self.plan is None:
            self.plan = DecodePlan(**snapshot.plan)
        if snapshot.stream_plan is not None and self.stream_plan is None:
            self.stream_plan = StreamPlan(**snapshot.stream_plan)
        if snapshot.push is not None and self.feed is not None:
            self.feed.take(snapshot.push)
        status = JobStatus(snapshot.status)
        if status in FINAL_STATUSES and not final:
            return  # ends here once every fragment and event is here too
        if status in FINAL_STATUSES and snapshot.error is not None:
            self.error = snapshot.error
        self.status = status

    def _lose(self, error: VaecastError) -> None:
        """This mirror ends without the job's end (shutdown here, the job lost)."""
        self._job_object = None
        if not self.finished:
            failed = not isinstance(error, CancelledByShutdown)
            self._end(JobStatus.FAILED if failed else JobStatus.CANCELLED, error)
        elif not self.log.closed:
            self.log.abort(error.detached())

    async def _until_gone(self, fragments: int, events: int) -> None:
        """After the end: until the host says the job is gone (age, DELETE), then
        evict the mirror the same way."""
        try:
            while True:
                update = await self.shared.follow(fragments, events, FOLLOW_WAIT_S)
                if update is None or update.deleted is not None:
                    reason = EvictionReason(update.deleted if update else GONE_AGE)
                    break
        except Exception:  # its host is gone
            reason = EvictionReason.AGE
        if self.on_gone is not None:
            self.on_gone(self, reason)

    def _after_task(self, task: asyncio.Task[None]) -> None:
        if not self.finished:
            self._lose(self.error or CancelledByShutdown("this front end is shutting down"))
        self._close_out()

    def _in_background(self, awaitable: Awaitable[Any]) -> None:
        async def run() -> None:
            try:
                await awaitable
            except Exception as error:
                log.warning("job %s: a call to its host failed: %s", self.id, error)

        task = asyncio.ensure_future(run())
        self._calls.add(task)
        task.add_done_callback(self._calls.discard)


class ClusterJobManager(JobManager):
    """The routes' JobManager in Ray mode (see the module docstring)."""

    def __init__(
        self,
        config: ServerConfig,
        decoders: Mapping[str, ChunkedDecoder],
        replicas: ReplicaOptions,
    ) -> None:
        super().__init__(config, decoders)
        self.replica_options = replicas
        self._replica_states: dict[str, int] | None = None
        self._lookups: dict[str, asyncio.Future[None]] = {}
        self._poller: asyncio.Task[None] | None = None
        self._hosts: dict[str, Any] = {}
        self._creating: list[Any] = []  # ObjectRefs of jobs being created at their hosts
        self._side: set[asyncio.Task[None]] = set()
        self.metrics.read_replicas = self.replica_health

    def start(self) -> None:
        super().start()
        self._poller = asyncio.create_task(self._poll_replicas(), name="vaecast-replicas")
        self._in_background(self._start_hosts())

    async def _start_hosts(self) -> None:
        """Start (or find) every job host now, so that no job waits for one to start."""
        try:
            for name in JOB_HOST_NAMES:
                host = await asyncio.to_thread(self._host, name)
                await host.jobs.remote()  # up and running
        except Exception as error:  # the first job of a host starts it then
            log.warning("job hosts not started: %s", error)

    def _host(self, name: str) -> Any:
        """The job host `name`, started if the cluster has none (blocks on the cluster:
        once per host and process, at start)."""
        host = self._hosts.get(name)
        if host is None:
            host = self._hosts[name] = JOB_HOST.options(
                name=name, get_if_exists=True, **HOST_OPTIONS
            ).remote()
        return host

    def queue_position(self, job: Job) -> int | None:
        return None  # jobs wait in Serve's queue, which has no positions to show

    def replica_health(self) -> dict[str, Any] | None:
        states = self._replica_states or {}
        return {
            "count": sum(states.values()),
            "healthy": states.get("RUNNING", 0),
            "states": states,
            "max_ongoing_requests": self.replica_options.max_ongoing,
        }

    def _start_job(self, request: DecodeRequest | PushRequest) -> Job:
        plan, decoder = self._checked_start(request)
        job_id = "video_" + secrets.token_hex(12)
        spec, call = _describe(job_id, request, plan, self.config)
        settings = JobSettings(
            self.config.push_queue_blocks,
            self.config.push_idle_timeout_s,
            self.config.retention_s,
        )
        host = self._host(host_name(job_id))
        created = host.create.remote(spec, call, settings)
        self._creating.append(created)
        shared = JobRef(host, job_id)
        job = ClusterJob(spec, shared, decoder, self.config, self.metrics, created, self.fanout)
        self._unfinished += 1
        self._register(job)
        return job

    async def settle(self) -> None:
        """Until the jobs created here so far exist at their hosts (another front end
        may be asked for one as soon as its creation is answered)."""
        creating, self._creating = self._creating, []
        if creating:
            await asyncio.gather(*creating, return_exceptions=True)

    async def ensure(self, job_id: str) -> None:
        """Mirror job `job_id` here if the cluster has it and this process does not."""
        if job_id in self.jobs or self.retention.gone(job_id) or not JOB_ID.fullmatch(job_id):
            return
        pending = self._lookups.get(job_id)
        if pending is None:
            pending = self._lookups[job_id] = asyncio.ensure_future(self._look_up(job_id))
            pending.add_done_callback(lambda _: self._lookups.pop(job_id, None))
        await asyncio.shield(pending)

    async def delete(self, job: Job) -> None:
        if isinstance(job, ClusterJob) and job.finished:
            refused = await job.shared.delete()
            if refused is not None:
                raise refused
        await super().delete(job)

    async def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)
        for pending in list(self._lookups.values()):
            pending.cancel()
        await super().close()
        for job in list(self.jobs.values()):
            if isinstance(job, ClusterJob):
                await job.close_calls()
        await asyncio.gather(*self._side, return_exceptions=True)

    async def _look_up(self, job_id: str) -> None:
        try:
            host = self._hosts.get(host_name(job_id)) or await asyncio.to_thread(
                ray.get_actor, host_name(job_id), NAMESPACE
            )
            spec: JobSpec | None = await asyncio.wait_for(
                host.spec.remote(job_id), LOOKUP_TIMEOUT_S
            )
        except (ValueError, ray.exceptions.RayActorError, TimeoutError):
            spec = None
        if spec is None or job_id in self.jobs or self.draining:
            return  # no such job in the cluster (or it just ended): the route says 404
        shared = JobRef(host, job_id)
        decoder = self.decoders.get(spec.model) or self.decoders[self.config.default_model]
        job = ClusterJob(spec, shared, decoder, self.config, self.metrics, None, self.fanout)
        self._register(job)
        with contextlib.suppress(TimeoutError):  # served as it is: the mirror fills in
            await asyncio.wait_for(job.synced.wait(), LOOKUP_TIMEOUT_S)

    def _register(self, job: ClusterJob) -> None:
        self.jobs[job.id] = job
        job.on_gone = self._on_gone
        task = asyncio.create_task(job.mirror(), name=f"mirror-{job.id}")
        job.attach(task)
        self._tasks.add(task)
        task.add_done_callback(lambda task: self._mirror_ended(task, job))

    def _mirror_ended(self, task: asyncio.Task[None], job: ClusterJob) -> None:
        self._tasks.discard(task)
        if job.created_here:
            self._unfinished -= 1
        if not self.draining:
            self.retention.job_ended(job)

    def _on_gone(self, job: ClusterJob, reason: EvictionReason) -> None:
        self._in_background(self.retention.evict(job, reason))

    async def _poll_replicas(self) -> None:
        while True:
            try:
                self._replica_states = await asyncio.to_thread(replica_states)
            except Exception as error:
                log.warning("replica status unavailable: %s", error)
                self._replica_states = None
            await asyncio.sleep(HEALTH_POLL_S)

    def _in_background(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coroutine)
        self._side.add(task)
        task.add_done_callback(self._side.discard)


class ClusterPushSession(PushSession):
    """A push session opened on any front end: its state is the shared job's."""

    async def _sync(self) -> None:
        feed: ActorFeed = self.feed  # type: ignore[assignment]
        await feed.refresh()
        self._block_shape = feed.block_shape
        self._dtype = None if feed.dtype is None else getattr(torch, feed.dtype)

    def _parse_block(
        self, data: bytes, params: dict[str, str]
    ) -> tuple[torch.Tensor, TimedAudio | None, bool]:
        parsed = super()._parse_block(data, params)
        assert self._dtype is not None
        self.feed.next_dtype = dtype_name(self._dtype)  # type: ignore[attr-defined]
        return parsed


class ClusterPushSessions(PushSessions):
    def open(self, job: Job) -> PushSession:
        assert isinstance(job, ClusterJob)
        for job_id in [i for i in self._sessions if i not in self._manager.jobs]:
            del self._sessions[job_id]
        session = self._sessions[job.id] = ClusterPushSession(
            job, self._manager, token=job.push_token, watch_idle=False
        )
        return session

    def get(self, job_id: str) -> PushSession:
        job = self._manager.get(job_id)
        if job.id not in self._sessions and isinstance(job, ClusterJob) and job.feed is not None:
            return self.open(job)
        return super().get(job_id)


@web.middleware
async def mirror_jobs(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Before a route reads job `{video_id}`: mirror it here if only the cluster has it;
    after a route created a job: answer once the job exists in the cluster."""
    manager = request.app[MANAGER]
    if not isinstance(manager, ClusterJobManager):
        return await handler(request)
    job_id = request.match_info.get("video_id")
    if job_id is not None:
        await manager.ensure(job_id)
    response = await handler(request)
    await manager.settle()
    return response


def _raise_if_error(answer: PushState | VaecastError) -> PushState:
    """The host returns its refusals (they arrive intact that way): raise them here."""
    if isinstance(answer, VaecastError):
        raise answer
    return answer


def _describe(
    job_id: str, request: DecodeRequest | PushRequest, plan: DecodePlan | None, config: ServerConfig
) -> tuple[JobSpec, DecodeCall]:
    """What the shared job keeps (the spec) and what it sends a replica (the call)."""
    push = isinstance(request, PushRequest)
    audio: dict[str, int] | None = None
    soundtrack = audio_format = None
    if isinstance(request, DecodeRequest) and request.soundtrack is not None:
        track = request.soundtrack
        audio = {"sample_rate": track.sample_rate, "channels": track.channels}
        soundtrack = (track.waveform, track.sample_rate)
    if isinstance(request, PushRequest) and request.audio_format is not None:
        fmt = request.audio_format
        audio = {"sample_rate": fmt.sample_rate, "channels": fmt.channels}
        audio_format = (fmt.sample_rate, fmt.channels)
    spec = JobSpec(
        job_id,
        "push" if push else "latents",
        request.model,
        request.fps,
        time.time(),
        audio,
        None if plan is None else asdict(plan),
        secrets.token_urlsafe(32) if push else None,
    )
    call = DecodeCall(
        job_id,
        request.model,
        request.fps,
        asdict(config.encoder),
        config.queue_chunks,
        latents=None if push else request.latents.detach().contiguous().numpy(),  # type: ignore[union-attr]
        soundtrack=soundtrack,
        audio_format=audio_format,
    )
    return spec, call
