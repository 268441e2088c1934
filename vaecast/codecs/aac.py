"""AAC-LC encoding of a float waveform into fMP4-ready samples, through PyAV's native `aac`.

Two ways in. `encode_until`: the whole waveform is known before the decode starts
(it arrives with the latents), so audio is fed ahead of the video it belongs to:
each fragment carries every AAC frame that starts before the end of its video
chunk, and the encoder's lookahead never holds a chunk's audio back. `feed` and
`flush`: audio that arrives over time and a length known only at the end (a live
stream, see `live_audio`).

Delay (measured, PyAV 18.1): the packet of the AAC frame at sample k comes out
when the frame at k + 2048 is fed; a partial last frame comes out only at the flush.

Priming, trimmed: FFmpeg's encoder emits one priming frame first (pts -1024,
`initial_padding`), after which packet pts are exactly input sample positions. We
drop the priming packet and place each packet at its pts, so input sample 0
plays at media time 0 in every player. The alternative, signalling the priming
with an edit list, is honoured unevenly by MSE implementations. The price: the
first frame (1024 samples, 21 ms at 48 kHz) decodes without its overlap partner,
a faint fade-in over audio that is usually silent there anyway.

Length: the caller fixes the track length to the video's duration; a shorter
waveform is padded with silence, a longer one trimmed (`fit_to_length`), and the
last packet's duration is cut so both tracks end together.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import av
import numpy as np
from av.codec.context import Flags

from vaecast.codecs.fmp4 import Sample

AAC_FRAME_SAMPLES = 1024
MIN_SAMPLE_RATE_HZ = 16_000
MAX_SAMPLE_RATE_HZ = 48_000
MAX_CHANNELS = 2
# Per channel; AAC-LC at this rate is transparent for generated soundtracks.
BITRATE_PER_CHANNEL_BPS = 64_000
CODEC_STRING = "mp4a.40.2"  # MPEG-4 audio, object type 2: AAC-LC


@dataclass(frozen=True, slots=True)
class AudioSettings:
    sample_rate: int
    channels: int


def fit_to_length(waveform: np.ndarray, samples: int) -> np.ndarray:
    """Pad with silence or trim (channels, n) float audio to exactly `samples`."""
    have = waveform.shape[1]
    if have >= samples:
        return np.ascontiguousarray(waveform[:, :samples], dtype=np.float32)
    padded = np.zeros((waveform.shape[0], samples), dtype=np.float32)
    padded[:, :have] = waveform
    return padded


def samples_for_duration(seconds: Fraction, sample_rate: int) -> int:
    return round(seconds * sample_rate)


class AacEncoder:
    """One AAC-LC stream. Not thread-safe: one encoder per stream, one thread at a time."""

    def __init__(self, sample_rate: int, channels: int, total_samples: int | None = None) -> None:
        """`total_samples`: the track's length for `encode_until`; None for `feed`/`flush`."""
        if not MIN_SAMPLE_RATE_HZ <= sample_rate <= MAX_SAMPLE_RATE_HZ:
            raise ValueError(f"sample rate must be 16-48 kHz, got {sample_rate}")
        if channels not in (1, 2):
            raise ValueError(f"audio must be mono or stereo, got {channels} channels")
        self.sample_rate = sample_rate
        self.channels = channels
        self.total_samples = total_samples
        self._layout = "mono" if channels == 1 else "stereo"
        context = av.CodecContext.create("aac", "w")
        context.sample_rate = sample_rate
        context.layout = self._layout
        context.format = "fltp"
        context.bit_rate = BITRATE_PER_CHANNEL_BPS * channels
        context.time_base = Fraction(1, sample_rate)
        # AudioSpecificConfig in extradata at open(), for the esds of the init segment.
        context.flags |= Flags.global_header
        context.open()
        self._context: av.AudioCodecContext | None = context
        self.audio_specific_config = bytes(context.extradata or b"")
        self._fed = 0  # input samples given to the encoder
        # `feed`'s input past the last whole AAC frame, kept for the next call.
        self._pending = np.zeros((channels, 0), np.float32)
        self._emitted_until = 0  # media time (samples) covered by packets handed out
        self._flushed = False

    @property
    def timescale(self) -> int:
        return self.sample_rate

    def encode_until(self, waveform: np.ndarray, end_sample: int) -> list[Sample]:
        """Feed `waveform` (the whole track, (channels, total)) up to `end_sample`; return
        the packets that came out, priming dropped. At the end of the track, flush."""
        context = self._require_open()
        if self.total_samples is None:
            raise RuntimeError("encode_until needs total_samples; this encoder takes feed()")
        end_sample = min(end_sample, self.total_samples)
        packets: list[av.Packet] = []
        while self._fed + AAC_FRAME_SAMPLES <= end_sample:
            packets += context.encode(self._frame(waveform, self._fed, AAC_FRAME_SAMPLES))
            self._fed += AAC_FRAME_SAMPLES
        if end_sample == self.total_samples and not self._flushed:
            if self._fed < self.total_samples:
                tail = self.total_samples - self._fed
                packets += context.encode(self._frame(waveform, self._fed, tail))
                self._fed = self.total_samples
            packets += context.encode(None)
            self._flushed = True
        return self._samples(packets)

    def feed(self, waveform: np.ndarray) -> list[Sample]:
        """Append (channels, n) float32 samples after everything fed so far; encode each
        whole AAC frame now and keep the remainder (under one frame) for later. Returns
        the packets that came out: whole frames, ending two frames behind the input."""
        context = self._require_open()
        if self._flushed:
            raise RuntimeError("the AAC encoder was flushed")
        if self.total_samples is not None:
            raise RuntimeError("feed takes no total_samples; this encoder takes encode_until")
        pending = np.concatenate([self._pending, waveform], axis=1)
        whole = pending.shape[1] - pending.shape[1] % AAC_FRAME_SAMPLES
        packets: list[av.Packet] = []
        for start in range(0, whole, AAC_FRAME_SAMPLES):
            packets += context.encode(self._frame(pending, start, AAC_FRAME_SAMPLES, self._fed))
            self._fed += AAC_FRAME_SAMPLES
        self._pending = pending[:, whole:].copy()
        return self._samples(packets)

    def flush(self) -> list[Sample]:
        """End `feed`'s track where the input ends: encode the remainder, drain the codec.
        The last packet's duration is cut to the input's end; the caller trims further."""
        context = self._require_open()
        if self._flushed:
            raise RuntimeError("the AAC encoder was flushed")
        packets: list[av.Packet] = []
        if self._pending.shape[1]:
            tail = self._pending.shape[1]
            packets += context.encode(self._frame(self._pending, 0, tail, self._fed))
            self._fed += tail
            self._pending = self._pending[:, :0]
        packets += context.encode(None)
        self._flushed = True
        return self._samples(packets)

    def close(self) -> None:
        self._context = None

    def _frame(
        self, waveform: np.ndarray, start: int, count: int, pts: int | None = None
    ) -> av.AudioFrame:
        frame = av.AudioFrame.from_ndarray(
            np.ascontiguousarray(waveform[:, start : start + count], dtype=np.float32),
            format="fltp",
            layout=self._layout,
        )
        frame.sample_rate = self.sample_rate
        frame.pts = start if pts is None else pts
        return frame

    def _samples(self, packets: list[av.Packet]) -> list[Sample]:
        samples = []
        for packet in packets:
            if packet.pts is None or packet.pts < 0:
                continue  # the priming frame (see the module docstring)
            if packet.pts != self._emitted_until:
                raise RuntimeError(
                    f"AAC packet at {packet.pts}, expected {self._emitted_until}: a gap"
                )
            # The last packet ends where the track (or, fed, the input) ends, not a
            # whole frame later.
            end = self.total_samples if self.total_samples is not None else self._fed
            duration = min(AAC_FRAME_SAMPLES, end - packet.pts)
            if duration <= 0:
                continue  # flush padding entirely past the end of the track
            samples.append(Sample(bytes(packet), duration, is_sync=True))
            self._emitted_until += duration
        return samples

    def _require_open(self) -> av.AudioCodecContext:
        if self._context is None:
            raise RuntimeError("the AAC encoder is closed")
        return self._context
