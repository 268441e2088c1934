"""One job's shared state in Ray mode: `SharedJob`, kept by a `JobHost` actor.

A SharedJob is the job, as far as the cluster is concerned: its `JobRecord` (status,
counters, timings, events: the record the server's jobs keep), its fragments (each
put in Ray's object store, the refs kept in order), and a push session's block
queue. It drives the decode itself: it calls the decoder replicas' streaming
`decode` and takes each record as it comes (`vaecast.cluster.replica_calls`), so the
job does not depend on the front end that created it.

Front ends follow it by long polls (`follow`: the record's transitions and the
fragments since those they have, and the job's state) and apply them to a local Job
mirror (`vaecast.cluster.mirror`), whose record then reads as this one; a push goes
from any front end into the block queue (`push_block` waits while it is full), and
the replica pulls blocks from it (`next_block`).

A job with a preview (`JobSpec.preview`) makes two calls on the replicas, one per
rendition (they may run on different replicas): each call's records are tagged with
its variant, its fragments go into the one list in the order of the transitions
that name them, a push session's blocks go to each call's queue, and each rendition
ends on its own (`VariantEnded`; `cancel_variant` stops one) before the job does.

After the job ends it keeps its fragments for `retention_s`, or until DELETE, then
tells its followers why they are gone, and its host forgets it.

Apart from the actor that keeps jobs by id (`vaecast.cluster.job_host`, which
re-exports this module's names): this is one job's life, that is the host's bookkeeping.
This module imports neither torch nor PyAV.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from vaecast.cluster.records import (
    GONE_AGE,
    GONE_DELETED,
    Audio,
    Block,
    DecodeCall,
    JobRef,
    JobSpec,
    PushState,
    Snapshot,
    Update,
    plan_facts,
)
from vaecast.cluster.replica_calls import ReplicaCalls
from vaecast.errors import (
    DecodeCancelled,
    JobStateError,
    VaecastError,
)
from vaecast.job.record import (
    FINAL,
    PREVIEW,
    Completed,
    Ended,
    Geometry,
    JobRecord,
    JobStatus,
    LengthKnown,
    SegmentAdded,
    VariantEnded,
)
from vaecast.job.transitions import JobInput, Variant
from vaecast.push_ledger import session_timeout

# Fragments and events per `follow` answer: a late follower catches up in batches.
FOLLOW_BATCH = 64
# A deleted or expired job is kept this much longer, so that followers waiting on
# it hear why before it is forgotten.
GONE_GRACE_S = 1.0


@dataclass(frozen=True, slots=True)
class JobSettings:
    push_queue_blocks: int
    push_idle_timeout_s: float
    push_first_block_timeout_s: float
    retention_s: float


class SharedJob:
    """One job's shared state and its drive of a replica (see the module docstring)."""

    def __init__(
        self,
        spec: JobSpec,
        call: DecodeCall,
        settings: JobSettings,
        ref: JobRef,
        forget: Callable[[], None],
        preview_call: DecodeCall | None = None,
    ) -> None:
        self.spec = spec
        self._ref = ref
        self._forget = forget
        self._settings = settings
        # Moments on the wall clock, from the job's creation at its front end: a
        # mirror on another machine reads the same timings.
        self.record = JobRecord.from_spec(spec)
        self.fragments: list[Any] = []  # ObjectRefs, in order
        calls = {FINAL: call, **({} if preview_call is None else {PREVIEW: preview_call})}
        self._replicas = ReplicaCalls(
            ref, calls, self.record, self.fragments, self._apply, self._drop_blocks
        )
        self.plan = spec.plan
        self.stream_plan: dict[str, Any] | None = None
        self._gone: str | None = None
        self._stop_error: VaecastError | None = None
        self._stop_failed = False
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._side: set[asyncio.Task[None]] = set()
        # A push session's blocks (None after the last), a queue per rendition, and what
        # each next one must match.
        self._blocks: dict[str, asyncio.Queue[Block | None]] = {
            variant: asyncio.Queue(settings.push_queue_blocks) for variant in calls
        }
        self._first_block = asyncio.Event()
        self._push = PushState(0, None, None, False) if spec.input == JobInput.PUSH else None
        self._last_push = time.perf_counter()
        self._pushes_in_flight = 0

    @property
    def finished(self) -> bool:
        return self.record.is_final

    # Lifetime.

    async def start(self) -> None:
        """Start the decode (once); a push session's waits for its first block."""
        if self._task is None:
            self._task = asyncio.create_task(self._drive())
            if self._push is not None:
                self._in_background(self._watch_idle())

    async def cancel(self, error: VaecastError) -> None:
        """Stop the job (DELETE, a stream's client gone); returns once it has ended."""
        await self._stop(error)

    async def fail(self, error: VaecastError) -> None:
        """End the job as failed with `error` (a live demo's producer failed, say)."""
        await self._stop(error, failed=True)

    async def delete(self) -> VaecastError | None:
        """DELETE of a finished job: its fragments go now, then the job itself."""
        if not self.finished:
            return JobStateError(
                f"video {self.spec.job_id} is {self.record.status.value}: cancel it first"
            )
        self._go(GONE_DELETED)
        return None

    async def replica_stopped(self, decoded_chunks: int, variant: Variant = FINAL) -> None:
        """The replica's decode of this job (its rendition `variant`) has returned,
        after `decoded_chunks` chunks."""
        self._replicas.replica_stopped(decoded_chunks, variant)

    async def cancel_variant(self, variant: Variant, error: VaecastError) -> None:
        """Stop one rendition of a job with a preview; the other goes on (stopping the
        last one still running stops the job). Returns once it has stopped."""
        preview = self.record.preview
        if self.finished or preview is None or variant not in self._replicas.calls:
            return
        other = PREVIEW if variant == FINAL else FINAL
        other_ended = preview.is_final if other == PREVIEW else self.record.final_ended is not None
        if other_ended or self._replicas.stopping(other):
            await self._stop(error)
            return
        if self._replicas.stopping(variant):
            return
        self._drop_blocks(variant)
        if not await self._replicas.stop(variant, error):  # it never starts
            self._apply(VariantEnded(variant, JobStatus.CANCELLED, error.detached()))

    async def follow(self, fragments_seen: int, transitions_seen: int, wait_s: float) -> Update:
        """The record's transitions after the first `transitions_seen`, and the fragments
        of their `SegmentAdded`s (after `fragments_seen`), once there are any (or the job
        is gone, or `wait_s` passed)."""
        deadline = time.perf_counter() + wait_s
        transitions = self.record.transitions
        while self._gone is None and transitions_seen >= len(transitions):
            changed = self._changed
            left = deadline - time.perf_counter()
            if left <= 0:
                break
            try:
                await asyncio.wait_for(changed.wait(), left)
            except TimeoutError:
                break
        if self._gone is not None:
            return Update([], [], self._snapshot(), True, deleted=self._gone)
        batch = transitions[transitions_seen : transitions_seen + FOLLOW_BATCH]
        segments = sum(isinstance(t, SegmentAdded) for t in batch)
        fragments = self.fragments[fragments_seen : fragments_seen + segments]
        final = self.finished and transitions_seen + len(batch) == len(transitions)
        return Update(fragments, batch, self._snapshot(), final)

    # A push session.

    async def push_state(self) -> PushState | None:
        return self._push

    async def push_block(
        self,
        latents: Any,
        audio: Audio | None,
        expected_latent_frames: int,
        dtype: str,
        stream_plan: dict[str, Any] | None,
    ) -> PushState | VaecastError:
        """Queue a block pushed through any front end; waits while the queue is full.

        `expected_latent_frames` is what the front end checked the block against: a
        push that another one overtook meanwhile is refused (its audio would be placed
        wrongly). Errors are returned, not raised: they reach the front end intact.
        """
        state = self._push
        if state is None:
            return JobStateError(f"video {self.spec.job_id} is not a push session")
        if (refused := self._refuse_push()) is not None:
            return refused
        if expected_latent_frames != state.latent_frames:
            return JobStateError(f"video {self.spec.job_id}: another block came first; push again")
        shape = tuple(latents.shape)
        self._push = replace(
            state,
            latent_frames=state.latent_frames + shape[2],
            block_shape=state.block_shape or shape,
            dtype=state.dtype or dtype,
        )
        if self.stream_plan is None and stream_plan is not None:
            self.stream_plan = stream_plan
            self.record.apply(Geometry(stream_plan["width"], stream_plan["height"]))
        self._first_block.set()
        self._last_push = time.perf_counter()
        self._pushes_in_flight += 1
        try:
            if not await self._until_job_ends(self._put_all(Block(latents, audio, time.time()))):
                return self._refuse_push() or JobStateError(f"video {self.spec.job_id} has ended")
        finally:
            self._pushes_in_flight -= 1
            self._last_push = time.perf_counter()
        self._changed_now()
        return self._push

    async def end_feed(
        self, plan: dict[str, Any] | None, preview_chunks: int | None = None
    ) -> PushState | VaecastError:
        """The last block came: the whole video's `plan` (None when nothing was pushed),
        and a preview's chunk count."""
        state = self._push
        if state is None:
            return JobStateError(f"video {self.spec.job_id} is not a push session")
        if (refused := self._refuse_push()) is not None:
            return refused
        self._push = replace(state, ended=True)
        if state.block_shape is None:  # nothing was pushed: as a LatentFeed ends
            self._in_background(
                self._stop(DecodeCancelled("the session ended before any block"), failed=True)
            )
            return self._push
        if plan is not None:
            self.plan = plan
            self._apply(LengthKnown(plan_facts(plan), preview_chunks))  # type: ignore[arg-type]
        await self._until_job_ends(self._put_all(None))
        return self._push

    async def next_block(self, variant: Variant = FINAL) -> Block | None:
        """The next block of a replica's call for rendition `variant` (None: the session
        ended, or the rendition was stopped); waits for one."""
        queue = self._blocks.get(variant)
        return None if queue is None else await queue.get()

    async def _put_all(self, block: Block | None) -> None:
        """`block` into each running rendition's queue, waiting for room in each."""
        for variant in list(self._blocks):
            queue = self._blocks.get(variant)
            if queue is not None:  # a rendition stopped meanwhile: its queue is gone
                await queue.put(block)

    def _drop_blocks(self, variant: Variant) -> None:
        """A stopped rendition takes no more blocks: a put waiting for its room goes on."""
        queue = self._blocks.pop(variant, None)
        while queue is not None and not queue.empty():
            queue.get_nowait()
        if queue is not None and self._push is not None:
            queue.put_nowait(None)  # a pull waiting for a block ends

    # Driving the replica.

    async def _drive(self) -> None:
        try:
            if self._push is not None:
                await self._first_block.wait()
            await self._replicas.run()
            final = self.record.final_ended
            if final is not None and final.error is not None:  # a job with a preview
                self._end(final.status, final.error)
                return
            self._apply(Completed())
        except asyncio.CancelledError:
            self._end(
                JobStatus.FAILED if self._stop_failed else JobStatus.CANCELLED,
                self._stop_error or DecodeCancelled("cancelled"),
            )
        except VaecastError as error:
            self._end(JobStatus.FAILED, error)
        except Exception as error:
            self._end(JobStatus.FAILED, self._replicas.lost(error))
        finally:
            self._replicas.drop_latents()
            self._changed_now()
            self._in_background(self._expire())

    async def _stop(self, error: VaecastError, failed: bool = False) -> None:
        if self.finished:
            return
        if self._task is None:  # never started
            self._end(JobStatus.FAILED if failed else JobStatus.CANCELLED, error)
            return
        self._stop_error, self._stop_failed = error, failed
        self._task.cancel()
        await asyncio.wait([self._task])

    def _end(self, status: JobStatus, error: VaecastError) -> None:
        self._apply(Ended(status, error.detached(), self._replicas.decoded_chunks))

    def _apply(self, transition: Any) -> None:
        self.record.apply(transition)
        self._changed_now()

    def _refuse_push(self) -> VaecastError | None:
        if self._push is not None and self._push.ended:
            return JobStateError(f"video {self.spec.job_id} has had its final block")
        if self.finished:
            return JobStateError(f"video {self.spec.job_id} has ended: {self.record.status.value}")
        return None

    async def _until_job_ends(self, waiting: Any) -> bool:
        """Await `waiting` unless the job ends first (then cancel it: False)."""
        put = asyncio.ensure_future(waiting)
        try:
            while not put.done():
                if self.finished:
                    return False
                woken = asyncio.ensure_future(self._changed.wait())
                try:
                    await asyncio.wait([put, woken], return_when=asyncio.FIRST_COMPLETED)
                finally:
                    woken.cancel()
            return True
        finally:
            if not put.done():
                put.cancel()

    async def _watch_idle(self) -> None:
        settings, opened = self._settings, self._last_push
        while not self.finished and self._push is not None and not self._push.ended:
            wait_s, error = session_timeout(
                time.perf_counter(),
                opened,
                self._last_push,
                self._pushes_in_flight > 0,
                self._first_block.is_set(),
                settings.push_idle_timeout_s,
                settings.push_first_block_timeout_s,
            )
            if error is not None:
                await self._stop(error, failed=True)
                return
            await asyncio.sleep(wait_s)

    async def _expire(self) -> None:
        await asyncio.sleep(self._settings.retention_s)
        self._go(GONE_AGE)

    def _go(self, reason: str) -> None:
        """Free the fragments, tell the followers why (GONE_*), then leave the host."""
        if self._gone is not None:
            return
        self._gone = reason
        self.fragments.clear()
        self._changed_now()
        asyncio.get_running_loop().call_later(GONE_GRACE_S, self._forget)

    def _snapshot(self) -> Snapshot:
        return Snapshot(self.plan, self.stream_plan, self._push)

    def _changed_now(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _in_background(self, coroutine: Any) -> None:
        task = asyncio.ensure_future(coroutine)
        self._side.add(task)
        task.add_done_callback(self._side.discard)
