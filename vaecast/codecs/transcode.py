"""The two encodes a job's WebRTC viewers may share: VP8 video and Opus audio. No I/O.

A WebRTC peer that cannot take the job's H.264 as it is (no H.264 in its offer, or
not the profile the job was encoded in) gets VP8, and every peer gets its audio as
Opus, the one audio codec browsers all decode. Both are made from the job's own
access units (`access_units.py`), once per job however many viewers share them:
aiortc would otherwise encode per viewer. Each transcoder is synchronous, for one
thread at a time, and keeps timestamps in the source's time: a VP8 frame has its
H.264 frame's pts, an Opus frame the pts its first sample had in the AAC.

VP8 keyframes fall exactly where the H.264 ones do (and nowhere else), so a viewer
joining at a keyframe joins both streams at the same picture.
"""

from __future__ import annotations

from fractions import Fraction

import av
from av.audio.resampler import AudioResampler
from av.video.frame import PictureType

from vaecast.codecs.access_units import AccessUnit

OPUS_RATE = 48_000
OPUS_FRAME_SAMPLES = 960  # 20 ms: what WebRTC peers expect
OPUS_BIT_RATE = 96_000
# VP8 bits per pixel per frame: ~1.6 Mbit/s at 832x480 and 16 fps, close to what the
# H.264 at its default quantizer spends on the same scenes.
VP8_BITS_PER_PIXEL = 0.25
VP8_MIN_BIT_RATE = 300_000


class Vp8Transcoder:
    """H.264 access units in (Annex B, parameter sets before keyframes), VP8 out."""

    def __init__(self, width: int, height: int, fps: float, timescale: int) -> None:
        self._decoder = av.CodecContext.create("h264", "r")
        encoder = av.CodecContext.create("libvpx", "w")
        encoder.width, encoder.height = width, height
        encoder.pix_fmt = "yuv420p"
        encoder.time_base = Fraction(1, timescale)
        encoder.bit_rate = max(VP8_MIN_BIT_RATE, int(width * height * fps * VP8_BITS_PER_PIXEL))
        # Realtime: no lookahead (a frame in, its packet out), the fastest speed, and
        # keyframes only where this code asks for them.
        encoder.gop_size = 1 << 30
        encoder.options = {
            "deadline": "realtime",
            "cpu-used": "8",
            "lag-in-frames": "0",
            "auto-alt-ref": "0",
            "error-resilient": "1",
        }
        encoder.thread_count = 1
        self._encoder = encoder
        self._time_base = Fraction(1, timescale)

    def transcode(self, unit: AccessUnit) -> list[AccessUnit]:
        out = []
        for frame in self._decoder.decode(av.Packet(unit.data)):
            frame.pts = unit.pts
            frame.time_base = self._time_base
            frame.pict_type = PictureType.I if unit.keyframe else PictureType.NONE
            for packet in self._encoder.encode(frame):
                out.append(AccessUnit(unit.pts, unit.duration, packet.is_keyframe, bytes(packet)))
        return out


class OpusTranscoder:
    """Raw AAC frames in, 20 ms Opus frames out (48 kHz stereo, pts in 1/48000 s)."""

    def __init__(self, audio_specific_config: bytes, sample_rate: int) -> None:
        decoder = av.CodecContext.create("aac", "r")
        decoder.extradata = audio_specific_config
        self._decoder = decoder
        self._sample_rate = sample_rate
        self._resampler = AudioResampler(format="s16", layout="stereo", rate=OPUS_RATE)
        encoder = av.CodecContext.create("libopus", "w")
        encoder.sample_rate = OPUS_RATE
        encoder.layout = "stereo"
        encoder.format = "s16"
        encoder.time_base = Fraction(1, OPUS_RATE)
        encoder.bit_rate = OPUS_BIT_RATE
        encoder.options = {"application": "audio", "frame_duration": "20"}
        self._encoder = encoder
        self._fifo = av.AudioFifo()
        # In 1/48000 s: of the next frame into the encoder, and of its next packet out.
        # Packets are stamped in order from the first frame's pts: libopus's own pts
        # would start its 6.5 ms of pre-skip early, before the source's first sample.
        self._next_pts: int | None = None
        self._next_packet_pts = 0

    @property
    def time_base(self) -> Fraction:
        return Fraction(1, OPUS_RATE)

    def transcode(self, unit: AccessUnit) -> list[AccessUnit]:
        if self._next_pts is None:
            self._next_pts = self._next_packet_pts = unit.pts * OPUS_RATE // self._sample_rate
        out = []
        for frame in self._decoder.decode(av.Packet(unit.data)):
            frame.pts = None
            for resampled in self._resampler.resample(frame):
                resampled.pts = None
                self._fifo.write(resampled)
        while self._fifo.samples >= OPUS_FRAME_SAMPLES:
            frame = self._fifo.read(OPUS_FRAME_SAMPLES)
            frame.pts = self._next_pts
            frame.time_base = self.time_base
            self._next_pts += OPUS_FRAME_SAMPLES
            for packet in self._encoder.encode(frame):
                out.append(
                    AccessUnit(self._next_packet_pts, OPUS_FRAME_SAMPLES, True, bytes(packet))
                )
                self._next_packet_pts += OPUS_FRAME_SAMPLES
        return out
