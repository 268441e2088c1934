"""A live stream whose caller waits for each chunk's audio: every fragment's audio ends
within one AAC frame of its video, and the last chunk ends the track."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from tests.helpers.fragment_audio import assert_aligned, timeline
from tests.helpers.media import gradient_yuv
from vaecast.codecs.aac import AAC_FRAME_SAMPLES, AudioSettings
from vaecast.codecs.live_audio import LiveAudioTrack, audio_needed, reach_past
from vaecast.codecs.stream import VideoStreamEncoder

AAC = AAC_FRAME_SAMPLES


def tone(samples: int, channels: int = 1) -> np.ndarray:
    t = np.arange(samples) / 16_000
    return np.tile(0.1 * np.sin(2 * np.pi * 330 * t), (channels, 1)).astype(np.float32)


@pytest.mark.parametrize("end", [0, 1000, 1024, 3000, 5119, 5120, 48_000])
def test_audio_needed_is_exactly_what_releases_every_packet_up_to_the_end(end: int):
    def released_with(received: int) -> int:
        track = LiveAudioTrack(16_000, 1)
        try:
            track.append(tone(received))
            return sum(sample.duration for sample in track.release_until(end))
        finally:
            track.close()

    assert released_with(audio_needed(end)) == end // AAC * AAC
    if end >= AAC:  # one sample less: the last packet is still in the encoder
        assert released_with(audio_needed(end) - 1) == end // AAC * AAC - AAC


@pytest.mark.parametrize(
    ("video_end", "next_frame_end", "reach"),
    [
        (2000, 4000, 2048),  # the boundary after the video's end
        (2048, 4096, 2048),  # on a boundary already
        (1000, 2000, 1024),
        (1100, 2000, 2000),  # the next frame ends before the boundary: no further
        (0, 1000, 0),
    ],
)
def test_the_audio_reaches_past_the_video_no_further_than_its_next_frame(
    video_end: int, next_frame_end: int, reach: int
):
    assert reach_past(video_end, next_frame_end) == reach


def test_a_gap_given_up_is_silence_and_the_audio_after_it_is_encoded_at_once():
    track = LiveAudioTrack(16_000, 1)
    try:
        assert track.append(tone(2000)) == 2000
        assert track.append(tone(3000), at_sample=4000) == 3000  # after a gap: waits
        assert (track.received, track.waiting_samples) == (2000, 3000)
        track.give_up_before(4000)
        assert (track.received, track.waiting_samples) == (7000, 0)
        assert track.append(tone(500), at_sample=3000) == 0  # given up: not taken again
        track.give_up_before(9000)  # no audio at all up to there: silence
        assert track.received == 9000
        assert [s.duration for s in track.release_until(9000)] == [AAC] * 6
    finally:
        track.close()


def live_encoder(rate: int = 16_000, fps: int = 8) -> VideoStreamEncoder:
    return VideoStreamEncoder(64, 48, Fraction(fps), audio=AudioSettings(rate, 1))


def test_chunks_that_wait_for_their_audio_end_their_fragments_with_their_video():
    # 8 fps, 16 kHz: 2000 samples a frame; chunks of 1, 4, 4, 4 frames, as a causal
    # VAE publishes them, each encoded once the audio it needs (the next block's) is in.
    chunks, frames = (1, 4, 4, 4), gradient_yuv(13)
    encoder = live_encoder()
    wave = tone(13 * 2000)
    data, start, fed = [encoder.init_segment], 0, 0
    try:
        for index, count in enumerate(chunks):
            end = start + count
            last = index == len(chunks) - 1
            need = wave.shape[1] if last else encoder.live_audio_needed(end, more_follows=True)
            need = min(need, wave.shape[1])
            if need > fed:
                encoder.append_audio(wave[:, fed:need], at_sample=fed)
                fed = need
            assert encoder.audio_received >= need
            data.append(encoder.encode_chunk(frames[start:end], last=last))
            start = end
        assert encoder.last_chunk_encoded
        with pytest.raises(RuntimeError, match="last chunk was encoded"):
            encoder.encode_chunk(frames[:1])
        with pytest.raises(RuntimeError, match="last chunk was encoded"):
            encoder.append_audio(tone(10))
        assert encoder.finish() == b""
    finally:
        encoder.close()
    line = assert_aligned(b"".join(data))
    assert [span.audio for span in line.spans] == [
        (0, 2048),
        (2048, 10240),
        (10240, 18432),
        (18432, 26000),
    ]


def test_when_more_video_is_not_known_to_follow_the_audio_stays_within_the_video():
    encoder = live_encoder()
    try:
        encoder.append_audio(tone(20_000))  # far ahead: only the video holds it back
        fragments = [encoder.init_segment, encoder.encode_chunk(gradient_yuv(1))]
        fragments.append(encoder.encode_chunk(gradient_yuv(4), last=None))
        fragments.append(encoder.finish())  # the rest, audio-only, fitted to 5 frames
    finally:
        encoder.close()
    spans = timeline(b"".join(fragments)).spans
    assert [span.video for span in spans] == [(0, 2000), (2000, 10000), None]
    assert [span.audio for span in spans] == [(0, 1024), (1024, 9216), (9216, 10000)]


def test_settling_audio_that_never_came_fills_the_fragment_with_silence():
    encoder = live_encoder()
    try:
        encoder.append_audio(tone(2000))  # frame 0's; frames 1-4 send none
        encoder.settle_audio(encoder.audio_sample_at(9))  # a later block came
        assert encoder.audio_received == 18_000
        first = encoder.encode_chunk(gradient_yuv(1), last=False)
        second = encoder.encode_chunk(gradient_yuv(4), last=False)
        encoder.append_audio(tone(8000), at_sample=18_000)
        third = encoder.encode_chunk(gradient_yuv(4), last=True)
    finally:
        encoder.close()
    line = assert_aligned(encoder.init_segment + first + second + third)
    assert [span.audio for span in line.spans] == [(0, 2048), (2048, 10240), (10240, 18000)]


def test_a_wrong_promise_that_more_video_follows_fails_loudly_at_finish():
    encoder = live_encoder()
    try:
        encoder.append_audio(tone(8000))
        encoder.encode_chunk(gradient_yuv(1), last=False)  # its audio reaches 2048
        with pytest.raises(ValueError, match="already reaches 2048, past 2000"):
            encoder.finish()
    finally:
        encoder.close()
