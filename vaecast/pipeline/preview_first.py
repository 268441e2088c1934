"""A preview decode before the final one, chunk by chunk, when both share a device.

A job with a preview decoder (`"preview": "taehv"`) decodes its latents twice: with
the fast preview decoder, whose first fragment a viewer should see at that decoder's
own time to first fragment, and with the model's full decoder, the final. On one
device the two would share its cores (or its GPU) and the preview's first fragment
would come late. So the final yields: before its first chunk and after each one, its
decode thread waits while the preview has work (`PreviewFirst`). The preview is
idle only while it waits for latents (a push session's next block) or once it has
ended, so an upload's final starts when its preview is done, and a push session's
final decodes each block after the preview has.

The two sides are latent-source wrappers, so `run_pipeline` runs each rendition
unchanged: `PreviewSide` marks the preview working while it decodes (a `FeedTap`
tells it when it waits for a block), and `FinalSide` waits for its turn. Both are
for the decode threads; `FinalSide.cancel` (any thread) ends a wait at once.
"""

from __future__ import annotations

import threading

from vaecast.errors import DecodeCancelled
from vaecast.models.base import ChunkCallback, ChunkedDecoder, DecodedChunk
from vaecast.pipeline.interfaces import FeedState, LatentSource, TimedAudio

# How often a final waiting for its turn looks at its cancel flag.
TURN_POLL_S = 0.05


class PreviewFirst:
    """Whether the preview has work right now; the final waits while it has. It starts
    working: the final's thread may start before the preview's, and must not take
    the device first. The preview side sets it idle when it waits, ends or is
    cancelled (also one that never ran)."""

    def __init__(self) -> None:
        self._idle = threading.Event()

    def preview_working(self, working: bool) -> None:
        if working:
            self._idle.clear()
        else:
            self._idle.set()

    def final_turn(self, stop: threading.Event) -> None:
        """On the final's decode thread: return once the preview is idle; raises
        DecodeCancelled when `stop` is set first."""
        while not self._idle.wait(TURN_POLL_S):
            if stop.is_set():
                raise DecodeCancelled("decode cancelled")
        if stop.is_set():
            raise DecodeCancelled("decode cancelled")


class _Wrapped:
    """A latent source around another: its audio and (a push session's) feed state
    are the wrapped one's; the sides change only how it decodes and is cancelled."""

    def __init__(self, source: LatentSource, gate: PreviewFirst) -> None:
        self._source = source
        self._gate = gate

    def take_audio(self) -> list[TimedAudio]:
        return self._source.take_audio()

    def feed_state(self) -> FeedState:
        return self._source.feed_state()  # type: ignore[attr-defined]  # a LiveSource's

    async def feed_changed(self, version: int) -> None:
        await self._source.feed_changed(version)  # type: ignore[attr-defined]


class PreviewSide(_Wrapped):
    """The preview's source: working for `gate` from the start of its decode to its
    end, except while it waits for a block (when the source can say so: `waiting`)."""

    def __init__(self, source: LatentSource, gate: PreviewFirst) -> None:
        super().__init__(source, gate)
        if hasattr(source, "waiting"):  # a FeedTap: idle while it waits for a block
            source.waiting = lambda waiting: gate.preview_working(not waiting)

    def decode(self, decoder: ChunkedDecoder, on_chunk: ChunkCallback) -> None:
        self._gate.preview_working(True)
        try:
            self._source.decode(decoder, on_chunk)
        finally:
            self._gate.preview_working(False)

    def cancel(self) -> None:
        self._source.cancel()
        self._gate.preview_working(False)  # a preview that never decoded holds nothing


class FinalSide(_Wrapped):
    """The final's source: it takes its turn (`PreviewFirst.final_turn`) before its
    first chunk and after each."""

    def __init__(self, source: LatentSource, gate: PreviewFirst) -> None:
        super().__init__(source, gate)
        self._stop = threading.Event()

    def decode(self, decoder: ChunkedDecoder, on_chunk: ChunkCallback) -> None:
        def each(chunk: DecodedChunk) -> None:
            on_chunk(chunk)
            self._gate.final_turn(self._stop)

        self._gate.final_turn(self._stop)
        self._source.decode(decoder, each)

    def cancel(self) -> None:
        self._stop.set()
        self._source.cancel()
