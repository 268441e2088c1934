"""`vaecast decode`'s progress: a bar redrawn in place on a terminal, plain lines in a log.

A terminal gets one line rewritten with `\\r` after each chunk. Anything else (a log
file, a pipe, CI's output) would keep every redraw, so it gets a line as each tenth
of the chunks is done, and one at the end: a long decode's log stays a few lines.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from vaecast.pipeline.run import FragmentDone

BAR_WIDTH = 30
LOG_STEPS = 10  # lines for a whole decode where the output is not a terminal


class DecodeProgress:
    """A pipeline observer that shows chunks and frames done, and the decode's rate."""

    def __init__(self, chunks: int, frames: int, out: TextIO | None = None) -> None:
        self.chunks, self.frames = chunks, frames
        self._out = sys.stderr if out is None else out
        self._terminal = self._out.isatty()
        self._since = time.perf_counter()
        self._logged_step = 0  # a line once the first tenth is done
        self._done = (0, 0)

    def started(self, content_type: str) -> None:
        if self._terminal:
            self._draw(0, 0)

    def fragment(self, done: FragmentDone) -> None:
        chunks_done, frames_done = done.index + 1, done.frame_start + done.frames
        self._done = (chunks_done, frames_done)
        if self._terminal:
            self._draw(chunks_done, frames_done)
            return
        step = LOG_STEPS * chunks_done // self.chunks
        if step > self._logged_step:
            self._logged_step = step
            print(self._status(chunks_done, frames_done), file=self._out, flush=True)

    def finish(self, ok: bool) -> None:
        if self._terminal:
            print("" if ok else " failed", file=self._out, flush=True)
        elif not ok:
            print(f"failed at {self._status(*self._done)}", file=self._out, flush=True)

    def _draw(self, chunks_done: int, frames_done: int) -> None:
        filled = BAR_WIDTH * chunks_done // self.chunks
        bar = "#" * filled + "-" * (BAR_WIDTH - filled)
        print(
            f"\r[{bar}] {self._status(chunks_done, frames_done)}",
            end="",
            file=self._out,
            flush=True,
        )

    def _status(self, chunks_done: int, frames_done: int) -> str:
        elapsed = time.perf_counter() - self._since
        rate = frames_done / elapsed if elapsed > 0 else 0.0
        return (
            f"{chunks_done}/{self.chunks} chunks {frames_done}/{self.frames} frames {rate:5.1f} fps"
        )
