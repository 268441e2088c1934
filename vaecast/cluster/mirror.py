"""A job of the cluster as one front end serves it: a Job whose runner mirrors it.

The job runs in the cluster, kept by its host (`vaecast.cluster.shared_job`). What this
process holds is a server `Job` (its record, SegmentLog, fragment index and events) with a
`MirrorRunner`: it follows the shared job by long polls and applies the host's
transitions, in order, to the job's record (each `SegmentAdded` by appending the
fragment it names), so `/content` (live, finished, Range), `/events`, the HLS
playlist and parts read what they always read, and two front ends following one job
send the same bytes. What the routes ask of a job (cancel, abort, the end of a push
session) goes to the shared job. A push session's blocks go there through an
`ActorFeed`, with the token and the block state kept in the cluster.

A front end going down stops only its mirrors: the job goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import asdict
from typing import Any

import torch

from vaecast.cluster.records import GONE_AGE, Audio, JobRef, JobSpec, PushState, Snapshot
from vaecast.codecs.fragment import Fragment
from vaecast.errors import (
    CancelledByShutdown,
    ClusterUnavailableError,
    DecodeCancelled,
    GoneError,
    VaecastError,
)
from vaecast.job.record import Completed, JobStatus, SegmentAdded, Transition, VariantEnded
from vaecast.job.transitions import JobInput, Variant
from vaecast.models.base import ChunkedDecoder, DecodePlan, StreamPlan
from vaecast.pipeline.run import TimedAudio
from vaecast.server.stream.finished_file import state_duration
from vaecast.server.stream.job import Job
from vaecast.server.stream.retention import EvictionReason
from vaecast.server.stream.segment_log import SegmentLog

log = logging.getLogger("vaecast.cluster")

# A mirror's long poll: the host answers at once when something is new.
FOLLOW_WAIT_S = 10.0
# How long a request waits for this mirror to catch up with its host (`catch_up`)
# before it is answered from what the mirror has.
CATCH_UP_TIMEOUT_S = 15.0


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
        self.final_plan: DecodePlan | None = None
        self.preview_chunks: int | None = None

    def take(self, state: PushState) -> None:
        self.latent_frames, self.ended = state.latent_frames, state.ended
        self.block_shape, self.dtype = state.block_shape, state.dtype

    async def shared_state(self) -> tuple[tuple[int, ...] | None, str | None]:
        """The session's first block shape and dtype, as the shared job has them."""
        state = await self._job.push_state()
        if state is not None:
            self.take(state)
        return self.block_shape, self.dtype

    async def put(
        self,
        latents: torch.Tensor,
        audio: TimedAudio | None = None,
        *,
        dtype: str | None = None,
        wait_for_room: bool = True,
    ) -> None:
        """Queue a block in the shared job (waits while its queue is full: the shared
        job bounds its queue itself, so `wait_for_room` is not asked of it)."""
        stream_plan = None
        if self.block_shape is None:
            stream_plan = asdict(self._decoder.plan_stream(tuple(latents.shape)))
        answer = await self._job.push_block(
            latents.detach().contiguous().numpy(),
            None if audio is None else Audio(audio.samples, audio.first_frame),
            self.latent_frames,
            dtype or "float32",
            stream_plan,
        )
        self.take(_raise_if_error(answer))

    async def end(self) -> None:
        plan = None if self.final_plan is None else asdict(self.final_plan)
        self.take(_raise_if_error(await self._job.end_feed(plan, self.preview_chunks)))


class MirrorRunner:
    """The runner of a job that runs in the cluster (see the module docstring)."""

    watches_push_idle = False  # the shared job does

    def __init__(
        self,
        spec: JobSpec,
        shared: JobRef,
        decoder: ChunkedDecoder,
        creation: Any,
        on_gone: Callable[[Job, EvictionReason], None],
    ) -> None:
        """`creation`: the ObjectRef of the job's creation at its host, for a job
        created here (None: found there). `on_gone`: evict the job here once the
        cluster no longer keeps it."""
        self.spec = spec
        self.shared = shared
        self.push_token = spec.push_token
        self.feed: ActorFeed | None = (
            ActorFeed(shared, decoder) if spec.input == JobInput.PUSH else None
        )
        self.stop_error: VaecastError | None = None
        self.synced = asyncio.Event()  # the host's first answer is applied
        # Transitions applied here so far; `_progressed` is set (and replaced) at each.
        self.applied = 0
        self._progressed = asyncio.Event()
        self._following = True
        self._creation = creation
        self._on_gone = on_gone
        self._calls: set[asyncio.Task[Any]] = set()

    async def run(self, job: Job, slot: AbstractAsyncContextManager[Any]) -> None:
        """Apply the shared job's transitions and fragments here until it ends (the
        cluster has its own queue: `slot` is not taken)."""
        fragments = transitions = 0
        try:
            if self._creation is not None:  # calls of other handles may overtake it
                await self._creation
            while True:
                update = await self.shared.follow(fragments, transitions, FOLLOW_WAIT_S)
                if update is None:  # its host lost it (restarted)
                    raise ClusterUnavailableError(f"the cluster lost video {job.id}")
                if update.deleted is not None:
                    raise GoneError(f"video {job.id} is no longer kept")
                self._take(job, update.snapshot)
                refs = iter(update.fragments)
                for transition in update.transitions:
                    if isinstance(transition, SegmentAdded):
                        data, facts = await next(refs)
                        segment = data if facts is None else Fragment(data, facts)
                        await job.sink(transition.variant).append(segment)
                        fragments += 1
                    else:
                        await _state_duration_before(job, transition)
                        job.apply(transition)
                        if isinstance(transition, VariantEnded):
                            _close(job.rendition(transition.variant).log, transition.error)
                    transitions += 1
                    self._applied(transitions)
                self.synced.set()
                if update.final:
                    break
            if job.record.status is JobStatus.COMPLETED:
                _close(job.log, None)
            for rendition in job.renditions:  # what its own end did not close
                _close(rendition.log, job.error or DecodeCancelled("cancelled"))
        except asyncio.CancelledError:
            self._lose(
                job, self.stop_error or CancelledByShutdown("this front end is shutting down")
            )
        except VaecastError as error:
            self._lose(job, error)
        except Exception as error:
            log.warning("job %s: its host is gone: %s", job.id, error)
            self._lose(
                job,
                ClusterUnavailableError(f"the cluster lost video {job.id}: {type(error).__name__}"),
            )
        else:
            self._in_background(job, self._until_gone(job, fragments, transitions))
        finally:
            self.synced.set()
            self._following = False
            self._progressed.set()

    async def catch_up(self) -> None:
        """Until this mirror has applied every transition its host had when asked.

        Each front end follows the host at its own pace, so without this one could
        still stream the live file (its init segment silent about the length) after
        another has answered `completed` and sent the finished one. A read that waits
        here first says at least what any front end said before it began. Bounded: a
        host that does not answer, or a mirror that does not get there in
        CATCH_UP_TIMEOUT_S, leaves the answer to what the mirror has.
        """
        if not self._following:
            return
        try:
            target = await asyncio.wait_for(self.shared.transitions(), CATCH_UP_TIMEOUT_S)
        except Exception:  # the host is gone or slow: the follow loop says so
            return
        if target is None:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(CATCH_UP_TIMEOUT_S):
                while self._following and self.applied < target:
                    await self._progressed.wait()

    def _applied(self, transitions: int) -> None:
        self.applied = transitions
        self._progressed.set()
        self._progressed = asyncio.Event()

    def _take(self, job: Job, snapshot: Snapshot) -> None:
        if snapshot.plan is not None and job.plan is None:
            job.plan = DecodePlan(**snapshot.plan)
        if snapshot.stream_plan is not None and job.stream_plan is None:
            job.stream_plan = StreamPlan(**snapshot.stream_plan)
        if snapshot.push is not None and self.feed is not None:
            self.feed.take(snapshot.push)

    # What the routes ask of a job, done by the shared job.

    def cancel(self, job: Job, reason: str, by_shutdown: bool) -> None:
        """Cancel the job in the cluster; at this front end's shutdown, only stop
        mirroring it (the job goes on, other front ends serve it)."""
        if by_shutdown:
            self.stop_error = CancelledByShutdown(reason)
            job.stop_task()
            return
        self._in_background(job, self.shared.cancel(DecodeCancelled(reason)))

    def abort(self, job: Job, error: VaecastError) -> None:
        self._in_background(job, self.shared.fail(error.detached()))

    def cancel_variant(self, job: Job, variant: Variant, error: VaecastError) -> None:
        """Stop one rendition of the job in the cluster (the host ends it; its
        `VariantEnded` closes the rendition here)."""
        self._in_background(job, self.shared.cancel_variant(variant, error))

    def length_known(self, job: Job, plan: DecodePlan, preview_chunks: int | None) -> None:
        """A push session's last block came through here: the shared job gets the plan
        with the end of the feed (and its record the length)."""
        job.plan = plan
        assert self.feed is not None
        self.feed.final_plan, self.feed.preview_chunks = plan, preview_chunks

    def interrupted(self, job: Job) -> None:
        self._lose(job, self.stop_error or CancelledByShutdown("this front end is shutting down"))

    async def close_calls(self) -> None:
        for task in list(self._calls):
            task.cancel()
        await asyncio.gather(*self._calls, return_exceptions=True)

    def _lose(self, job: Job, error: VaecastError) -> None:
        """This mirror ends without the job's end (shutdown here, the job lost)."""
        if not job.record.is_final:
            failed = not isinstance(error, CancelledByShutdown)
            job.end(JobStatus.FAILED if failed else JobStatus.CANCELLED, error)
        elif not job.log.closed:
            job.log.abort(error.detached())

    async def _until_gone(self, job: Job, fragments: int, transitions: int) -> None:
        """After the end: until the host says the job is gone (age, DELETE), then
        evict the mirror the same way."""
        try:
            while True:
                update = await self.shared.follow(fragments, transitions, FOLLOW_WAIT_S)
                if update is None or update.deleted is not None:
                    reason = EvictionReason(update.deleted if update else GONE_AGE)
                    break
        except Exception:  # its host is gone
            reason = EvictionReason.AGE
        self._on_gone(job, reason)

    def _in_background(self, job: Job, awaitable: Awaitable[Any]) -> None:
        async def run() -> None:
            try:
                await awaitable
            except Exception as error:
                log.warning("job %s: a call to its host failed: %s", job.id, error)

        task = asyncio.ensure_future(run())
        self._calls.add(task)
        task.add_done_callback(self._calls.discard)


async def _state_duration_before(job: Job, transition: Transition) -> None:
    """A rendition that completes states its duration first, as a local one does."""
    if isinstance(transition, Completed):
        rendition = job.final
    elif isinstance(transition, VariantEnded) and transition.status is JobStatus.COMPLETED:
        rendition = job.rendition(transition.variant)
    else:
        return
    if not rendition.log.closed:
        await state_duration(rendition)


def _close(log: SegmentLog, error: VaecastError | None) -> None:
    """End a rendition's log as its rendition ended (once: a later end changes nothing)."""
    if log.closed:
        return
    if error is None:
        log.finish()
    else:
        log.abort(error.detached())


def _raise_if_error(answer: PushState | VaecastError) -> PushState:
    """The host returns its refusals (they arrive intact that way): raise them here."""
    if isinstance(answer, VaecastError):
        raise answer
    return answer
