"""`vaecast decode`: the pipeline with a file as its sink, and its progress shown.

The MP4 is written to a temporary file beside the output and renamed into place
only on success, so a failed or interrupted decode never leaves a truncated file
under the output's name (nor replaces a good one). Before the rename, the init segment
at its start is rewritten to state the video's duration, which the fragments, written
as they came, could not know (`vaecast.codecs.fmp4_finish`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from pathlib import Path
from typing import BinaryIO

import torch

from vaecast.cli.progress import DecodeProgress
from vaecast.codecs.fmp4_finish import DurationTally
from vaecast.models.base import ChunkedDecoder, DecodePlan
from vaecast.pipeline.run import VideoOutput, WholeLatents, Workers, run_pipeline


def decode_to_file(
    latents: torch.Tensor, decoder: ChunkedDecoder, output: VideoOutput, path: Path
) -> DecodePlan:
    """Decode `latents` (BCTHW) into the MP4 file `path`; the plan it followed."""
    plan = decoder.plan(latents.shape)
    progress = DecodeProgress(plan.chunks, plan.frames)
    fd, partial_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    partial = Path(partial_name)
    workers = Workers.for_slots(1)
    try:
        with os.fdopen(fd, "wb") as file:
            sink = _FileSink(file)
            pipeline = run_pipeline(
                WholeLatents(latents), decoder, plan, output, sink, workers, observer=progress
            )
            asyncio.run(pipeline)
            sink.state_duration()
            # mkstemp makes the file 0600 whatever the umask; the output is an ordinary
            # file, with the mode any other command would give it (0644 under umask 022).
            os.fchmod(file.fileno(), 0o666 & ~_umask())
        os.replace(partial, path)
    except BaseException:
        progress.finish(ok=False)
        with contextlib.suppress(FileNotFoundError):
            partial.unlink()
        raise
    finally:
        workers.shutdown()
    progress.finish(ok=True)
    return plan


def _umask() -> int:
    """The process's umask (reading it means setting it: set it straight back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


class _FileSink:
    """The pipeline's sink for `vaecast decode`: each fragment written as it comes."""

    def __init__(self, file: BinaryIO) -> None:
        self._file = file
        self._durations = DurationTally()

    async def append(self, segment: bytes) -> None:
        self._durations.add(segment)
        await asyncio.to_thread(self._write, segment)

    def _write(self, segment: bytes) -> None:
        self._file.write(segment)
        self._file.flush()

    def state_duration(self) -> None:
        """Once the last fragment is written: the init segment, at the file's start,
        rewritten in place to state the durations (the same length)."""
        init = self._durations.finished_init()
        if init is not None:
            os.pwrite(self._file.fileno(), init, 0)
