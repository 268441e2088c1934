"""The decoder replicas: a Ray Serve deployment that runs `run_pipeline` per job.

Each replica loads its models once and decodes jobs as `decode(call)`, a streaming
method (called through `handle.options(stream=True)`): it runs the one pipeline with
a sink that hands every segment to the generator, and yields small records (see
`vaecast.cluster.records`): Started (with this replica's id), each Segment, each
chunk's timings, and a VaecastError as the last record of a decode that failed.

Bounds: a replica runs at most `max_ongoing_requests` decodes (Serve queues the
rest); the relay between the pipeline and the generator holds at most
`RELAY_SEGMENTS` segments, so the encoder waits when the generator is not taken
from. Cancel: when the caller cancels the call, the generator's CancelledError
cancels the pipeline's task, and `run_pipeline` stops the decoder at its next chunk
and returns only once the decode thread has returned.

A push session's blocks come through the same `LatentFeed` a local push session's
do, its transport a pull from the job's host (`actor_pull`, one `next_block` call at
a time): the feed's pump pulls at most `PULL_AHEAD_BLOCKS` blocks (and one more, held
back) ahead of the decoder, beyond the job's own bounded queue. So the pipeline sees a
live source here too, and a push's audio is aligned per fragment as it is locally:
a chunk's fragment waits for the audio that ends it, which comes with a later block.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import ray
import torch
from ray import serve

from vaecast.cluster.records import (
    APP_NAME,
    DEPLOYMENT_NAME,
    Block,
    Chunk,
    DecodeCall,
    JobRef,
    ReplicaInfo,
    ReplicaOptions,
    Segment,
    Started,
)
from vaecast.codecs.fragment import facts_of
from vaecast.codecs.h264 import EncoderSettings
from vaecast.codecs.stream import Soundtrack
from vaecast.errors import DecodeFailedError, UnknownModelError, VaecastError
from vaecast.job.transitions import Variant
from vaecast.models.base import ChunkCallback, ChunkedDecoder, DecodedChunk
from vaecast.models.linear import LinearDecoder
from vaecast.pipeline.heap import retain_decode_heap
from vaecast.pipeline.latent_feed import BlockPull, LatentFeed, PulledBlock
from vaecast.pipeline.run import (
    AudioFormat,
    FeedState,
    FragmentDone,
    LatentSource,
    TimedAudio,
    VideoOutput,
    WholeLatents,
    Workers,
    run_pipeline,
)

RELAY_SEGMENTS = 2
# Blocks the replica's feed queues ahead of the decoder (its pump holds one more, held
# back): enough that a chunk's fragment has the next block's audio while the decoder
# is still on its own block.
PULL_AHEAD_BLOCKS = 1


class DecoderReplica:
    """One replica: its models, its threads, and `decode`."""

    def __init__(self, options: ReplicaOptions) -> None:
        from vaecast.models.registry import get_decoder

        # The replica decodes again and again (vaecast/pipeline/heap.py): set before
        # its models load, though Ray's own threads have allocated already.
        retain_decode_heap()
        weights = dict(options.weights)
        self._decoders: dict[str, ChunkedDecoder] = {
            name: get_decoder(name, device=options.device, weights=weights.get(name))
            for name in options.models
        }
        self._device = options.device
        slots = max(1, options.max_ongoing)
        self._workers = Workers.for_slots(slots)
        context = serve.get_replica_context()
        self.info = ReplicaInfo(
            context.replica_id.unique_id, ray.get_runtime_context().get_node_id(), os.getpid()
        )

    async def decode(self, call: DecodeCall) -> AsyncIterator[Any]:
        relay = _Relay(self.info)
        task = asyncio.create_task(self._run(call, relay), name=f"decode-{call.job_id}")
        try:
            async for record in relay:
                yield record
        finally:
            task.cancel()
            # run_pipeline returns only after the decode thread has returned: then the
            # job's host hears how far the decoder got (a cancel's proof).
            await asyncio.gather(task, return_exceptions=True)
            if call.job is not None:
                call.job.replica_stopped(relay.decoded_chunks, call.variant)

    async def _run(self, call: DecodeCall, relay: _Relay) -> None:
        feed: LatentFeed | None = None
        try:
            decoder = self._decoders.get(call.model)
            if decoder is None and call.model == LinearDecoder.name:  # parameter-free: any
                decoder = self._decoders[call.model] = LinearDecoder(self._device)
            if decoder is None:
                raise UnknownModelError(
                    f"model {call.model!r} is not loaded on this replica "
                    f"(it has: {', '.join(sorted(self._decoders))})"
                )
            source: WholeLatents | LatentFeed
            if call.latents is not None:
                latents = torch.from_numpy(call.latents)
                plan: Any = decoder.plan(tuple(latents.shape))
                source = WholeLatents(latents)
            else:
                if call.job is None:
                    raise DecodeFailedError("a push session's decode call names no job")
                loop = asyncio.get_running_loop()
                feed = source = LatentFeed(
                    loop, PULL_AHEAD_BLOCKS, pull=actor_pull(call.job, call.variant)
                )
                # Raises DecodeCancelled where the session ended before any block.
                plan = decoder.plan_stream(await feed.first_block_shape())
                relay.arrivals = feed.chunk_arrivals
            soundtrack = None if call.soundtrack is None else Soundtrack(*call.soundtrack)
            audio_format = None if call.audio_format is None else AudioFormat(*call.audio_format)
            output = VideoOutput(
                call.fps, EncoderSettings(**call.encoder), soundtrack, audio_format
            )
            await run_pipeline(
                _counted(source, relay),
                decoder,
                plan,
                output,
                relay,
                self._workers,
                observer=relay,
                queue_chunks=call.queue_chunks,
            )
        except VaecastError as error:
            relay.end(error.detached())
        except Exception as error:
            relay.end(DecodeFailedError(f"internal error on the replica: {error}"))
        else:
            relay.end(None)
        finally:
            if feed is not None:
                feed.cancel()  # its pump, where the pipeline never ran


class _Relay:
    """The pipeline's sink and observer, read as an async iterator of records.

    `append` waits while RELAY_SEGMENTS segments are not yet taken; each segment is
    followed by at most one Chunk, and a decode by one end, so the queue is bounded.
    """

    def __init__(self, info: ReplicaInfo) -> None:
        self._info = info
        self._records: asyncio.Queue[Any] = asyncio.Queue()
        self._room = asyncio.Semaphore(RELAY_SEGMENTS)
        self.arrivals: dict[int, float] = {}
        self.decoded_chunks = 0  # chunks the decoder published (counted on its thread)

    def started(self, content_type: str) -> None:
        self._records.put_nowait(Started(self._info, content_type))

    async def append(self, segment: bytes) -> None:
        await self._room.acquire()
        self._records.put_nowait(Segment(segment, facts_of(segment)))

    def fragment(self, done: FragmentDone) -> None:
        self._records.put_nowait(
            Chunk(
                done.index,
                done.total,
                done.frame_start,
                done.frames,
                done.bytes,
                done.encode_s,
                done.decode_wait_s,
                self.arrivals.pop(done.index, None),
            )
        )

    def end(self, error: VaecastError | None) -> None:
        self._records.put_nowait(_End(error))

    async def __aiter__(self) -> AsyncIterator[Any]:
        while True:
            record = await self._records.get()
            if isinstance(record, _End):
                if record.error is not None:
                    yield record.error
                return
            if isinstance(record, Segment):
                self._room.release()
            yield record


class _Counted:
    """A latent source whose decoder's chunks are counted as they are published."""

    def __init__(self, source: LatentSource, relay: _Relay) -> None:
        self._source = source
        self._relay = relay

    def decode(self, decoder: ChunkedDecoder, on_chunk: ChunkCallback) -> None:
        def counted(chunk: DecodedChunk) -> None:
            self._relay.decoded_chunks += 1
            on_chunk(chunk)

        self._source.decode(decoder, counted)

    def cancel(self) -> None:
        self._source.cancel()

    def take_audio(self) -> list[TimedAudio]:
        return list(self._source.take_audio())


class _CountedFeed(_Counted):
    """As `_Counted`, for a feed: a live source to the pipeline, as the feed is."""

    def __init__(self, feed: LatentFeed, relay: _Relay) -> None:
        super().__init__(feed, relay)
        self._feed = feed

    def feed_state(self) -> FeedState:
        return self._feed.feed_state()

    async def feed_changed(self, version: int) -> None:
        await self._feed.feed_changed(version)


def _counted(source: WholeLatents | LatentFeed, relay: _Relay) -> _Counted:
    return (
        _CountedFeed(source, relay) if isinstance(source, LatentFeed) else _Counted(source, relay)
    )


class _End:
    def __init__(self, error: VaecastError | None) -> None:
        self.error = error


def actor_pull(job: JobRef, variant: Variant = "final") -> BlockPull:
    """A `LatentFeed`'s transport for a push job of the cluster: its next block (for
    the rendition `variant`), pulled from the job's host actor (None after the last); a
    cancelled pull cancels the call."""

    async def pull() -> PulledBlock | None:
        pending = job.next_block(variant)
        try:
            block: Block | None = await pending
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):  # it finished meanwhile
                ray.cancel(pending)
            raise
        if block is None:
            return None
        audio = block.audio
        return PulledBlock(
            torch.from_numpy(np.ascontiguousarray(block.latents)),
            None if audio is None else TimedAudio(audio.samples, audio.first_frame),
            block.arrived,
        )

    return pull


def deploy(options: ReplicaOptions) -> bool:
    """Deploy the decoder replicas unless this cluster already runs them (another front
    end deployed them): True when this call deployed them. Blocks until they are up."""
    from ray.serve.config import ProxyLocation

    if APP_NAME in _applications():
        return False
    # No Serve HTTP proxy: the vaecast front ends are the HTTP edge.
    serve.start(proxy_location=ProxyLocation.Disabled)
    app = replica_deployment(options).bind(options)
    serve.run(app, name=APP_NAME, route_prefix=None)
    return True


def replica_deployment(options: ReplicaOptions) -> serve.Deployment:
    """The decoder replicas' Serve deployment for `vaecast serve --replica-*` flags: a
    fixed count, or Serve autoscaling between `replicas` and `max_replicas`."""
    deployment_options: dict[str, Any] = {
        "name": DEPLOYMENT_NAME,
        "ray_actor_options": {"num_cpus": options.cpus, "num_gpus": options.gpus},
        "max_ongoing_requests": options.max_ongoing,
    }
    if options.max_replicas is not None:
        deployment_options["autoscaling_config"] = {
            "min_replicas": options.replicas,
            "max_replicas": options.max_replicas,
            "target_ongoing_requests": max(1, options.max_ongoing // 2),
        }
    else:
        deployment_options["num_replicas"] = options.replicas
    return serve.deployment(DecoderReplica).options(**deployment_options)


def build_app(args: dict[str, Any]) -> serve.Application:
    """Serve's application builder, for a cluster that deploys vaecast from a config
    (KubeRay's serveConfigV2 names `vaecast.cluster.replica:build_app` and passes `args`:
    `models`, and optionally `device`, `weights` {model: path} and `max_ongoing`).
    Replica counts, GPUs and CPUs come from the config's deployment section there."""
    options = ReplicaOptions(
        models=tuple(args["models"]),
        device=args.get("device", "cpu"),
        weights=tuple(sorted((args.get("weights") or {}).items())),
        max_ongoing=int(args.get("max_ongoing", 2)),
    )
    return serve.deployment(DecoderReplica).options(name=DEPLOYMENT_NAME).bind(options)


def replica_states() -> dict[str, int]:
    """The replicas by state (RUNNING, STARTING, ...), as Serve's controller reports them."""
    status = serve.status().applications.get(APP_NAME)
    if status is None:
        return {}
    deployment = status.deployments.get(DEPLOYMENT_NAME)
    if deployment is None:
        return {}
    return {
        str(getattr(state, "value", state)): count
        for state, count in deployment.replica_states.items()
    }


def _applications() -> dict[str, Any]:
    try:
        return dict(serve.status().applications)
    except Exception:  # Serve not started on this cluster yet
        return {}
