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


@dataclass(frozen=True, slots=True)
class _Write:
    write: Callable[[JobDatabase], None]
    after: Callable[[], None] | None


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
        self._thread = threading.Thread(target=self._run, name="vaecast-store", daemon=True)
        self._thread.start()

    def submit(
        self, write: Callable[[JobDatabase], None], after: Callable[[], None] | None = None
    ) -> None:
        """Run `write` in the next transaction, then `after` once it is committed."""
        self._ops.put(_Write(write, after))

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
        while True:
            op = self._ops.get()
            writes: list[_Write] = []
            while isinstance(op, _Write):
                writes.append(op)
                if len(writes) >= BATCH_WRITES:  # commit, then go on with the queue
                    op = None
                    break
                try:
                    op = self._ops.get_nowait()
                except queue.Empty:
                    op = None
            self._commit(writes)
            if isinstance(op, _Call):
                self._answer(op)
            elif op is _STOP:
                if self._db is not None:
                    self._db.close()
                return

    def _commit(self, writes: list[_Write]) -> None:
        if not writes or self._db is None:
            return
        try:
            with self._db.transaction():
                for write in writes:
                    write.write(self._db)
        except Exception:
            self.failed_writes += 1
            log.exception(
                "store: a write of %d row change(s) failed and was rolled back", len(writes)
            )
            return
        for write in writes:
            if write.after is not None:
                try:
                    write.after()
                except OSError as error:
                    log.warning("store: %s", error)

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
