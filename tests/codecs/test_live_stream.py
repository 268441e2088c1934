"""A live stream: audio that arrives block by block, a length known only at `finish`."""

from __future__ import annotations

import io
import itertools
from dataclasses import dataclass, field
from fractions import Fraction

import av
import numpy as np
import pytest

from tests.helpers.media import gradient_yuv
from vaecast.codecs import fmp4, fmp4_reader
from vaecast.codecs.aac import AacEncoder, AudioSettings, fit_to_length, samples_for_duration
from vaecast.codecs.h264 import H264Encoder
from vaecast.codecs.stream import AUDIO_TRACK_ID, VIDEO_TRACK_ID, Soundtrack, VideoStreamEncoder

FPS = Fraction(16)
CHUNKS = (1, 4, 4, 4, 4, 4, 4, 4, 4)  # 33 frames, as a causal VAE publishes them
FRAMES = sum(CHUNKS)
AAC_FRAME = 1024
# The encoder hands a frame's packet out two frames after it was fed (see `aac`).
AAC_DELAY = 2 * AAC_FRAME


def clicks(frames_with_click: list[int], sample_rate: int, channels: int = 2) -> np.ndarray:
    """A quiet hum (so silence fill is told apart) with a loud burst at each listed frame."""
    samples = samples_for_duration(FRAMES / FPS, sample_rate)
    t = np.arange(samples) / sample_rate
    wave = np.tile(0.02 * np.sin(2 * np.pi * 220 * t), (channels, 1)).astype(np.float32)
    for frame in frames_with_click:
        start = samples_for_duration(frame / FPS, sample_rate)
        wave[:, start : start + 64] = 0.9
    return wave


@dataclass
class LiveRun:
    init: bytes
    chunk_fragments: list[bytes] = field(default_factory=list)
    # Audio samples on the stream's timeline when each chunk's fragment was written.
    received: list[int] = field(default_factory=list)
    last: bytes = b""

    @property
    def data(self) -> bytes:
        return self.init + b"".join(self.chunk_fragments) + self.last


def live_stream(
    waveform: np.ndarray | None,
    block_frames: int,
    sample_rate: int = 48_000,
    missing: tuple[int, ...] = (),
    late: dict[int, int] | None = None,
    positioned: bool = True,
) -> LiveRun:
    """Push FRAMES frames in blocks of `block_frames`, each block's audio (its span of
    `waveform`) arriving with it, after chunk `late[block]` was encoded, or never
    (`missing`). The video is encoded in CHUNKS, as the decoder publishes it."""
    audio = None if waveform is None else AudioSettings(sample_rate, waveform.shape[0])
    encoder = VideoStreamEncoder(64, 48, FPS, audio=audio)
    run, frames = LiveRun(encoder.init_segment), gradient_yuv(FRAMES)
    start, pushed, late = 0, 0, late or {}

    def deliver(block: int) -> None:
        assert waveform is not None
        first = encoder.audio_sample_at(block * block_frames)
        last = encoder.audio_sample_at(min((block + 1) * block_frames, FRAMES))
        if (block + 1) * block_frames >= FRAMES:
            last = waveform.shape[1]  # the last block carries whatever audio remains
        at = first if positioned else None
        encoder.append_audio(waveform[:, first:last], at_sample=at)

    try:
        for index, count in enumerate(CHUNKS):
            while pushed * block_frames < start + count:  # the block holding this chunk came
                if waveform is not None and pushed not in missing and pushed not in late:
                    deliver(pushed)
                pushed += 1
            run.chunk_fragments.append(encoder.encode_chunk(frames[start : start + count]))
            run.received.append(encoder.audio_received)
            start += count
            for block in [b for b, after in late.items() if after == index]:
                deliver(block)
        run.last = encoder.finish()
    finally:
        encoder.close()
    return run


def check_live(run: LiveRun, sample_rate: int, has_audio: bool = True) -> None:
    """Sequence numbers, tfdt continuity per track, where each fragment's audio may end,
    and the exact track lengths at the end."""
    position = {VIDEO_TRACK_ID: 0, AUDIO_TRACK_ID: 0}
    video_frames = 0
    fragments = run.chunk_fragments + ([run.last] if run.last else [])
    for number, data in enumerate(fragments, start=1):
        parsed = fmp4_reader.parse_fragment(data)
        assert parsed.sequence_number == number
        for traf in parsed.runs:
            assert traf.base_media_decode_time == position[traf.track_id]
            position[traf.track_id] += traf.duration
        if number > len(CHUNKS):  # finish's fragment: audio only
            assert [traf.track_id for traf in parsed.runs] == [AUDIO_TRACK_ID]
            continue
        video_frames += CHUNKS[number - 1]
        assert parsed.runs[0].track_id == VIDEO_TRACK_ID
        assert len(parsed.runs[0].sample_sizes) == CHUNKS[number - 1]
        video_end = samples_for_duration(video_frames / FPS, sample_rate)
        audio_end, received = position[AUDIO_TRACK_ID], run.received[number - 1]
        # Never past the video or the audio that exists; behind by no more than the
        # encoder's delay, or a part of one AAC frame where the video ends.
        assert audio_end <= min(video_end, received)
        emitted = received // AAC_FRAME * AAC_FRAME - AAC_DELAY
        assert audio_end >= min(video_end - (AAC_FRAME - 1), emitted)
    assert video_frames == FRAMES
    expected = samples_for_duration(FRAMES / FPS, sample_rate) if has_audio else 0
    assert position[AUDIO_TRACK_ID] == expected
    assert position[VIDEO_TRACK_ID] == FRAMES * 1000


def decode(data: bytes) -> tuple[int, np.ndarray | None, int]:
    """(video frames, first channel of the audio, sample rate) as FFmpeg decodes them."""
    with av.open(io.BytesIO(data)) as container:
        video = sum(1 for _ in container.decode(video=0))
    with av.open(io.BytesIO(data)) as container:
        if not container.streams.audio:
            return video, None, 0
        frames = list(container.decode(audio=0))
    audio = np.concatenate([f.to_ndarray().reshape(f.layout.nb_channels, -1)[0] for f in frames])
    assert frames[0].time == 0.0
    return video, audio, frames[0].sample_rate


def heard_at(audio: np.ndarray, rate: int) -> list[float]:
    """Video frame times at which bursts start."""
    loud = np.abs(audio) > 0.3
    onsets = [i for i in np.flatnonzero(loud) if i == 0 or not loud[i - 1]]
    return sorted({round(i / rate * float(FPS), 2) for i in onsets})


def assert_decodes(run: LiveRun, rate: int) -> np.ndarray:
    video, audio, decoded_rate = decode(run.data)
    assert video == FRAMES
    assert audio is not None and decoded_rate == rate
    assert abs(len(audio) / rate - FRAMES / float(FPS)) <= AAC_FRAME / rate
    return audio


@pytest.mark.parametrize(
    ("block_frames", "sample_rate", "channels"),
    [(1, 48_000, 2), (4, 16_000, 1), (5, 44_100, 2), (8, 48_000, 1), (FRAMES, 48_000, 2)],
)
def test_audio_delivered_per_block_is_muxed_as_it_comes(block_frames, sample_rate, channels):
    click_frames = [5, 17, 30]
    wave = clicks(click_frames, sample_rate, channels)
    run = live_stream(wave, block_frames, sample_rate, positioned=block_frames % 2 == 0)
    check_live(run, sample_rate)
    heard = heard_at(assert_decodes(run, sample_rate), sample_rate)
    assert len(heard) == len(click_frames)
    for frame, when in zip(click_frames, heard, strict=True):
        assert abs(when - frame) < 1.0, (frame, when)


def test_audio_ahead_reaches_each_fragment_s_video_end():
    # The whole soundtrack (longer than the video, so the encoder's delay lies past its
    # end) with the first block: only the cut at the video's end lags.
    run = live_stream(np.concatenate([clicks([], 48_000)] * 2, axis=1), FRAMES)
    check_live(run, 48_000)
    ends = [0]
    for data in run.chunk_fragments:
        runs = {r.track_id: r for r in fmp4_reader.parse_fragment(data).runs}
        ends.append(ends[-1] + (runs[AUDIO_TRACK_ID].duration if AUDIO_TRACK_ID in runs else 0))
    video_ends = np.cumsum(CHUNKS) * 3000  # 48 kHz / 16 fps
    assert all(v - AAC_FRAME < a <= v for a, v in zip(ends[1:], video_ends, strict=True))


def test_longer_audio_is_trimmed_to_the_video():
    wave = np.concatenate([clicks([], 16_000, 1)] * 2, axis=1)
    run = live_stream(wave, 4, 16_000)
    check_live(run, 16_000)
    assert_decodes(run, 16_000)


@pytest.mark.parametrize(
    ("missing", "late", "silent_blocks"),
    [
        # Blocks of 8 frames: block 1 is frames 8-15, block 3 frames 24-31; chunk 2
        # is frames 5-8, chunk 4 frames 13-16, chunk 6 frames 21-24.
        ((1,), {}, {1}),  # never: given up when block 2's audio is due
        ((3,), {1: 2}, {3}),  # block 1 after chunk 2 (its first video), still in time
        ((), {0: 1, 2: 5}, set()),  # two blocks a chunk late: they lag, nothing lost
        ((), {0: 3}, {0}),  # after block 1's audio was due: given up, dropped
    ],
)
def test_missing_or_late_audio_lags_without_stalling_the_video(missing, late, silent_blocks):
    rate, click_frames = 48_000, [5, 12, 20, 27, 32]
    run = live_stream(clicks(click_frames, rate), 8, rate, missing=missing, late=late)
    check_live(run, rate)
    audio = assert_decodes(run, rate)
    expected = [f for f in click_frames if f // 8 not in silent_blocks]
    heard = heard_at(audio, rate)
    assert len(heard) == len(expected)
    for frame, when in zip(expected, heard, strict=True):
        assert abs(when - frame) < 1.0, (frame, when)
    for block in silent_blocks:  # filled with silence, not the hum
        span = audio[block * 8 * 3000 + AAC_FRAME : (block + 1) * 8 * 3000 - AAC_FRAME]
        assert np.abs(span).max() < 0.005


def test_audio_after_a_gap_waits_for_it_until_due():
    # Blocks' audio in reverse order, all before any video: each waits for the one
    # before it, none is given up, and every click is heard in its place.
    rate, click_frames = 16_000, [2, 9, 18, 29]
    wave = clicks(click_frames, rate, 1)
    encoder = VideoStreamEncoder(64, 48, FPS, audio=AudioSettings(rate, 1))
    try:
        bounds = [encoder.audio_sample_at(f) for f in (0, 8, 16, 24)] + [wave.shape[1]]
        for first, last in reversed(list(itertools.pairwise(bounds))):
            assert encoder.append_audio(wave[:, first:last], at_sample=first) == last - first
            assert encoder.audio_received == (wave.shape[1] if first == 0 else 0)
        run, frames, start = LiveRun(encoder.init_segment), gradient_yuv(FRAMES), 0
        for count in CHUNKS:
            run.chunk_fragments.append(encoder.encode_chunk(frames[start : start + count]))
            run.received.append(encoder.audio_received)
            start += count
        run.last = encoder.finish()
    finally:
        encoder.close()
    check_live(run, rate)
    heard = heard_at(assert_decodes(run, rate), rate)
    assert len(heard) == len(click_frames)
    for frame, when in zip(click_frames, heard, strict=True):
        assert abs(when - frame) < 1.0, (frame, when)


def test_audio_that_never_comes_is_silence_in_the_last_fragment():
    run = live_stream(np.zeros((2, 0), np.float32), FRAMES, missing=(0,))
    assert not any(len(fmp4_reader.parse_fragment(data).runs) > 1 for data in run.chunk_fragments)
    check_live(run, 48_000)
    assert np.abs(assert_decodes(run, 48_000)).max() < 0.005


def test_without_audio_finish_returns_nothing_and_the_stream_ends():
    run = live_stream(None, 4)
    assert run.last == b""
    check_live(run, 48_000, has_audio=False)
    assert decode(run.data)[:2] == (FRAMES, None)
    encoder = VideoStreamEncoder(64, 48, FPS)
    try:
        assert encoder.finish() == b""  # no frames at all
        with pytest.raises(RuntimeError, match="finished"):
            encoder.encode_chunk(gradient_yuv(1))
        with pytest.raises(RuntimeError, match="finished"):
            encoder.finish()
    finally:
        encoder.close()


def test_no_frames_and_no_audio_left_finish_with_nothing():
    encoder = VideoStreamEncoder(64, 48, FPS, audio=AudioSettings(48_000, 2))
    try:
        encoder.append_audio(np.zeros((2, 5000), np.float32))
        assert encoder.finish() == b""  # the video is 0 s long: the audio is trimmed away
    finally:
        encoder.close()


def test_positions_already_filled_are_not_taken_again():
    encoder = VideoStreamEncoder(64, 48, FPS, audio=AudioSettings(16_000, 1))
    try:
        assert encoder.audio_sample_at(3) == 3000

        def append(count: int, at: int | None) -> int:
            return encoder.append_audio(np.zeros((1, count), np.float32), at_sample=at)

        assert append(4000, 1000) == 4000  # waits for 0-1000
        assert append(2000, 4000) == 1000  # 4000-5000 is taken
        assert append(700, 500) == 500
        assert encoder.audio_received == 0
        assert append(1000, 0) == 500
        assert encoder.audio_received == 6000
        assert append(500, None) == 0  # after the last call's audio: 1000-1500, filled
        assert append(500, 6000) == 500
        assert append(300, None) == 300  # 6500-6800
        assert encoder.audio_received == 6800
    finally:
        encoder.close()


def test_bad_audio_is_refused_before_the_codec():
    encoder = VideoStreamEncoder(64, 48, FPS, audio=AudioSettings(48_000, 2))
    try:
        bad = [
            (np.zeros(10, np.float32), None, "numpy array"),
            (np.zeros((1, 10), np.float32), None, "2 channels, got 1"),
            (np.zeros((2, 10), np.int16), None, "float samples"),
            (np.full((2, 10), np.nan, np.float32), None, "NaN"),
            (np.zeros((2, 10), np.float32), -1, "position >= 0"),
            (np.zeros((2, 10), np.float32), 2.5, "position >= 0"),
        ]
        for samples, at, message in bad:
            with pytest.raises(ValueError, match=message):
                encoder.append_audio(samples, at_sample=at)
        assert encoder.append_audio(np.zeros((2, 10), np.float64)) == 10
    finally:
        encoder.close()
    with pytest.raises(RuntimeError, match="audio=AudioSettings"):
        VideoStreamEncoder(64, 48, FPS).append_audio(np.zeros((2, 10), np.float32))
    with pytest.raises(ValueError, match="no soundtrack or total_frames"):
        VideoStreamEncoder(64, 48, FPS, total_frames=3, audio=AudioSettings(48_000, 2))


def legacy_whole_video(counts: tuple[int, ...], soundtrack: Soundtrack) -> bytes:
    """The whole-video stream as written before live audio (issue 13), from the same
    parts: audio fed three AAC frames past each chunk's end, flushed at the last."""
    video, frames = H264Encoder(64, 48, FPS), gradient_yuv(sum(counts))
    rate, total_frames = soundtrack.sample_rate, sum(counts)
    total = samples_for_duration(total_frames / FPS, rate)
    aac = AacEncoder(rate, soundtrack.channels, total)
    wave = fit_to_length(soundtrack.waveform, total)
    tracks = [
        fmp4.VideoTrack(VIDEO_TRACK_ID, video.timescale, 64, 48, video.avcc),
        fmp4.AudioTrack(AUDIO_TRACK_ID, rate, soundtrack.channels, aac.audio_specific_config),
    ]
    out, start, times = [fmp4.init_segment(tracks)], 0, [0, 0]
    for number, count in enumerate(counts, start=1):
        samples = video.encode(frames[start : start + count])
        runs = [fmp4.TrackRun(VIDEO_TRACK_ID, times[0], tuple(samples))]
        times[0] += sum(s.duration for s in samples)
        start += count
        video_end = samples_for_duration(Fraction(start) / FPS, rate)
        audio = aac.encode_until(wave, total if start >= total_frames else video_end + 3072)
        if audio:
            runs.append(fmp4.TrackRun(AUDIO_TRACK_ID, times[1], tuple(audio)))
            times[1] += sum(s.duration for s in audio)
        out.append(fmp4.fragment(number, runs))
    return b"".join(out)


@pytest.mark.parametrize(("rate", "channels", "factor"), [(48_000, 2, 1.0), (22_050, 1, 0.6)])
def test_whole_video_bytes_are_unchanged(rate, channels, factor):
    wave = clicks([3, 20], rate, channels)[:, : round(clicks([], rate).shape[1] * factor)]
    soundtrack = Soundtrack(wave, rate)
    encoder = VideoStreamEncoder(64, 48, FPS, soundtrack=soundtrack, total_frames=FRAMES)
    try:
        data, start, frames = encoder.init_segment, 0, gradient_yuv(FRAMES)
        for count in CHUNKS:
            data += encoder.encode_chunk(frames[start : start + count])
            start += count
        assert encoder.finish() == b""  # the last chunk flushed the soundtrack
    finally:
        encoder.close()
    assert data == legacy_whole_video(CHUNKS, soundtrack)


def test_each_fragment_comes_with_the_facts_its_boxes_state():
    """`codecs.fragment`: what the encoder hands over with each fragment (duration,
    keyframe, each track's ticks) is what its moof says, down to the audio-only tail."""
    rate = 16_000
    encoder = VideoStreamEncoder(64, 48, FPS, audio=AudioSettings(rate, 1))
    try:
        encoder.append_audio(clicks([3], rate, 1)[:, : encoder.audio_sample_at(FRAMES)])
        frames, start, fragments = gradient_yuv(FRAMES), 0, []
        for count in CHUNKS:
            fragments.append(encoder.encode_chunk(frames[start : start + count]))
            start += count
        tail = encoder.finish()
    finally:
        encoder.close()
    assert tail, "the audio after the last chunk's frames: an audio-only fragment"
    for fragment in [*fragments, tail]:
        runs = {run.track_id: run for run in fmp4_reader.fragment_timing(fragment)}
        facts = fragment.facts
        assert dict(facts.track_ticks) == {i: run.duration for i, run in runs.items()}
        video = runs.get(VIDEO_TRACK_ID)
        if video is None:
            assert not facts.keyframe
            assert facts.duration_s == runs[AUDIO_TRACK_ID].duration / rate
        else:
            assert facts.keyframe == (not video.first_sample_flags & fmp4.SAMPLE_IS_NON_SYNC_SAMPLE)
            assert facts.duration_s == video.duration / encoder.timescale
    assert [fragment.facts.keyframe for fragment in fragments][:2] == [True, True]
