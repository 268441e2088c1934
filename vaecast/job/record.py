"""The record of one job, sans-IO: what happened to it in, its state and events out.

In the shape of h11's `_state.py`. A runner tells the record what happened, as small
frozen transitions (`Started`, `Encoding`, `SegmentAdded`, `ChunkEncoded`,
`LengthKnown`, `Geometry`, `Completed`, `Ended`), through the one door, `apply`. The
record checks that the transition is legal in the job's state (`IllegalTransition`
otherwise: a runner's bug, never a client's error), updates its counters and
moments, and returns the progress event the transition makes, if any. Out come the
status, the counters, the moments and the event list (`events`). What the record
shows (the API's job object, its timings, the log line) is rendered from it by
`vaecast.job.views`, which reads it and is never read by it.

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
from fractions import Fraction
from typing import Any, Protocol

from vaecast.errors import VaecastError
from vaecast.job.transitions import (
    ALLOWED,
    FINAL,
    FINAL_STATUSES,
    LIVE,
    PREVIEW,
    ChunkEncoded,
    Completed,
    Encoding,
    Ended,
    FinalReady,
    Geometry,
    IllegalTransition,
    JobInput,
    JobStatus,
    LengthKnown,
    LiveChunk,
    NotStored,
    PlanFacts,
    SegmentAdded,
    Started,
    Transition,
    VariantEnded,
)
from vaecast.playback_deadlines import Commit, stall_free_start_s

__all__ = [
    "FINAL",
    "FINAL_STATUSES",
    "LIVE",
    "PREVIEW",
    "ChunkEncoded",
    "Completed",
    "Encoding",
    "Ended",
    "FinalReady",
    "Geometry",
    "IllegalTransition",
    "JobRecord",
    "JobStatus",
    "LengthKnown",
    "LiveChunk",
    "LiveProgress",
    "NotStored",
    "PlanFacts",
    "PreviewProgress",
    "SegmentAdded",
    "Started",
    "Transition",
    "VariantEnded",
]


@dataclass(slots=True)
class PreviewProgress:
    """The preview rendition of a job: its decoder, status and counters. The final
    rendition's are the job's own (`JobRecord.chunks_done` and the rest)."""

    decoder: str
    chunks: int | None  # its chunk count; None while a push session's length is unknown
    status: JobStatus = JobStatus.QUEUED
    error: VaecastError | None = None
    chunks_done: int = 0
    frames_done: int = 0
    bytes: int = 0
    first_fragment: float | None = None
    finished: float | None = None

    @property
    def is_final(self) -> bool:
        return self.status in FINAL_STATUSES


@dataclass(slots=True)
class LiveProgress:
    """The live rendition of a job with a preview: its start delay, status, counters,
    and each fragment's source (`sources[i]`: the rendition chunk i's came from)."""

    status: JobStatus = JobStatus.QUEUED
    error: VaecastError | None = None
    delay_s: float | None = None
    sources: list[str] = field(default_factory=list)
    frames_done: int = 0
    bytes: int = 0
    first_fragment: float | None = None
    finished: float | None = None

    @property
    def is_final(self) -> bool:
        return self.status in FINAL_STATUSES


class SharedSpec(Protocol):
    """What a job is, as it crosses machines (Ray mode's `vaecast.cluster.records.JobSpec`)."""

    job_id: str
    input: JobInput
    model: str
    fps: Fraction
    audio: Mapping[str, int] | None
    created_at: float
    preview: str | None
    preview_chunks: int | None

    @property
    def plan_facts(self) -> PlanFacts | None: ...


@dataclass(slots=True)
class JobRecord:
    """One job's state (see the module docstring). Create it, then `apply` what happens."""

    id: str
    input: JobInput
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
    # A job with a preview decoder: the preview rendition's progress; and how the
    # final ended while the job went on (`VariantEnded`), and when it was ready.
    preview: PreviewProgress | None = None
    # A job whose preview and final fragments line up: the live rendition's progress.
    live: LiveProgress | None = None
    final_ended: VariantEnded | None = None
    final_ready: float | None = None
    # The final's fragments as played (vaecast.playback_deadlines), and the earliest
    # start after its first fragment that plays it all without a stall, so far.
    commits: list[Commit] = field(default_factory=list)
    stall_free_start_s: float | None = None
    # Why the store does not keep this video (NotStored); None: kept, or no store.
    not_stored: str | None = None
    # A failed or cancelled job whose fragments so far are kept as a file (`Ended`).
    partial: bool = False
    # Where the job's start and end are POSTed: its request's (checked), or the
    # server's default when it was made.
    webhook_url: str | None = None
    # A push session's length as its producer expects it (a hint: the video ends where
    # its last block says), over which its stall-free start is predicted meanwhile.
    expected_frames: int | None = None

    def __post_init__(self) -> None:
        if self.created is None:
            self.created = self.clock()
        self._emit("queued")

    @classmethod
    def from_spec(cls, spec: SharedSpec) -> JobRecord:
        """The record of a job made elsewhere, from what it is (Ray mode: its host's, and
        each front end's mirror of it). Its moments are on the wall clock, from the
        job's creation at its front end, so every copy reads the same timings."""
        preview = spec.preview
        return cls(
            spec.job_id,
            spec.input,
            spec.model,
            spec.fps,
            spec.audio,
            spec.plan_facts,
            created_at=spec.created_at,
            clock=time.time,
            created=spec.created_at,
            preview=None if preview is None else PreviewProgress(preview, spec.preview_chunks),
        )

    # The door.

    def apply(self, transition: Transition) -> dict[str, Any] | None:
        """Record `transition` (raises IllegalTransition if the state forbids it);
        returns the event it makes, also appended to `events`, or None."""
        allowed = ALLOWED.get(self.status, ())
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
            if t.variant == PREVIEW:
                self._preview().bytes += t.size
            elif t.variant == LIVE:
                self._live().bytes += t.size
            else:
                self.bytes += t.size
            return None
        if isinstance(t, ChunkEncoded):
            return self._preview_chunk(t) if t.variant == PREVIEW else self._chunk(t)
        if isinstance(t, LiveChunk):
            return self._live_chunk(t)
        if isinstance(t, LengthKnown):
            if self.plan is not None:
                raise IllegalTransition(f"job {self.id}: its length was known already")
            self.plan = t.plan
            if self.preview is not None:
                self.preview.chunks = t.preview_chunks
            return self._emit("length", frames=t.plan.frames, chunks=t.plan.chunks)
        if isinstance(t, VariantEnded):
            return self._variant_ended(t)
        if isinstance(t, FinalReady):
            return self._final_is_ready(t)
        if isinstance(t, NotStored):
            self.not_stored = t.reason
            return None
        if isinstance(t, Completed):
            if self.plan is not None and self.chunks_done != self.plan.chunks:
                raise IllegalTransition(
                    f"job {self.id}: completed after {self.chunks_done} chunks "
                    f"of {self.plan.chunks}"
                )
            if self.final_ended is not None and self.final_ended.status is not JobStatus.COMPLETED:
                raise IllegalTransition(f"job {self.id}: completed after its final ended")
            self.status, self.finished = JobStatus.COMPLETED, t.at
            # Its job object comes with it where the job is shown (`views.with_job`).
            return self._emit("done")
        return self._end(t)

    def _preview(self) -> PreviewProgress:
        if self.preview is None:
            raise IllegalTransition(f"job {self.id} has no preview")
        return self.preview

    def _live(self) -> LiveProgress:
        if self.live is None:
            raise IllegalTransition(f"job {self.id} has no live rendition")
        return self.live

    def _live_chunk(self, t: LiveChunk) -> dict[str, Any]:
        live = self._live()
        if live.is_final or t.index != len(live.sources) or t.source not in (PREVIEW, FINAL):
            raise IllegalTransition(
                f"job {self.id}: live chunk {t.index} from {t.source!r} came where "
                f"{len(live.sources)} was due ({live.status.value})"
            )
        live.sources.append(str(t.source))
        live.frames_done += t.frames
        live.status, live.delay_s = JobStatus.IN_PROGRESS, t.delay_s
        if live.first_fragment is None:
            live.first_fragment = t.at
        return self._emit(
            "chunk",
            variant=LIVE,
            source=str(t.source),
            index=t.index,
            total=None if self.plan is None else self.plan.chunks,
            frame_start=t.frame_start,
            frames=t.frames,
            bytes=t.bytes,
            frames_done=live.frames_done,
            total_bytes=live.bytes,
        )

    def _preview_chunk(self, t: ChunkEncoded) -> dict[str, Any]:
        preview = self._preview()
        if preview.is_final or t.index != preview.chunks_done:
            raise IllegalTransition(
                f"job {self.id}: preview chunk {t.index} came where "
                f"{preview.chunks_done} was due ({preview.status.value})"
            )
        preview.chunks_done += 1
        preview.frames_done += t.frames
        preview.status = JobStatus.IN_PROGRESS
        if preview.first_fragment is None:
            preview.first_fragment = t.at
        return self._emit(
            "chunk",
            variant=PREVIEW,
            index=t.index,
            total=t.total,
            frame_start=t.frame_start,
            frames=t.frames,
            bytes=t.bytes,
            frames_done=preview.frames_done,
            total_bytes=preview.bytes,
        )

    def _variant_ended(self, t: VariantEnded) -> dict[str, Any]:
        preview = self._preview()
        if t.status not in FINAL_STATUSES or (t.status is JobStatus.COMPLETED) != (t.error is None):
            raise IllegalTransition(f"job {self.id}: {t.variant} ended {t.status} with {t.error}")
        if t.variant == PREVIEW:
            if preview.is_final:
                raise IllegalTransition(f"job {self.id}: its preview ended already")
            preview.status, preview.error, preview.finished = t.status, t.error, t.at
        elif t.variant == FINAL:
            if self.final_ended is not None:
                raise IllegalTransition(f"job {self.id}: its final ended already")
            self.final_ended = t
        elif t.variant == LIVE:
            live = self._live()
            if live.is_final:
                raise IllegalTransition(f"job {self.id}: its live rendition ended already")
            live.status, live.error, live.finished = t.status, t.error, t.at
        else:
            raise IllegalTransition(f"job {self.id}: no variant {t.variant!r}")
        if t.error is None:
            return self._emit(f"{t.variant}_done", variant=t.variant)
        error = {"type": t.error.type, "message": t.error.message}
        return self._emit(f"{t.variant}_error", variant=t.variant, error=error)

    def _final_is_ready(self, t: FinalReady) -> dict[str, Any]:
        preview = self._preview()
        if self.final_ready is not None or preview.first_fragment is None:
            raise IllegalTransition(f"job {self.id}: final_ready again, or before the preview")
        self.final_ready = t.at
        assert t.at is not None
        return self._emit(
            "final_ready",
            variant=FINAL,
            frames_done=self.frames_done,
            after_preview_s=round(t.at - preview.first_fragment, 4),
        )

    def final_caught_up(self, now: float | None = None) -> bool:
        """Has the final passed where a viewer of the preview is playing? That viewer
        started at the preview's first fragment and plays in real time, but never past
        what the preview has decoded (it stalls there). A finished final always has."""
        preview = self.preview
        if preview is None or preview.first_fragment is None or self.final_ready is not None:
            return False
        if self.plan is not None and self.chunks_done == self.plan.chunks:
            return True
        now = self.clock() if now is None else now
        playing_s = min(now - preview.first_fragment, float(preview.frames_done / self.fps))
        return float(self.frames_done / self.fps) >= playing_s and self.frames_done > 0

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
        assert t.at is not None
        self.commits.append(
            Commit(t.at, float(t.frame_start / self.fps), float(t.frames / self.fps))
        )
        self.stall_free_start_s = stall_free_start_s(self.commits, self.length_s())
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
            stall_free_start_s=self.stall_free_start_s,
            **({} if self.preview is None else {"variant": FINAL}),
        )

    def _end(self, t: Ended) -> dict[str, Any]:
        if t.status not in (JobStatus.FAILED, JobStatus.CANCELLED):
            raise IllegalTransition(
                f"job {self.id}: Ended needs failed or cancelled, not {t.status}"
            )
        self.status, self.error, self.finished = t.status, t.error, t.at
        self.partial = t.partial
        for other in (self.preview, self.live):  # each still running ends with the job
            if other is not None and not other.is_final:
                other.status, other.error, other.finished = t.status, t.error, t.at
        stopped = {} if t.decoded_chunks is None else {"decoded_chunks": t.decoded_chunks}
        kept = {"partial": True} if t.partial else {}
        error = {"type": t.error.type, "message": t.error.message}
        return self._emit("error", error=error, **stopped, **kept)

    def _emit(self, event: str, **fields: Any) -> dict[str, Any]:
        record = {"event": event, "status": self.status.value, **fields}
        self.events.append(record)
        return record

    # What comes out.

    @property
    def is_final(self) -> bool:
        return self.status in FINAL_STATUSES

    def length_s(self) -> float | None:
        """The video's length in seconds: its plan's, or (a push session's, until its
        last block) what its producer expects while the video is shorter; else None."""
        if self.plan is not None:
            return float(self.plan.frames / self.fps)
        expected = self.expected_frames
        if expected is not None and self.frames_done < expected:
            return float(expected / self.fps)
        return None

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

    def final_status(self) -> JobStatus:
        """The final rendition's status: the job's, unless it ended while the job went on."""
        if self.final_ended is not None and not self.is_final:
            return self.final_ended.status
        return self.status

    def plays(self) -> list[str]:
        """The renditions whose content plays, running or completed: after `DELETE
        ?variant=final` the job says `cancelled` (as its final did) and plays its
        preview; a rendition that failed or was stopped does not play."""
        stopped = (JobStatus.FAILED, JobStatus.CANCELLED)
        playing = [] if self.final_status() in stopped else [FINAL]
        if self.preview is not None and self.preview.status not in stopped:
            playing.insert(0, PREVIEW)
        if self.live is not None and self.live.status not in stopped:
            playing.insert(0, LIVE)
        return playing
