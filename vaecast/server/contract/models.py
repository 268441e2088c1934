"""The JSON the API sends and takes, as msgspec Structs: their JSON Schema is the document's.

The job object is rendered from the job record (`vaecast.job.views.job_object`) and
the routes (`with_links`); these types say what it is, field by field, and the tests
validate real answers against the schemas made from them (unknown fields are refused,
so a field added on one side and not the other fails). msgspec makes JSON Schema 2020-12,
the dialect of OpenAPI 3.1.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType, field

from vaecast.demo.scenes import SCENE_NAMES
from vaecast.job.transitions import JobStatus

Count = Annotated[int, Meta(ge=0)]
Seconds = Annotated[float, Meta(description="seconds")]
Variant = Literal["preview", "final", "live"]
ErrorTypeName = Annotated[
    str, Meta(pattern=r"^[a-z0-9_]+$", description="machine-readable kind of error")
]


class ErrorDetail(Struct, forbid_unknown_fields=True):
    type: ErrorTypeName
    message: str
    # push_sequence_gap: the block index the session waits for.
    expected_seq: Count | UnsetType = UNSET


class ErrorBody(Struct, forbid_unknown_fields=True):
    """Every error this server answers: `{"error": {"type", "message"}}`."""

    error: ErrorDetail


class Audio(Struct, forbid_unknown_fields=True):
    sample_rate: Annotated[int, Meta(ge=1)]
    channels: Annotated[int, Meta(ge=1)]


class Chunks(Struct, forbid_unknown_fields=True):
    done: Count
    total: Count | None


class Timings(Struct, forbid_unknown_fields=True):
    """Seconds from the job's creation to each moment; null until it comes."""

    queued_s: Seconds | None
    time_to_first_fragment_s: Seconds | None
    total_s: Seconds | None
    decode_wait_s: Seconds
    encode_s: Seconds


class PreviewRendition(Struct, forbid_unknown_fields=True):
    decoder: str
    status: JobStatus
    chunks: Chunks
    frames_done: Count
    bytes: Count
    time_to_first_fragment_s: Seconds | None
    total_s: Seconds | None
    error: ErrorDetail | None


class FinalRendition(Struct, forbid_unknown_fields=True):
    decoder: str
    status: JobStatus
    chunks: Chunks
    frames_done: Count
    bytes: Count
    time_to_first_fragment_s: Seconds | None
    total_s: Seconds | None
    ready_after_preview_s: Seconds | None
    error: ErrorDetail | None


class LiveChunks(Struct, forbid_unknown_fields=True):
    done: Count


class LiveRendition(Struct, forbid_unknown_fields=True):
    """The live rendition: each chunk the final's fragment when it came in time for
    that chunk's playout deadline, the preview's otherwise."""

    status: JobStatus
    start_delay_s: Annotated[
        float | None,
        Meta(description="from the first fragment of either rendition to the live one's"),
    ]
    chunks: LiveChunks
    sources: Annotated[
        list[Literal["preview", "final"]],
        Meta(description="the rendition each fragment is, in order"),
    ]
    final_share: Annotated[float, Meta(ge=0, le=1)] | None
    frames_done: Count
    bytes: Count
    time_to_first_fragment_s: Seconds | None
    total_s: Seconds | None
    error: ErrorDetail | None


class Variants(Struct, forbid_unknown_fields=True):
    """A job with a preview: each rendition's progress (`live` where its preview's
    and final's chunks line up)."""

    preview: PreviewRendition
    final: FinalRendition
    live: LiveRendition | UnsetType = UNSET


class JobUrls(Struct, kw_only=True, forbid_unknown_fields=True):
    self_: str = field(name="self")
    content: str
    events: str
    playlist: str
    thumbnail: str
    spritesheet: str
    preview_content: str | UnsetType = UNSET
    preview_playlist: str | UnsetType = UNSET
    master_playlist: str | UnsetType = UNSET
    live_content: str | UnsetType = UNSET
    live_playlist: str | UnsetType = UNSET


class PushTarget(Struct, forbid_unknown_fields=True):
    """Where to push a session's blocks, and its secret (shown only in this answer)."""

    url: str
    token: Annotated[str, Meta(description="send it as the X-Push-Token header")]


class Viewers(Struct, forbid_unknown_fields=True):
    """A job's live viewers as the server pictures their players from what it sent each
    and when: each starts with its first media and plays in real time."""

    watching: Count
    seen: Count
    # The least, among those watching, of media time sent minus real time since their
    # first media: negative once one is behind real time. None: none watching.
    min_slack_s: Seconds | None
    stalls: Count
    stalled_s: Seconds


class JobObject(Struct, forbid_unknown_fields=True):
    """A video job: its state, progress, timings and URLs."""

    id: Annotated[str, Meta(pattern=r"^video_[0-9a-f]{24}$")]
    object: Literal["video"]
    input: Literal["latents", "push"]
    model: str
    status: JobStatus
    progress: Annotated[int, Meta(ge=0, le=100)] | None
    created_at: Annotated[int, Meta(description="Unix time, seconds")]
    frames: Count | None
    width: Count | None
    height: Count | None
    fps: float
    audio: Audio | None
    seconds: Seconds | None
    chunks: Chunks
    frames_done: Count
    bytes: Count
    content_type: str
    timings: Timings
    realtime_factor: float | None
    stall_free_start_s: Seconds | None
    error: ErrorDetail | None
    replica: str | None
    # Why the store does not keep this video (it outgrew --store-max-gb): it streams on
    # and is served until it expires, and is gone after a restart. None: kept, or no store.
    not_stored: str | None
    # Failed or cancelled, its fragments so far kept as a playable file at `content`
    # (the X-Video-Partial header says so too), until retention removes it.
    partial: bool
    # Where its start and end are POSTed: its own, or the server's default (then).
    webhook_url: str | None
    queue_position: Annotated[int, Meta(ge=0)] | None
    urls: JobUrls
    variants: Variants | UnsetType = UNSET
    # With `variants`: the renditions whose content plays (running or completed).
    plays: list[Variant] | UnsetType = UNSET
    # Only in the answer that created a push session.
    push: PushTarget | UnsetType = UNSET
    # In the API's answers (not in events or webhooks): its live viewers' playout.
    viewers: Viewers | UnsetType = UNSET
    # A push session created with `expected_frames`: its producer's expected length.
    expected_frames: Count | UnsetType = UNSET


class WebhookMessage(Struct, forbid_unknown_fields=True):
    """What a webhook POSTs (the Standard Webhooks envelope): the job as it was then."""

    type: Literal["video.started", "video.completed", "video.failed", "video.cancelled"]
    timestamp: Annotated[str, Meta(description="when it happened, ISO 8601")]
    data: JobObject


class JobList(Struct, forbid_unknown_fields=True):
    """Jobs, most recent first; a push batch's answer also says where to push."""

    object: Literal["list"]
    data: list[JobObject]
    push: PushTarget | UnsetType = UNSET


class DeletedVideo(Struct, forbid_unknown_fields=True):
    id: str
    object: Literal["video.deleted"]
    deleted: Literal[True]


class DeletedWhepSession(Struct, forbid_unknown_fields=True):
    id: str
    object: Literal["whep_session"]
    deleted: Literal[True]


class PushAccepted(Struct, forbid_unknown_fields=True):
    """A block was queued (or, a retry, was taken before): 202."""

    latent_frames: Annotated[Count, Meta(description="latent frames the session holds")]
    frames_done: Count | UnsetType = UNSET
    seq: Count | UnsetType = UNSET


class DemoRequest(Struct, forbid_unknown_fields=True):
    """A procedural scene rendered here and decoded with the embedded model."""

    # Literal of a tuple is the Literal of its items.
    scene: Literal[SCENE_NAMES]  # type: ignore[valid-type]
    frames: Annotated[int, Meta(ge=1, description="4k+1 frames (the latent geometry)")] = 81
    width: Annotated[int, Meta(ge=8, multiple_of=8)] = 832
    height: Annotated[int, Meta(ge=8, multiple_of=8)] = 480
    seed: Annotated[int, Meta(ge=0, le=2**32 - 1)] = 0
    fps: float | str | UnsetType = UNSET
    model: str | UnsetType = UNSET
    sound: bool = True
    live: Annotated[bool, Meta(description="produced block by block, as a push")] = False
    preview: Annotated[str, Meta(min_length=1, max_length=200)] | UnsetType = UNSET
    webhook_url: Annotated[str, Meta(max_length=2048)] | UnsetType = UNSET


class PushSessionRequest(Struct, forbid_unknown_fields=True):
    """A push session: latents (or frames) are pushed to it block by block."""

    input: Literal["push"]
    kind: Literal["latents", "frames"] = "latents"
    fps: float | str | UnsetType = UNSET
    model: str | UnsetType = UNSET
    batch: Annotated[int, Meta(ge=1)] | str = 1
    audio_sample_rate: int | str | UnsetType = UNSET
    audio_channels: int | str | UnsetType = UNSET
    value_range: Annotated[list[float], Meta(min_length=2, max_length=2)] | UnsetType = UNSET
    width: int | str | UnsetType = UNSET
    height: int | str | UnsetType = UNSET
    preview: Annotated[str, Meta(min_length=1, max_length=200)] | UnsetType = UNSET
    webhook_url: Annotated[str, Meta(max_length=2048)] | UnsetType = UNSET
    expected_frames: (
        Annotated[
            int,
            Meta(
                ge=1,
                description="the frames the producer expects to push: the stall-free "
                "start is then predicted over the whole video",
            ),
        ]
        | str
        | UnsetType
    ) = UNSET


class WarmUp(Struct, forbid_unknown_fields=True):
    state: Literal["off", "running", "done", "stopped", "failed"]
    seconds: dict[str, float] | UnsetType = UNSET


class HealthLimits(Struct, forbid_unknown_fields=True):
    max_frames: Count
    max_pixels_per_frame: Count
    max_upload_bytes: Count
    max_demo_pixels: Count


class QueueState(Struct, forbid_unknown_fields=True):
    depth: Count
    max: Count


class WebRtcState(Struct, forbid_unknown_fields=True):
    viewers: dict[str, int]
    max: Count


class WebhooksState(Struct, forbid_unknown_fields=True):
    pending: Count
    delivered: Count
    given_up: Count
    failed_tries: Count


class Health(Struct, forbid_unknown_fields=True):
    """Liveness (any answer) and readiness (200 only while jobs are admitted)."""

    status: Literal["ok", "draining", "failing"]
    ready: bool
    version: str
    models: list[str]
    limits: HealthLimits
    jobs: Count
    queue: QueueState
    decode_slots: Count
    places: dict[str, int]
    warm_up: WarmUp
    # The WHEP face's (one not configured shows none).
    webrtc: WebRtcState | UnsetType = UNSET
    # The webhooks face's, where the server sends webhooks (--webhook-secret).
    webhooks: WebhooksState | UnsetType = UNSET
    # With a store: "failing" while it cannot write (503), and why in store_error.
    store: Literal["ok", "failing"] | UnsetType = UNSET
    store_error: str | UnsetType = UNSET
    replicas: dict[str, Any] | UnsetType = UNSET


# Server-sent events: each `data:` is one of these, its `event` the SSE event name
# (the first, `state`, is the job object itself).


class QueuedEvent(Struct, tag_field="event", tag="queued", forbid_unknown_fields=True):
    status: JobStatus


class StartedEvent(Struct, tag_field="event", tag="started", forbid_unknown_fields=True):
    status: JobStatus
    replica: dict[str, Any] | UnsetType = UNSET


class LengthEvent(Struct, tag_field="event", tag="length", forbid_unknown_fields=True):
    status: JobStatus
    frames: Count
    chunks: Count


class ChunkEvent(Struct, tag_field="event", tag="chunk", forbid_unknown_fields=True):
    status: JobStatus
    index: Count
    total: Count | None
    frame_start: Count
    frames: Count
    bytes: Count
    frames_done: Count
    total_bytes: Count
    progress: Annotated[int, Meta(ge=0, le=100)] | UnsetType | None = UNSET
    stall_free_start_s: Seconds | UnsetType | None = UNSET
    latency_s: Seconds | UnsetType = UNSET
    variant: Variant | UnsetType = UNSET
    # A live chunk's: the rendition whose fragment it is.
    source: Literal["preview", "final"] | UnsetType = UNSET


class DoneEvent(Struct, tag_field="event", tag="done", forbid_unknown_fields=True):
    status: JobStatus
    job: JobObject


class ErrorEvent(Struct, tag_field="event", tag="error", forbid_unknown_fields=True):
    status: JobStatus
    error: ErrorDetail
    decoded_chunks: Count | UnsetType = UNSET
    partial: Literal[True] | UnsetType = UNSET  # its fragments so far are kept


class PreviewDoneEvent(Struct, tag_field="event", tag="preview_done", forbid_unknown_fields=True):
    status: JobStatus
    variant: Literal["preview"]


class FinalDoneEvent(Struct, tag_field="event", tag="final_done", forbid_unknown_fields=True):
    status: JobStatus
    variant: Literal["final"]


class PreviewErrorEvent(Struct, tag_field="event", tag="preview_error", forbid_unknown_fields=True):
    status: JobStatus
    variant: Literal["preview"]
    error: ErrorDetail


class FinalErrorEvent(Struct, tag_field="event", tag="final_error", forbid_unknown_fields=True):
    status: JobStatus
    variant: Literal["final"]
    error: ErrorDetail


class LiveDoneEvent(Struct, tag_field="event", tag="live_done", forbid_unknown_fields=True):
    status: JobStatus
    variant: Literal["live"]


class LiveErrorEvent(Struct, tag_field="event", tag="live_error", forbid_unknown_fields=True):
    status: JobStatus
    variant: Literal["live"]
    error: ErrorDetail


class FinalReadyEvent(Struct, tag_field="event", tag="final_ready", forbid_unknown_fields=True):
    status: JobStatus
    variant: Literal["final"]
    frames_done: Count
    after_preview_s: Seconds


JobEvent = (
    QueuedEvent
    | StartedEvent
    | LengthEvent
    | ChunkEvent
    | DoneEvent
    | ErrorEvent
    | PreviewDoneEvent
    | FinalDoneEvent
    | PreviewErrorEvent
    | FinalErrorEvent
    | LiveDoneEvent
    | LiveErrorEvent
    | FinalReadyEvent
)
EVENT_TYPES: tuple[type[Struct], ...] = JobEvent.__args__  # type: ignore[attr-defined]


def event_names() -> list[str]:
    """The SSE event names: `state`, then each event type's tag."""
    return ["state", *(msgspec.inspect.type_info(t).tag for t in EVENT_TYPES)]
