"""Append-only logs that one writer fills and any number of readers follow.

`SegmentLog` holds one job's MP4 bytes: the init segment, then one fragment per
chunk. Each reader follows from the start at its own pace; appends never wait for
readers, so a slow viewer cannot slow the decode or another viewer: the log is the
only buffer, and it holds what a finished job's file would hold anyway. Past
`spill_threshold_bytes`, further segments go to a temporary file instead of RAM,
so a long video costs a bounded amount of memory per job. With a durable store, every
segment is also written to the job's video file (`durable_path`) at its offset in the
MP4, and RAM only keeps copies up to the threshold, for the viewers who follow live;
`drop_memory` then lets a finished video be served from its file alone. A durable log
asks the store's budget (`StoreBudget`) before each segment: when the store has no room
for it, the log leaves the store, copying what it wrote to a spill file, and goes on
as a log without a store (the job says so: `NotStored`). File reads
and writes run in threads (`vaecast.server.stream.segment_file`), never on the loop.

Besides followers, which pull, a log has listeners, which it tells synchronously of
each segment appended and of its close: what lets `broadcast.py` write a segment to
every caught-up viewer in one batch, instead of waking each viewer to do it.

The job's progress events use the same mechanism (`FollowableLog[dict]`), which is
what lets a late subscriber see the state so far before following live.

Logs are single-threaded by design: every method runs on the event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, Protocol, TypeVar

from vaecast.errors import GoneError, VaecastError
from vaecast.server.stream.segment_file import SPILL_PREFIX, SegmentFile

__all__ = ["SPILL_PREFIX", "FollowableLog", "SegmentListener", "SegmentLog", "StoreBudget"]

T = TypeVar("T")


class FollowableLog(Generic[T]):
    def __init__(self) -> None:
        self._items: list[T] = []
        self._closed = False
        self._error: VaecastError | None = None
        self._appended = asyncio.Event()

    def __len__(self) -> int:
        return len(self._items)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def error(self) -> VaecastError | None:
        return self._error

    def items(self) -> list[T]:
        """What was appended so far (the log's own list: read, don't modify)."""
        return self._items

    def revoke(self, error: VaecastError) -> None:
        """Drop every item and close with `error`, even a log that finished cleanly:
        a reader still following gets the error instead of a false end."""
        self._items.clear()
        self._closed = True
        self._error = error
        self._wake_readers()

    def append(self, item: T) -> None:
        if self._closed:
            raise RuntimeError("append to a closed log")
        self._items.append(item)
        self._wake_readers()

    def finish(self) -> None:
        """Mark the log whole; readers end after the last item."""
        if not self._closed:
            self._closed = True
            self._wake_readers()

    def abort(self, error: VaecastError) -> None:
        """Mark the log broken; readers get `error` after the last item."""
        if not self._closed:
            self._closed = True
            self._error = error
            self._wake_readers()

    async def wait_for(self, count: int) -> None:
        """Return once the log holds `count` items or has finished; raise the error of
        a log that broke before it got there."""
        while True:
            appended = self._appended  # taken before looking, as in `follow`
            if len(self._items) >= count:
                return
            if self._closed:
                if self._error is not None:
                    raise self._error.detached()  # each reader its own: no shared frames
                return
            await appended.wait()

    async def follow(self, start: int = 0) -> AsyncIterator[T]:
        """Yield items from index `start`, then each new one as it is appended.

        Ends after the last item of a finished log; raises the log's error after
        the last item of an aborted one.
        """
        index = start
        while True:
            # Take the event before looking, so an append between the look and
            # the wait still wakes us.
            appended = self._appended
            while index < len(self._items):
                yield self._items[index]
                index += 1
            if self._closed:
                if self._error is not None:
                    raise self._error.detached()  # each reader its own: no shared frames
                return
            await appended.wait()

    def next_append(self) -> asyncio.Event:
        """Set at the next append or close. Take it *before* looking at the items, so
        that a change between the look and the wait still wakes the reader."""
        return self._appended

    def _wake_readers(self) -> None:
        self._appended.set()
        self._appended = asyncio.Event()


class StoreBudget(Protocol):
    """A durable log's share of the store's disk budget (`--store-max-gb`)."""

    def refuse(self, length: int) -> str | None:
        """None when the store has room for `length` more bytes of this video (having
        evicted what it may); else why not, for the client."""

    def left(self, reason: str) -> None:
        """The log no longer writes the store's file, because of `reason` (told once)."""


class SegmentListener(Protocol):
    """Told by a SegmentLog, synchronously, of what happens to it.

    Called inside `append` and the closing calls, so it must neither await nor raise,
    and should be quick: the writer (the job's pipeline) waits for it.
    """

    def appended(self, segment: bytes) -> None:
        """`segment` (its bytes, in memory or spilled) is now the log's last one."""

    def closed(self) -> None:
        """The log finished, broke or was released (see its `complete` and `error`)."""


@dataclass(frozen=True, slots=True)
class _Segment:
    offset: int  # in the whole MP4
    length: int
    data: bytes | None  # None: only in the file, at `file_offset`
    file_offset: int = 0


class SegmentLog:
    """One job's fragmented MP4: init segment, then a moof+mdat per chunk."""

    def __init__(
        self,
        spill_threshold_bytes: int | None = None,
        spill_dir: str | Path | None = None,
        durable_path: Path | None = None,
        budget: StoreBudget | None = None,
    ) -> None:
        """`budget`: asked before each segment of a durable log (None: no limit)."""
        self._segments: FollowableLog[_Segment] = FollowableLog()
        self._size = 0
        self._memory_bytes = 0
        self._spill_threshold = spill_threshold_bytes
        self._spill_dir = spill_dir
        self._file = None if durable_path is None else SegmentFile(durable_path, temporary=False)
        self._spilled_bytes = 0
        self._budget = budget
        # The store's file of a log that left the store: still read by readers that
        # began before (the store unlinks it), closed with the log.
        self._left_file: SegmentFile | None = None
        self._released = False
        self._listeners: list[SegmentListener] = []

    @property
    def size(self) -> int:
        return self._size

    @property
    def memory_bytes(self) -> int:
        return self._memory_bytes

    @property
    def released(self) -> bool:
        return self._released

    @property
    def spill_path(self) -> Path | None:
        """The temporary file spilled segments are in (None: none, or a durable log)."""
        return self._file.path if self._file is not None and self._file.temporary else None

    @property
    def durable(self) -> bool:
        """Every segment is in the store's video file."""
        return self._file is not None and not self._file.temporary

    @classmethod
    def restored(
        cls, path: Path | None, segments: list[tuple[int, int]], error: VaecastError | None
    ) -> SegmentLog:
        """A closed log of a store's video file: `segments` (offset, length) are in it;
        `error`: the log broke with it (no video kept), else it is whole."""
        log = cls(durable_path=path)
        for offset, length in segments:
            log._segments.append(_Segment(offset, length, None, offset))
            log._size = offset + length
        if error is None:
            log._segments.finish()
        else:
            log._segments.abort(error)
        return log

    @property
    def complete(self) -> bool:
        """Closed without an error: the bytes are a whole MP4 file."""
        return self._segments.closed and self._segments.error is None

    @property
    def closed(self) -> bool:
        return self._segments.closed

    @property
    def error(self) -> VaecastError | None:
        return self._segments.error

    def __len__(self) -> int:
        return len(self._segments)

    def add_listener(self, listener: SegmentListener) -> None:
        """Tell `listener` of every segment appended from now on, and of the close."""
        self._listeners.append(listener)

    async def append(self, segment: bytes) -> None:
        if self._released:
            raise RuntimeError("append to a released SegmentLog")
        if self.durable and self._budget is not None:
            reason = self._budget.refuse(len(segment))
            if reason is not None:
                await self._leave_store(reason)
        if self.durable:
            entry = await self._write_through(segment)
        elif self._spill_threshold is not None and self._memory_bytes + len(segment) > (
            self._spill_threshold
        ):
            entry = await self._spill(segment)
        else:
            entry = _Segment(self._size, len(segment), segment)
            self._memory_bytes += len(segment)
        self._size += len(segment)
        self._segments.append(entry)
        for listener in self._listeners:
            listener.appended(segment)

    def finish(self) -> None:
        self._segments.finish()
        self._tell_closed()

    def abort(self, error: VaecastError) -> None:
        self._segments.abort(error)
        self._tell_closed()

    def _tell_closed(self) -> None:
        for listener in self._listeners:
            listener.closed()

    async def rewrite_init(self, segment: bytes) -> None:
        """Replace the init segment, before the log is finished, by one of the same
        length (the finished file's, which states its duration: `fmp4_finish`): every
        later segment keeps its offset. Viewers sent the first keep it; both are valid.

        The copy in RAM changes first, at once, and every reader from then on takes it,
        so none reads the file while it is rewritten; a durable log's file is written
        next (the store fsyncs it at `completed`). Once finished, the log's bytes are
        served as a file under an ETag of its size, so they no longer change."""
        if self.closed:
            raise RuntimeError("rewrite of a closed SegmentLog")
        items = self._segments.items()
        first = items[0]
        if len(segment) != first.length:
            raise ValueError(f"an init segment of {len(segment)} bytes for {first.length}")
        if first.data is None:
            self._memory_bytes += len(segment)
        items[0] = _Segment(first.offset, first.length, segment, first.file_offset)
        if self.durable:
            assert self._file is not None
            await asyncio.to_thread(self._file.write, segment, first.file_offset)

    async def wait_for_init(self) -> None:
        """Until the init segment exists (or the log broke before it, raising why)."""
        await self._segments.wait_for(1)

    async def wait_for_segments(self, count: int) -> None:
        """Until `count` segments exist or the log is closed (raising a broken log's error)."""
        await self._segments.wait_for(count)

    async def read_segment(self, index: int) -> bytes:
        """Segment `index` (0: the init segment), which must exist."""
        segment = self._segments.items()[index]
        return await self._read(segment, 0, segment.length)

    def segment_size(self, index: int) -> int:
        return self._segments.items()[index].length

    async def wait_for_size(self, size: int | None) -> None:
        """Until the log holds `size` bytes or is closed (`size` None: until it is closed);
        raises the error of a log that broke before it got there."""
        while size is None or self._size < size:
            if self.closed:
                if self.error is not None:
                    raise self.error.detached()  # each waiter its own: no shared frames
                return
            # One segment at a time: the size only changes when one is appended.
            await self._segments.wait_for(len(self._segments) + 1)

    async def follow(self, start: int = 0) -> AsyncIterator[bytes]:
        """Yield segments from index `start` as they exist (see FollowableLog.follow).

        FollowableLog.follow written out: one generator instead of two nested ones,
        and an in-memory segment handed over as it is (no slice, no coroutine); only
        a spilled one is read (in a thread). Live viewers no longer follow this way:
        `broadcast.py` is told of each segment by the log (`add_listener`).
        """
        log = self._segments
        index = start
        while True:
            appended = log.next_append()
            items = log.items()  # revoke() empties this very list
            while index < len(items):
                segment = items[index]
                index += 1
                data = segment.data
                yield data if data is not None else await self._read(segment, 0, segment.length)
            if log.closed:
                if log.error is not None:
                    raise log.error.detached()  # each reader its own: no shared frames
                return
            await appended.wait()

    async def read_range(self, first: int, last: int) -> AsyncIterator[bytes]:
        """Bytes `first..last` (inclusive) of what is already written, segment by segment."""
        for segment in self._segments.items():
            end = segment.offset + segment.length
            if end <= first or segment.offset > last:
                continue
            start_in = max(first - segment.offset, 0)
            stop_in = min(last + 1, end) - segment.offset
            yield await self._read(segment, start_in, stop_in)

    async def read_all(self) -> bytes:
        return b"".join([part async for part in self.read_range(0, self._size - 1)])

    def drop_memory(self) -> int:
        """A durable log's copies in RAM are dropped (its file has every segment); the
        bytes freed. A log without a durable file keeps them: they are its only copy."""
        if not self.durable:
            return 0
        items = self._segments.items()
        for index, segment in enumerate(items):
            if segment.data is not None:
                items[index] = _Segment(segment.offset, segment.length, None, segment.offset)
        freed, self._memory_bytes = self._memory_bytes, 0
        return freed

    async def release(self) -> None:
        """Forget the bytes and close the file, removing a spill file (an evicted or
        shut-down job); a durable file is the store's to remove."""
        self._released = True
        self._segments.revoke(GoneError("the video was evicted"))
        self._tell_closed()
        self._memory_bytes = 0
        for file in (self._file, self._left_file):
            if file is not None:
                await asyncio.to_thread(file.close)
        self._file = self._left_file = None

    async def _read(self, segment: _Segment, start: int, stop: int) -> bytes:
        if segment.data is not None:
            return segment.data[start:stop]
        if self._file is None:
            raise GoneError("the video was evicted")
        return await asyncio.to_thread(self._file.read, stop - start, segment.file_offset + start)

    async def _write_through(self, segment: bytes) -> _Segment:
        assert self._file is not None
        await asyncio.to_thread(self._file.write, segment, self._size)
        keep = self._spill_threshold is None or (
            self._memory_bytes + len(segment) <= self._spill_threshold
        )
        if keep:
            self._memory_bytes += len(segment)
        return _Segment(self._size, len(segment), segment if keep else None, self._size)

    async def _leave_store(self, reason: str) -> None:
        """Go on without the store: what the store's file holds is copied to a spill
        file at the same offsets (those of the MP4), which takes every later segment."""
        stored, budget = self._file, self._budget
        assert stored is not None and budget is not None
        spill = await asyncio.to_thread(SegmentFile.spill, self._spill_dir)
        await asyncio.to_thread(_copy, stored, spill, self._size)
        self._file, self._left_file = spill, stored
        self._spilled_bytes = self._size
        self._budget = None
        budget.left(reason)

    async def _spill(self, segment: bytes) -> _Segment:
        if self._file is None:
            self._file = await asyncio.to_thread(SegmentFile.spill, self._spill_dir)
        entry = _Segment(self._size, len(segment), None, self._spilled_bytes)
        await asyncio.to_thread(self._file.write, segment, self._spilled_bytes)
        self._spilled_bytes += len(segment)
        return entry


COPY_BLOCK = 1 << 20


def _copy(source: SegmentFile, target: SegmentFile, length: int) -> None:
    """The first `length` bytes of `source` into `target`, a block at a time (blocks)."""
    for offset in range(0, length, COPY_BLOCK):
        target.write(source.read(min(COPY_BLOCK, length - offset), offset), offset)
