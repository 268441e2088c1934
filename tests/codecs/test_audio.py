"""The soundtrack: AAC-LC in a second track of the same fragments, in sync with the video."""

from __future__ import annotations

import io
from fractions import Fraction

import av
import numpy as np
import pytest

from tests.helpers.media import gradient_yuv
from vaecast.codecs import fmp4, fmp4_reader
from vaecast.codecs.aac import AacEncoder, fit_to_length
from vaecast.codecs.stream import AUDIO_TRACK_ID, VIDEO_TRACK_ID, Soundtrack, VideoStreamEncoder

FPS = Fraction(16)
CHUNKS = (1, 4, 4, 4, 4, 4, 4, 4, 4)  # 33 frames, as a causal VAE publishes them
FRAMES = sum(CHUNKS)
AAC_FRAME = 1024


def clicks(frames_with_click: list[int], sample_rate: int, channels: int = 2) -> np.ndarray:
    """Silence with a short loud burst at each listed video frame's timestamp."""
    samples = round(FRAMES / FPS * sample_rate)
    wave = np.zeros((channels, samples), np.float32)
    for frame in frames_with_click:
        start = round(frame / FPS * sample_rate)
        wave[:, start : start + 64] = 0.9
    return wave


def encode(soundtrack: Soundtrack) -> tuple[bytes, list[bytes]]:
    encoder = VideoStreamEncoder(64, 48, FPS, soundtrack=soundtrack, total_frames=FRAMES)
    frames, start, fragments = gradient_yuv(FRAMES), 0, []
    for count in CHUNKS:
        fragments.append(encoder.encode_chunk(frames[start : start + count]))
        start += count
    encoder.close()
    return encoder.init_segment, fragments


def decoded_audio(data: bytes) -> tuple[np.ndarray, int, float]:
    """(mono samples, sample rate, time of the first sample) as FFmpeg decodes them."""
    with av.open(io.BytesIO(data)) as container:
        frames = list(container.decode(audio=0))
    samples = np.concatenate([f.to_ndarray().reshape(f.layout.nb_channels, -1)[0] for f in frames])
    return samples, frames[0].sample_rate, float(frames[0].time)


def video_seconds(data: bytes) -> float:
    with av.open(io.BytesIO(data)) as container:
        frames = list(container.decode(video=0))
    return len(frames) / float(FPS)


@pytest.mark.parametrize(("sample_rate", "channels"), [(48_000, 2), (16_000, 1), (44_100, 2)])
def test_both_tracks_decode_and_last_equally_long(sample_rate: int, channels: int):
    init, fragments = encode(Soundtrack(clicks([], sample_rate, channels), sample_rate))
    data = init + b"".join(fragments)
    tracks = fmp4_reader.parse_init_segment(init).tracks
    assert [type(t).__name__ for t in tracks] == ["VideoTrack", "AudioTrack"]
    assert (tracks[1].sample_rate, tracks[1].channels) == (sample_rate, channels)
    samples, rate, first_time = decoded_audio(data)
    assert rate == sample_rate
    assert first_time == 0.0
    assert abs(len(samples) / rate - video_seconds(data)) <= AAC_FRAME / rate


def test_a_click_at_frame_k_is_heard_within_one_frame_of_it():
    sample_rate = 48_000
    click_frames = [5, 17, 30]
    init, fragments = encode(Soundtrack(clicks(click_frames, sample_rate), sample_rate))
    samples, rate, _ = decoded_audio(init + b"".join(fragments))
    loud = np.abs(samples) > 0.3
    onsets = [i for i in np.flatnonzero(loud) if i == 0 or not loud[i - 1]]
    heard = sorted({round(i / rate * float(FPS), 2) for i in onsets})
    assert len(heard) == len(click_frames)
    for frame, when in zip(click_frames, heard, strict=True):
        assert abs(when - frame) < 1.0, (frame, when)


def test_every_fragment_carries_both_tracks_with_continuous_decode_times():
    sample_rate = 48_000
    _, fragments = encode(Soundtrack(clicks([], sample_rate), sample_rate))
    next_time = {VIDEO_TRACK_ID: 0, AUDIO_TRACK_ID: 0}
    for fragment in fragments:
        runs = {run.track_id: run for run in fmp4_reader.parse_fragment(fragment).runs}
        assert sorted(runs) == [VIDEO_TRACK_ID, AUDIO_TRACK_ID]
        for track_id, run in runs.items():
            assert run.base_media_decode_time == next_time[track_id]
            next_time[track_id] += run.duration
        # Each fragment's audio reaches as far as its video, so a player never waits
        # for sound to show a picture it already has.
        assert next_time[AUDIO_TRACK_ID] / sample_rate >= next_time[VIDEO_TRACK_ID] / 16_000
    video_end_s = next_time[VIDEO_TRACK_ID] / 16_000
    assert next_time[AUDIO_TRACK_ID] / sample_rate == pytest.approx(video_end_s)


@pytest.mark.parametrize("factor", [0.5, 1.5])
def test_short_audio_is_padded_and_long_audio_trimmed_to_the_video(factor: float):
    sample_rate = 16_000
    wave = np.full((1, round(FRAMES / FPS * sample_rate * factor)), 0.5, np.float32)
    _, fragments = encode(Soundtrack(wave, sample_rate))
    audio_ticks = sum(
        run.duration
        for fragment in fragments
        for run in fmp4_reader.parse_fragment(fragment).runs
        if run.track_id == AUDIO_TRACK_ID
    )
    assert audio_ticks == round(FRAMES / FPS * sample_rate)


def test_fit_to_length_pads_with_silence_and_trims():
    wave = np.ones((2, 5), np.float32)
    assert fit_to_length(wave, 3).tolist() == [[1, 1, 1], [1, 1, 1]]
    assert fit_to_length(wave, 7).tolist() == [[1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0, 0]]


def test_esds_carries_the_audio_specific_config_and_round_trips():
    track = fmp4.AudioTrack(2, 48_000, 2, bytes.fromhex("1190"))
    es = fmp4.esds(track)
    # esds full box, ES_Descriptor (tag 3), DecoderConfigDescriptor (tag 4, MPEG-4
    # audio 0x40, audio stream 0x15), DecoderSpecificInfo (tag 5) = the ASC, SLConfig.
    assert es == bytes.fromhex(
        "000000276573647300000000031900000004114015000000000000000000000005021190060102"
    )
    video = fmp4.VideoTrack(1, 16_000, 64, 48, bytes.fromhex("0142c00affe100000100"))
    init = fmp4.init_segment([video, track])
    assert fmp4_reader.parse_init_segment(init).tracks == (video, track)


def test_bad_audio_settings_are_refused():
    with pytest.raises(ValueError, match="sample rate must be 16-48 kHz, got 8000"):
        AacEncoder(8000, 1, 100)
    with pytest.raises(ValueError, match="mono or stereo, got 3 channels"):
        AacEncoder(48_000, 3, 100)
    with pytest.raises(ValueError, match="a soundtrack needs total_frames"):
        VideoStreamEncoder(
            64, 48, FPS, soundtrack=Soundtrack(np.zeros((1, 10), np.float32), 16_000)
        )
