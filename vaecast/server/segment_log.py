"""SegmentLog: one job's MP4 bytes, written once, read by any number of viewers.

The job appends the init segment and then one fragment per chunk; each reader
follows from the start at its own pace. Appends never wait for readers, so a slow
viewer cannot slow the decode or another viewer: the log is the only buffer, and
it holds what a finished job's file would hold anyway.

Single-threaded by design: every method runs on the event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from vaecast.errors import VaecastError


class SegmentLog:
    def __init__(self) -> None:
        self._segments: list[bytes] = []
        self._size = 0
        self._closed = False
        self._error: VaecastError | None = None
        self._appended = asyncio.Event()

    @property
    def size(self) -> int:
        return self._size

    @property
    def segment_count(self) -> int:
        return len(self._segments)

    @property
    def complete(self) -> bool:
        """Closed without an error: the bytes are a whole MP4 file."""
        return self._closed and self._error is None

    @property
    def error(self) -> VaecastError | None:
        return self._error

    def append(self, segment: bytes) -> None:
        if self._closed:
            raise RuntimeError("append to a closed SegmentLog")
        self._segments.append(segment)
        self._size += len(segment)
        self._wake_readers()

    def finish(self) -> None:
        """Mark the stream whole; readers end after the last segment."""
        if not self._closed:
            self._closed = True
            self._wake_readers()

    def abort(self, error: VaecastError) -> None:
        """Mark the stream broken; readers get `error` after what was written."""
        if not self._closed:
            self._closed = True
            self._error = error
            self._wake_readers()

    def read_all(self) -> bytes:
        return b"".join(self._segments)

    async def follow(self, start: int = 0) -> AsyncIterator[bytes]:
        """Yield segments from index `start`, then each new one as it is appended.

        Ends after the last segment of a finished log; raises the log's error
        after the last segment of an aborted one.
        """
        index = start
        while True:
            # Take the event before looking, so an append between the look and
            # the wait still wakes us.
            appended = self._appended
            while index < len(self._segments):
                yield self._segments[index]
                index += 1
            if self._closed:
                if self._error is not None:
                    raise self._error
                return
            await appended.wait()

    def _wake_readers(self) -> None:
        self._appended.set()
        self._appended = asyncio.Event()
