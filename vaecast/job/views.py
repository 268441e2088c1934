"""What a job shows: the API's job object, its timings, each rendition of a job with a
preview, the log line, and the `done` event with the job object in it.

Pure functions of a `JobRecord` (`vaecast.job.record`): the record keeps the job's
state and its transitions; these render it, and it never calls them. Standard
library only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vaecast.errors import VaecastError
from vaecast.job.record import JobRecord, LiveProgress
from vaecast.job.transitions import FINAL, LIVE, PREVIEW, JobStatus


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


def timings_of(record: JobRecord) -> dict[str, float | None]:
    assert record.created is not None
    return job_timings(
        record.created,
        record.started,
        record.first_fragment,
        record.finished,
        record.decode_wait_s,
        record.encode_s,
    )


def job_object(record: JobRecord) -> dict[str, Any]:
    """The job as the API shows it, less what the routes add (URLs, queue place)."""
    plan = record.plan
    size = plan or record.geometry
    error = record.error
    return {
        "id": record.id,
        "object": "video",
        "input": record.input,
        "model": record.model,
        "status": record.status.value,
        "progress": record.progress,
        "created_at": int(record.created_at),
        "frames": None if plan is None else plan.frames,
        "width": None if size is None else size.width,
        "height": None if size is None else size.height,
        "fps": float(record.fps),
        "audio": None if record.audio is None else dict(record.audio),
        "seconds": None if plan is None else round(float(plan.frames / record.fps), 3),
        "chunks": {"done": record.chunks_done, "total": None if plan is None else plan.chunks},
        "frames_done": record.frames_done,
        "bytes": record.bytes,
        "content_type": record.content_type,
        "timings": timings_of(record),
        "realtime_factor": record.realtime_factor,
        "stall_free_start_s": record.stall_free_start_s,
        "error": (
            {"type": error.type, "message": error.message}
            if error is not None and record.status is not JobStatus.COMPLETED
            else None
        ),
        "replica": None if record.replica is None else record.replica.get("id"),
        "not_stored": record.not_stored,
        "partial": record.partial,
        "webhook_url": record.webhook_url,
        **({} if record.expected_frames is None else {"expected_frames": record.expected_frames}),
        **(
            {}
            if record.preview is None
            else {"variants": variants_json(record), "plays": record.plays()}
        ),
    }


def with_job(record: JobRecord, event: dict[str, Any]) -> dict[str, Any]:
    """`event` as the job's event log keeps it: the `done` event carries the job object
    as it is at that moment (what an events reader gets with the news)."""
    if event["event"] == "done" and "job" not in event:
        return {**event, "job": job_object(record)}
    return event


def summary_line(record: JobRecord) -> str:
    """The job's log line, key=value."""
    timings = timings_of(record)
    error = record.error
    message = error.message if error and record.status is not JobStatus.COMPLETED else ""
    plan = record.plan
    return (
        f"id={record.id} model={record.model} status={record.status.value} "
        f"frames={record.frames_done}/{None if plan is None else plan.frames} "
        f"chunks={record.chunks_done}/{None if plan is None else plan.chunks} "
        f"bytes={record.bytes} "
        f"ttff_s={timings['time_to_first_fragment_s']} total_s={timings['total_s']} "
        f"encode_s={timings['encode_s']} error={message!r}"
    )


def variants_json(record: JobRecord) -> dict[str, Any]:
    """Each rendition of a job with a preview, as the job object shows it."""
    preview = record.preview
    assert preview is not None
    assert record.created is not None

    def since_created(moment: float | None) -> float | None:
        return None if moment is None else round(moment - record.created, 4)  # type: ignore[operator]

    def error_json(error: VaecastError | None) -> dict[str, str] | None:
        return None if error is None else {"type": error.type, "message": error.message}

    final_error = record.final_ended.error if record.final_ended is not None else None
    if final_error is None and record.status is not JobStatus.COMPLETED:
        final_error = record.error
    ready = record.final_ready
    return {
        PREVIEW: {
            "decoder": preview.decoder,
            "status": preview.status.value,
            "chunks": {"done": preview.chunks_done, "total": preview.chunks},
            "frames_done": preview.frames_done,
            "bytes": preview.bytes,
            "time_to_first_fragment_s": since_created(preview.first_fragment),
            "total_s": since_created(preview.finished),
            "error": error_json(preview.error),
        },
        FINAL: {
            "decoder": record.model,
            "status": record.final_status().value,
            "chunks": {
                "done": record.chunks_done,
                "total": None if record.plan is None else record.plan.chunks,
            },
            "frames_done": record.frames_done,
            "bytes": record.bytes,
            "time_to_first_fragment_s": since_created(record.first_fragment),
            "total_s": since_created(
                record.final_ended.at if record.final_ended is not None else record.finished
            ),
            "ready_after_preview_s": (
                None
                if ready is None or preview.first_fragment is None
                else round(ready - preview.first_fragment, 4)
            ),
            "error": error_json(final_error),
        },
        **({} if record.live is None else {LIVE: _live_json(record.live, since_created)}),
    }


def _live_json(live: LiveProgress, since_created: Callable[[float | None], float | None]) -> Any:
    """The live rendition: its start delay, and which rendition each fragment is."""
    return {
        "status": live.status.value,
        "start_delay_s": live.delay_s,
        "chunks": {"done": len(live.sources)},
        "sources": live.sources,
        "final_share": (
            None if not live.sources else round(live.sources.count(FINAL) / len(live.sources), 4)
        ),
        "frames_done": live.frames_done,
        "bytes": live.bytes,
        "time_to_first_fragment_s": since_created(live.first_fragment),
        "total_s": since_created(live.finished),
        "error": None if live.error is None else _error_json(live.error),
    }


def _error_json(error: VaecastError) -> dict[str, str]:
    return {"type": error.type, "message": error.message}
