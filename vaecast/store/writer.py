"""The store's one thread: every read and write of its database, in order, off the loop.

The event loop hands over writes (`submit`) without waiting; the thread runs what
has piled up in one transaction, so a burst of fragment and event rows costs one
commit, then runs what each write asked to do once it is committed (removing a
file only after the row that named it is gone). `call` runs a read, or a step that
must finish before the caller goes on (recovery, a flush), and returns its result
to the loop. Writes are applied in the order they were handed over: a job's
fragment rows always precede its `completed` row.

The queue holds what a running server produces between two commits: a few rows
per fragment, bounded by the jobs in flight and their fragments.

A commit that fails (a full or read-only disk, an I/O error) is rolled back and its
writes are kept, in order, to be tried again (every RETRY_S, and before any later
write): the database never skips a write, and the store says it is `failing` (with
the reason) until a retry commits. Each write has a number; `committed` is the
number of the last one on disk, so a caller knows whether what it handed over is.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from vaecast.store.database import JobDatabase

log = logging.getLogger("vaecast.store")

T = TypeVar("T")
# Writes per transaction at most: a commit every so often even under a flood.
BATCH_WRITES = 512
# How soon a failed commit is tried again when nothing new comes.
RETRY_S = 1.0


@dataclass(frozen=True, slots=True)
class _Write:
    write: Callable[[JobDatabase], None]
    after: Callable[[], None] | None
    number: int


@dataclass(frozen=True, slots=True)
class _Call:
    call: Callable[[JobDatabase | None], Any]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]


_STOP = object()


class StoreWriter:
    def __init__(self) -> None:
        self._ops: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._db: JobDatabase | None = None
        self.failed_writes = 0  # batches a database error rolled back
        self.submitted = 0  # writes handed over (their numbers run from 1)
        self.committed = 0  # the number of the last write on disk
        self.failing: str | None = None  # why the last commit failed; None: it did not
        self._thread = threading.Thread(target=self._run, name="vaecast-store", daemon=True)
        self._thread.start()

    def submit(
        self, write: Callable[[JobDatabase], None], after: Callable[[], None] | None = None
    ) -> None:
        """Run `write` in the next transaction, then `after` once it is committed."""
        self.submitted += 1
        self._ops.put(_Write(write, after, self.submitted))

    async def call(self, call: Callable[[JobDatabase | None], T]) -> T:
        """Run `call` on the thread, after every write handed over before it."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._ops.put(_Call(call, loop, future))
        return await future

    def use(self, db: JobDatabase) -> None:
        """The database later writes go to (set by a `call`, on the thread)."""
        self._db = db

    async def close(self) -> None:
        """Commit what is pending, close the database and end the thread."""
        self._ops.put(_STOP)
        await asyncio.to_thread(self._thread.join)

    def _run(self) -> None:
        retry: list[_Write] = []  # a failed commit's writes, first in the next one
        while True:
            try:
                op = self._ops.get(timeout=RETRY_S) if retry else self._ops.get()
            except queue.Empty:
                op = None
            writes, retry = retry, []
            while isinstance(op, _Write):
                writes.append(op)
                if len(writes) >= BATCH_WRITES:  # commit, then go on with the queue
                    op = None
                    break
                try:
                    op = self._ops.get_nowait()
                except queue.Empty:
                    op = None
            if not self._commit(writes):
                retry = writes
            if isinstance(op, _Call):
                self._answer(op)
            elif op is _STOP:
                if self._db is not None:
                    self._db.close()
                return

    def _commit(self, writes: list[_Write]) -> bool:
        """Commit `writes` in one transaction; False if it failed (rolled back)."""
        if not writes or self._db is None:
            return True
        try:
            with self._db.transaction():
                for write in writes:
                    write.write(self._db)
        except Exception as error:
            self.failed_writes += 1
            if self.failing is None:  # once per failing spell, not once per retry
                log.exception(
                    "store: a write of %d row change(s) failed and was rolled back; "
                    "it is tried again until it commits",
                    len(writes),
                )
            self.failing = f"{type(error).__name__}: {error}"
            return False
        if self.failing is not None:
            log.warning("store: writes commit again (after: %s)", self.failing)
            self.failing = None
        self.committed = writes[-1].number
        for write in writes:
            if write.after is not None:
                try:
                    write.after()
                except OSError as error:
                    log.warning("store: %s", error)
        return True

    def _answer(self, op: _Call) -> None:
        try:
            result = op.call(self._db)
        except Exception as error:  # handed to the caller
            op.loop.call_soon_threadsafe(_set_exception, op.future, error)
        else:
            op.loop.call_soon_threadsafe(_set_result, op.future, result)


def _set_result(future: asyncio.Future[Any], result: Any) -> None:
    if not future.done():
        future.set_result(result)


def _set_exception(future: asyncio.Future[Any], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)
