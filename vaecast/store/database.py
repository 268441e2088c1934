"""The store's SQLite file: opened, migrated, and moved aside when it is corrupt.

The standard library's `sqlite3`, with a rollback journal (`journal_mode=TRUNCATE`: a
crash mid-write leaves the last committed state) and `synchronous=FULL`, so a commit
is on disk when it returns. Not WAL: WAL maps its `-shm` index into memory, and a
write to that map once the file cannot be written (made read-only or immutable under
a running server) ends the process with SIGBUS, which no Python code can catch. With a
journal every write is a system call whose error is an exception: the store says it
is failing (503) and recovers once writes succeed again. One `JobDatabase` is used by
one thread, the store's writer (`vaecast.store.writer`), and never on the event loop.
Several processes may share the file (two front ends on one store): SQLite's locks
order their writes, and `busy_timeout` makes one wait for the other instead of failing.

A file that is not a database, or one SQLite finds damaged, never stops a start: it
is renamed aside (`jobs.db.corrupt-<time>`, with its journal) and an empty one begins.
So is a file written by a newer vaecast, whose schema this one cannot know.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vaecast.store.schema import MIGRATIONS, SCHEMA_VERSION

log = logging.getLogger("vaecast.store")

DATABASE_NAME = "jobs.db"
BUSY_TIMEOUT_MS = 10_000


@dataclass(frozen=True, slots=True)
class JobRow:
    id: str
    owner: str
    status: str
    snapshot: dict[str, Any]
    file: str | None
    size: int
    finished_at: float | None
    gone: str | None


@dataclass(frozen=True, slots=True)
class UnreadableRow:
    """A job row whose record is not a JSON object (the store was damaged)."""

    id: str
    reason: str


@dataclass(frozen=True, slots=True)
class SegmentRow:
    offset: int
    length: int
    duration_s: float | None  # None: the init segment
    independent: bool


class JobDatabase:
    """The SQLite file of one store (see the module docstring). One thread uses it."""

    def __init__(self, connection: sqlite3.Connection, path: Path) -> None:
        self._db = connection
        self.path = path

    @classmethod
    def open(cls, folder: Path) -> tuple[JobDatabase, str | None]:
        """The database in `folder`, migrated to this version's schema, and a sentence
        saying what was moved aside (None: nothing was)."""
        path = folder / DATABASE_NAME
        try:
            return cls(_connect(path), path), None
        except (sqlite3.DatabaseError, _NewerSchema) as error:
            aside = _move_aside(path)
            note = f"the job database {path} could not be used ({error}); moved it to {aside}"
            return cls(_connect(path), path), note

    def close(self) -> None:
        self._db.close()

    @contextlib.contextmanager
    def savepoint(self) -> Iterator[None]:
        """Inside a transaction: what the block wrote is undone if it raises."""
        self._db.execute("SAVEPOINT one_job")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK TO one_job")
            self._db.execute("RELEASE one_job")
            raise
        self._db.execute("RELEASE one_job")

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
            self._db.execute("COMMIT")
        except BaseException:
            if self._db.in_transaction:  # a COMMIT that failed (I/O) leaves it open
                with contextlib.suppress(sqlite3.Error):
                    self._db.execute("ROLLBACK")
            raise

    # Writes (inside `transaction`).

    def put_job(self, job_id: str, owner: str, snapshot: dict[str, Any], file: str | None) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO jobs (id, owner, status, snapshot, file, created_at)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (job_id, owner, snapshot["status"], json.dumps(snapshot), file, snapshot["created_at"]),
        )

    def update_job(
        self,
        job_id: str,
        snapshot: dict[str, Any],
        size: int,
        finished_at: float | None = None,
        expires_at: float | None = None,
    ) -> None:
        self._db.execute(
            "UPDATE jobs SET status = ?, snapshot = ?, size = ?,"
            " finished_at = coalesce(?, finished_at), expires_at = coalesce(?, expires_at)"
            " WHERE id = ? AND gone IS NULL",
            (snapshot["status"], json.dumps(snapshot), size, finished_at, expires_at, job_id),
        )

    def add_event(self, job_id: str, seq: int, event: dict[str, Any]) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO events (job_id, seq, body) VALUES (?, ?, ?)",
            (job_id, seq, json.dumps(event)),
        )

    def add_segment(self, job_id: str, index: int, segment: SegmentRow) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO segments VALUES (?, ?, ?, ?, ?, ?)",
            (
                job_id,
                index,
                segment.offset,
                segment.length,
                segment.duration_s,
                int(segment.independent),
            ),
        )

    def drop_file(self, job_id: str) -> None:
        """The job stays; its video does not (a failed job's bytes, never served)."""
        self._db.execute("UPDATE jobs SET file = NULL, size = 0 WHERE id = ?", (job_id,))
        self._db.execute("DELETE FROM segments WHERE job_id = ?", (job_id,))

    def trim_segments(self, job_id: str, count: int, size: int) -> None:
        """Keep the first `count` segments (what the file holds whole)."""
        self._db.execute("DELETE FROM segments WHERE job_id = ? AND idx >= ?", (job_id, count))
        self._db.execute("UPDATE jobs SET size = ? WHERE id = ?", (size, job_id))

    def forget(self, job_id: str, reason: str, announce: bool = True) -> None:
        """The job is gone (deleted, evicted): only its id and why stay, for a 410.
        `announce`: the other servers of the store stop serving it (`gone_since`); not
        for a video the store could not keep, which its own server still serves."""
        now = time.time()
        self._db.execute(
            "UPDATE jobs SET gone = ?, gone_at = ?, file = NULL, size = 0, snapshot = '{}',"
            " finished_at = coalesce(finished_at, ?) WHERE id = ?",
            (reason, now if announce else None, now, job_id),
        )
        self._db.execute("DELETE FROM events WHERE job_id = ?", (job_id,))
        self._db.execute("DELETE FROM segments WHERE job_id = ?", (job_id,))
        self._db.execute("DELETE FROM deliveries WHERE job_id = ?", (job_id,))

    def record_delivery(
        self, job_id: str, event: str, outcome: str, attempts: int, error: str | None
    ) -> None:
        """A webhook of the job was delivered or given up."""
        self._db.execute(
            "INSERT OR REPLACE INTO deliveries (job_id, event, outcome, attempts, at, error)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (job_id, event, outcome, attempts, time.time(), error),
        )

    def quarantine(self, job_id: str, reason: str) -> None:
        """Move job `job_id`'s row (it could not be read) to the quarantine table, with
        why; its events and fragment index go."""
        row = self._db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        names = [column[1] for column in self._db.execute("PRAGMA table_info(jobs)")]
        kept = json.dumps(dict(zip(names, row or (), strict=False)), default=str)
        self._db.execute(
            "INSERT INTO quarantine (id, reason, job, at) VALUES (?, ?, ?, ?)",
            (job_id, reason, kept, time.time()),
        )
        tables = (("jobs", "id"), ("events", "job_id"), ("segments", "job_id"))
        for table, column in (*tables, ("deliveries", "job_id")):
            self._db.execute(f"DELETE FROM {table} WHERE {column} = ?", (job_id,))

    # Reads.

    def job(self, job_id: str) -> JobRow | None:
        """Job `job_id`'s row; None if there is none, or none that can be read."""
        row = self._db.execute(_JOB_COLUMNS + " WHERE id = ?", (job_id,)).fetchone()
        found = None if row is None else _job_row(row)
        return found if isinstance(found, JobRow) else None

    def kept_jobs(self) -> list[JobRow | UnreadableRow]:
        """Every job not gone, oldest first."""
        rows = self._db.execute(_JOB_COLUMNS + " WHERE gone IS NULL ORDER BY created_at")
        return [_job_row(row) for row in rows]

    def gone_jobs(self, limit: int) -> list[tuple[str, str]]:
        """The `limit` most recently gone ids and why, oldest first."""
        rows = self._db.execute(
            "SELECT id, gone FROM jobs WHERE gone IS NOT NULL ORDER BY finished_at DESC LIMIT ?",
            (limit,),
        ).fetchall()
        return rows[::-1]

    def gone_since(self, moment: float) -> list[tuple[str, str, float]]:
        """The jobs that went after `moment` (wall clock): id, why, when; oldest first."""
        return self._db.execute(
            "SELECT id, gone, gone_at FROM jobs WHERE gone_at > ? ORDER BY gone_at", (moment,)
        ).fetchall()

    def deliveries(self) -> dict[tuple[str, str], str]:
        """(job id, event) -> how each webhook delivered or given up ended."""
        rows = self._db.execute("SELECT job_id, event, outcome FROM deliveries")
        return {(job_id, event): outcome for job_id, event, outcome in rows}

    def events(self, job_id: str) -> list[dict[str, Any]]:
        rows = self._db.execute("SELECT body FROM events WHERE job_id = ? ORDER BY seq", (job_id,))
        return [json.loads(body) for (body,) in rows]

    def segments(self, job_id: str) -> list[SegmentRow]:
        rows = self._db.execute(
            "SELECT offset, length, duration_s, independent FROM segments"
            " WHERE job_id = ? ORDER BY idx",
            (job_id,),
        )
        return [SegmentRow(o, n, d, bool(i)) for o, n, d, i in rows]


_JOB_COLUMNS = "SELECT id, owner, status, snapshot, file, size, finished_at, gone FROM jobs"


def _job_row(row: tuple[Any, ...]) -> JobRow | UnreadableRow:
    job_id, owner, status, snapshot, file, size, finished_at, gone = row
    try:
        data = json.loads(snapshot)
    except (TypeError, ValueError) as error:
        return UnreadableRow(job_id, f"its record is not JSON ({error})")
    if not isinstance(data, dict):
        return UnreadableRow(job_id, f"its record is a JSON {type(data).__name__}, not an object")
    return JobRow(job_id, owner, status, data, file, size, finished_at, gone)


class _NewerSchema(Exception):
    pass


def _connect(path: Path) -> sqlite3.Connection:
    connection = sqlite3.connect(path, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000)
    try:
        connection.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        # A store an earlier build wrote in WAL mode is checkpointed into the file here,
        # and its -wal and -shm removed.
        connection.execute("PRAGMA journal_mode = TRUNCATE")
        connection.execute("PRAGMA synchronous = FULL")
        (check,) = connection.execute("PRAGMA quick_check").fetchone()
        if check != "ok":
            raise sqlite3.DatabaseError(f"quick_check: {check}")
        _migrate(connection)
    except BaseException:
        connection.close()
        raise
    return connection


def _migrate(connection: sqlite3.Connection) -> None:
    (version,) = connection.execute("PRAGMA user_version").fetchone()
    if version > SCHEMA_VERSION:
        raise _NewerSchema(
            f"its schema is version {version}, written by a newer vaecast; "
            f"this one knows up to {SCHEMA_VERSION}"
        )
    for number in range(version, SCHEMA_VERSION):
        # One transaction per step: a crash midway leaves the previous version.
        connection.executescript(
            f"BEGIN IMMEDIATE; {MIGRATIONS[number]}; PRAGMA user_version = {number + 1}; COMMIT;"
        )


def _move_aside(path: Path) -> Path:
    aside = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}")
    for suffix in ("", "-journal", "-wal"):
        source = Path(f"{path}{suffix}")
        if source.exists():
            source.rename(Path(f"{aside}{suffix}"))
    with contextlib.suppress(FileNotFoundError):
        Path(f"{path}-shm").unlink()
    return aside
