"""The audio of a live stream: a soundtrack that arrives block by block, for a video
whose length is known only when it ends. Pure: no I/O, no threads.

Timeline. The track is one run of samples from 0. `append` puts a block's audio
where the last call's ended, or at `at_sample` when the caller knows where it
belongs, in any order. Audio after a gap (a block whose audio has not come) waits,
as PCM, for the gap's audio until the video reaches it, or until the caller says no
more audio will come for it (`give_up_before`: a push session knows that once a later
block is in, since a block brings only audio from its own first frame on); then the
gap is given up and filled with silence, because holding due audio back for a block
that may never send any would leave the rest of the stream silent. At `finish` every
gap, and the end if the audio stops short of the video, is silence. Samples at
positions already filled (or given up) are dropped, not rewritten: their packets may
be out in fragments already.

What a fragment carries (`release_until(end)`): every AAC packet that
- exists: the encoder hands a frame's packet out only once the two frames after it
  were fed, and a partial frame only at the flush (see `aac`); so a fragment has every
  packet up to `end` once `audio_needed(end)` samples are in, and
- ends at or before `end`. A packet's duration can be cut only while nobody has it,
  and the video's final length (where the audio must end) is known only at `finish`;
  so a packet never crosses the shortest the video can still turn out to be.
`end` is the caller's: the video's end so far when the caller cannot tell whether more
video follows (the audio then ends up to one AAC frame short of the video), or, when
it knows more follows, `reach_past(video end, next frame's end)`: the AAC frame
boundary at or after the video's end, so the fragment's video has sound all through,
but never past the end of the next video frame (the shortest the video can then be).

A caller that encodes each chunk as soon as it has it gets a fragment whose audio ends
at min(end, whole AAC frames received - 2 frames), rounded down to a frame: with audio
in step with the video it lags by two to three AAC frames (43-64 ms at 48 kHz,
128-192 ms at 16 kHz), and `finish` carries the rest, cut so the track ends exactly
with the video. A caller that first waits for `audio_needed(end)` samples (the
pipeline does, for a push session: `vaecast.pipeline.run`) gets every fragment's audio
ending within one AAC frame of its video, and ends the track with its last chunk.
A lagging track never holds the video back here.

Memory: audio that arrives in order, even far ahead of its video, is encoded at
once, so what waits is compressed packets (about 16 kB per second of stereo) and
under one AAC frame of PCM; only audio after a gap waits as PCM. How far ahead a
caller may send audio, or how large a gap `at_sample` may open (a gap costs
encoding its silence), is the caller's limit.
"""

from __future__ import annotations

import dataclasses
from collections import deque

import numpy as np

from vaecast.codecs.aac import AAC_FRAME_SAMPLES, AacEncoder
from vaecast.codecs.fmp4 import Sample

# Silence is fed in pieces of this many samples, so a long gap never allocates its
# whole length at once.
_SILENCE_PIECE_SAMPLES = 64 * AAC_FRAME_SAMPLES
# The encoder hands a frame's packet out once the two frames after it were fed
# (measured, PyAV 18.1: see `aac`).
ENCODER_DELAY_SAMPLES = 2 * AAC_FRAME_SAMPLES


def audio_needed(end_sample: int) -> int:
    """The samples (whole from 0) that must be in for `release_until(end_sample)` to
    release every packet ending at or before `end_sample`."""
    return end_sample // AAC_FRAME_SAMPLES * AAC_FRAME_SAMPLES + ENCODER_DELAY_SAMPLES


def reach_past(video_end: int, next_frame_end: int) -> int:
    """How far a fragment's audio may reach when more video is known to follow: to the
    AAC frame boundary at or after `video_end`, so every video frame has its sound, and
    never past `next_frame_end` (where the next video frame ends: the shortest the video
    can still be), so no packet has to be cut after it went out. Where a video frame is
    shorter than an AAC frame, the packets that fit may then end short of `video_end`."""
    boundary = -(-video_end // AAC_FRAME_SAMPLES) * AAC_FRAME_SAMPLES
    return min(boundary, max(next_frame_end, video_end))


class LiveAudioTrack:
    """One live AAC track. Not thread-safe: one thread at a time, like the stream."""

    def __init__(self, sample_rate: int, channels: int) -> None:
        self._encoder = AacEncoder(sample_rate, channels)
        self.sample_rate = sample_rate
        self.channels = channels
        self.audio_specific_config = self._encoder.audio_specific_config
        self.received = 0  # the timeline is whole (fed to the encoder) up to here
        self.released = 0  # media time (samples) handed out for fragments
        self._held: deque[Sample] = deque()  # encoded, starting at `released`
        # Audio after a gap: (start, samples), sorted, disjoint, each past `received`.
        self._waiting: list[tuple[int, np.ndarray]] = []
        self._next_start = 0  # where audio without `at_sample` goes: after the last
        self._finished = False

    def check(self, samples: np.ndarray, at_sample: int | None = None) -> np.ndarray:
        """Raise ValueError unless `samples` is (channels, n) finite float audio and
        `at_sample` a position >= 0; return the samples as contiguous float32."""
        if not isinstance(samples, np.ndarray) or samples.ndim != 2:
            raise ValueError("audio must be a (channels, samples) numpy array")
        if samples.shape[0] != self.channels:
            raise ValueError(f"audio must have {self.channels} channels, got {samples.shape[0]}")
        if samples.dtype.kind != "f":
            raise ValueError(f"audio must be float samples in [-1, 1], got {samples.dtype}")
        if not np.isfinite(samples).all():
            raise ValueError("audio holds NaN or infinite samples")
        if at_sample is not None and (
            not isinstance(at_sample, int | np.integer)
            or isinstance(at_sample, bool)
            or at_sample < 0
        ):
            raise ValueError(f"at_sample must be a position >= 0, got {at_sample!r}")
        return np.ascontiguousarray(samples, dtype=np.float32)

    @property
    def waiting_samples(self) -> int:
        """Samples received after a gap, waiting for it."""
        return sum(part.shape[1] for _, part in self._waiting)

    def append(self, samples: np.ndarray, at_sample: int | None = None) -> int:
        """Add `check`ed audio at `at_sample` (default: where the last call's audio
        ended). Returns how many samples were taken: not those at positions filled."""
        if self._finished:
            raise RuntimeError("the live audio track is finished")
        start = self._next_start if at_sample is None else int(at_sample)
        self._next_start = start + samples.shape[1]
        taken = 0
        for begin, end in self._free_spans(start, start + samples.shape[1]):
            # A copy: the caller may reuse its buffer while this part waits.
            self._waiting.append((begin, samples[:, begin - start : end - start].copy()))
            taken += end - begin
        self._waiting.sort(key=lambda part: part[0])
        self._feed_waiting()
        return taken

    def give_up_before(self, end_sample: int) -> None:
        """No more audio will come for positions before `end_sample`: the gaps there,
        and the stretch from the audio received to it, are silence now, and the audio
        waiting after them is encoded."""
        if self._finished:
            raise RuntimeError("the live audio track is finished")
        self._give_up_gaps_before(end_sample)
        self._silence(end_sample - self.received)
        self._feed_waiting()

    def release_until(self, end_sample: int) -> list[Sample]:
        """The held packets that end at or before `end_sample` (the video's end so far,
        or `reach_past` it), after giving up the gaps before audio that it has reached."""
        self._give_up_gaps_before(end_sample)
        released = []
        while self._held and self.released + self._held[0].duration <= end_sample:
            sample = self._held.popleft()
            released.append(sample)
            self.released += sample.duration
        return released

    def finish(self, end_sample: int) -> list[Sample]:
        """End the track at `end_sample` (the video's duration): fill every gap and the
        end with silence, flush the encoder, return the packets left, cut at the end."""
        if self._finished:
            raise RuntimeError("the live audio track is finished")
        if end_sample < self.released:
            raise ValueError(f"the track already reaches {self.released}, past {end_sample}")
        self._finished = True
        # Waiting audio wholly past the end is dropped, not encoded.
        self._waiting = [part for part in self._waiting if part[0] < end_sample]
        self._give_up_gaps_before(end_sample)
        self._silence(end_sample - self.received)
        self._held.extend(self._encoder.flush())
        remaining = []
        for sample in self._held:
            room = end_sample - self.released
            if room <= 0:
                break  # audio received past the video's end
            if sample.duration > room:
                sample = dataclasses.replace(sample, duration=room)
            remaining.append(sample)
            self.released += sample.duration
        self._held.clear()
        return remaining

    def close(self) -> None:
        self._encoder.close()
        self._waiting.clear()

    def _give_up_gaps_before(self, end_sample: int) -> None:
        """Silence in each gap before waiting audio that starts before `end_sample`."""
        while self._waiting and self._waiting[0][0] < end_sample:
            self._silence(self._waiting[0][0] - self.received)
            self._feed_waiting()

    def _free_spans(self, start: int, end: int) -> list[tuple[int, int]]:
        """The parts of [start, end) neither fed nor waiting."""
        spans, cursor = [], max(start, self.received)
        for begin, part in self._waiting:
            if begin >= end:
                break
            if begin > cursor:
                spans.append((cursor, begin))
            cursor = max(cursor, begin + part.shape[1])
        if cursor < end:
            spans.append((cursor, end))
        return spans

    def _feed_waiting(self) -> None:
        """Encode the waiting audio that continues the whole timeline."""
        while self._waiting and self._waiting[0][0] == self.received:
            _, part = self._waiting.pop(0)
            self._held.extend(self._encoder.feed(part))
            self.received += part.shape[1]

    def _silence(self, count: int) -> None:
        piece = np.zeros((self.channels, min(max(count, 0), _SILENCE_PIECE_SAMPLES)), np.float32)
        while count > 0:
            step = min(count, piece.shape[1])
            self._held.extend(self._encoder.feed(piece[:, :step]))
            self.received += step
            count -= step
