"""What a job record shows of itself: its timings and, for a job with a preview, each
rendition. Pure functions of a `JobRecord` (`vaecast.job.record`), apart from it so
that the record reads as its state and its transitions. Standard library only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vaecast.errors import VaecastError
from vaecast.job.transitions import FINAL, PREVIEW, JobStatus

if TYPE_CHECKING:
    from vaecast.job.record import JobRecord


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
    }
