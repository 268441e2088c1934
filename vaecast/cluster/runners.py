"""Ray mode's `JobRunners`: jobs that live in the cluster, mirrored by each front end.

The CLI builds the server's `JobManager` with these when `vaecast serve --ray` runs:
admission and size checks as ever, but a new job is created at its named job host
(`vaecast.cluster.shared_job`), which drives a decoder replica, and what this process
holds of it is a mirror (`vaecast.cluster.mirror`). A request for a job this process
never saw (`find`, before the route runs) looks up the job's host by name and adopts
a mirror of it; a push to such a job opens the session here, with the token and
block state kept in the cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import secrets
import time
from collections.abc import Coroutine
from dataclasses import asdict, replace
from typing import Any

import ray

from vaecast.cluster.job_host import JobHost, JobSettings
from vaecast.cluster.mirror import MirrorRunner
from vaecast.cluster.records import (
    JOB_HOST_NAMES,
    NAMESPACE,
    DecodeCall,
    JobRef,
    JobSpec,
    ReplicaOptions,
    host_name,
)
from vaecast.cluster.replica import replica_states
from vaecast.errors import InvalidRequestError
from vaecast.job.record import PREVIEW, JobRecord
from vaecast.job.transitions import JobInput
from vaecast.models.base import ChunkedDecoder, DecodePlan
from vaecast.server.config import ServerConfig
from vaecast.server.stream.job import Job
from vaecast.server.stream.job_requests import DecodeRequest, PushRequest
from vaecast.server.stream.retention import EvictionReason
from vaecast.server.stream.segment_log import SegmentLog
from vaecast.server.stream.services import JobServices, JobTable

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
# How long a request for a job seen first here waits for the job's state.
LOOKUP_TIMEOUT_S = 15.0
HEALTH_POLL_S = 2.0


class ClusterRunners:
    """The JobRunners of a front end in Ray mode (see the module docstring)."""

    decodes_here = False  # jobs wait in Serve's queue, which has no positions to show

    def __init__(self, replicas: ReplicaOptions) -> None:
        self.replica_options = replicas
        self._table: JobTable | None = None
        self._replica_states: dict[str, int] | None = None
        self._lookups: dict[str, asyncio.Future[None]] = {}
        self._poller: asyncio.Task[None] | None = None
        self._hosts: dict[str, Any] = {}
        self._creating: list[Any] = []  # ObjectRefs of jobs being created at their hosts
        self._side: set[asyncio.Task[None]] = set()

    def start(self, table: JobTable) -> None:
        self._table = table
        table.services.metrics.read_replicas = self.replica_health
        self._poller = asyncio.create_task(self._poll_replicas(), name="vaecast-replicas")
        self._in_background(self._start_hosts())

    def new_job(
        self,
        services: JobServices,
        request: DecodeRequest | PushRequest,
        plan: DecodePlan | None,
        decoder: ChunkedDecoder,
        preview: ChunkedDecoder | None = None,
    ) -> Job:
        if request.webhook_url is not None:
            raise InvalidRequestError(
                "webhook_url is not taken with --ray yet (a front end's own jobs only): "
                "follow the job's /events instead"
            )
        job_id = "video_" + secrets.token_hex(12)
        config = services.config
        spec, call = _describe(job_id, request, plan, config)
        preview_call = None
        if preview is not None:  # a second call on the replicas, for the preview
            chunks = None
            if isinstance(request, DecodeRequest):
                chunks = preview.plan(tuple(request.latents.shape)).chunks
            spec = replace(spec, preview=preview.name, preview_chunks=chunks)
            preview_call = replace(call, model=preview.name, variant=PREVIEW)
        settings = JobSettings(
            config.push_queue_blocks,
            config.push_idle_timeout_s,
            config.push_first_block_timeout_s,
            config.retention_s,
        )
        host = self._host(host_name(job_id))
        created = host.create.remote(spec, call, settings, preview_call)
        self._creating.append(created)
        push_kind = request.kind if isinstance(request, PushRequest) else None
        # The front end that created the job writes it to the store (--store), if any.
        log = services.new_log(job_id)
        shared = JobRef(host, job_id)
        return self._mirror(services, spec, shared, decoder, created, push_kind, log, preview)

    async def settle(self) -> None:
        """Until the jobs created here so far exist at their hosts (another front end
        may be asked for one as soon as its creation is answered)."""
        creating, self._creating = self._creating, []
        if creating:
            await asyncio.gather(*creating, return_exceptions=True)

    async def find(self, table: JobTable, job_id: str) -> None:
        """Mirror job `job_id` here if the cluster has it and this process does not."""
        if not JOB_ID.fullmatch(job_id):
            return
        pending = self._lookups.get(job_id)
        if pending is None:
            pending = self._lookups[job_id] = asyncio.ensure_future(self._look_up(table, job_id))
            pending.add_done_callback(lambda _: self._lookups.pop(job_id, None))
        await asyncio.shield(pending)

    async def catch_up(self, job: Job) -> None:
        """Before a read of a job mirrored here: until the mirror has what its host had
        (`MirrorRunner.catch_up`): every front end serves the same bytes."""
        if isinstance(job.runner, MirrorRunner):
            await job.runner.catch_up()

    async def delete(self, job: Job) -> None:
        assert isinstance(job.runner, MirrorRunner)
        refused = await job.runner.shared.delete()
        if refused is not None:
            raise refused

    async def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)
        for pending in list(self._lookups.values()):
            pending.cancel()
        jobs = [] if self._table is None else list(self._table.jobs.values())
        for job in jobs:
            if isinstance(job.runner, MirrorRunner):
                await job.runner.close_calls()
        await asyncio.gather(*self._side, return_exceptions=True)

    def replica_health(self) -> dict[str, Any] | None:
        states = self._replica_states or {}
        return {
            "count": sum(states.values()),
            "healthy": states.get("RUNNING", 0),
            "states": states,
            "max_ongoing_requests": self.replica_options.max_ongoing,
        }

    # Jobs.

    def _mirror(
        self,
        services: JobServices,
        spec: JobSpec,
        shared: JobRef,
        decoder: ChunkedDecoder,
        created: Any,
        push_kind: Any = None,
        log: SegmentLog | None = None,
        preview: ChunkedDecoder | None = None,
    ) -> Job:
        def gone(job: Job, reason: EvictionReason) -> None:
            assert self._table is not None  # started before any job exists
            self._in_background(self._table.retention.evict(job, reason))

        runner = MirrorRunner(spec, shared, decoder, created, on_gone=gone)
        # The host's record, rebuilt here: the same facts, its moments on the wall clock.
        record = JobRecord.from_spec(spec)
        plan = None if spec.plan is None else DecodePlan(**spec.plan)
        config = services.config
        if spec.preview is not None and preview is None:  # a job found here: planning only
            preview = services.previews.decoders.get(spec.preview, decoder)
        return Job(
            record,
            decoder,
            plan,
            config,
            services.metrics,
            runner,
            services.attach,
            push_kind,
            log,
            preview=preview,
        )

    async def _look_up(self, table: JobTable, job_id: str) -> None:
        try:
            host = self._hosts.get(host_name(job_id)) or await asyncio.to_thread(
                ray.get_actor, host_name(job_id), NAMESPACE
            )
            spec: JobSpec | None = await asyncio.wait_for(
                host.spec.remote(job_id), LOOKUP_TIMEOUT_S
            )
        except (ValueError, ray.exceptions.RayActorError, TimeoutError):
            spec = None
        if spec is None or job_id in table.jobs or table.draining:
            return  # no such job in the cluster (or it just ended): the route says 404
        services = table.services
        decoders = services.decoders
        decoder = decoders.get(spec.model) or decoders[services.config.default_model]
        job = self._mirror(services, spec, JobRef(host, job_id), decoder, None)
        table.adopt(job)
        assert isinstance(job.runner, MirrorRunner)
        with contextlib.suppress(TimeoutError):  # served as it is: the mirror fills in
            await asyncio.wait_for(job.runner.synced.wait(), LOOKUP_TIMEOUT_S)

    # Hosts and replicas.

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
        JobInput.PUSH if push else JobInput.LATENTS,
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
