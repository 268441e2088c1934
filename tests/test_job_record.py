"""Unit tests for `vaecast.job.record`, the sans-IO record of one job.

In the manner of h11's `_tests/test_state.py`: the record is a pure object, so these
tests build records, `apply` transitions to them and read what comes out (status,
counters, `progress`, `events`, `transitions`, `to_json()`, `summary()`, timings),
with no asyncio, no server and no real clock. Every moment is given explicitly (`at=`)
or comes from a `FakeClock` the test controls, so nothing depends on the time of day.

The table of legal transitions is written out here as a literal (`EXPECTED_ALLOWED`),
not read back from `vaecast.job.transitions.ALLOWED`, so that a change to the module's table
fails these tests; every (status, transition type) pair is checked against it: the
allowed ones succeed, the others raise `IllegalTransition` and change nothing.
"""

from __future__ import annotations

import ast
import dataclasses
import sys
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

import vaecast.job.record as job_record_module
from vaecast.errors import VaecastError
from vaecast.job.record import (
    FINAL,
    FINAL_STATUSES,
    PREVIEW,
    ChunkEncoded,
    Completed,
    Encoding,
    Ended,
    FinalReady,
    Geometry,
    IllegalTransition,
    JobRecord,
    JobStatus,
    LengthKnown,
    LiveChunk,
    LiveProgress,
    NotStored,
    PlanFacts,
    PreviewProgress,
    SegmentAdded,
    Started,
    VariantEnded,
)
from vaecast.job.views import job_object, job_timings, summary_line, timings_of, with_job

CREATED = 100.0  # the moment, on every record's clock, at which the test jobs are created
CREATED_AT_WALL = 1_700_000_000.75  # the wall-clock creation time the API shows
FPS = Fraction(24)
MP4_CONTENT_TYPE = 'video/mp4; codecs="avc1.640028"'


class FakeClock:
    """A clock that reads what the test set, and counts how often it was read."""

    def __init__(self, now: float = CREATED) -> None:
        self.now = now
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        return self.now


def forbidden_clock() -> float:
    """A clock for records that must never read one (their moments all come given)."""
    raise AssertionError("the record read its clock")


class DecodeFailed(VaecastError):
    status = 500
    type = "decode_failed"


class Cancelled(VaecastError):
    status = 499
    type = "cancelled"


def make_latents_record(
    plan: PlanFacts | None = None,
    clock: Callable[[], float] | None = None,
    audio: dict[str, int] | None = None,
) -> JobRecord:
    """A job decoding uploaded latents: its plan is known from the start. Its clock, unless
    given, is a `FakeClock` standing at `CREATED`."""
    return JobRecord(
        "job-latents",
        "latents",
        "tiny-vae",
        FPS,
        audio,
        plan if plan is not None else PlanFacts(frames=48, chunks=3, width=640, height=360),
        created_at=CREATED_AT_WALL,
        clock=FakeClock() if clock is None else clock,
        created=CREATED,
    )


def make_push_record(clock: Callable[[], float] | None = None) -> JobRecord:
    """A push session: no plan until its last block comes (`LengthKnown`). Its clock, unless
    given, is a `FakeClock` standing at `CREATED`."""
    return JobRecord(
        "job-push",
        "push",
        "tiny-vae",
        FPS,
        None,
        None,
        created_at=CREATED_AT_WALL,
        clock=FakeClock() if clock is None else clock,
        created=CREATED,
    )


def chunk(
    index: int,
    at: float,
    total: int = 3,
    frames: int = 16,
    size: int = 1000,
    encode_s: float = 0.5,
    decode_wait_s: float = 0.25,
    latency_s: float | None = None,
) -> ChunkEncoded:
    return ChunkEncoded(
        index=index,
        total=total,
        frame_start=index * frames,
        frames=frames,
        bytes=size,
        encode_s=encode_s,
        decode_wait_s=decode_wait_s,
        latency_s=latency_s,
        at=at,
    )


def snapshot(record: JobRecord) -> dict[str, Any]:
    """Everything a record shows and holds, copied, to compare before and after."""
    state = {
        f.name: getattr(record, f.name) for f in dataclasses.fields(record) if f.name != "clock"
    }
    state["events"] = [dict(event) for event in record.events]
    state["transitions"] = list(record.transitions)
    state["to_json"] = job_object(record)
    state["summary"] = summary_line(record)
    return state


# The literal table of what each status allows; a final status allows nothing.
EXPECTED_ALLOWED: dict[JobStatus, frozenset[type]] = {
    JobStatus.QUEUED: frozenset({Started, Geometry, LengthKnown, VariantEnded, Ended}),
    JobStatus.IN_PROGRESS: frozenset(
        {
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
        }
    ),
    JobStatus.COMPLETED: frozenset(),
    JobStatus.FAILED: frozenset(),
    JobStatus.CANCELLED: frozenset(),
}

ALL_TRANSITION_TYPES: tuple[type, ...] = (
    Started,
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
)


def record_in_status(status: JobStatus) -> JobRecord:
    """A push record (no plan yet, no chunk yet) brought to `status` by legal transitions,
    so that the sample transition of every allowed type is legal on it. It reads no clock.
    It has a preview, whose first chunk is in once it runs (so that `FinalReady` may be),
    and a live rendition."""
    record = make_push_record(clock=forbidden_clock)
    record.preview = PreviewProgress("linear", None)
    record.live = LiveProgress()
    if status is JobStatus.QUEUED:
        return record
    record.apply(Started(at=101.0))
    record.apply(dataclasses.replace(chunk(0, at=101.5), variant=PREVIEW))
    if status is JobStatus.IN_PROGRESS:
        return record
    if status is JobStatus.COMPLETED:
        record.apply(LengthKnown(PlanFacts(frames=16, chunks=1, width=64, height=32)))
        record.apply(SegmentAdded(500))
        record.apply(chunk(0, at=102.0, total=1))
        record.apply(Completed(at=103.0))
    else:
        record.apply(Ended(status, DecodeFailed(f"ended {status.value}"), at=103.0))
    assert record.status is status
    return record


def sample_transition(transition_type: type) -> Any:
    """One transition of `transition_type`, legal on `record_in_status` where allowed."""
    samples: dict[type, Any] = {
        Started: Started(at=101.0),
        Encoding: Encoding(MP4_CONTENT_TYPE),
        Geometry: Geometry(64, 32),
        SegmentAdded: SegmentAdded(700),
        ChunkEncoded: chunk(0, at=102.0),
        LiveChunk: LiveChunk(0, FINAL, 0, 1, 500, delay_s=0.25, at=102.5),
        LengthKnown: LengthKnown(PlanFacts(frames=32, chunks=2, width=64, height=32)),
        VariantEnded: VariantEnded(PREVIEW, JobStatus.COMPLETED, at=103.5),
        FinalReady: FinalReady(at=103.6),
        NotStored: NotStored("the store's budget has no room for it"),
        Completed: Completed(at=104.0),
        Ended: Ended(JobStatus.CANCELLED, Cancelled("the client cancelled"), at=104.0),
    }
    return samples[transition_type]


# The table, and every pair in it.


def test_every_status_is_in_the_expected_table() -> None:
    assert set(EXPECTED_ALLOWED) == set(JobStatus)


def test_the_transition_union_is_every_transition_type() -> None:
    assert set(job_record_module.Transition.__args__) == set(ALL_TRANSITION_TYPES)


ALLOWED_PAIRS = [
    pytest.param(status, kind, id=f"{status.value}-{kind.__name__}")
    for status in JobStatus
    for kind in ALL_TRANSITION_TYPES
    if kind in EXPECTED_ALLOWED[status]
]
ILLEGAL_PAIRS = [
    pytest.param(status, kind, id=f"{status.value}-{kind.__name__}")
    for status in JobStatus
    for kind in ALL_TRANSITION_TYPES
    if kind not in EXPECTED_ALLOWED[status]
]


@pytest.mark.parametrize(("status", "transition_type"), ALLOWED_PAIRS)
def test_allowed_transition_is_applied(status: JobStatus, transition_type: type) -> None:
    record = record_in_status(status)
    transitions_before = list(record.transitions)
    transition = sample_transition(transition_type)
    record.apply(transition)
    assert record.transitions == [*transitions_before, transition]


@pytest.mark.parametrize(("status", "transition_type"), ILLEGAL_PAIRS)
def test_illegal_transition_raises_and_changes_nothing(
    status: JobStatus, transition_type: type
) -> None:
    record = record_in_status(status)
    before = snapshot(record)
    with pytest.raises(IllegalTransition, match=f"is {status.value}: {transition_type.__name__}"):
        record.apply(sample_transition(transition_type))
    assert snapshot(record) == before


@pytest.mark.parametrize("status", list(JobStatus))
def test_illegal_transition_with_a_none_moment_reads_no_clock(status: JobStatus) -> None:
    # The forbidden clock would raise AssertionError, not IllegalTransition, if it were read
    # before the state check: nothing is filled in for a transition that is refused.
    record = record_in_status(status)
    refused = next(kind for kind in (Completed, Started) if kind not in EXPECTED_ALLOWED[status])
    with pytest.raises(IllegalTransition):
        record.apply(refused(at=None))


# Lifecycles, end to end.


def test_latents_job_lifecycle_queued_to_completed() -> None:
    record = make_latents_record(audio={"sample_rate": 48000, "channels": 2})
    assert record.status is JobStatus.QUEUED
    assert record.events == [{"event": "queued", "status": "queued"}]
    assert record.progress == 0
    assert not record.is_final

    started = record.apply(Started(at=101.5))
    assert started == {"event": "started", "status": "in_progress"}
    assert record.status is JobStatus.IN_PROGRESS
    assert record.started == 101.5

    assert record.apply(Encoding(MP4_CONTENT_TYPE)) is None
    assert record.content_type == MP4_CONTENT_TYPE
    assert record.apply(SegmentAdded(800)) is None  # the init segment
    assert record.bytes == 800

    assert record.apply(SegmentAdded(1000)) is None
    first = record.apply(chunk(0, at=102.25, size=1000))
    assert first == {
        "event": "chunk",
        "status": "in_progress",
        "index": 0,
        "total": 3,
        "frame_start": 0,
        "frames": 16,
        "bytes": 1000,
        "frames_done": 16,
        "total_bytes": 1800,
        "progress": 33,
        "stall_free_start_s": None,  # no rate yet to go by
    }
    assert record.first_fragment == 102.25
    assert (record.chunks_done, record.frames_done, record.progress) == (1, 16, 33)

    record.apply(SegmentAdded(1100))
    second = record.apply(chunk(1, at=103.0, size=1100, encode_s=0.125, decode_wait_s=0.5))
    assert second is not None
    assert (second["index"], second["frame_start"], second["progress"]) == (1, 16, 67)
    # Chunk 1 came 1/12 s after a viewer who started at chunk 0 needed it; at the rate
    # so far (8/9 of real time) chunk 2 would come 1/6 s late: start 1/6 s later.
    assert second["stall_free_start_s"] == pytest.approx(1 / 6, abs=1e-4)
    assert record.first_fragment == 102.25  # the first fragment's moment stays

    record.apply(SegmentAdded(1200))
    third = record.apply(chunk(2, at=103.5, size=1200))
    assert third is not None
    assert (third["frames_done"], third["total_bytes"], third["progress"]) == (48, 4100, 100)
    assert record.apply(SegmentAdded(64)) is None  # the audio tail

    done = record.apply(Completed(at=104.0))
    assert record.status is JobStatus.COMPLETED
    assert record.is_final
    assert record.finished == 104.0
    # The record says it is done; the view puts the job object in the event it is shown as.
    assert done == {"event": "done", "status": "completed"}
    assert with_job(record, done) == {**done, "job": job_object(record)}

    assert job_object(record) == {
        "id": "job-latents",
        "object": "video",
        "input": "latents",
        "model": "tiny-vae",
        "status": "completed",
        "progress": 100,
        "created_at": 1_700_000_000,
        "frames": 48,
        "width": 640,
        "height": 360,
        "fps": 24.0,
        "audio": {"sample_rate": 48000, "channels": 2},
        "seconds": 2.0,
        "chunks": {"done": 3, "total": 3},
        "frames_done": 48,
        "bytes": 4164,
        "content_type": MP4_CONTENT_TYPE,
        "timings": {
            "queued_s": 1.5,
            "time_to_first_fragment_s": 2.25,
            "total_s": 4.0,
            "decode_wait_s": 1.0,
            "encode_s": 1.125,
        },
        "realtime_factor": 0.8,  # 2 s of video in 2.5 s of decoding
        "stall_free_start_s": 0.0833,  # chunk 2 came early after all: chunk 1's 1/12 s
        "error": None,
        "replica": None,
        "not_stored": None,
        "partial": False,
        "webhook_url": None,
    }
    assert summary_line(record) == (
        "id=job-latents model=tiny-vae status=completed frames=48/48 chunks=3/3 "
        "bytes=4164 ttff_s=2.25 total_s=4.0 encode_s=1.125 error=''"
    )
    assert [event["event"] for event in record.events] == [
        "queued",
        "started",
        "chunk",
        "chunk",
        "chunk",
        "done",
    ]
    assert record.events[1:] == [started, first, second, third, done]
    assert [type(t) for t in record.transitions] == [
        Started,
        Encoding,
        SegmentAdded,
        SegmentAdded,
        ChunkEncoded,
        SegmentAdded,
        ChunkEncoded,
        SegmentAdded,
        ChunkEncoded,
        SegmentAdded,
        Completed,
    ]
    assert record.run_seconds == 2.5


def test_push_session_lifecycle_geometry_then_length_known() -> None:
    record = make_push_record()
    assert record.progress is None  # the length is unknown
    assert record.apply(Geometry(320, 180)) is None  # the first block, before its start
    json = job_object(record)
    assert (json["width"], json["height"], json["frames"], json["seconds"]) == (
        320,
        180,
        None,
        None,
    )
    assert json["chunks"] == {"done": 0, "total": None}
    assert json["progress"] is None

    record.apply(Started(at=100.5))
    record.apply(SegmentAdded(400))
    pushed = record.apply(chunk(0, at=101.0, total=0, latency_s=0.123456))
    assert pushed is not None
    assert pushed["latency_s"] == 0.1235
    assert pushed["progress"] is None
    assert record.apply(Geometry(999, 999)) is None  # the first geometry stays
    assert record.geometry == Geometry(320, 180)

    record.apply(SegmentAdded(400))
    record.apply(chunk(1, at=101.5, total=0))
    length = record.apply(LengthKnown(PlanFacts(frames=40, chunks=3, width=320, height=180)))
    assert length == {"event": "length", "status": "in_progress", "frames": 40, "chunks": 3}
    assert record.progress == 67
    assert job_object(record)["chunks"] == {"done": 2, "total": 3}
    assert job_object(record)["seconds"] == round(40 / 24, 3)

    record.apply(SegmentAdded(200))
    record.apply(chunk(2, at=102.0, total=3, frames=8))
    record.apply(Completed(at=102.5))
    assert record.status is JobStatus.COMPLETED
    assert job_object(record)["frames_done"] == 40
    assert summary_line(record) == (
        "id=job-push model=tiny-vae status=completed frames=40/40 chunks=3/3 "
        "bytes=1000 ttff_s=1.0 total_s=2.5 encode_s=1.5 error=''"
    )


def test_length_known_while_queued_makes_progress_zero() -> None:
    record = make_push_record()
    event = record.apply(LengthKnown(PlanFacts(frames=16, chunks=2, width=8, height=8)))
    assert event == {"event": "length", "status": "queued", "frames": 16, "chunks": 2}
    assert record.status is JobStatus.QUEUED
    assert record.progress == 0


def test_plan_width_wins_over_geometry_in_json() -> None:
    record = make_push_record()
    record.apply(Geometry(320, 180))
    record.apply(LengthKnown(PlanFacts(frames=16, chunks=1, width=640, height=360)))
    assert (job_object(record)["width"], job_object(record)["height"]) == (640, 360)


def test_queued_job_cancelled() -> None:
    record = make_latents_record()
    error = Cancelled("the client cancelled it")
    event = record.apply(Ended(JobStatus.CANCELLED, error, at=100.75))
    assert event == {
        "event": "error",
        "status": "cancelled",
        "error": {"type": "cancelled", "message": "the client cancelled it"},
    }
    assert record.status is JobStatus.CANCELLED
    assert record.is_final
    assert record.error is error
    assert timings_of(record) == {
        "queued_s": None,
        "time_to_first_fragment_s": None,
        "total_s": 0.75,
        "decode_wait_s": 0.0,
        "encode_s": 0.0,
    }
    assert record.run_seconds is None
    assert record.realtime_factor is None
    json = job_object(record)
    assert json["status"] == "cancelled"
    assert json["error"] == {"type": "cancelled", "message": "the client cancelled it"}
    assert json["progress"] == 0
    assert summary_line(record) == (
        "id=job-latents model=tiny-vae status=cancelled frames=0/48 chunks=0/3 "
        "bytes=0 ttff_s=None total_s=0.75 encode_s=0.0 error='the client cancelled it'"
    )


def test_queued_job_failed() -> None:
    record = make_push_record()
    record.apply(Ended(JobStatus.FAILED, DecodeFailed("bad first block"), at=100.25))
    assert record.status is JobStatus.FAILED
    assert job_object(record)["error"] == {"type": "decode_failed", "message": "bad first block"}


def test_running_job_failed_with_error_and_decoded_chunks() -> None:
    record = make_latents_record()
    record.apply(Started(replica={"id": "replica-7", "node": "gpu-3"}, at=101.0))
    record.apply(SegmentAdded(800))
    record.apply(SegmentAdded(1000))
    record.apply(chunk(0, at=102.0))
    event = record.apply(
        Ended(JobStatus.FAILED, DecodeFailed("CUDA out of memory"), decoded_chunks=2, at=103.0)
    )
    assert event == {
        "event": "error",
        "status": "failed",
        "error": {"type": "decode_failed", "message": "CUDA out of memory"},
        "decoded_chunks": 2,
    }
    assert record.status is JobStatus.FAILED
    assert record.is_final
    assert record.run_seconds == 2.0
    assert record.realtime_factor == round((16 / 24) / 2.0, 3)
    json = job_object(record)
    assert json["replica"] == "replica-7"
    assert json["progress"] == 33
    assert json["timings"]["total_s"] == 3.0
    assert json["error"] == {"type": "decode_failed", "message": "CUDA out of memory"}
    assert summary_line(record).endswith("error='CUDA out of memory'")


def test_running_job_cancelled() -> None:
    record = make_latents_record()
    record.apply(Started(at=101.0))
    event = record.apply(Ended(JobStatus.CANCELLED, Cancelled("server shutting down"), at=102.0))
    assert event is not None
    assert event["status"] == "cancelled"
    assert "decoded_chunks" not in event
    assert record.status is JobStatus.CANCELLED


def test_a_cancel_that_keeps_the_video_so_far_says_so_and_keeps_it_in_a_snapshot() -> None:
    from vaecast.job.snapshot import from_snapshot, snapshot

    record = make_latents_record()
    record.apply(Started(at=101.0))
    kept = Ended(JobStatus.CANCELLED, Cancelled("cancelled by request"), at=102.0, partial=True)
    event = record.apply(kept)
    assert event is not None and event["partial"] is True
    assert record.partial and job_object(record)["partial"] is True
    again = from_snapshot(snapshot(record), record.events)
    assert (again.status, again.partial) == (JobStatus.CANCELLED, True)
    record = make_latents_record()
    event = record.apply(Ended(JobStatus.FAILED, Cancelled("x"), at=102.0))
    assert event is not None and "partial" not in event and not record.partial


def test_started_with_replica_puts_it_in_the_event() -> None:
    record = make_latents_record()
    replica = {"id": "replica-1", "node": "gpu-0"}
    event = record.apply(Started(replica=replica, at=101.0))
    assert event == {"event": "started", "status": "in_progress", "replica": replica}
    assert record.replica == replica
    assert job_object(record)["replica"] == "replica-1"


# Refusals inside an allowed transition type: still a refusal, still nothing changed.


def assert_refused_unchanged(record: JobRecord, transition: Any, message: str) -> None:
    before = snapshot(record)
    with pytest.raises(IllegalTransition, match=message):
        record.apply(transition)
    assert snapshot(record) == before


def test_length_known_twice_is_refused() -> None:
    record = make_latents_record()
    plan = PlanFacts(frames=48, chunks=3, width=640, height=360)
    assert_refused_unchanged(record, LengthKnown(plan), "its length was known already")
    record.apply(Started(at=101.0))
    assert_refused_unchanged(record, LengthKnown(plan), "its length was known already")


@pytest.mark.parametrize("wrong_index", [1, 2, -1])
def test_chunk_out_of_order_is_refused(wrong_index: int) -> None:
    record = make_latents_record()
    record.apply(Started(at=101.0))
    assert_refused_unchanged(
        record, chunk(wrong_index, at=102.0), f"chunk {wrong_index} came where chunk 0 was due"
    )


def test_chunk_repeated_is_refused() -> None:
    record = make_latents_record()
    record.apply(Started(at=101.0))
    record.apply(chunk(0, at=102.0))
    assert_refused_unchanged(record, chunk(0, at=102.5), "chunk 0 came where chunk 1 was due")


def test_completed_before_every_chunk_is_refused() -> None:
    record = make_latents_record()
    record.apply(Started(at=101.0))
    record.apply(chunk(0, at=102.0))
    assert_refused_unchanged(record, Completed(at=103.0), "completed after 1 chunks of 3")


def test_completed_without_a_plan_is_accepted() -> None:
    # A push session's plan may be unknown; only a known plan's chunk count is checked.
    record = make_push_record()
    record.apply(Started(at=101.0))
    record.apply(Completed(at=102.0))
    assert record.status is JobStatus.COMPLETED
    assert record.progress is None


@pytest.mark.parametrize("status", [JobStatus.QUEUED, JobStatus.IN_PROGRESS, JobStatus.COMPLETED])
@pytest.mark.parametrize("running", [False, True], ids=["queued", "in_progress"])
def test_ended_with_a_status_other_than_failed_or_cancelled_is_refused(
    status: JobStatus, running: bool
) -> None:
    record = make_latents_record()
    if running:
        record.apply(Started(at=101.0))
    assert_refused_unchanged(
        record,
        Ended(status, DecodeFailed("nope"), at=102.0),
        "Ended needs failed or cancelled",
    )


# Moments: given, or read from the record's clock.


def test_created_none_reads_the_clock() -> None:
    clock = FakeClock(now=55.0)
    record = JobRecord(
        "job-clock",
        "latents",
        "tiny-vae",
        FPS,
        None,
        PlanFacts(frames=8, chunks=1, width=8, height=8),
        created_at=CREATED_AT_WALL,
        clock=clock,
    )
    assert record.created == 55.0
    assert clock.reads == 1


def test_given_created_reads_no_clock() -> None:
    record = make_latents_record(clock=forbidden_clock)
    assert record.created == CREATED


@pytest.mark.parametrize(
    "transition",
    [
        Started(),
        chunk(0, at=0.0),
        Completed(),
        Ended(JobStatus.FAILED, DecodeFailed("x")),
    ],
    ids=["Started", "ChunkEncoded", "Completed", "Ended"],
)
def test_a_none_moment_is_filled_from_the_clock(transition: Any) -> None:
    clock = FakeClock()
    record = make_latents_record(
        plan=PlanFacts(frames=16, chunks=1, width=8, height=8), clock=clock
    )
    if not isinstance(transition, Started):
        clock.now = 101.0
        record.apply(Started())
        if isinstance(transition, Completed):
            record.apply(chunk(0, at=102.0, total=1))
    if isinstance(transition, ChunkEncoded):
        transition = dataclasses.replace(transition, at=None)
    clock.now = 103.0
    reads_before = clock.reads
    record.apply(transition)
    assert clock.reads == reads_before + 1
    recorded = record.transitions[-1]
    assert recorded == dataclasses.replace(transition, at=103.0)
    assert recorded.at == 103.0


def test_explicit_moments_are_kept_and_read_no_clock() -> None:
    record = make_latents_record(
        plan=PlanFacts(frames=16, chunks=1, width=8, height=8), clock=forbidden_clock
    )
    started, chunk0, completed = Started(at=101.0), chunk(0, at=102.0, total=1), Completed(at=103.0)
    record.apply(started)
    record.apply(Encoding(MP4_CONTENT_TYPE))
    record.apply(SegmentAdded(10))
    record.apply(chunk0)
    record.apply(completed)
    assert record.transitions[0] is started
    assert record.transitions[3] is chunk0
    assert record.transitions[4] is completed
    assert (record.started, record.first_fragment, record.finished) == (101.0, 102.0, 103.0)


def test_mirror_replaying_the_transitions_reads_the_same() -> None:
    # The module's promise for Ray mode: a mirror applying the host's `transitions`, in
    # order, to a record of its own shows the host's timings (the moments travel along).
    host_clock = FakeClock()
    host = make_latents_record(clock=host_clock)
    for now, transition in [
        (101.0, Started(replica={"id": "replica-2"})),
        (101.0, Encoding(MP4_CONTENT_TYPE)),
        (101.1, SegmentAdded(800)),
        (101.2, SegmentAdded(900)),
        (101.7, dataclasses.replace(chunk(0, at=0.0), at=None)),
        (101.8, SegmentAdded(900)),
        (102.3, dataclasses.replace(chunk(1, at=0.0), at=None)),
        (102.4, SegmentAdded(900)),
        (102.9, dataclasses.replace(chunk(2, at=0.0), at=None)),
        (103.0, Completed()),
    ]:
        host_clock.now = now
        host.apply(transition)

    mirror = make_latents_record(clock=forbidden_clock)  # created at the host's moment
    for transition in host.transitions:
        mirror.apply(transition)
    assert job_object(mirror) == job_object(host)
    assert mirror.events == host.events
    assert summary_line(mirror) == summary_line(host)
    assert timings_of(mirror) == timings_of(host)
    assert mirror.transitions == host.transitions


# Derived values.


def test_progress_rounds_to_whole_percent() -> None:
    record = make_latents_record(plan=PlanFacts(frames=48, chunks=3, width=8, height=8))
    record.apply(Started(at=101.0))
    seen = [record.progress]
    for index in range(3):
        record.apply(chunk(index, at=102.0 + index))
        seen.append(record.progress)
    assert seen == [0, 33, 67, 100]


def test_realtime_factor_while_running_uses_the_clock() -> None:
    clock = FakeClock()
    record = make_latents_record(clock=clock)
    assert record.realtime_factor is None  # not started
    record.apply(Started(at=101.0))
    clock.now = 105.0
    assert record.realtime_factor is None  # no frame yet
    record.apply(chunk(0, at=102.0, frames=48))  # 2 s of video
    clock.now = 102.0
    assert record.realtime_factor == 2.0  # in 1 s of decoding
    clock.now = 105.0
    assert record.realtime_factor == 0.5  # in 4 s
    assert record.run_seconds is None  # not finished


def test_realtime_factor_after_finishing_ignores_the_clock() -> None:
    clock = FakeClock()
    record = make_latents_record(plan=PlanFacts(frames=24, chunks=1, width=8, height=8))
    record.clock = clock
    record.apply(Started(at=101.0))
    record.apply(chunk(0, at=101.5, total=1, frames=24))
    record.apply(Completed(at=103.0))
    reads = clock.reads
    clock.now = 1_000.0
    assert record.realtime_factor == 0.5  # 1 s of video in 2 s
    assert clock.reads == reads
    assert record.run_seconds == 2.0


def test_realtime_factor_guards_a_zero_run() -> None:
    record = make_latents_record(plan=PlanFacts(frames=24, chunks=1, width=8, height=8))
    record.apply(Started(at=101.0))
    record.apply(chunk(0, at=101.0, total=1, frames=24))
    record.apply(Completed(at=101.0))
    assert record.realtime_factor == round(1.0 / 1e-6, 3)
    assert record.run_seconds == 0.0


def test_realtime_factor_uses_a_fractional_frame_rate() -> None:
    record = JobRecord(
        "job-ntsc",
        "latents",
        "tiny-vae",
        Fraction(30000, 1001),
        None,
        PlanFacts(frames=30, chunks=1, width=8, height=8),
        created_at=0.0,
        clock=forbidden_clock,
        created=0.0,
    )
    record.apply(Started(at=0.0))
    record.apply(chunk(0, at=0.5, total=1, frames=30))
    record.apply(Completed(at=1.0))
    assert record.realtime_factor == round(30 * 1001 / 30000, 3)
    assert job_object(record)["fps"] == pytest.approx(29.97, abs=1e-3)
    assert job_object(record)["seconds"] == round(30 * 1001 / 30000, 3)


def test_job_timings_rounds_and_leaves_missing_moments_none() -> None:
    assert job_timings(10.0, None, None, None, 0.0, 0.0) == {
        "queued_s": None,
        "time_to_first_fragment_s": None,
        "total_s": None,
        "decode_wait_s": 0.0,
        "encode_s": 0.0,
    }
    assert job_timings(10.0, 10.123456, 11.00004, 12.5, 0.333333, 1.987654) == {
        "queued_s": 0.1235,
        "time_to_first_fragment_s": 1.0,
        "total_s": 2.5,
        "decode_wait_s": 0.3333,
        "encode_s": 1.9877,
    }


def test_summary_of_a_queued_push_session() -> None:
    record = make_push_record()
    assert summary_line(record) == (
        "id=job-push model=tiny-vae status=queued frames=0/None chunks=0/None "
        "bytes=0 ttff_s=None total_s=None encode_s=0.0 error=''"
    )


def test_to_json_of_a_fresh_push_session() -> None:
    assert job_object(make_push_record()) == {
        "id": "job-push",
        "object": "video",
        "input": "push",
        "model": "tiny-vae",
        "status": "queued",
        "progress": None,
        "created_at": 1_700_000_000,
        "frames": None,
        "width": None,
        "height": None,
        "fps": 24.0,
        "audio": None,
        "seconds": None,
        "chunks": {"done": 0, "total": None},
        "frames_done": 0,
        "bytes": 0,
        "content_type": "video/mp4",
        "timings": {
            "queued_s": None,
            "time_to_first_fragment_s": None,
            "total_s": None,
            "decode_wait_s": 0.0,
            "encode_s": 0.0,
        },
        "realtime_factor": None,
        "stall_free_start_s": None,
        "error": None,
        "replica": None,
        "not_stored": None,
        "partial": False,
        "webhook_url": None,
    }


def test_to_json_copies_the_audio_mapping() -> None:
    audio = {"sample_rate": 44100, "channels": 1}
    record = make_latents_record(audio=audio)
    shown = job_object(record)["audio"]
    assert shown == audio
    assert shown is not audio


# Statuses, final statuses and the frozen values.


def test_status_values() -> None:
    assert {status.value for status in JobStatus} == {
        "queued",
        "in_progress",
        "completed",
        "failed",
        "cancelled",
    }
    assert JobStatus.IN_PROGRESS == "in_progress"  # a StrEnum: compares as its value


def test_final_statuses() -> None:
    assert frozenset({JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED}) == (
        FINAL_STATUSES
    )
    assert isinstance(FINAL_STATUSES, frozenset)


@pytest.mark.parametrize("status", list(JobStatus))
def test_is_final_matches_the_status(status: JobStatus) -> None:
    expected_final = status in {JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED}
    assert record_in_status(status).is_final is expected_final


@pytest.mark.parametrize(
    "value",
    [
        PlanFacts(frames=1, chunks=1, width=8, height=8),
        *map(sample_transition, ALL_TRANSITION_TYPES),
    ],
    ids=lambda value: type(value).__name__,
)
def test_plan_facts_and_transitions_are_frozen(value: Any) -> None:
    first_field = dataclasses.fields(value)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(value, first_field, None)


def test_plan_facts_compare_by_value() -> None:
    assert PlanFacts(10, 2, 64, 32) == PlanFacts(frames=10, chunks=2, width=64, height=32)
    assert PlanFacts(10, 2, 64, 32) != PlanFacts(10, 3, 64, 32)


def test_illegal_transition_is_a_runtime_error_not_a_client_error() -> None:
    assert issubclass(IllegalTransition, RuntimeError)
    assert not issubclass(IllegalTransition, VaecastError)


# Sans-IO: the module's imports.


@pytest.mark.parametrize("module", ["record", "transitions", "views"])
def test_module_imports_only_the_standard_library_and_vaecast_errors(module: str) -> None:
    source = (Path(job_record_module.__file__).parent / f"{module}.py").read_text(encoding="utf-8")
    imported: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "no relative imports"
            assert node.module is not None
            imported.add(node.module)
    assert imported, "the parse found the imports"
    outside = {
        name
        for name in imported
        if name
        not in (
            "vaecast.errors",
            "vaecast.job.transitions",
            "vaecast.job.views",
            "vaecast.playback_deadlines",
        )
        and name != "vaecast.job.record"  # the views' type, under TYPE_CHECKING
        and name != "__future__"
        and name.split(".")[0] not in sys.stdlib_module_names
    }
    assert outside == set()


def test_a_chunk_past_the_plans_last_is_refused() -> None:
    record = make_latents_record(PlanFacts(frames=16, chunks=1, width=640, height=360))
    record.apply(Started(at=101.0))
    record.apply(chunk(0, at=102.0, total=1))
    assert_refused_unchanged(
        record, chunk(1, at=103.0, total=1), "chunk 1 is past the last of its 1"
    )
    assert record.progress == 100
