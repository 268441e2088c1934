"""The preview's priority over the final on one device (`vaecast.pipeline.preview_first`), on
real threads: the final waits while the preview works, goes once it waits for a block
or has ended, and a cancel ends its wait at once."""

from __future__ import annotations

import threading
import time

import pytest

from vaecast.errors import DecodeCancelled
from vaecast.pipeline.preview_first import FinalSide, PreviewFirst, PreviewSide

WAIT_S = 5.0


class Recorder:
    """A latent source that reports each decode to a shared log, and can hold."""

    def __init__(self, name: str, log: list[str], chunks: int, hold: threading.Event | None = None):
        self.name, self.log, self.chunks, self.hold = name, log, chunks, hold
        self.cancelled = threading.Event()
        self.waiting = None  # set by PreviewSide, as on a FeedTap

    def decode(self, decoder, on_chunk) -> None:
        for index in range(self.chunks):
            if self.hold is not None and index == 1:
                if self.waiting is not None:
                    self.waiting(True)  # as a tap waiting for its next block
                assert self.hold.wait(WAIT_S)
                if self.waiting is not None:
                    self.waiting(False)
            time.sleep(0.01)
            self.log.append(f"{self.name}{index}")
            on_chunk(index)

    def cancel(self) -> None:
        self.cancelled.set()

    def take_audio(self) -> list:
        return []


def run(target, *args) -> threading.Thread:
    thread = threading.Thread(target=target, args=args, daemon=True)
    thread.start()
    return thread


def test_the_final_decodes_once_the_preview_has_ended():
    log: list[str] = []
    gate = PreviewFirst()
    preview = PreviewSide(Recorder("p", log, 3), gate)
    final = FinalSide(Recorder("f", log, 2), gate)
    threads = [run(preview.decode, None, lambda _: None)]
    time.sleep(0.005)  # the preview is working
    threads.append(run(final.decode, None, lambda _: None))
    for thread in threads:
        thread.join(WAIT_S)
    assert log == ["p0", "p1", "p2", "f0", "f1"]


def test_the_final_goes_while_the_preview_waits_for_a_block_and_yields_after_it():
    log: list[str] = []
    gate, block = PreviewFirst(), threading.Event()
    preview = PreviewSide(Recorder("p", log, 3, hold=block), gate)
    final = FinalSide(Recorder("f", log, 3), gate)
    threads = [run(preview.decode, None, lambda _: None)]
    time.sleep(0.005)

    def on_final_chunk(chunk: int) -> None:
        if chunk == 0:  # the preview's next block comes while the final's chunk goes out
            block.set()
            time.sleep(0.05)

    threads.append(run(final.decode, None, on_final_chunk))
    for thread in threads:
        thread.join(WAIT_S)
    # The final's first chunk while the preview waited; the preview's next block (which
    # came meanwhile) before the final's next chunk.
    assert log[:2] == ["p0", "f0"] and log.index("p2") < log.index("f1")


def test_a_cancel_ends_the_finals_wait_at_once():
    gate = PreviewFirst()
    gate.preview_working(True)  # and never idle again
    final = FinalSide(Recorder("f", [], 1), gate)
    failed: list[BaseException] = []

    def decode() -> None:
        try:
            final.decode(None, lambda _: None)
        except DecodeCancelled as error:
            failed.append(error)

    thread = run(decode)
    time.sleep(0.1)
    started = time.perf_counter()
    final.cancel()
    thread.join(WAIT_S)
    assert failed and time.perf_counter() - started < 1.0


def test_a_preview_that_raises_lets_the_final_go():
    gate = PreviewFirst()

    class Broken(Recorder):
        def decode(self, decoder, on_chunk) -> None:
            raise RuntimeError("the preview decoder failed")

    with pytest.raises(RuntimeError):
        PreviewSide(Broken("p", [], 1), gate).decode(None, lambda _: None)
    log: list[str] = []
    FinalSide(Recorder("f", log, 1), gate).decode(None, lambda _: None)
    assert log == ["f0"]
