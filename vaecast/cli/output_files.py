"""Files the commands write: whole under their name or not there, with the umask's mode.

A file is written beside its destination under a hidden `.part` name and renamed into
place once complete, so a failed or interrupted command never leaves a truncated file
under the output's name (nor replaces a good one). `tempfile.mkstemp` makes that file
0600 whatever the umask, and safetensors' own writer does too: the output is an
ordinary file, so it gets the mode any other command would give it (0644 under the
usual umask 022).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def process_umask() -> int:
    """The process's umask (reading it means setting it: set it straight back; the
    commands run it before they start any thread)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def new_partial(path: Path) -> tuple[int, Path]:
    """A new, empty partial file for `path` (its descriptor and name), in its folder,
    with the umask's mode."""
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    os.fchmod(fd, 0o666 & ~process_umask())
    return fd, Path(name)


def write_whole(path: Path, data: bytes) -> None:
    """`data` as the file `path`, renamed into place once written."""
    fd, partial = new_partial(path)
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
        os.replace(partial, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            partial.unlink()
        raise
