"""The `JobHost` actors: named, detached async actors that keep Ray mode's jobs.

Each keeps any number of `SharedJob`s (`vaecast.cluster.shared_job`: a job's state
and its drive of a replica) and answers for them by job id; `vaecast.cluster.runners`
starts them as `ray.remote(JobHost)`, by this class path.

Why hosts, and not an actor per job: an actor is a process, which on a loaded node
takes seconds to start and import Ray Serve, all of it added to the job's time to
first fragment, and some 150 MB each. `JOB_HOSTS` async actors, started
with the first front end, keep any number of jobs; a job's id names its host
(`records.host_name`), so any front end finds any job. The price: a host that dies
takes its share of the jobs with it (Ray restarts it, empty; their viewers are cut
and the jobs answer 503 on the front ends that were following them).

`SharedJob`, `JobSettings` and `plan_facts` are re-exported from here, where they
lived first. This module imports neither torch nor PyAV.
"""

from __future__ import annotations

from typing import Any

import ray

from vaecast.cluster.records import (
    Block,
    DecodeCall,
    JobRef,
    JobSpec,
    PushState,
    Update,
    plan_facts,
)
from vaecast.cluster.shared_job import JobSettings, SharedJob
from vaecast.errors import JobStateError, VaecastError
from vaecast.job.transitions import Variant

__all__ = ["JobHost", "JobSettings", "SharedJob", "plan_facts"]


class JobHost:
    """A named, detached async actor that keeps jobs (runs as `ray.remote(JobHost)`).

    Its methods are the SharedJob's, by job id; a job it does not have (never, or no
    longer) answers None.
    """

    def __init__(self) -> None:
        self._jobs: dict[str, SharedJob] = {}

    async def create(
        self,
        spec: JobSpec,
        call: DecodeCall,
        settings: JobSettings,
        preview_call: DecodeCall | None = None,
    ) -> None:
        if spec.job_id in self._jobs:
            return
        me = ray.get_runtime_context().current_actor
        job = SharedJob(
            spec,
            call,
            settings,
            JobRef(me, spec.job_id),
            forget=lambda: self._jobs.pop(spec.job_id, None),
            preview_call=preview_call,
        )
        self._jobs[spec.job_id] = job
        await job.start()

    async def jobs(self) -> int:
        return len(self._jobs)

    async def spec(self, job_id: str) -> JobSpec | None:
        job = self._jobs.get(job_id)
        return None if job is None else job.spec

    async def transitions(self, job_id: str) -> int | None:
        job = self._jobs.get(job_id)
        return None if job is None else len(job.record.transitions)

    async def follow(self, job_id: str, *args: Any) -> Update | None:
        job = self._jobs.get(job_id)
        return None if job is None else await job.follow(*args)

    async def cancel(self, job_id: str, error: VaecastError) -> None:
        if (job := self._jobs.get(job_id)) is not None:
            await job.cancel(error)

    async def fail(self, job_id: str, error: VaecastError) -> None:
        if (job := self._jobs.get(job_id)) is not None:
            await job.fail(error)

    async def delete(self, job_id: str) -> VaecastError | None:
        if (job := self._jobs.get(job_id)) is not None:
            return await job.delete()
        return None

    async def push_state(self, job_id: str) -> PushState | None:
        job = self._jobs.get(job_id)
        return None if job is None else await job.push_state()

    async def push_block(self, job_id: str, *args: Any) -> PushState | VaecastError:
        job = self._jobs.get(job_id)
        return _gone(job_id) if job is None else await job.push_block(*args)

    async def end_feed(
        self, job_id: str, plan: dict[str, Any] | None, preview_chunks: int | None = None
    ) -> PushState | VaecastError:
        job = self._jobs.get(job_id)
        return _gone(job_id) if job is None else await job.end_feed(plan, preview_chunks)

    async def next_block(self, job_id: str, variant: Variant = "final") -> Block | None:
        job = self._jobs.get(job_id)
        return None if job is None else await job.next_block(variant)

    async def replica_stopped(
        self, job_id: str, decoded_chunks: int, variant: Variant = "final"
    ) -> None:
        if (job := self._jobs.get(job_id)) is not None:
            await job.replica_stopped(decoded_chunks, variant)

    async def cancel_variant(self, job_id: str, variant: Variant, error: VaecastError) -> None:
        if (job := self._jobs.get(job_id)) is not None:
            await job.cancel_variant(variant, error)


def _gone(job_id: str) -> VaecastError:
    return JobStateError(f"video {job_id} is no longer kept in the cluster")
