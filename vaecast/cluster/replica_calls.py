"""A job's calls on the decoder replicas, as its host drives them (`SharedJob`).

One call per rendition: the final's (the model), and a preview's (the preview
decoder, `DecodeCall.variant` "preview"), which may run on another replica. Each is a
Serve streaming call whose records (Started, Segment, Chunk) become the job record's
transitions, tagged with the call's variant; each Segment's bytes go into the job's
one fragment list, in the order of the transitions that name them. A job with a
preview ends each rendition on its own (`VariantEnded`; `stop` ends one), and says
`final_ready` once the final has passed a viewer of the preview. Apart from the
shared job so that it reads as the job's state and its push session; this is the
drive of its decode. It imports neither torch nor PyAV.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from typing import Any

import ray
from ray import serve

from vaecast.cluster.records import (
    APP_NAME,
    DEPLOYMENT_NAME,
    Chunk,
    DecodeCall,
    JobRef,
    Segment,
    Started,
)
from vaecast.errors import DecodeFailedError, ReplicaFailedError, VaecastError
from vaecast.job.record import (
    FINAL,
    PREVIEW,
    ChunkEncoded,
    Encoding,
    FinalReady,
    JobRecord,
    JobStatus,
    SegmentAdded,
    VariantEnded,
)
from vaecast.job.record import Started as RecordStarted
from vaecast.job.transitions import Variant

# A cancelled call ends once its replica says its decode returned, or after this long.
REPLICA_STOP_WAIT_S = 10.0


class ReplicaCalls:
    """One job's replica calls (see the module docstring)."""

    def __init__(
        self,
        ref: JobRef,
        calls: dict[str, DecodeCall],
        record: JobRecord,
        fragments: list[Any],
        apply: Callable[[Any], None],
        rendition_ended: Callable[[str], None],
    ) -> None:
        """`apply`: the job's door to its record; `rendition_ended(variant)`: told
        when a rendition's call has ended (its push blocks are no longer wanted)."""
        self._ref = ref
        self.calls = calls  # their latents are dropped once a replica has them
        self._record = record
        self._fragments = fragments
        self._apply = apply
        self._rendition_ended = rendition_ended
        self._stopped = {variant: asyncio.Event() for variant in calls}  # replicas' word
        self.decoded_chunks: int | None = None  # the final's, as its replica said
        self._stops: dict[str, VaecastError] = {}  # renditions stopped alone
        self._tasks: dict[str, asyncio.Task[None]] = {}

    async def run(self) -> None:
        """Every call to its end. A job without a preview raises how its call failed;
        with one, each rendition's end is a `VariantEnded` and this returns."""
        if PREVIEW in self.calls:
            await self._run_renditions()
        else:
            await self._stream(FINAL)
            self._check_chunks()

    def replica_stopped(self, decoded_chunks: int, variant: Variant) -> None:
        if variant == FINAL:
            self.decoded_chunks = decoded_chunks
        if (stopped := self._stopped.get(variant)) is not None:
            stopped.set()

    def stopping(self, variant: Variant) -> bool:
        return variant in self._stops

    async def stop(self, variant: Variant, error: VaecastError) -> bool:
        """Stop one rendition's call (its `VariantEnded` says so once it has stopped);
        False: it never started, and never will."""
        if variant in self._stops:
            return True
        self._stops[variant] = error
        task = self._tasks.get(variant)
        if task is None:
            return False
        task.cancel()
        await asyncio.wait([task])
        return True

    def drop_latents(self) -> None:
        for variant, call in self.calls.items():
            self.calls[variant] = replace(call, latents=None, soundtrack=None)

    async def _stream(self, variant: Variant) -> None:
        """One replica call (rendition `variant`) to its end, each record taken."""
        call = replace(self.calls[variant], job=self._ref)
        self.calls[variant] = replace(call, latents=None)
        handle = serve.get_deployment_handle(DEPLOYMENT_NAME, app_name=APP_NAME)
        stream = handle.options(stream=True).decode.remote(call)
        del call
        ended = False
        try:
            async for record in stream:
                self._take(record, variant)
            ended = True
        except asyncio.CancelledError:
            if not ended:
                stream.cancel()
                if self._record.replica is not None:  # its replica decodes it: until it stopped
                    await self._until_replica_stopped(variant)
            raise
        finally:
            if not ended:
                stream.cancel()  # a no-op once it ended; stops the replica's decode otherwise

    def _check_chunks(self) -> None:
        plan = self._record.plan
        if plan is not None and self._record.chunks_done != plan.chunks:
            raise DecodeFailedError(
                f"the replica ended after {self._record.chunks_done} chunks, "
                f"the plan has {plan.chunks}"
            )

    async def _run_renditions(self) -> None:
        """Both renditions' calls, each to its own end; cancelled, both stop."""
        for variant in self.calls:
            if variant not in self._stops:
                self._tasks[variant] = asyncio.create_task(self._rendition(variant))
        tasks = list(self._tasks.values())
        try:
            await asyncio.wait(tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _rendition(self, variant: Variant) -> None:
        try:
            await self._stream(variant)
            if variant == FINAL:
                self._check_chunks()
        except asyncio.CancelledError:
            stopped = self._stops.get(variant)
            if stopped is None:
                raise  # the job is being stopped: `_drive` records how
            self._apply(VariantEnded(variant, JobStatus.CANCELLED, stopped.detached()))
        except VaecastError as error:
            self._apply(VariantEnded(variant, JobStatus.FAILED, error.detached()))
        except Exception as error:
            self._apply(VariantEnded(variant, JobStatus.FAILED, self.lost(error)))
        else:
            self._final_ready()
            self._apply(VariantEnded(variant, JobStatus.COMPLETED))
        finally:
            self._rendition_ended(variant)

    def _final_ready(self) -> None:
        if self._record.final_caught_up():  # (never for a job without a preview)
            self._apply(FinalReady())

    def _take(self, record: Started | Segment | Chunk | VaecastError, variant: Variant) -> None:
        if isinstance(record, Segment):
            # The bytes and their facts: a front end's mirror makes the fragment again.
            self._fragments.append(ray.put((record.data, record.facts)))
            self._apply(SegmentAdded(len(record.data), variant))
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
                    latency_s=latency if variant == FINAL else None,
                    variant=variant,
                )
            )
            self._final_ready()
        elif isinstance(record, Started):
            if self._record.status is JobStatus.QUEUED:  # the first rendition to start
                self._apply(RecordStarted(replica=asdict(record.replica)))
            if "codecs=" not in self._record.content_type:  # both renditions' alike
                self._apply(Encoding(record.content_type))
        elif isinstance(record, VaecastError):
            raise record

    async def _until_replica_stopped(self, variant: Variant) -> None:
        # Past the wait the job ends cancelled all the same; the replica is Serve's to watch.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopped[variant].wait(), REPLICA_STOP_WAIT_S)

    def lost(self, error: Exception) -> VaecastError:
        replica = self._record.replica
        where = "" if replica is None else f" {replica['id']}"
        first_line = (str(error).strip().splitlines() or [""])[0][:200]
        return ReplicaFailedError(
            f"the decoder replica{where} failed: {type(error).__name__}: {first_line}"
        )
