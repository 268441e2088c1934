"""One stream: YUV 4:2:0 chunks (and optionally a soundtrack) in, an init segment and
one fMP4 fragment per chunk out.

Pure glue between `h264.H264Encoder`, `aac.AacEncoder` and `fmp4`: no I/O and no
threads. The caller (the server's job task) runs `encode_chunk` in an executor and
appends the bytes it returns to the stream's log; concatenating `init_segment` and
every returned fragment in order is a playable fragmented MP4 at every step. Each
fragment comes with its facts (`codecs.fragment`: duration, keyframe, each track's
ticks), so nothing downstream parses it back.

Two ways to open a stream with sound:
- Whole video (`soundtrack=`, `total_frames=`): the waveform and the length are known
  up front. Each fragment also carries the AAC frames that start before the end of
  its video chunk (audio is fed up to three AAC frames past the chunk's end, so the
  encoder's lookahead holds nothing back); the last chunk's fragment flushes the
  rest, and the audio track is exactly as long as the video (see `aac`).
- Live (`audio=AudioSettings(...)`): the soundtrack arrives over time through
  `append_audio`, between chunks, and the length is known only at the end. Each
  fragment carries the audio received so far that ends within its video, or, with
  `encode_chunk(last=False)` (more video follows), that reaches just past its video's
  end (see `live_audio` for how far each is). A caller that can tell the last chunk
  says so (`last=True`): its fragment carries the rest of the audio, the track fitted
  to end exactly with the video. Otherwise `finish` returns a last, audio-only
  fragment with the rest, fitted the same way. A caller that first waits until
  `live_audio_needed` samples are in (`audio_received`) gets each fragment's audio
  ending within one AAC frame of its video (`vaecast.pipeline.run` does, for a push
  session); `settle_audio` tells the track where no more audio will come, so that
  gaps there are silence at once rather than when the video reaches them.

Either way `finish()` ends the stream: the bytes it returns (possibly b"") are the
stream's last fragment.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from vaecast.codecs import fmp4
from vaecast.codecs.aac import (
    AAC_FRAME_SAMPLES,
    AacEncoder,
    AudioSettings,
    fit_to_length,
    samples_for_duration,
)
from vaecast.codecs.aac import CODEC_STRING as AAC_CODEC_STRING
from vaecast.codecs.colour import Yuv420Frames
from vaecast.codecs.fmp4 import Sample
from vaecast.codecs.fragment import Fragment, FragmentFacts
from vaecast.codecs.h264 import EncoderSettings, H264Encoder
from vaecast.codecs.live_audio import LiveAudioTrack, audio_needed, reach_past

VIDEO_TRACK_ID = 1
AUDIO_TRACK_ID = 2
# Audio fed past each chunk's end so that the fragment's audio reaches at least as far
# as its video: FFmpeg's AAC encoder hands a frame's packet out two frames later
# (measured, PyAV 18.1), plus the frame the chunk ends in.
AUDIO_LOOKAHEAD_SAMPLES = 3 * AAC_FRAME_SAMPLES


@dataclass(frozen=True, slots=True)
class Soundtrack:
    """A waveform to mux with the video: (channels, samples) float32 in [-1, 1]."""

    waveform: np.ndarray
    sample_rate: int

    @property
    def channels(self) -> int:
        return int(self.waveform.shape[0])


class VideoStreamEncoder:
    """Encodes one stream's chunks; one instance per stream, one thread at a time.

    After a codec raises inside `encode_chunk`, `append_audio` or `finish`, the encoders
    may hold data that no fragment will carry, so the stream refuses further calls (the
    caller ends the stream as failed) rather than emit a fragment with a gap. Input
    refused with ValueError changes nothing.

    Call order: `init_segment`, then `encode_chunk` per chunk (live audio: any number of
    `append_audio` and `settle_audio` calls between them), then `finish` once (after
    a chunk encoded with `last=True` too); `close` always.
    """

    def __init__(
        self,
        width: int,
        height: int,
        fps: Fraction,
        settings: EncoderSettings = EncoderSettings(),  # noqa: B008 (frozen, immutable)
        soundtrack: Soundtrack | None = None,
        total_frames: int | None = None,
        *,
        audio: AudioSettings | None = None,
    ) -> None:
        """`total_frames` (the whole video's length) is needed with a soundtrack, whose
        length is fitted to the video's duration. `audio` opens a live stream instead:
        that audio format, samples through `append_audio`, the length at `finish`."""
        if audio is not None and (soundtrack is not None or total_frames is not None):
            raise ValueError("live audio takes no soundtrack or total_frames: finish() ends it")
        self._encoder = H264Encoder(width, height, fps, settings)
        self.width, self.height, self.fps = width, height, self._encoder.fps
        self.timescale = self._encoder.timescale
        tracks: list[fmp4.Track] = [
            fmp4.VideoTrack(
                track_id=VIDEO_TRACK_ID,
                timescale=self.timescale,
                width=width,
                height=height,
                avcc=self._encoder.avcc,
            )
        ]
        codecs = [self._encoder.codec_string]
        self._audio: AacEncoder | None = None
        self._waveform: np.ndarray | None = None
        self._live: LiveAudioTrack | None = None
        self.total_frames = total_frames
        if soundtrack is not None:
            if total_frames is None:
                raise ValueError("a soundtrack needs total_frames, to fit it to the video")
            total_samples = samples_for_duration(total_frames / self.fps, soundtrack.sample_rate)
            self._waveform = fit_to_length(soundtrack.waveform, total_samples)
            self._audio = AacEncoder(soundtrack.sample_rate, soundtrack.channels, total_samples)
            tracks.append(
                fmp4.AudioTrack(
                    AUDIO_TRACK_ID,
                    soundtrack.sample_rate,
                    soundtrack.channels,
                    self._audio.audio_specific_config,
                )
            )
            codecs.append(AAC_CODEC_STRING)
        if audio is not None:
            self._live = LiveAudioTrack(audio.sample_rate, audio.channels)
            tracks.append(
                fmp4.AudioTrack(
                    AUDIO_TRACK_ID,
                    audio.sample_rate,
                    audio.channels,
                    self._live.audio_specific_config,
                )
            )
            codecs.append(AAC_CODEC_STRING)
        self.codec_string = ", ".join(codecs)
        self.content_type = f'video/mp4; codecs="{self.codec_string}"'
        self.init_segment = fmp4.init_segment(tracks)
        self.audio_decode_time = 0
        self.frames_encoded = 0
        self.fragments_written = 0
        # Decode time of the next fragment's first sample, in `timescale` ticks.
        self.decode_time = 0
        self._failed = False
        self._closed = False
        self.finished = False
        self.last_chunk_encoded = False  # `encode_chunk(last=True)` ended the video

    @property
    def sample_rate(self) -> int | None:
        """The audio track's sample rate; None without audio."""
        if self._live is not None:
            return self._live.sample_rate
        return self._audio.sample_rate if self._audio is not None else None

    @property
    def audio_received(self) -> int:
        """Live audio: samples on the track with nothing missing before them."""
        return self._live.received if self._live is not None else 0

    def audio_sample_at(self, frame_index: int) -> int:
        """The audio sample where video frame `frame_index` starts: `append_audio`'s
        `at_sample` for a block that starts there (the rounding `finish` uses). Pure:
        callable from any thread, while another encodes."""
        if self.sample_rate is None:
            raise RuntimeError("this stream has no audio track")
        return samples_for_duration(Fraction(frame_index) / self.fps, self.sample_rate)

    def live_audio_needed(self, frame_end: int, more_follows: bool) -> int:
        """Live audio: the samples `audio_received` must reach for the fragment of a chunk
        ending at video frame `frame_end` to carry every packet its `encode_chunk` may
        (`last=False` when `more_follows`, else `last=None`): audio within one AAC frame
        of the video's end. Pure: callable from any thread, while another encodes."""
        return audio_needed(self._live_audio_end(frame_end, more_follows))

    def _live_audio_end(self, frame_end: int, more_follows: bool) -> int:
        video_end = self.audio_sample_at(frame_end)
        if not more_follows:
            return video_end
        return reach_past(video_end, self.audio_sample_at(frame_end + 1))

    def _check_usable(self) -> None:
        if self._closed:
            raise RuntimeError("stream encoder is closed")
        if self._failed:
            raise RuntimeError("stream encoder failed earlier; the stream cannot continue")
        if self.finished:
            raise RuntimeError("stream is finished")

    def encode_chunk(
        self, frames: Yuv420Frames, last: bool | None = None, keyframe: bool = False
    ) -> Fragment:
        """`Yuv420Frames` of T >= 1 frames -> exactly one moof + mdat for these frames.

        `last` matters to live audio only: True, these are the video's last frames (the
        fragment carries the rest of the audio, fitted to end with them; `finish` then
        adds nothing); False, more frames will follow (the audio may reach just past
        these frames, see `live_audio.reach_past`); None, not known (the audio ends
        within these frames). A False that turns out wrong can leave `finish` unable
        to end the audio with the video: it raises ValueError then. `keyframe`: the
        fragment starts with one, whatever the interval (`H264Encoder.encode`)."""
        self._check_usable()
        self._check_video_open()
        # Bad input is refused before any frame reaches the codec; only a failure
        # inside the codec leaves it holding part of a chunk.
        self._encoder.check_frames(frames)
        if len(frames) == 0:
            raise ValueError("a chunk must hold at least one frame")
        try:
            samples = self._encoder.encode(frames, keyframe)
        except Exception:
            self._failed = True
            raise
        runs = [fmp4.TrackRun(VIDEO_TRACK_ID, self.decode_time, tuple(samples))]
        self.frames_encoded += len(samples)
        self.decode_time += sum(sample.duration for sample in samples)
        if self._audio is not None:
            audio_run = self._audio_run(self._encode_audio())
            if audio_run is not None:
                runs.append(audio_run)
        elif self._live is not None:
            audio_run = self._audio_run(self._live_chunk_audio(last))
            if audio_run is not None:
                runs.append(audio_run)
        self.last_chunk_encoded = bool(last)
        return self._fragment(runs)

    def _live_chunk_audio(self, last: bool | None) -> list[Sample]:
        assert self._live is not None
        try:
            if last:
                return self._live.finish(self.audio_sample_at(self.frames_encoded))
            end = self._live_audio_end(self.frames_encoded, more_follows=last is False)
            return self._live.release_until(end)
        except Exception:
            self._failed = True
            raise

    def append_audio(self, samples: np.ndarray, at_sample: int | None = None) -> int:
        """Add (channels, n) float32 audio to a live stream, between chunks: where the
        last call's audio ended, or at `at_sample` (see `audio_sample_at`), in any order.
        Audio after a gap waits for it until the video reaches that audio; then (or at
        `finish`) the gap is silence. Returns the samples taken: not those at positions
        already filled or given up."""
        self._check_usable()
        self._check_video_open()
        if self._live is None:
            raise RuntimeError("append_audio needs a stream opened with audio=AudioSettings")
        # Bad input is refused before the codec sees any of it.
        checked = self._live.check(samples, at_sample)
        try:
            return self._live.append(checked, at_sample)
        except Exception:
            self._failed = True
            raise

    def settle_audio(self, until_sample: int) -> None:
        """Live audio: no more will come for positions before `until_sample` (a caller
        that knows its audio arrives in order of position, block by block): the gaps
        there are silence now, so the chunks' fragments need not wait for them."""
        self._check_usable()
        self._check_video_open()
        if self._live is None:
            raise RuntimeError("settle_audio needs a stream opened with audio=AudioSettings")
        try:
            self._live.give_up_before(until_sample)
        except Exception:
            self._failed = True
            raise

    def finish(self) -> bytes:
        """End the stream after its last chunk: a last fragment with the audio left (live
        audio only, fitted to end with the video; audio-only), or b"" when none is (no
        live audio, or the last chunk was encoded with `last=True`)."""
        self._check_usable()
        self.finished = True
        if self._live is None or self.last_chunk_encoded:
            return b""  # flushed with the last chunk
        try:
            samples = self._live.finish(self.audio_sample_at(self.frames_encoded))
        except Exception:
            self._failed = True
            raise
        audio_run = self._audio_run(samples)
        return b"" if audio_run is None else self._fragment([audio_run])

    def _check_video_open(self) -> None:
        if self.last_chunk_encoded:
            raise RuntimeError("the stream's last chunk was encoded: only finish() is left")

    def _fragment(self, runs: list[fmp4.TrackRun]) -> Fragment:
        """The fragment of `runs`, with the facts its boxes state (`codecs.fragment`)."""
        data = fmp4.fragment(self.fragments_written + 1, runs)
        self.fragments_written += 1
        ticks = {run.track_id: sum(sample.duration for sample in run.samples) for run in runs}
        video = next((run for run in runs if run.track_id == VIDEO_TRACK_ID), None)
        if video is not None:
            duration_s = ticks[VIDEO_TRACK_ID] / self.timescale
            keyframe = video.samples[0].is_sync
        else:  # the sound after the last frame
            assert self.sample_rate is not None
            duration_s = ticks[AUDIO_TRACK_ID] / self.sample_rate
            keyframe = False
        return Fragment(data, FragmentFacts(duration_s, keyframe, tuple(ticks.items())))

    def _audio_run(self, samples: list[Sample]) -> fmp4.TrackRun | None:
        if not samples:
            return None
        run = fmp4.TrackRun(AUDIO_TRACK_ID, self.audio_decode_time, tuple(samples))
        self.audio_decode_time += sum(sample.duration for sample in samples)
        return run

    def _encode_audio(self) -> list[Sample]:
        assert self._audio is not None and self._waveform is not None
        video_end = samples_for_duration(
            Fraction(self.frames_encoded) / self.fps, self._audio.sample_rate
        )
        last_chunk = self.frames_encoded >= (self.total_frames or 0)
        end = self._audio.total_samples if last_chunk else video_end + AUDIO_LOOKAHEAD_SAMPLES
        try:
            return self._audio.encode_until(self._waveform, end)
        except Exception:
            self._failed = True
            raise

    def close(self) -> None:
        """Release the codec; safe to call twice."""
        self._closed = True
        self._encoder.close()
        if self._audio is not None:
            self._audio.close()
        if self._live is not None:
            self._live.close()
