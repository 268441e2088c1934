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
- one past its retention is forgotten, as the retention sweep would have done;
- one that cannot be read (its record is not a JSON object, lacks what a record has,
  or names a file outside the store's `videos/` folder) is moved to the `quarantine`
  table with one WARNING naming it, and the start goes on. A name that resolves
  outside the folder is never opened or deleted.
Files no row names (a job's file created just before a crash) are removed. What was
done is counted (`Recovered.counts`), for the start's log line and `/metrics`.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vaecast.job.snapshot import from_snapshot, snapshot
from vaecast.store.database import JobDatabase, JobRow, SegmentRow, UnreadableRow
from vaecast.store.owners import owner_gone

log = logging.getLogger("vaecast.store")

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
                "quarantined",
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
            try:
                if isinstance(row, UnreadableRow):
                    raise UnreadableJob(row.reason)
                with db.savepoint():  # what a row that fails halfway wrote is undone
                    outcome, kept = _recover_one(
                        folder, db, row, owner, now, expires, expired_reason
                    )
            except Exception as error:
                reason = _unreadable(error)
                db.quarantine(row.id, reason)
                log.warning("store: job %s cannot be read (%s): quarantined", row.id, reason)
                found.counts["quarantined"] += 1
                continue
            if kept is not None:
                named.add(kept)
            if isinstance(outcome, StoredJob):
                found.jobs.append(outcome)
                found.counts["interrupted" if row.status not in FINAL else row.status] += 1
            elif outcome in found.counts:  # dropped, expired ("running": another's)
                found.counts[outcome] += 1
        found.gone = db.gone_jobs(GONE_IDS_KEPT)
    if videos.is_dir():
        for path in videos.iterdir():
            if path.name not in named and not path.is_dir():
                _remove(path)
                found.counts["orphan_files"] += 1
    return found


class UnreadableJob(ValueError):
    """A job row that recovery cannot use (see the module docstring)."""


def _recover_one(
    folder: Path,
    db: JobDatabase,
    row: JobRow,
    owner: str,
    now: float,
    expires: Callable[[float], bool],
    expired_reason: str,
) -> tuple[StoredJob | str, str | None]:
    """What becomes of one readable row: the job kept (a StoredJob), or "running"
    (another front end's), "dropped" or "expired"; and the file name it keeps."""
    videos = folder / VIDEOS_FOLDER
    if row.status not in FINAL:
        if row.owner == owner or not owner_gone(folder, row.owner):
            running = _video_path(videos, row.file)  # checked: refused if outside
            return "running", None if running is None else running.name
        row = _interrupt(db, row, now)
    job = _checked(db, videos, row)
    if job is None:
        db.forget(row.id, LOST_FILE)
        return "dropped", None
    from_snapshot(job.snapshot, job.events)  # what serving it will do: raises if it cannot
    if expires(job.finished_at):
        db.forget(row.id, expired_reason)
        _remove(job.path)
        return "expired", None
    return job, None if job.path is None else job.path.name


def _video_path(videos: Path, name: str | None) -> Path | None:
    """The store's file `name` in `videos`, refusing any name that is not a plain file
    name there (absolute, `..`, a folder): such a row is never followed out of the store."""
    if not name:
        return None
    if not isinstance(name, str) or Path(name).name != name or name in (".", ".."):
        raise UnreadableJob(f"its video file {str(name)[:200]!r} is outside the store's videos")
    return videos / name


def _unreadable(error: Exception) -> str:
    if isinstance(error, UnreadableJob):
        return str(error)
    if isinstance(error, KeyError):
        return f"its record lacks {error}"
    return f"its record cannot be read ({type(error).__name__}: {str(error)[:200]})"


def stored_job(db: JobDatabase, videos: Path, row: JobRow) -> StoredJob | None:
    """A finished job another process stored, as it is now (None: not servable)."""
    if row.status not in FINAL or row.gone is not None:
        return None
    try:
        job = _checked(db, videos, row)
        if job is not None:
            from_snapshot(job.snapshot, job.events)
    except Exception as error:
        log.warning("store: job %s cannot be read (%s): not served", row.id, _unreadable(error))
        return None
    return job


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
    path = _video_path(videos, row.file)
    if path is None:
        return StoredJob(row.id, row.snapshot, events, [], None, finished_at)
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
