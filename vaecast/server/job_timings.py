"""A job's timings and progress as its JSON and its events report them.

Timings come from its moments (time.perf_counter). Pure and free of torch and PyAV:
the server's Job and, in Ray mode, the job hosts (which never import torch) report
the same fields the same way.
"""

from __future__ import annotations

import time
from typing import Any


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


def realtime_factor(
    frames: int, fps: float, started: float | None, finished: float | None
) -> float | None:
    """Seconds of video made per second of decoding (so far, while running): above 1,
    faster than real time; None before the first frame."""
    if started is None or frames == 0:
        return None
    end = finished if finished is not None else time.perf_counter()
    return round(float(frames / fps) / max(end - started, 1e-6), 3)


def progress_percent(chunks_done: int, chunks: int | None) -> int | None:
    """Percent of chunks decoded and encoded; None while the length is unknown."""
    if chunks is None:
        return None
    return round(100 * chunks_done / chunks)


def chunk_event(
    *,
    index: int,
    total: int,
    frame_start: int,
    frames: int,
    chunk_bytes: int,
    frames_done: int,
    total_bytes: int,
    progress: int | None,
    latency_s: float | None,
) -> dict[str, Any]:
    """The fields of a `chunk` event, in their order; `latency_s` (from a pushed
    block's arrival to its fragment) only for pushed blocks."""
    latency = {} if latency_s is None else {"latency_s": round(latency_s, 4)}
    return {
        **latency,
        "index": index,
        "total": total,
        "frame_start": frame_start,
        "frames": frames,
        "bytes": chunk_bytes,
        "frames_done": frames_done,
        "total_bytes": total_bytes,
        "progress": progress,
    }
