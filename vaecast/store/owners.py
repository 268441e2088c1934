"""Which process owns a running job: a lock file each server holds while it lives.

A job that is queued or decoding belongs to the process that runs it. After a crash
its row still says `in_progress`, and only its owner's death makes it `interrupted`;
with two front ends on one store, the other one's running jobs are not this one's
to fail. Each server takes an exclusive `flock` on `owners/<id>.lock` at start and
holds it until it exits; the kernel releases it however the process ends, SIGKILL
included, so "can I take its lock?" is "is it gone?" without pids, which are reused,
or host names, which change when a container moves.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import uuid
from pathlib import Path

OWNERS_FOLDER = "owners"


class OwnerLease:
    """This process's lock (see the module docstring)."""

    def __init__(self, store_folder: Path) -> None:
        folder = store_folder / OWNERS_FOLDER
        folder.mkdir(parents=True, exist_ok=True)
        self.id = uuid.uuid4().hex
        self._path = folder / f"{self.id}.lock"
        self._fd: int | None = os.open(self._path, os.O_CREAT | os.O_RDWR, 0o666)
        fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(FileNotFoundError):
                self._path.unlink()
            os.close(self._fd)
            self._fd = None


def owner_gone(store_folder: Path, owner: str) -> bool:
    """True when the process `owner` has ended (its lock is free, or its file is gone);
    its lock file is then removed."""
    path = store_folder / OWNERS_FOLDER / f"{Path(owner).name}.lock"
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    return True
