"""What happens to a job, as the record (`vaecast.job.record`) is told it: its statuses,
the small frozen transitions a runner applies, and which each status allows.

Apart from the record so that the vocabulary reads on its own; `vaecast.job.record`
re-exports every name. Standard library only, like the record.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from vaecast.errors import VaecastError


class JobStatus(StrEnum):
    QUEUED = "queued"
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


FINAL_STATUSES = frozenset({JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED})


class IllegalTransition(RuntimeError):
    """A transition the job's state does not allow: the runner that applied it is wrong."""


@dataclass(frozen=True, slots=True)
class PlanFacts:
    """What the API shows of a decode plan."""

    frames: int
    chunks: int
    width: int
    height: int


# Transitions. `at` is a moment of the record's clock; None: now (`apply` fills it in).


@dataclass(frozen=True, slots=True)
class Started:
    """The job took a decode slot (or a replica took it) and its decode begins."""

    replica: Mapping[str, Any] | None = None  # which replica decodes it (Ray mode)
    at: float | None = None


@dataclass(frozen=True, slots=True)
class Encoding:
    """The encoder is open: the stream's Content-Type, which names its codecs."""

    content_type: str


@dataclass(frozen=True, slots=True)
class Geometry:
    """A push session's frame size, known at its first block (its length is not)."""

    width: int
    height: int


class Variant(StrEnum):
    """A job's renditions: with a preview (`JobRecord.preview`), the preview decoder's
    and the model's own, the final, and (`JobRecord.live`) the live one, whose every
    fragment is one of theirs; a job without a preview has only its final."""

    PREVIEW = "preview"
    FINAL = "final"
    LIVE = "live"


PREVIEW, FINAL, LIVE = Variant.PREVIEW, Variant.FINAL, Variant.LIVE


class JobInput(StrEnum):
    """What a job decodes: an uploaded latent file, or the blocks a push session gets."""

    LATENTS = "latents"
    PUSH = "push"


@dataclass(frozen=True, slots=True)
class SegmentAdded:
    """Bytes of the MP4 appended: the init segment, a fragment, the audio tail."""

    size: int
    variant: Variant = FINAL


@dataclass(frozen=True, slots=True)
class ChunkEncoded:
    """A chunk's fragment is in the MP4 (after its `SegmentAdded`)."""

    index: int
    total: int
    frame_start: int
    frames: int
    bytes: int
    encode_s: float
    decode_wait_s: float
    latency_s: float | None = None  # from its pushed block's arrival (push sessions)
    at: float | None = None
    variant: Variant = FINAL


@dataclass(frozen=True, slots=True)
class LiveChunk:
    """The live rendition took chunk `index`'s fragment from rendition `source` (the
    preview or the final): `delay_s` is its start delay, chosen with its first."""

    index: int
    source: Variant
    frame_start: int
    frames: int
    bytes: int
    delay_s: float
    at: float | None = None


@dataclass(frozen=True, slots=True)
class LengthKnown:
    """A push session's last block came: the whole video's plan (and the preview's
    chunk count, for a job with a preview)."""

    plan: PlanFacts
    preview_chunks: int | None = None


@dataclass(frozen=True, slots=True)
class VariantEnded:
    """One rendition of a job with a preview ended while the job goes on: the
    preview (completed, failed or stopped), or the final (completed, or stopped by
    `DELETE ?variant=final`, or failed). The job itself ends with `Completed` or
    `Ended` once both have."""

    variant: Variant
    status: JobStatus
    error: VaecastError | None = None
    at: float | None = None


@dataclass(frozen=True, slots=True)
class FinalReady:
    """The final rendition has caught up with where a viewer of the preview, who
    started at its first fragment, is playing: a player may switch to it now."""

    at: float | None = None


@dataclass(frozen=True, slots=True)
class NotStored:
    """The video outgrew the durable store's budget: it streams on, from memory and
    spill files, and is not kept across a restart; `reason` says so to the client."""

    reason: str


@dataclass(frozen=True, slots=True)
class Completed:
    at: float | None = None


@dataclass(frozen=True, slots=True)
class Ended:
    """The job ended without completing: failed or cancelled, with the reason."""

    status: JobStatus
    error: VaecastError
    decoded_chunks: int | None = None  # chunks its replica decoded (Ray mode)
    at: float | None = None
    # Its final's fragments so far are kept as a playable file (a partial video).
    partial: bool = False


Transition = (
    Started
    | Encoding
    | Geometry
    | SegmentAdded
    | ChunkEncoded
    | LiveChunk
    | LengthKnown
    | VariantEnded
    | FinalReady
    | NotStored
    | Completed
    | Ended
)

# Which transitions each status allows; a final status allows none.
ALLOWED: dict[JobStatus, tuple[type, ...]] = {
    JobStatus.QUEUED: (Started, Geometry, LengthKnown, VariantEnded, Ended),
    JobStatus.IN_PROGRESS: (
        Encoding,
        Geometry,
        SegmentAdded,
        ChunkEncoded,
        LiveChunk,
        LengthKnown,
        VariantEnded,
        FinalReady,
        NotStored,
        Completed,
        Ended,
    ),
}
