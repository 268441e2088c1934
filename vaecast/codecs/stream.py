"""One video stream: RGB chunks in, an init segment and one fMP4 fragment per chunk out.

Pure glue between `h264.H264Encoder` and `fmp4`: no I/O and no threads. The caller
(the server's job task) runs `encode_chunk` in an executor and appends the bytes
it returns to the stream's log; concatenating `init_segment` and every returned
fragment in order is a playable fragmented MP4 at every step.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from vaecast.codecs import fmp4
from vaecast.codecs.h264 import EncoderSettings, H264Encoder

VIDEO_TRACK_ID = 1


class VideoStreamEncoder:
    """Encodes one stream's chunks; one instance per stream, one thread at a time.

    After `encode_chunk` raises, the encoder may hold frames of a chunk whose
    fragment was never written, so the stream refuses further chunks (the caller
    ends the stream as failed) rather than emit a fragment with a gap.
    """

    def __init__(
        self,
        width: int,
        height: int,
        fps: Fraction,
        settings: EncoderSettings = EncoderSettings(),  # noqa: B008 (frozen, immutable)
    ) -> None:
        self._encoder = H264Encoder(width, height, fps, settings)
        self.width, self.height, self.fps = width, height, self._encoder.fps
        self.timescale = self._encoder.timescale
        self.codec_string = self._encoder.codec_string
        self.content_type = f'video/mp4; codecs="{self.codec_string}"'
        self.init_segment = fmp4.init_segment(
            [
                fmp4.VideoTrack(
                    track_id=VIDEO_TRACK_ID,
                    timescale=self.timescale,
                    width=width,
                    height=height,
                    avcc=self._encoder.avcc,
                )
            ]
        )
        self.frames_encoded = 0
        self.fragments_written = 0
        # Decode time of the next fragment's first sample, in `timescale` ticks.
        self.decode_time = 0
        self._failed = False
        self._closed = False

    def encode_chunk(self, frames: np.ndarray) -> bytes:
        """(T, H, W, 3) uint8 RGB, T >= 1 -> exactly one moof + mdat for these frames."""
        if self._closed:
            raise RuntimeError("stream encoder is closed")
        if self._failed:
            raise RuntimeError("stream encoder failed earlier; the stream cannot continue")
        # Bad input is refused before any frame reaches the codec; only a failure
        # inside the codec leaves it holding part of a chunk.
        self._encoder.check_frames(frames)
        if len(frames) == 0:
            raise ValueError("a chunk must hold at least one frame")
        try:
            samples = self._encoder.encode(frames)
        except Exception:
            self._failed = True
            raise
        run = fmp4.TrackRun(VIDEO_TRACK_ID, self.decode_time, tuple(samples))
        data = fmp4.fragment(self.fragments_written + 1, [run])
        self.fragments_written += 1
        self.frames_encoded += len(samples)
        self.decode_time += sum(sample.duration for sample in samples)
        return data

    def close(self) -> None:
        """Release the codec; safe to call twice."""
        self._closed = True
        self._encoder.close()
