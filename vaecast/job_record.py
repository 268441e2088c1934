"""The record of one job, sans-IO: what happened to it in, its state and events out.

In the shape of h11's `_state.py`. A runner tells the record what happened, as small
frozen transitions (`Started`, `Encoding`, `SegmentAdded`, `ChunkEncoded`,
`LengthKnown`, `Geometry`, `Completed`, `Ended`), through the one door, `apply`. The
record checks that the transition is legal in the job's state (`IllegalTransition`
otherwise: a runner's bug, never a client's error), updates its counters and
moments, and returns the progress event the transition makes, if any. Out come the
status, the counters, the timings, the event list (`events`), the API's job object
(`to_json`) and the log line (`summary`).

Every copy of a job reads the same because every copy is this record:
- the server's `Job` keeps one, fed by the pipeline that decodes it here;
- in Ray mode the job's host (`vaecast.cluster.shared_job`) keeps one, fed by the
  replica's records, and each front end's mirror applies the host's transitions, in
  order (`transitions`), to a record of its own. Moments travel inside the
  transitions (`at`, the clock of the record that first applied them), so a mirror's
  timings are the host's.

Nothing here does I/O, waits or imports beyond the standard library and
`vaecast.errors`: no torch, asyncio or aiohttp, so a job host (which never imports
torch) and the tests hold it as a plain object.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from fractions import Fraction
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


@dataclass(frozen=True, slots=True)
class SegmentAdded:
    """Bytes of the MP4 appended: the init segment, a fragment, the audio tail."""

    size: int


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


@dataclass(frozen=True, slots=True)
class LengthKnown:
    """A push session's last block came: the whole video's plan."""

    plan: PlanFacts


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


Transition = (
    Started | Encoding | Geometry | SegmentAdded | ChunkEncoded | LengthKnown | Completed | Ended
)

# Which transitions each status allows; a final status allows none.
_ALLOWED: dict[JobStatus, tuple[type, ...]] = {
    JobStatus.QUEUED: (Started, Geometry, LengthKnown, Ended),
    JobStatus.IN_PROGRESS: (
        Encoding,
        Geometry,
        SegmentAdded,
        ChunkEncoded,
        LengthKnown,
        Completed,
        Ended,
    ),
}


def job_timings(
    created: float,
    started: float | None,
    first_fragment: float | None,
    finished: float | None,
    decode_wait_s: float,
    encode_s: float,
) -> dict[str, float | None]:
    """Seconds from the job's creation to each moment (None until it comes)."""

    def since_created(moment: float | None) -> float | None:
        return None if moment is None else round(moment - created, 4)

    return {
        "queued_s": since_created(started),
        "time_to_first_fragment_s": since_created(first_fragment),
        "total_s": since_created(finished),
        "decode_wait_s": round(decode_wait_s, 4),
        "encode_s": round(encode_s, 4),
    }


@dataclass(slots=True)
class JobRecord:
    """One job's state (see the module docstring). Create it, then `apply` what happens."""

    id: str
    input: str  # "latents" or "push"
    model: str
    fps: Fraction
    audio: Mapping[str, int] | None  # sample_rate and channels
    plan: PlanFacts | None  # None for a push session until its last block
    created_at: float  # wall-clock seconds, as the API shows it
    clock: Callable[[], float] = time.perf_counter
    created: float | None = None  # a moment of `clock`; None: now
    status: JobStatus = JobStatus.QUEUED
    error: VaecastError | None = None
    content_type: str = "video/mp4"
    geometry: Geometry | None = None
    chunks_done: int = 0
    frames_done: int = 0
    bytes: int = 0
    encode_s: float = 0.0
    decode_wait_s: float = 0.0
    replica: Mapping[str, Any] | None = None
    started: float | None = None
    first_fragment: float | None = None
    finished: float | None = None
    events: list[dict[str, Any]] = field(default_factory=list)
    transitions: list[Transition] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.created is None:
            self.created = self.clock()
        self._emit("queued")

    # The door.

    def apply(self, transition: Transition) -> dict[str, Any] | None:
        """Record `transition` (raises IllegalTransition if the state forbids it);
        returns the event it makes, also appended to `events`, or None."""
        allowed = _ALLOWED.get(self.status, ())
        if not isinstance(transition, allowed):
            raise IllegalTransition(
                f"job {self.id} is {self.status.value}: {type(transition).__name__} is not allowed"
            )
        if getattr(transition, "at", False) is None:
            transition = replace(transition, at=self.clock())  # type: ignore[type-var]
        event = self._take(transition)
        self.transitions.append(transition)
        return event

    def _take(self, t: Transition) -> dict[str, Any] | None:
        if isinstance(t, Started):
            self.status, self.started, self.replica = JobStatus.IN_PROGRESS, t.at, t.replica
            return self._emit("started", **({} if t.replica is None else {"replica": t.replica}))
        if isinstance(t, Encoding):
            self.content_type = t.content_type
            return None
        if isinstance(t, Geometry):
            if self.geometry is None:
                self.geometry = t
            return None
        if isinstance(t, SegmentAdded):
            self.bytes += t.size
            return None
        if isinstance(t, ChunkEncoded):
            return self._chunk(t)
        if isinstance(t, LengthKnown):
            if self.plan is not None:
                raise IllegalTransition(f"job {self.id}: its length was known already")
            self.plan = t.plan
            return self._emit("length", frames=t.plan.frames, chunks=t.plan.chunks)
        if isinstance(t, Completed):
            if self.plan is not None and self.chunks_done != self.plan.chunks:
                raise IllegalTransition(
                    f"job {self.id}: completed after {self.chunks_done} chunks "
                    f"of {self.plan.chunks}"
                )
            self.status, self.finished = JobStatus.COMPLETED, t.at
            return self._emit("done", job=self.to_json())
        return self._end(t)

    def _chunk(self, t: ChunkEncoded) -> dict[str, Any]:
        if t.index != self.chunks_done:
            raise IllegalTransition(
                f"job {self.id}: chunk {t.index} came where chunk {self.chunks_done} was due"
            )
        if self.plan is not None and t.index >= self.plan.chunks:
            raise IllegalTransition(
                f"job {self.id}: chunk {t.index} is past the last of its {self.plan.chunks}"
            )
        self.chunks_done += 1
        self.frames_done += t.frames
        self.encode_s += t.encode_s
        self.decode_wait_s += t.decode_wait_s
        if self.first_fragment is None:
            self.first_fragment = t.at
        latency = {} if t.latency_s is None else {"latency_s": round(t.latency_s, 4)}
        return self._emit(
            "chunk",
            **latency,
            index=t.index,
            total=t.total,
            frame_start=t.frame_start,
            frames=t.frames,
            bytes=t.bytes,
            frames_done=self.frames_done,
            total_bytes=self.bytes,
            progress=self.progress,
        )

    def _end(self, t: Ended) -> dict[str, Any]:
        if t.status not in (JobStatus.FAILED, JobStatus.CANCELLED):
            raise IllegalTransition(
                f"job {self.id}: Ended needs failed or cancelled, not {t.status}"
            )
        self.status, self.error, self.finished = t.status, t.error, t.at
        stopped = {} if t.decoded_chunks is None else {"decoded_chunks": t.decoded_chunks}
        error = {"type": t.error.type, "message": t.error.message}
        return self._emit("error", error=error, **stopped)

    def _emit(self, event: str, **fields: Any) -> dict[str, Any]:
        record = {"event": event, "status": self.status.value, **fields}
        self.events.append(record)
        return record

    # What comes out.

    @property
    def is_final(self) -> bool:
        return self.status in FINAL_STATUSES

    @property
    def progress(self) -> int | None:
        """Percent of chunks decoded and encoded; None while the length is unknown."""
        if self.plan is None:
            return None
        return round(100 * self.chunks_done / self.plan.chunks)

    @property
    def realtime_factor(self) -> float | None:
        """Seconds of video made per second of decoding (so far, while running): above
        1, faster than real time; None before the first frame."""
        if self.started is None or self.frames_done == 0:
            return None
        end = self.finished if self.finished is not None else self.clock()
        return round(float(self.frames_done / self.fps) / max(end - self.started, 1e-6), 3)

    @property
    def run_seconds(self) -> float | None:
        """From the start of decoding to the end; None unless both happened."""
        if self.started is None or self.finished is None:
            return None
        return self.finished - self.started

    def timings(self) -> dict[str, float | None]:
        assert self.created is not None
        return job_timings(
            self.created,
            self.started,
            self.first_fragment,
            self.finished,
            self.decode_wait_s,
            self.encode_s,
        )

    def to_json(self) -> dict[str, Any]:
        """The job as the API shows it, less what the routes add (URLs, queue place)."""
        plan = self.plan
        size = plan or self.geometry
        return {
            "id": self.id,
            "object": "video",
            "input": self.input,
            "model": self.model,
            "status": self.status.value,
            "progress": self.progress,
            "created_at": int(self.created_at),
            "frames": None if plan is None else plan.frames,
            "width": None if size is None else size.width,
            "height": None if size is None else size.height,
            "fps": float(self.fps),
            "audio": None if self.audio is None else dict(self.audio),
            "seconds": None if plan is None else round(float(plan.frames / self.fps), 3),
            "chunks": {"done": self.chunks_done, "total": None if plan is None else plan.chunks},
            "frames_done": self.frames_done,
            "bytes": self.bytes,
            "content_type": self.content_type,
            "timings": self.timings(),
            "realtime_factor": self.realtime_factor,
            "error": (
                {"type": self.error.type, "message": self.error.message}
                if self.error is not None and self.status is not JobStatus.COMPLETED
                else None
            ),
            "replica": None if self.replica is None else self.replica.get("id"),
        }

    def summary(self) -> str:
        """The job's log line, key=value."""
        timings = self.timings()
        error = self.error.message if self.error and self.status is not JobStatus.COMPLETED else ""
        plan = self.plan
        return (
            f"id={self.id} model={self.model} status={self.status.value} "
            f"frames={self.frames_done}/{None if plan is None else plan.frames} "
            f"chunks={self.chunks_done}/{None if plan is None else plan.chunks} "
            f"bytes={self.bytes} "
            f"ttff_s={timings['time_to_first_fragment_s']} total_s={timings['total_s']} "
            f"encode_s={timings['encode_s']} error={error!r}"
        )
