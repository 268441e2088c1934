"""One stream encoder opened ahead of the job that will use it.

Opening a stream encoder (x264 and the init segment) costs a few ms of CPU. The pipeline
already opens it on the encode thread while the first chunk decodes, so it does not wait
for it; but on a machine whose cores the decode fills, that CPU still comes out of the
first chunk's decode. `SpareEncoders` is an `EncoderFactory` that keeps one encoder open
for the stream it was last asked for and opens the next one between jobs (`replenish`,
which the job manager runs on an encode thread after each job), so a job like the
previous one starts with its encoder ready (what it saves:
benchmarks/results/design_notes.md, "Encoders opened ahead").

A spare is only ever a fresh encoder, never a used one: an encoder cannot be reset
(x264's state, the fragments' sequence numbers), and opening one again is exactly the
cost this saves. Streams with a whole soundtrack are never served from a spare: their
init segment depends on the waveform's length. Live-audio streams (the demo's) are,
keyed on their audio format like video streams on their size, rate and settings.
"""

from __future__ import annotations

import threading
from fractions import Fraction
from typing import Any

from vaecast.codecs.aac import AudioSettings
from vaecast.codecs.h264 import EncoderSettings
from vaecast.codecs.stream import Soundtrack, VideoStreamEncoder
from vaecast.pipeline.run import EncoderFactory

# What makes two streams' encoders interchangeable before their first frame.
SpareKey = tuple[int, int, Fraction, EncoderSettings, AudioSettings | None]


class SpareEncoders:
    """An `EncoderFactory` with one encoder opened ahead. Thread-safe."""

    def __init__(self, open_encoder: EncoderFactory = VideoStreamEncoder) -> None:
        self._open = open_encoder
        self._lock = threading.Lock()
        self._spare: VideoStreamEncoder | None = None
        self._spare_key: SpareKey | None = None
        self._wanted: SpareKey | None = None  # the last stream a spare could serve
        self._closed = False
        self.handed_out = 0  # spares given to streams (metrics, tests)

    def __call__(
        self,
        width: int,
        height: int,
        fps: Fraction,
        settings: EncoderSettings = EncoderSettings(),  # noqa: B008 (frozen, immutable)
        soundtrack: Soundtrack | None = None,
        total_frames: int | None = None,
        *,
        audio: AudioSettings | None = None,
    ) -> VideoStreamEncoder:
        """An encoder for this stream: the spare if it was opened for one like it."""
        if soundtrack is not None:
            return self._open(width, height, fps, settings, soundtrack, total_frames)
        key: SpareKey = (width, height, Fraction(fps), settings, audio)
        with self._lock:
            self._wanted = key
            spare = self._spare if self._spare_key == key else None
            if spare is not None:
                self._spare = self._spare_key = None
                self.handed_out += 1
        if spare is None:
            return self._open(
                width, height, fps, settings, total_frames=total_frames, **_audio(audio)
            )
        # Silent whole videos carry their length; it changes nothing before a frame.
        spare.total_frames = total_frames
        return spare

    def replenish(self) -> None:
        """Open a spare for the last stream asked for, unless one is open already.

        Blocking (milliseconds): run it on an encode thread when no job needs it.
        A failure to open is left for the next job's own open to report.
        """
        with self._lock:
            key = self._wanted
            if self._closed or key is None or self._spare_key == key:
                return
        width, height, fps, settings, audio = key
        try:
            encoder = self._open(width, height, fps, settings, **_audio(audio))
        except Exception:  # the job that opens its own will say why
            return
        with self._lock:
            stale, self._spare, self._spare_key = self._spare, encoder, key
            if self._closed:
                stale, self._spare, self._spare_key = encoder, None, None
        if stale is not None:
            stale.close()

    @property
    def spare_key(self) -> SpareKey | None:
        """What the open spare was opened for (None: no spare)."""
        return self._spare_key

    def close(self) -> None:
        """Close the spare; later `replenish` calls open nothing."""
        with self._lock:
            self._closed = True
            spare, self._spare, self._spare_key = self._spare, None, None
        if spare is not None:
            spare.close()


def _audio(audio: AudioSettings | None) -> dict[str, Any]:
    return {} if audio is None else {"audio": audio}
