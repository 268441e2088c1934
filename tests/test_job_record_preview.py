"""A job with a preview decoder, as its record sees it: two renditions' counters, the
preview's chunks apart from the final's, `final_ready` where the final passes a
viewer of the preview, each rendition's end, and the whole through a snapshot."""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import pytest

from tests.test_job_record import FakeClock, chunk
from vaecast.errors import DecodeCancelled, DecodeFailedError
from vaecast.job.record import (
    FINAL,
    LIVE,
    PREVIEW,
    Completed,
    Ended,
    FinalReady,
    IllegalTransition,
    JobRecord,
    JobStatus,
    LengthKnown,
    LiveChunk,
    LiveProgress,
    PlanFacts,
    PreviewProgress,
    SegmentAdded,
    Started,
    VariantEnded,
)
from vaecast.job.snapshot import from_snapshot, snapshot
from vaecast.job.views import job_object

FPS = Fraction(16)
PLAN = PlanFacts(frames=48, chunks=3, width=64, height=64)  # 16 frames = 1 s a chunk


def record_with_preview(clock: FakeClock, plan: PlanFacts | None = PLAN) -> JobRecord:
    return JobRecord(
        "job",
        "latents",
        "wan2.1",
        FPS,
        None,
        plan,
        created_at=1.0,
        clock=clock,
        created=100.0,
        preview=PreviewProgress("taehv", None if plan is None else 3),
    )


def preview_chunk(index: int, at: float) -> object:
    return dataclasses.replace(chunk(index, at=at), variant=PREVIEW)


def test_the_preview_counts_apart_and_its_events_name_their_variant():
    record = record_with_preview(FakeClock())
    record.apply(Started(at=100.5))
    record.apply(SegmentAdded(300, variant=PREVIEW))
    record.apply(preview_chunk(0, at=100.6))
    record.apply(SegmentAdded(1000))
    record.apply(chunk(0, at=101.0))
    assert (record.chunks_done, record.bytes) == (1, 1000)
    assert record.preview.chunks_done == 1 and record.preview.bytes == 300
    chunks = [e for e in record.events if e["event"] == "chunk"]
    assert [e["variant"] for e in chunks] == [PREVIEW, FINAL]
    shown = job_object(record)["variants"]
    assert shown[PREVIEW]["status"] == "in_progress"
    assert shown[PREVIEW]["time_to_first_fragment_s"] == 0.6
    assert shown[FINAL]["time_to_first_fragment_s"] == 1.0
    assert shown[FINAL]["decoder"] == "wan2.1" and shown[PREVIEW]["decoder"] == "taehv"


def test_final_ready_waits_until_the_final_passes_the_preview_viewer():
    clock = FakeClock(100.0)
    record = record_with_preview(clock)
    record.apply(Started(at=100.0))
    for index in range(3):  # the whole preview in 0.3 s: its viewer is at 1 s at most
        record.apply(preview_chunk(index, at=100.1 * (index + 1)))
    record.apply(VariantEnded(PREVIEW, JobStatus.COMPLETED, at=100.4))
    record.apply(chunk(0, at=101.5))  # 1 s decoded; the viewer is 1.4 s in
    assert not record.final_caught_up(now=101.5)
    record.apply(chunk(1, at=102.0))  # 2 s decoded; the viewer is 1.9 s in
    assert record.final_caught_up(now=102.0)
    event = record.apply(FinalReady(at=102.0))
    assert event["event"] == "final_ready" and event["after_preview_s"] == pytest.approx(1.9)
    assert not record.final_caught_up(now=102.0)  # once
    with pytest.raises(IllegalTransition):
        record.apply(FinalReady(at=102.1))


def test_a_final_slower_than_real_time_is_ready_only_at_its_end():
    record = record_with_preview(FakeClock(100.0))
    record.apply(Started(at=100.0))
    for index in range(3):
        record.apply(preview_chunk(index, at=100.1 + index / 10))
    for index in range(2):  # 1 s of video each 2 s
        record.apply(chunk(index, at=102.0 + 2 * index))
        assert not record.final_caught_up(now=102.0 + 2 * index)
    record.apply(chunk(2, at=106.0))
    assert record.final_caught_up(now=106.0)


def test_a_stopped_final_keeps_the_preview_and_the_job_says_what_happened():
    record = record_with_preview(FakeClock())
    record.apply(Started(at=100.0))
    stop = DecodeCancelled("the final rendition was stopped; the preview is kept")
    record.apply(VariantEnded(FINAL, JobStatus.CANCELLED, stop, at=100.2))
    assert record.final_status() is JobStatus.CANCELLED and record.status is JobStatus.IN_PROGRESS
    for index in range(3):
        record.apply(preview_chunk(index, at=100.3 + index / 10))
    record.apply(VariantEnded(PREVIEW, JobStatus.COMPLETED, at=100.7))
    with pytest.raises(IllegalTransition):
        record.apply(Completed(at=100.8))  # its final did not complete
    record.apply(Ended(JobStatus.CANCELLED, stop, at=100.8))
    shown = job_object(record)
    assert shown["status"] == "cancelled"
    assert shown["variants"][PREVIEW]["status"] == "completed"
    assert shown["variants"][FINAL]["status"] == "cancelled"
    assert shown["variants"][FINAL]["error"]["type"] == "cancelled"
    names = [e["event"] for e in record.events]
    assert names.index("final_error") < names.index("preview_done") < names.index("error")


def test_a_job_that_fails_ends_a_running_preview_with_it():
    record = record_with_preview(FakeClock())
    record.apply(Started(at=100.0))
    record.apply(Ended(JobStatus.FAILED, DecodeFailedError("boom"), at=100.5))
    assert record.preview.status is JobStatus.FAILED and record.preview.finished == 100.5


def test_preview_transitions_on_a_job_without_one_are_illegal():
    record = JobRecord("j", "latents", "tiny", FPS, None, PLAN, created_at=1.0, created=0.0)
    record.apply(Started(at=0.1))
    for transition in (
        preview_chunk(0, at=0.2),
        VariantEnded(PREVIEW, JobStatus.COMPLETED, at=0.2),
        FinalReady(at=0.2),
    ):
        with pytest.raises(IllegalTransition):
            record.apply(transition)
    assert "variants" not in job_object(record)
    assert "variant" not in record.apply(chunk(0, at=0.3))


def test_a_push_session_learns_the_preview_length_with_its_own():
    record = record_with_preview(FakeClock(), plan=None)
    record.apply(Started(at=100.0))
    assert job_object(record)["variants"][PREVIEW]["chunks"]["total"] is None
    record.apply(LengthKnown(PLAN, preview_chunks=5))
    assert job_object(record)["variants"][PREVIEW]["chunks"]["total"] == 5


def test_the_variants_survive_a_snapshot():
    clock = FakeClock(100.0)
    record = record_with_preview(clock)
    record.live = LiveProgress()
    record.apply(Started(at=100.0))
    for index in range(3):
        record.apply(preview_chunk(index, at=100.1 + index / 10))
    record.apply(VariantEnded(PREVIEW, JobStatus.COMPLETED, at=100.4))
    for index in range(3):
        record.apply(chunk(index, at=101.0 + index))
        source = PREVIEW if index == 0 else FINAL
        record.apply(LiveChunk(index, source, 16 * index, 16, 700, delay_s=1.0, at=101.5 + index))
    record.apply(VariantEnded(LIVE, JobStatus.COMPLETED, at=103.0))
    record.apply(FinalReady(at=103.0))
    record.apply(VariantEnded(FINAL, JobStatus.COMPLETED, at=103.0))
    record.apply(Completed(at=103.0))
    clock.now = 110.0
    again = from_snapshot(snapshot(record), record.events, clock=FakeClock(500.0))
    assert job_object(again) == job_object(record)
    assert job_object(again)["variants"]["live"]["sources"] == ["preview", "final", "final"]


def test_the_live_rendition_records_each_fragments_source_and_ends_with_the_job():
    record = record_with_preview(FakeClock())
    record.live = LiveProgress()
    record.apply(Started(at=100.5))
    record.apply(SegmentAdded(300, variant=LIVE))
    event = record.apply(LiveChunk(0, PREVIEW, 0, 16, 900, delay_s=0.75, at=101.0))
    assert event == {
        "event": "chunk",
        "status": "in_progress",
        "variant": "live",
        "source": "preview",
        "index": 0,
        "total": 3,
        "frame_start": 0,
        "frames": 16,
        "bytes": 900,
        "frames_done": 16,
        "total_bytes": 300,
    }
    record.apply(LiveChunk(1, FINAL, 16, 16, 800, delay_s=0.75, at=102.0))
    with pytest.raises(IllegalTransition):  # out of order
        record.apply(LiveChunk(3, FINAL, 48, 16, 800, delay_s=0.75, at=103.0))
    with pytest.raises(IllegalTransition):  # a live chunk is the preview's or the final's
        record.apply(LiveChunk(2, LIVE, 32, 16, 800, delay_s=0.75, at=103.0))
    live = job_object(record)["variants"]["live"]
    assert (live["sources"], live["final_share"], live["start_delay_s"]) == (
        ["preview", "final"],
        0.5,
        0.75,
    )
    assert (live["status"], live["chunks"], live["frames_done"], live["bytes"]) == (
        "in_progress",
        {"done": 2},
        32,
        300,
    )
    assert live["time_to_first_fragment_s"] == 1.0
    assert record.plays() == ["live", "preview", "final"]
    record.apply(Ended(JobStatus.CANCELLED, DecodeCancelled("stop"), at=104.0))
    assert record.live.status is JobStatus.CANCELLED and record.plays() == []
    assert job_object(record)["variants"]["live"]["error"]["type"] == "cancelled"


def test_a_live_rendition_ends_on_its_own_and_a_record_without_one_refuses_its_chunks():
    record = record_with_preview(FakeClock())
    record.apply(Started(at=100.5))
    with pytest.raises(IllegalTransition):
        record.apply(LiveChunk(0, PREVIEW, 0, 16, 900, delay_s=0.5, at=101.0))
    record.live = LiveProgress()
    failed = DecodeFailedError("its preview and final streams differ")
    assert record.apply(VariantEnded(LIVE, JobStatus.FAILED, failed, at=101.5))["event"] == (
        "live_error"
    )
    assert record.plays() == ["preview", "final"]
    with pytest.raises(IllegalTransition):
        record.apply(VariantEnded(LIVE, JobStatus.COMPLETED, at=102.0))
