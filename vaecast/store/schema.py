"""The store's SQLite schema, as a list of migrations.

`MIGRATIONS[n]` takes a database from version n to n + 1 (SQLite's `user_version`
holds the version); a new version appends a migration and never edits an old one,
so every store written by an earlier vaecast opens in a later one.

- `jobs`: one row per job: its record (`vaecast.job.snapshot`, JSON), the process
  that owns it while it runs, its video file and the bytes of it that are indexed,
  when it finished and expires, and why it is gone (deleted, evicted), if it is.
- `events`: the job's progress events, in order (their index is their SSE id).
- `segments`: the job's fragment index: each segment's place in the MP4 file, and
  for HLS each fragment's duration and whether it starts with a keyframe.
- `quarantine` (version 2): job rows a start could not read, moved out of `jobs` with
  why and when, the row as it was (JSON), for a person to look at.
- `jobs.gone_at` (version 3): when the job went (deleted, evicted), so that servers
  sharing the store learn of it.
- `deliveries` (version 4): each webhook of a job that was delivered or given up (its
  event, how it ended, after how many tries). A job whose end has no row here is owed
  its webhook: a restart sends it (the webhooks face).
"""

from __future__ import annotations

MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE jobs (
        id TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        status TEXT NOT NULL,
        snapshot TEXT NOT NULL,
        file TEXT,
        size INTEGER NOT NULL DEFAULT 0,
        created_at REAL NOT NULL,
        finished_at REAL,
        expires_at REAL,
        gone TEXT
    );
    CREATE INDEX jobs_by_status ON jobs (gone, status, finished_at);
    CREATE TABLE events (
        job_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        body TEXT NOT NULL,
        PRIMARY KEY (job_id, seq)
    ) WITHOUT ROWID;
    CREATE TABLE segments (
        job_id TEXT NOT NULL,
        idx INTEGER NOT NULL,
        offset INTEGER NOT NULL,
        length INTEGER NOT NULL,
        duration_s REAL,
        independent INTEGER,
        PRIMARY KEY (job_id, idx)
    ) WITHOUT ROWID;
    """,
    """
    CREATE TABLE quarantine (
        id TEXT NOT NULL,
        reason TEXT NOT NULL,
        job TEXT NOT NULL,
        at REAL NOT NULL
    );
    """,
    """
    ALTER TABLE jobs ADD COLUMN gone_at REAL;
    CREATE INDEX jobs_by_gone_at ON jobs (gone_at);
    """,
    """
    CREATE TABLE deliveries (
        job_id TEXT NOT NULL,
        event TEXT NOT NULL,
        outcome TEXT NOT NULL,
        attempts INTEGER NOT NULL,
        at REAL NOT NULL,
        error TEXT,
        PRIMARY KEY (job_id, event)
    ) WITHOUT ROWID;
    """,
)

SCHEMA_VERSION = len(MIGRATIONS)
