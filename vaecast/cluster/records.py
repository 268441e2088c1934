"""What crosses process boundaries in Ray mode: small values of builtins and numpy.

The job hosts, the decoder replicas and the front ends exchange these. They are kept
free of torch, PyAV and the server so that a job host never imports any of them: a
tensor crosses as a numpy array, a plan as its fields, and each side rebuilds what it
needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from vaecast.codecs.fragment import FragmentFacts
from vaecast.errors import VaecastError
from vaecast.job.transitions import JobInput, PlanFacts, Variant


@dataclass(frozen=True, slots=True)
class ReplicaOptions:
    """The decoder replicas' deployment, from `vaecast serve --replica-*` flags."""

    models: tuple[str, ...]
    device: str = "cpu"
    weights: tuple[tuple[str, str], ...] = ()  # (model, path)
    replicas: int = 1
    max_replicas: int | None = None  # with it: Serve autoscaling from `replicas` to it
    gpus: float = 0.0
    cpus: float = 1.0
    max_ongoing: int = 2


@dataclass(frozen=True, slots=True)
class ReplicaInfo:
    """Which replica decodes a job: Serve's replica id, and where it runs."""

    id: str
    node: str
    pid: int


@dataclass(frozen=True, slots=True)
class Audio:
    """Audio that came with a pushed block, from its first video frame on."""

    samples: np.ndarray  # (channels, n) float32
    first_frame: int


@dataclass(frozen=True, slots=True)
class Block:
    """A pushed latent block (BCTHW float32) and its audio."""

    latents: np.ndarray
    audio: Audio | None
    arrived: float  # time.time() at the job's actor


@dataclass(frozen=True, slots=True)
class DecodeCall:
    """One job, as a replica's `decode` takes it: whole latents, or (None: a push
    session) blocks pulled from `job`, which also hears when the decode stopped."""

    job_id: str
    model: str
    fps: Fraction
    encoder: dict[str, Any]  # EncoderSettings' fields
    queue_chunks: int
    latents: np.ndarray | None = None
    job: JobRef | None = None  # a push session's blocks come from it; it hears the stop
    soundtrack: tuple[np.ndarray, int] | None = None  # (waveform, sample rate)
    audio_format: tuple[int, int] | None = None  # (sample rate, channels)
    # Which rendition of its job this call makes ("final", or "preview": `model` is
    # then the preview decoder); a push session's blocks are pulled for it.
    variant: Variant = "final"


# What a replica's `decode` yields, in order: Started, then Segment (the init segment
# first) and, after each chunk's Segment, its Chunk; the stream's audio tail may come
# as a last Segment; then the stream ends (an error ends it by raising).


@dataclass(frozen=True, slots=True)
class Started:
    replica: ReplicaInfo
    content_type: str


@dataclass(frozen=True, slots=True)
class Segment:
    """A segment of a replica's stream: its bytes, and a fragment's facts (None for the
    init segment), which the front ends' fragment indexes read (`codecs.fragment`)."""

    data: bytes
    facts: FragmentFacts | None = None


@dataclass(frozen=True, slots=True)
class Chunk:
    """The fields of `vaecast.pipeline.run.FragmentDone`, and when its newest block came."""

    index: int
    total: int | None
    frame_start: int
    frames: int
    bytes: int
    encode_s: float
    decode_wait_s: float
    block_arrived: float | None = None  # time.time(); push sessions only


@dataclass(frozen=True, slots=True)
class JobSpec:
    """What a job is, known when it is created (shared with every front end)."""

    job_id: str
    input: JobInput
    model: str
    fps: Fraction
    created_at: float
    audio: dict[str, int] | None
    plan: dict[str, Any] | None  # DecodePlan's fields; a push session's comes at the end
    push_token: str | None = None
    preview: str | None = None  # the preview decoder of a job with two renditions
    preview_chunks: int | None = None  # its chunk count (a push session's: at its end)

    @property
    def plan_facts(self) -> PlanFacts | None:
        """What the job's record shows of its plan (None until a push session's end)."""
        return plan_facts(self.plan)


@dataclass(frozen=True, slots=True)
class PushState:
    """A push session's shared state: what the next block is checked against."""

    latent_frames: int
    block_shape: tuple[int, ...] | None
    dtype: str | None
    ended: bool


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What a job's host keeps beside its record: `follow` returns it with what is new."""

    plan: dict[str, Any] | None  # DecodePlan's fields
    stream_plan: dict[str, Any] | None  # StreamPlan's fields
    push: PushState | None


@dataclass(frozen=True, slots=True)
class Update:
    """`follow`'s answer: the record's transitions from where the caller was, the
    fragments of their `SegmentAdded`s, and the state."""

    fragments: list[Any]  # ObjectRefs of the segments, in order
    transitions: list[Any]  # vaecast.job.record transitions, in order
    snapshot: Snapshot
    final: bool  # the job has ended and every transition is in this update
    deleted: str | None = None  # why the job's shared state is gone: GONE_*


# Where things are found in the cluster.
NAMESPACE = "vaecast"
APP_NAME = "vaecast"
DEPLOYMENT_NAME = "DecoderReplica"
# Jobs are kept by this many named, detached host actors; a job's id says which.
JOB_HOSTS = 4
JOB_HOST_NAMES = tuple(f"vaecast-jobs-{index}" for index in range(JOB_HOSTS))


def host_name(job_id: str) -> str:
    """The name of the actor that keeps job `job_id`, in NAMESPACE: any front end
    finds it from the id alone."""
    return JOB_HOST_NAMES[int(job_id[-2:], 16) % JOB_HOSTS]


@dataclass(frozen=True, slots=True)
class JobRef:
    """One job at its host actor: each method sends the call and returns its ObjectRef
    (awaitable on an event loop, or `ray.get` on a thread)."""

    host: Any  # the JobHost's ActorHandle
    job_id: str

    def follow(self, fragments_seen: int, transitions_seen: int, wait_s: float) -> Any:
        return self.host.follow.remote(self.job_id, fragments_seen, transitions_seen, wait_s)

    def spec(self) -> Any:
        return self.host.spec.remote(self.job_id)

    def transitions(self) -> Any:
        """How many transitions the job's record has had (None: the host lost it)."""
        return self.host.transitions.remote(self.job_id)

    def cancel(self, error: VaecastError) -> Any:
        return self.host.cancel.remote(self.job_id, error)

    def fail(self, error: VaecastError) -> Any:
        return self.host.fail.remote(self.job_id, error)

    def delete(self) -> Any:
        return self.host.delete.remote(self.job_id)

    def push_state(self) -> Any:
        return self.host.push_state.remote(self.job_id)

    def push_block(self, *args: Any) -> Any:
        return self.host.push_block.remote(self.job_id, *args)

    def end_feed(self, plan: dict[str, Any] | None, preview_chunks: int | None = None) -> Any:
        return self.host.end_feed.remote(self.job_id, plan, preview_chunks)

    def next_block(self, variant: Variant = "final") -> Any:
        return self.host.next_block.remote(self.job_id, variant)

    def replica_stopped(self, decoded_chunks: int, variant: Variant = "final") -> Any:
        return self.host.replica_stopped.remote(self.job_id, decoded_chunks, variant)

    def cancel_variant(self, variant: Variant, error: VaecastError) -> Any:
        return self.host.cancel_variant.remote(self.job_id, variant, error)


# Why a job's shared state is gone: the values of vaecast.server.stream.retention.EvictionReason.
GONE_AGE = "age"
GONE_DELETED = "deleted"


def plan_facts(plan: dict[str, Any] | None) -> PlanFacts | None:
    """A DecodePlan's fields (as they cross the cluster) as the record shows them."""
    if plan is None:
        return None
    frames = plan["chunk_frames"]
    return PlanFacts(sum(frames), len(frames), plan["width"], plan["height"])
