"""The file behind a segment log: a temporary spill file, or a store's video file.

Read and written at offsets (`os.pread`/`os.pwrite`: no shared file position), from
threads, never on the event loop. It is opened on first use, so a store restored
with thousands of finished videos holds no descriptor for one nobody reads.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import tempfile
import threading
from pathlib import Path

from vaecast.errors import GoneError

SPILL_PREFIX = "vaecast-segments-"
SPILL_NAME_TRIES = 100


class SegmentFile:
    def __init__(self, path: Path, *, temporary: bool) -> None:
        """`temporary`: a spill file, removed when the log is released; otherwise the
        store's, which removes it itself once its row says the video is gone."""
        self.path = path
        self.temporary = temporary
        self._fd: int | None = None
        self._closed = False
        self._lock = threading.Lock()

    @classmethod
    def spill(cls, folder: str | Path | None) -> SegmentFile:
        """A new temporary file in `folder` (None: the system's temp dir); blocks.

        Made as `mkstemp` makes one (a random name, created only if new), but with the
        umask's mode like every file vaecast writes, where mkstemp's is 0600."""
        where = Path(tempfile.gettempdir() if folder is None else folder)
        for _ in range(SPILL_NAME_TRIES):
            path = where / f"{SPILL_PREFIX}{secrets.token_hex(8)}.mp4"
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
            except FileExistsError:
                continue
            file = cls(path, temporary=True)
            file._fd = fd
            return file
        raise FileExistsError(f"no free spill file name in {where}")

    def write(self, data: bytes, offset: int) -> None:
        fd = self._open()
        view = memoryview(data)
        while view:
            written = os.pwrite(fd, view, offset)
            view, offset = view[written:], offset + written

    def read(self, length: int, offset: int) -> bytes:
        return os.pread(self._open(), length, offset)

    def close(self) -> None:
        """Close it (and remove a temporary one); later reads answer 410."""
        with self._lock:
            self._closed = True
            fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
        if self.temporary:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()

    def _open(self) -> int:
        with self._lock:
            if self._closed:
                raise GoneError("the video was evicted")
            if self._fd is None:
                try:
                    self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
                except FileNotFoundError:
                    raise GoneError("the video's file is gone") from None
            return self._fd
