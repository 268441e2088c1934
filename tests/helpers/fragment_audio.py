"""Where each fragment's video and audio start and end, read from its `tfdt`/`trun` boxes.

Both tracks' times in audio samples, so that a fragment's audio can be held against
its video: the video's ticks are converted with the rounding `VideoStreamEncoder`
uses to place audio (`samples_for_duration`).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from tests.helpers import split_stream
from vaecast.codecs.aac import AAC_FRAME_SAMPLES
from vaecast.codecs.fmp4 import AudioTrack, VideoTrack
from vaecast.codecs.fmp4_reader import parse_fragment, parse_init_segment


@dataclass(frozen=True, slots=True)
class Span:
    """One fragment's runs: [start, end) in audio samples; None where it has no run."""

    video: tuple[int, int] | None
    audio: tuple[int, int] | None
    video_frames: int


@dataclass(frozen=True, slots=True)
class Timeline:
    sample_rate: int
    spans: list[Span]


def timeline(data: bytes) -> Timeline:
    """Every fragment's spans, each run checked to start where its track's last ended."""
    init, fragments = split_stream(data)
    tracks = parse_init_segment(init).tracks
    (video,) = [t for t in tracks if isinstance(t, VideoTrack)]
    (audio,) = [t for t in tracks if isinstance(t, AudioTrack)]
    rate = audio.sample_rate

    def to_samples(ticks: int) -> int:
        return round(Fraction(ticks, video.timescale) * rate)

    ends = {video.track_id: 0, audio.track_id: 0}
    spans = []
    for number, fragment in enumerate(fragments, start=1):
        parsed = parse_fragment(fragment)
        assert parsed.sequence_number == number
        runs = {run.track_id: run for run in parsed.runs}
        assert set(runs) <= set(ends) and len(runs) == len(parsed.runs)
        for run in parsed.runs:
            assert run.base_media_decode_time == ends[run.track_id], (
                f"fragment {number}: track {run.track_id} starts at "
                f"{run.base_media_decode_time}, its previous run ended at {ends[run.track_id]}"
            )
            ends[run.track_id] += run.duration
        v, a = runs.get(video.track_id), runs.get(audio.track_id)
        spans.append(
            Span(
                video=None
                if v is None
                else (
                    to_samples(v.base_media_decode_time),
                    to_samples(v.base_media_decode_time + v.duration),
                ),
                audio=None if a is None else (a.base_media_decode_time, ends[audio.track_id]),
                video_frames=0 if v is None else len(v.sample_sizes),
            )
        )
    return Timeline(rate, spans)


def assert_aligned(data: bytes, without_audio: frozenset[int] = frozenset()) -> Timeline:
    """Every fragment has a video run and (but for the indexes in `without_audio`) an
    audio run, which starts where the previous one ended and ends within one AAC frame
    of the fragment's video end; the last ends exactly with the video."""
    line = timeline(data)
    assert line.spans, "no fragments"
    for index, span in enumerate(line.spans):
        assert span.video is not None, f"fragment {index + 1} is audio-only: {span}"
        if index in without_audio:
            assert span.audio is None, f"fragment {index + 1} has audio: {span}"
            continue
        assert span.audio is not None, f"fragment {index + 1} has no audio: {span}"
        gap = span.audio[1] - span.video[1]
        assert abs(gap) < AAC_FRAME_SAMPLES, (
            f"fragment {index + 1}: audio ends {gap:+d} samples from its video's end ({span})"
        )
    last = line.spans[-1]
    assert last.audio is not None and last.video is not None
    assert last.audio[1] == last.video[1], f"the audio does not end with the video: {last}"
    return line
