"""One job's shared state in Ray mode: `SharedJob`, kept by a `JobHost` actor.

A SharedJob is the job, as far as the cluster is concerned: its `JobRecord` (status,
counters, timings, events: the record the server's jobs keep), its fragments (each
put in Ray's object store, the refs kept in order), and a push session's block
queue. It drives the decode itself: it calls the decoder replicas' streaming
`decode` and takes each record as it comes, so the job does not depend on the front
end that created it.

Front ends follow it by long polls (`follow`: the record's transitions and the
fragments since those they have, and the job's state) and apply them to a local Job
mirror (`vaecast.cluster.mirror`), whose record then reads as this one; a push goes
from any front end into the block queue (`push_block` waits while it is full), and
the replica pulls blocks from it (`next_block`).

After the job ends it keeps its fragments for `retention_s`, or until DELETE, then
tells its followers why they are gone, and its host forgets it.

Apart from the actor that keeps jobs by id (`vaecast.cluster.job_host`, which
re-exports this module's names): this is one job's life, that is the host's bookkeeping.
This module imports neither torch nor PyAV.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

import ray
from ray import serve

from vaecast.cluster.records import (
    APP_NAME,
    DEPLOYMENT_NAME,
    GONE_AGE,
    GONE_DELETED,
    Audio,
    Block,
    Chunk,
    DecodeCall,
    JobRef,
    JobSpec,
    PushState,
    Segment,
    Snapshot,
    Started,
    Update,
)
from vaecast.errors import (
    DecodeCancelled,
    DecodeFailedError,
    JobStateError,
    ReplicaFailedError,
    VaecastError,
)
from vaecast.job_record import (
    ChunkEncoded,
    Completed,
    Encoding,
    Ended,
    Geometry,
    JobRecord,
    JobStatus,
    LengthKnown,
    PlanFacts,
    SegmentAdded,
)
from vaecast.job_record import Started as RecordStarted
from vaecast.push_ledger import session_timeout

# Fragments and events per `follow` answer: a late follower catches up in batches.
FOLLOW_BATCH = 64
# A deleted or expired job is kept this much longer, so that followers waiting on
# it hear why before it is forgotten.
GONE_GRACE_S = 1.0
# A cancelled job ends once its replica says its decode returned, or after this long.
REPLICA_STOP_WAIT_S = 10.0


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
    ) -> None:
        self.spec = spec
        self._ref = ref
        self._forget = forget
        self._call = call  # its latents are dropped once the replica has them
        self._settings = settings
        # Moments on the wall clock, from the job's creation at its front end: a
        # mirror on another machine reads the same timings.
        self.record = JobRecord(
            spec.job_id,
            spec.input,
            spec.model,
            spec.fps,
            spec.audio,
            plan_facts(spec.plan),
            created_at=spec.created_at,
            clock=time.time,
            created=spec.created_at,
        )
        self.fragments: list[Any] = []  # ObjectRefs, in order
        self.plan = spec.plan
        self.stream_plan: dict[str, Any] | None = None
        self._gone: str | None = None
        self._stop_error: VaecastError | None = None
        self._stop_failed = False
        self._replica_stop = asyncio.Event()
        self._decoded_chunks: int | None = None
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._side: set[asyncio.Task[None]] = set()
        # A push session's blocks (None after the last), and what each next one must match.
        self._blocks: asyncio.Queue[Block | None] = asyncio.Queue(settings.push_queue_blocks)
        self._first_block = asyncio.Event()
        self._push = PushState(0, None, None, False) if spec.input == "push" else None
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

    async def replica_stopped(self, decoded_chunks: int) -> None:
        """The replica's decode of this job has returned, after `decoded_chunks` chunks."""
        self._decoded_chunks = decoded_chunks
        self._replica_stop.set()

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
            if not await self._until_job_ends(self._blocks.put(Block(latents, audio, time.time()))):
                return self._refuse_push() or JobStateError(f"video {self.spec.job_id} has ended")
        finally:
            self._pushes_in_flight -= 1
            self._last_push = time.perf_counter()
        self._changed_now()
        return self._push

    async def end_feed(self, plan: dict[str, Any] | None) -> PushState | VaecastError:
        """The last block came: the whole video's `plan` (None when nothing was pushed)."""
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
            self._apply(LengthKnown(plan_facts(plan)))  # type: ignore[arg-type]
        await self._until_job_ends(self._blocks.put(None))
        return self._push

    async def next_block(self) -> Block | None:
        """The replica's next block (None: the session ended); waits for one."""
        return await self._blocks.get()

    # Driving the replica.

    async def _drive(self) -> None:
        stream = None
        ended = False
        try:
            if self._push is not None:
                await self._first_block.wait()
            call = replace(self._call, job=self._ref)
            self._call = replace(self._call, latents=None)
            handle = serve.get_deployment_handle(DEPLOYMENT_NAME, app_name=APP_NAME)
            stream = handle.options(stream=True).decode.remote(call)
            del call
            async for record in stream:
                await self._take(record)
            ended = True
            plan = self.record.plan
            if plan is not None and self.record.chunks_done != plan.chunks:
                raise DecodeFailedError(
                    f"the replica ended after {self.record.chunks_done} chunks, "
                    f"the plan has {plan.chunks}"
                )
            self._apply(Completed())
        except asyncio.CancelledError:
            if stream is not None and not ended:
                stream.cancel()
                if self.record.replica is not None:  # its replica decodes it: until it stopped
                    await self._until_replica_stopped()
            self._end(
                JobStatus.FAILED if self._stop_failed else JobStatus.CANCELLED,
                self._stop_error or DecodeCancelled("cancelled"),
            )
        except VaecastError as error:
            self._end(JobStatus.FAILED, error)
        except Exception as error:
            self._end(JobStatus.FAILED, self._replica_lost(error))
        finally:
            if stream is not None and not ended:
                stream.cancel()  # a no-op once it ended; stops the replica's decode otherwise
            self._call = replace(self._call, latents=None, soundtrack=None)
            self._changed_now()
            self._in_background(self._expire())

    async def _take(self, record: Started | Segment | Chunk | VaecastError) -> None:
        if isinstance(record, Segment):
            self.fragments.append(ray.put(record.data))
            self._apply(SegmentAdded(len(record.data)))
        elif isinstance(record, Chunk):
            latency = None if record.block_arrived is None else time.time() - record.block_arrived
            self._apply(
                ChunkEncoded(
                    index=record.index,
                    total=record.total,
                    frame_start=record.frame_start,
                    frames=record.frames,
                    bytes=record.bytes,
                    encode_s=record.encode_s,
                    decode_wait_s=record.decode_wait_s,
                    latency_s=latency,
                )
            )
        elif isinstance(record, Started):
            self._apply(RecordStarted(replica=asdict(record.replica)))
            self._apply(Encoding(record.content_type))
        elif isinstance(record, VaecastError):
            raise record

    async def _stop(self, error: VaecastError, failed: bool = False) -> None:
        if self.finished:
            return
        if self._task is None:  # never started
            self._end(JobStatus.FAILED if failed else JobStatus.CANCELLED, error)
            return
        self._stop_error, self._stop_failed = error, failed
        self._task.cancel()
        await asyncio.wait([self._task])

    async def _until_replica_stopped(self) -> None:
        # Past the wait the job ends cancelled all the same; the replica is Serve's to watch.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._replica_stop.wait(), REPLICA_STOP_WAIT_S)

    def _end(self, status: JobStatus, error: VaecastError) -> None:
        self._apply(Ended(status, error.detached(), self._decoded_chunks))

    def _apply(self, transition: Any) -> None:
        self.record.apply(transition)
        self._changed_now()

    def _replica_lost(self, error: Exception) -> VaecastError:
        replica = self.record.replica
        where = "" if replica is None else f" {replica['id']}"
        first_line = (str(error).strip().splitlines() or [""])[0][:200]
        return ReplicaFailedError(
            f"the decoder replica{where} failed: {type(error).__name__}: {first_line}"
        )

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


def plan_facts(plan: dict[str, Any] | None) -> PlanFacts | None:
    """A DecodePlan's fields (as they cross the cluster) as the record shows them."""
    if plan is None:
        return None
    frames = plan["chunk_frames"]
    return PlanFacts(sum(frames), len(frames), plan["width"], plan["height"])
