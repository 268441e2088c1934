"""A job record as plain data and back: what the durable store (`vaecast.store`) keeps.

`snapshot` turns a `JobRecord` into JSON-able data; `from_snapshot` makes the record
again, in another process, on its clock. Moments are kept as seconds since the
record's creation, so the timings a restored job shows are the ones it had. A record
that had not ended when it was written comes back failed, `interrupted`: the process
that ran it is gone. Pure, like the record: no I/O.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Any

from vaecast.errors import JobInterruptedError, VaecastError, error_of_type
from vaecast.job.record import (
    FINAL,
    Ended,
    Geometry,
    JobRecord,
    JobStatus,
    LiveProgress,
    PlanFacts,
    PreviewProgress,
    VariantEnded,
)
from vaecast.job.transitions import JobInput


def snapshot(record: JobRecord) -> dict[str, Any]:
    """The record's state as JSON-able data: moments as seconds since `created`
    (the clock is this process's), `age_s` how old the record is now."""
    assert record.created is not None

    def since(moment: float | None) -> float | None:
        return None if moment is None else moment - record.created  # type: ignore[operator]

    plan, geometry = record.plan, record.geometry
    return {
        "id": record.id,
        "input": record.input,
        "model": record.model,
        "fps": str(record.fps),
        "audio": None if record.audio is None else dict(record.audio),
        "plan": None if plan is None else [plan.frames, plan.chunks, plan.width, plan.height],
        "geometry": None if geometry is None else [geometry.width, geometry.height],
        "created_at": record.created_at,
        "status": record.status.value,
        "error": None if record.error is None else [record.error.type, record.error.message],
        "content_type": record.content_type,
        "counts": [record.chunks_done, record.frames_done, record.bytes],
        "seconds": [record.encode_s, record.decode_wait_s],
        "replica": None if record.replica is None else dict(record.replica),
        "moments": [since(record.started), since(record.first_fragment), since(record.finished)],
        "age_s": record.clock() - record.created,
        "stall_free_start_s": record.stall_free_start_s,
        "partial": record.partial,
        "webhook_url": record.webhook_url,
        **({} if record.preview is None else _variants(record, since)),
    }


def _error(error: VaecastError | None) -> list[str] | None:
    return None if error is None else [error.type, error.message]


def _variants(record: JobRecord, since: Callable[[float | None], float | None]) -> dict[str, Any]:
    """A job with a preview: the preview's progress, and how its final stands."""
    preview, final_ended = record.preview, record.final_ended
    assert preview is not None
    return {
        "preview": {
            "decoder": preview.decoder,
            "chunks": preview.chunks,
            "status": preview.status.value,
            "error": _error(preview.error),
            "counts": [preview.chunks_done, preview.frames_done, preview.bytes],
            "moments": [since(preview.first_fragment), since(preview.finished)],
        },
        "final_ended": (
            None
            if final_ended is None
            else [final_ended.status.value, _error(final_ended.error), since(final_ended.at)]
        ),
        "final_ready": since(record.final_ready),
        **({} if record.live is None else {"live": _live(record.live, since)}),
    }


def _live(live: LiveProgress, since: Callable[[float | None], float | None]) -> dict[str, Any]:
    return {
        "status": live.status.value,
        "error": _error(live.error),
        "delay_s": live.delay_s,
        "sources": list(live.sources),
        "counts": [live.frames_done, live.bytes],
        "moments": [since(live.first_fragment), since(live.finished)],
    }


def from_snapshot(
    data: Mapping[str, Any],
    events: list[dict[str, Any]],
    clock: Callable[[], float] = time.perf_counter,
) -> JobRecord:
    """The record `snapshot` wrote, with its events, on `clock`. A record that had
    not ended (the server stopped while it ran) comes back failed, `interrupted`,
    ended at its snapshot's age, with the error event a reader would have seen."""
    now = clock()
    created = now - float(data["age_s"])

    def moment(offset: float | None) -> float | None:
        return None if offset is None else created + float(offset)

    plan = data["plan"]
    geometry = data["geometry"]
    chunks_done, frames_done, size = data["counts"]
    error = data["error"]
    record = JobRecord(
        data["id"],
        JobInput(data["input"]),
        data["model"],
        Fraction(data["fps"]),
        data["audio"],
        None if plan is None else PlanFacts(*plan),
        created_at=float(data["created_at"]),
        clock=clock,
        created=created,
        status=JobStatus(data["status"]),
        error=None if error is None else error_of_type(*error),
        content_type=data["content_type"],
        geometry=None if geometry is None else Geometry(*geometry),
        chunks_done=chunks_done,
        frames_done=frames_done,
        bytes=size,
        encode_s=data["seconds"][0],
        decode_wait_s=data["seconds"][1],
        replica=data["replica"],
    )
    record.started, record.first_fragment, record.finished = map(moment, data["moments"])
    record.events = list(events)
    record.stall_free_start_s = data.get("stall_free_start_s")
    record.webhook_url = data.get("webhook_url")  # (absent from older stores' rows)
    record.partial = bool(data.get("partial", False))
    if (preview := data.get("preview")) is not None:
        record.preview = PreviewProgress(
            preview["decoder"],
            preview["chunks"],
            JobStatus(preview["status"]),
            None if preview["error"] is None else error_of_type(*preview["error"]),
            *preview["counts"],
            *map(moment, preview["moments"]),
        )
        if (ended := data["final_ended"]) is not None:
            status, final_error, at = ended
            record.final_ended = VariantEnded(
                FINAL,
                JobStatus(status),
                None if final_error is None else error_of_type(*final_error),
                moment(at),
            )
        record.final_ready = moment(data["final_ready"])
        if (live := data.get("live")) is not None:  # (absent from older stores' rows)
            record.live = LiveProgress(
                JobStatus(live["status"]),
                None if live["error"] is None else error_of_type(*live["error"]),
                live["delay_s"],
                list(live["sources"]),
                *live["counts"],
                *map(moment, live["moments"]),
            )
    if not record.is_final:  # its process is gone: end it as a reader would have seen
        error = JobInterruptedError(
            f"the server stopped while the job was {data['status']}; its video "
            f"holds the {chunks_done} chunk(s) decoded before that"
        )
        record.apply(Ended(JobStatus.FAILED, error, at=created + float(data["age_s"])))
    return record
