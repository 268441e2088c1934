"""`vaecast decode`: the pipeline with a file as its sink, and its progress shown.

The MP4 is written to a partial file beside the output and renamed into place only on
success (`vaecast.cli.output_files`). Before the rename, the init segment
at its start is rewritten to state the video's duration, which the fragments, written
as they came, could not know (`vaecast.codecs.fmp4_finish`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path
from typing import BinaryIO

import torch

from vaecast.cli.output_files import new_partial
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
    fd, partial = new_partial(path)
    workers = Workers.for_slots(1)
    try:
        with os.fdopen(fd, "wb") as file:
            sink = _FileSink(file)
            pipeline = run_pipeline(
                WholeLatents(latents), decoder, plan, output, sink, workers, observer=progress
            )
            asyncio.run(pipeline)
            sink.state_duration()
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
