"""What a start finds in the store, made consistent before the port opens.

For each job the database keeps (run on the store's thread, in one transaction):
- one that was queued or decoding when its owner died (`vaecast.store.owners`) is
  ended as failed, `interrupted`, with the error event its viewers would have seen;
  one whose owner still runs (another front end) is left to it;
- its video file is checked against its fragment index. Bytes past the last indexed
  fragment (written, never indexed) are cut off; a failed job keeps the whole
  fragments its file holds; a completed job whose file is shorter than its index,
  or whose index is not its whole length, cannot be served and is dropped (a
  completed job's file was fsynced before it was marked complete, so this means the
  disk lost it, not a crash);
- one past its retention is forgotten, as the retention sweep would have done.
Files no row names (a job's file created just before a crash) are removed. What was
done is counted (`Recovered.counts`), for the start's log line and `/metrics`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vaecast.job_snapshot import from_snapshot, snapshot
from vaecast.store.database import JobDatabase, JobRow, SegmentRow
from vaecast.store.owners import owner_gone

VIDEOS_FOLDER = "videos"
GONE_IDS_KEPT = 10_000
FINAL = frozenset({"completed", "failed", "cancelled"})
LOST_FILE = "its video file was lost from the store"

StoredSegment = SegmentRow


@dataclass(frozen=True, slots=True)
class StoredJob:
    """A finished job as the store holds it: enough to serve it again."""

    id: str
    snapshot: dict[str, Any]
    events: list[dict[str, Any]]
    segments: list[StoredSegment]  # the init segment first; empty: no video kept
    path: Path | None
    finished_at: float  # wall-clock seconds


@dataclass(slots=True)
class Recovered:
    jobs: list[StoredJob] = field(default_factory=list)  # oldest first
    gone: list[tuple[str, str]] = field(default_factory=list)  # id, why
    counts: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(
            (
                "completed",
                "failed",
                "cancelled",
                "interrupted",
                "dropped",
                "expired",
                "orphan_files",
            ),
            0,
        )
    )

    def summary(self) -> str:
        return " ".join(f"{name}={count}" for name, count in self.counts.items())


def recover(
    folder: Path,
    db: JobDatabase,
    owner: str,
    now: float,
    expires: Callable[[float], bool],
    expired_reason: str,
) -> Recovered:
    """Make the store consistent (see the module docstring); what it holds now.
    `expires(finished_at)`: whether a job that ended then is past its retention."""
    found = Recovered()
    videos = folder / VIDEOS_FOLDER
    named: set[str] = set()
    with db.transaction():
        for row in db.kept_jobs():
            interrupted = row.status not in FINAL
            if interrupted:
                if row.owner == owner or not owner_gone(folder, row.owner):
                    if row.file:
                        named.add(row.file)  # another front end's running job
                    continue
                row = _interrupt(db, row, now)
            job = _checked(db, videos, row)
            if job is None:
                db.forget(row.id, LOST_FILE)
                found.counts["dropped"] += 1
                continue
            if expires(job.finished_at):
                db.forget(row.id, expired_reason)
                _remove(job.path)
                found.counts["expired"] += 1
                continue
            found.counts["interrupted" if interrupted else row.snapshot["status"]] += 1
            if job.path is not None:
                named.add(job.path.name)
            found.jobs.append(job)
        found.gone = db.gone_jobs(GONE_IDS_KEPT)
    if videos.is_dir():
        for path in videos.iterdir():
            if path.name not in named:
                _remove(path)
                found.counts["orphan_files"] += 1
    return found


def stored_job(db: JobDatabase, videos: Path, row: JobRow) -> StoredJob | None:
    """A finished job another process stored, as it is now (None: not servable)."""
    return _checked(db, videos, row) if row.status in FINAL and row.gone is None else None


def _interrupt(db: JobDatabase, row: JobRow, now: float) -> JobRow:
    events = db.events(row.id)
    record = from_snapshot(row.snapshot, events)
    data = snapshot(record)
    db.add_event(row.id, len(record.events) - 1, record.events[-1])
    db.update_job(row.id, data, row.size, finished_at=now)
    return JobRow(row.id, row.owner, data["status"], data, row.file, row.size, now, None)


def _checked(db: JobDatabase, videos: Path, row: JobRow) -> StoredJob | None:
    finished_at = row.finished_at or row.snapshot["created_at"]
    events = db.events(row.id)
    if not row.file:
        return StoredJob(row.id, row.snapshot, events, [], None, finished_at)
    path = videos / row.file
    segments = db.segments(row.id)
    try:
        on_disk = path.stat().st_size
    except FileNotFoundError:
        on_disk = 0
    whole = [s for s in segments if s.offset + s.length <= on_disk]
    indexed = sum(s.length for s in whole)
    if row.snapshot["status"] == "completed":
        if len(whole) != len(segments) or indexed != row.snapshot["counts"][2]:
            _remove(path)
            return None
    elif len(whole) != len(segments) or indexed != row.size:
        db.trim_segments(row.id, len(whole), indexed)
    if on_disk > indexed:  # a fragment written and never indexed: not the job's
        os.truncate(path, indexed)
    if not whole:
        db.drop_file(row.id)
        _remove(path)
        return StoredJob(row.id, row.snapshot, events, [], None, finished_at)
    return StoredJob(row.id, row.snapshot, events, whole, path, finished_at)


def _remove(path: Path | None) -> None:
    if path is not None:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
