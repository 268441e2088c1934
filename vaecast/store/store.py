"""The store as the server holds it: what it is told happened, and what it finds.

Loop-side and never blocking: each call hands its rows to the store's thread
(`vaecast.store.writer`) and returns. A job's video file is named for the job, under
`videos/`; the segment log writes each segment into it at the segment's offset in
the MP4 (`vaecast.server.stream.segment_log`), so the file is the MP4 itself, and a
partial one plays up to its last fragment. The order a finished video is made
durable in: every fragment row, then the file's fsync, then the `completed` row, all
on the one thread, so a crash in between leaves a job that comes back `interrupted`
with its whole file, never a `completed` one with a short file.

`bytes_used` counts the videos this process knows of (what it restored and what its
jobs wrote); `room_for` compares it with the disk budget (`--store-max-gb`).

An answer is a promise: `settle` waits until every write handed over so far is
committed, and the server calls it before it tells a client anything a crash could
take back (a job created, completed, deleted). Writes are still batched: one commit
covers whatever piled up meanwhile, and a server with nothing pending pays nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vaecast.errors import StoreError, StoreUnavailableError
from vaecast.store.database import DATABASE_NAME, JobDatabase
from vaecast.store.owners import OwnerLease
from vaecast.store.recovery import VIDEOS_FOLDER, Recovered, StoredJob, StoredSegment, recover
from vaecast.store.recovery import stored_job as _stored_job
from vaecast.store.writer import StoreWriter


def default_store_dir() -> Path:
    """`$XDG_DATA_HOME/vaecast`, or `~/.local/share/vaecast` (the XDG base directories)."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "vaecast"


class Store:
    def __init__(
        self, folder: Path, max_bytes: int, writer: StoreWriter, lease: OwnerLease
    ) -> None:
        self.folder = folder
        self.videos = folder / VIDEOS_FOLDER
        self.max_bytes = max_bytes
        self._sizes: dict[str, int] = {}  # each video's bytes, of those this process knows
        self._used = 0
        self.database_note: str | None = None  # what was moved aside at open
        self._writer = writer
        self._lease = lease

    @classmethod
    async def open(
        cls,
        folder: Path,
        max_bytes: int,
        expires: Callable[[float], bool],
        expired_reason: str,
    ) -> tuple[Store, Recovered]:
        """Open (or create) the store in `folder` and recover what it holds; raises
        OSError when the folder cannot be made or written."""

        def prepare() -> OwnerLease:
            (folder / VIDEOS_FOLDER).mkdir(parents=True, exist_ok=True)
            _check_writable(folder)
            return OwnerLease(folder)

        lease = await asyncio.to_thread(prepare)
        writer = StoreWriter()
        store = cls(folder, max_bytes, writer, lease)

        def start(_: JobDatabase | None) -> Recovered:
            db, store.database_note = JobDatabase.open(folder)
            writer.use(db)
            return recover(folder, db, lease.id, time.time(), expires, expired_reason)

        try:
            recovered = await writer.call(start)
        except BaseException:
            await writer.close()
            lease.release()
            raise
        for job in recovered.jobs:
            store._sizes[job.id] = size = sum(segment.length for segment in job.segments)
            store._used += size
        return store, recovered

    @property
    def bytes_used(self) -> int:
        return self._used

    def adopted(self, job: StoredJob) -> None:
        """Count the video of a job another process stored, now served from here too."""
        if job.id not in self._sizes:
            self._sizes[job.id] = size = sum(segment.length for segment in job.segments)
            self._used += size

    def _uncount(self, job_id: str) -> None:
        self._used -= self._sizes.pop(job_id, 0)

    @property
    def failed_writes(self) -> int:
        return self._writer.failed_writes

    def video_path(self, job_id: str) -> Path:
        return self.videos / f"{job_id}.mp4"

    # What happens to a job (the server's job journal tells it).

    def _submit(
        self, write: Callable[[JobDatabase], None], after: Callable[[], None] | None = None
    ) -> None:
        self._writer.submit(write, after)

    @property
    def failing(self) -> str | None:
        """Why the store cannot write now (its last commit failed); None: it can."""
        return self._writer.failing

    def created(self, job_id: str, snapshot: dict[str, Any]) -> None:
        owner, name = self._lease.id, self.video_path(job_id).name
        self._submit(lambda db: db.put_job(job_id, owner, snapshot, name))

    def event(
        self, job_id: str, seq: int, event: dict[str, Any], snapshot: dict[str, Any], size: int
    ) -> None:
        def write(db: JobDatabase) -> None:
            db.add_event(job_id, seq, event)
            db.update_job(job_id, snapshot, size)

        self._submit(write)

    def segment(self, job_id: str, index: int, segment: StoredSegment) -> None:
        self._sizes[job_id] = self._sizes.get(job_id, 0) + segment.length
        self._used += segment.length
        self._submit(lambda db: db.add_segment(job_id, index, segment))

    def completed(
        self,
        job_id: str,
        event: tuple[int, dict[str, Any]],
        snapshot: dict[str, Any],
        size: int,
        expires_at: float,
    ) -> None:
        """The job's last fragment is in its file: fsync it, then mark it complete
        (with its `done` event, in the same transaction)."""
        path, folder = self.video_path(job_id), self.videos

        def write(db: JobDatabase) -> None:
            _fsync(path)
            _fsync(folder)  # the file's name, too
            db.add_event(job_id, *event)
            db.update_job(job_id, snapshot, size, finished_at=time.time(), expires_at=expires_at)

        self._submit(write)

    def ended(
        self,
        job_id: str,
        event: tuple[int, dict[str, Any]],
        snapshot: dict[str, Any],
    ) -> None:
        """The job failed or was cancelled: its record stays, its video (which is never
        served) goes."""
        path = self.video_path(job_id)

        def write(db: JobDatabase) -> None:
            db.add_event(job_id, *event)
            db.update_job(job_id, snapshot, 0, finished_at=time.time())
            db.drop_file(job_id)

        self._uncount(job_id)
        self._submit(write, lambda: _remove(path))

    def forget(self, job_id: str, reason: str) -> None:
        """The job is gone (deleted, evicted): its row keeps only why; its file goes
        once that is committed."""
        self._uncount(job_id)
        path = self.video_path(job_id)
        self._submit(lambda db: db.forget(job_id, reason), lambda: _remove(path))

    def not_stored(self, job_id: str, reason: str) -> None:
        """The job's video outgrew the budget: its server serves it without the store,
        which keeps only why (a 410 after a restart); its file goes once that is
        committed."""
        self._uncount(job_id)
        path = self.video_path(job_id)
        self._submit(lambda db: db.forget(job_id, reason, announce=False), lambda: _remove(path))

    def delivery(
        self, job_id: str, event: str, outcome: str, attempts: int, error: str | None = None
    ) -> None:
        """A webhook of the job was delivered (`outcome` "delivered") or given up."""
        self._submit(lambda db: db.record_delivery(job_id, event, outcome, attempts, error))

    def room_for(self, length: int) -> bool:
        """Whether `length` more bytes of video stay within the budget."""
        return self._used + length <= self.max_bytes

    # Reads.

    async def load(self, job_id: str) -> StoredJob | str | None:
        """A finished job another process stored (two front ends on one store), the
        reason it is gone, or None (unknown here, or still running elsewhere)."""
        videos = self.videos

        def read(db: JobDatabase | None) -> StoredJob | str | None:
            row = None if db is None else db.job(job_id)
            if row is None:
                return None
            if row.gone is not None:
                return row.gone
            return _stored_job(db, videos, row)  # type: ignore[arg-type]

        return await self._writer.call(read)

    async def deliveries(self) -> dict[tuple[str, str], str]:
        """Every webhook delivered or given up: (job id, event) -> its outcome."""
        return await self._writer.call(lambda db: {} if db is None else db.deliveries())

    async def gone_since(self, moment: float) -> list[tuple[str, str, float]]:
        """The jobs that went after `moment` (by any server of this store)."""
        return await self._writer.call(lambda db: [] if db is None else db.gone_since(moment))

    async def flush(self) -> None:
        """Until everything handed over so far is committed; StoreUnavailableError if
        the commit failed (it is tried again: see `vaecast.store.writer`)."""
        writer = self._writer
        target = writer.submitted
        await writer.call(lambda db: None)
        if writer.committed < target:
            raise StoreUnavailableError(
                f"the store cannot save right now ({writer.failing or 'its writes failed'}); "
                "nothing was answered as saved: try again"
            )

    async def settle(self) -> None:
        """Until every write handed over so far is committed; at once when none is
        pending (see the module docstring). Raises StoreUnavailableError as `flush`."""
        if self._writer.committed < self._writer.submitted:
            await self.flush()

    async def close(self) -> None:
        await self._writer.close()
        await asyncio.to_thread(self._lease.release)


def _check_writable(folder: Path) -> None:
    """Each of the database's files that exists opens for writing, or the start is
    refused in one line, before the port opens. A WAL-mode store an earlier build left
    is converted at the first open, through its `-shm` file, which SQLite maps: one it
    cannot write would end the process with SIGBUS, with no log line."""
    names = ("", "-journal", "-wal", "-shm")
    for name in (f"{DATABASE_NAME}{suffix}" for suffix in names):
        path = folder / name
        try:
            os.close(os.open(path, os.O_RDWR))
        except FileNotFoundError:
            continue
        except OSError as error:
            raise StoreError(
                f"the store's {path} cannot be written ({error.strerror}): "
                "make it writable, or give --store another folder"
            ) from None


def _fsync(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _remove(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
