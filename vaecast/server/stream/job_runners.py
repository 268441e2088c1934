"""How a `JobManager`'s jobs run: the `JobRunners` protocol, and `LocalRunners`.

A manager owns admission, slots, the queue and lookup; its runners own how a job
is made and run (composition, not subclassing). `LocalRunners`, the default,
decode jobs in this process (`LocalRunner`), in the manager's slots and queue; Ray
mode's (`vaecast.cluster.runners`) mirror jobs that run in the cluster. Kept apart
from `vaecast.server.stream.manager` (which re-exports these names) so that the
manager reads as admission and bookkeeping, and a runner factory as what it must
provide.
"""

from __future__ import annotations

import secrets
import time
from typing import Any, Protocol

from vaecast.job.record import JobRecord, LiveProgress, PreviewProgress
from vaecast.job.transitions import JobInput
from vaecast.models.base import ChunkedDecoder, DecodePlan
from vaecast.server.config import ServerConfig
from vaecast.server.stream.job import Job, plan_facts
from vaecast.server.stream.job_requests import DecodeRequest, PushRequest
from vaecast.server.stream.live_rendition import lines_up
from vaecast.server.stream.local_runner import LocalRunner, PreviewSetup
from vaecast.server.stream.services import JobServices, JobTable


class JobRunners(Protocol):
    """How a manager's jobs run (see the module docstring)."""

    # Jobs take this process's decode slots and wait in its queue (queue positions).
    decodes_here: bool

    def new_job(
        self,
        services: JobServices,
        request: DecodeRequest | PushRequest,
        plan: DecodePlan | None,
        decoder: ChunkedDecoder,
        preview: ChunkedDecoder | None = None,
    ) -> Job:
        """A new job of `request`, with its runner (checked, admitted: it will run);
        `preview`: its preview decoder, for a job with two renditions."""

    def start(self, table: JobTable) -> None:
        """On the running loop, when the manager starts."""

    async def close(self) -> None:
        """After the manager's jobs ended."""

    async def find(self, table: JobTable, job_id: str) -> None:
        """Adopt (`table.adopt`) job `job_id` if it runs elsewhere and is not here."""

    async def catch_up(self, job: Job) -> None:
        """Before a read of `job`, still running here: until what this process has of it
        is at least what any other process has said of it."""

    async def settle(self) -> None:
        """Until the jobs created here so far can be found from elsewhere."""

    async def delete(self, job: Job) -> None:
        """Before a finished job is evicted by DELETE: raises a refusal."""

    def replica_health(self) -> dict[str, Any] | None:
        """Decoder replicas elsewhere; None: this process decodes."""


class LocalRunners:
    """Jobs decoded in this process (`LocalRunner`), in its slots."""

    decodes_here = True

    def new_job(
        self,
        services: JobServices,
        request: DecodeRequest | PushRequest,
        plan: DecodePlan | None,
        decoder: ChunkedDecoder,
        preview: ChunkedDecoder | None = None,
    ) -> Job:
        push = isinstance(request, PushRequest)
        job_id = "video_" + secrets.token_hex(12)
        live = preview is not None and lines_up(decoder, preview, request)
        record = JobRecord(
            job_id,
            JobInput.PUSH if push else JobInput.LATENTS,
            request.model,
            request.fps,
            _audio_json(request),
            None if plan is None else plan_facts(plan),
            created_at=time.time(),
            webhook_url=request.webhook_url or _default_webhook(services.config),
            preview=None
            if preview is None
            else PreviewProgress(preview.name, _chunks(preview, request)),
            live=LiveProgress() if live else None,
            expected_frames=request.expected_frames if push else None,
        )
        setup = None
        if preview is not None:
            # On the model's device, the final yields to it (vaecast.pipeline.preview_first).
            first = preview.device == decoder.device
            setup = PreviewSetup(preview, services.previews.workers(services.workers), first)
        runner = LocalRunner(request, services.config, services.workers, services.stages, setup)
        return Job(
            record,
            decoder,
            plan,
            services.config,
            services.metrics,
            runner,
            services.attach,
            request.kind if push else None,
            log=services.new_log(job_id),
            preview=preview,
            live=live,
        )

    def start(self, table: JobTable) -> None:
        pass

    async def close(self) -> None:
        pass

    async def find(self, table: JobTable, job_id: str) -> None:
        pass  # every job of this process is in its manager

    async def catch_up(self, job: Job) -> None:
        pass  # this process is the only one that runs it

    async def settle(self) -> None:
        pass

    async def delete(self, job: Job) -> None:
        pass

    def replica_health(self) -> dict[str, Any] | None:
        return None


def _chunks(preview: ChunkedDecoder, request: DecodeRequest | PushRequest) -> int | None:
    """The preview's chunk count: an upload's now, a push session's at its end."""
    if isinstance(request, PushRequest):
        return None
    return preview.plan(tuple(request.latents.shape)).chunks


def _audio_json(request: DecodeRequest | PushRequest) -> dict[str, int] | None:
    """The job's audio as the API shows it: its sample rate and channels."""
    if isinstance(request, DecodeRequest):
        track = request.soundtrack
        return (
            None
            if track is None
            else {"sample_rate": track.sample_rate, "channels": track.channels}
        )
    fmt = request.audio_format
    return None if fmt is None else {"sample_rate": fmt.sample_rate, "channels": fmt.channels}


def _default_webhook(config: ServerConfig) -> str | None:
    """Where a job's webhooks go when it names none: the server's default, if it sends
    any. Kept in the job's record, so a restart with another default changes nothing
    for jobs made before it."""
    webhooks = config.webhooks
    return webhooks.default_url if webhooks.secret is not None else None
