"""libx264 through PyAV: parameter sets, codec strings, one sample per frame."""

from __future__ import annotations

import re
from collections.abc import Iterator
from fractions import Fraction

import av
import numpy as np
import pytest

from tests.helpers.media import gradient_frames, gradient_yuv, x264_options
from vaecast.codecs import avc
from vaecast.codecs.colour import Yuv420Frames, from_rgb
from vaecast.codecs.h264 import EncoderSettings, H264Encoder, media_timescale

WIDTH, HEIGHT = 64, 48


@pytest.fixture
def encoder() -> Iterator[H264Encoder]:
    enc = H264Encoder(WIDTH, HEIGHT, Fraction(16))
    yield enc
    enc.close()


@pytest.mark.parametrize(
    ("fps", "expected"),
    [
        (Fraction(16), (16000, 1000)),
        (Fraction(24), (24000, 1000)),
        (Fraction(30000, 1001), (30000, 1001)),
        (Fraction(25, 2), (12500, 1000)),
    ],
)
def test_media_timescale(fps: Fraction, expected: tuple[int, int]) -> None:
    assert media_timescale(fps) == expected


def test_media_timescale_rejects_non_positive() -> None:
    with pytest.raises(ValueError, match="fps must be positive"):
        media_timescale(Fraction(0))


@pytest.mark.parametrize(
    ("preset", "pattern"),
    [("ultrafast", r"avc1\.42C0[0-9A-F]{2}"), ("veryfast", r"avc1\.6400[0-9A-F]{2}")],
)
def test_real_encoder_parameter_sets(preset: str, pattern: str) -> None:
    enc = H264Encoder(WIDTH, HEIGHT, Fraction(16), EncoderSettings(preset=preset))
    try:
        assert re.fullmatch(pattern, enc.codec_string)
        sps_units, pps_units = avc.parse_avc_decoder_configuration_record(enc.avcc)
        assert len(sps_units) == len(pps_units) == 1
        assert enc.avcc[1:4] == sps_units[0][1:4]
        assert enc.avcc[4] == 0xFF  # 4-byte NAL lengths
        assert avc.parse_sps_codec_string(sps_units[0]) == enc.codec_string
    finally:
        enc.close()


def test_one_sample_per_frame_length_prefixed(encoder: H264Encoder) -> None:
    samples = encoder.encode(gradient_yuv(5))
    assert len(samples) == 5
    assert [s.duration for s in samples] == [1000] * 5
    assert [s.is_sync for s in samples] == [True, False, False, False, False]
    assert all(s.composition_offset == 0 for s in samples)
    for index, sample in enumerate(samples):
        types = [avc.nal_unit_type(u) for u in avc.split_length_prefixed(sample.data)]
        assert not {avc.NAL_SPS, avc.NAL_PPS, avc.NAL_AUD} & set(types)
        assert (avc.NAL_IDR_SLICE in types) == (index == 0)
    assert encoder.frames_encoded == 5


def test_encoder_continues_across_calls(encoder: H264Encoder) -> None:
    encoder.encode(gradient_yuv(2))
    second = encoder.encode(gradient_yuv(3))
    third = encoder.encode(gradient_yuv(3))
    # The second call starts with a keyframe (the first fragment is an HLS segment of
    # its own); later calls inside the interval do not.
    assert [s.is_sync for s in second] == [True, False, False]
    assert [s.is_sync for s in third] == [False, False, False]
    assert encoder.frames_encoded == 8


def test_keyframes_start_the_first_chunk_past_each_interval() -> None:
    settings = EncoderSettings(keyframe_interval_s=0.5)  # 8 frames at 16 fps
    enc = H264Encoder(WIDTH, HEIGHT, Fraction(16), settings)
    frames = gradient_yuv(21)
    try:
        # Chunks as a causal decoder makes them: 1 frame, then 4 at a time.
        samples = [s for start, stop in CHUNKS_OF_21 for s in enc.encode(frames[start:stop])]
    finally:
        enc.close()
    # The second chunk starts with a keyframe, and the interval counts from it: frame 9
    # is the first chunk start at or past 1 + 8.
    assert [i for i, s in enumerate(samples) if s.is_sync] == [0, 1, 9, 17]


def test_only_the_second_call_is_forced_whatever_the_interval() -> None:
    settings = EncoderSettings(keyframe_interval_s=10.0)  # 160 frames: past this stream
    enc = H264Encoder(WIDTH, HEIGHT, Fraction(16), settings)
    frames = gradient_yuv(21)
    try:
        samples = [s for start, stop in CHUNKS_OF_21 for s in enc.encode(frames[start:stop])]
        assert enc.encode(gradient_yuv(0)) == []  # an empty call is no chunk
    finally:
        enc.close()
    assert [i for i, s in enumerate(samples) if s.is_sync] == [0, 1]


CHUNKS_OF_21 = [(0, 1), (1, 5), (5, 9), (9, 13), (13, 17), (17, 21)]


def _slices(sample: bytes) -> int:
    return sum(avc.nal_unit_type(u) in (1, 5) for u in avc.split_length_prefixed(sample))


def test_one_x264_thread_by_default_one_slice_per_frame() -> None:
    encoder = H264Encoder(832, 480, Fraction(16))
    samples = encoder.encode(from_rgb(gradient_frames(2, 832, 480)))
    encoder.close()
    assert EncoderSettings().threads == 1
    assert [_slices(sample.data) for sample in samples] == [1, 1]


def test_samples_decode_with_avcc_as_extradata() -> None:
    # With two sliced threads x264 cuts each frame into two slices, so samples hold
    # several NAL units to walk.
    encoder = H264Encoder(832, 480, Fraction(16), EncoderSettings(threads=2))
    source = gradient_frames(4, 832, 480)
    samples = encoder.encode(from_rgb(source))
    encoder.close()
    assert all(_slices(sample.data) == 2 for sample in samples)
    decoder = av.CodecContext.create("h264", "r")
    decoder.extradata = encoder.avcc  # avcC extradata switches FFmpeg to length prefixes
    frames = []
    for sample in samples:
        frames += decoder.decode(av.Packet(sample.data))
    frames += decoder.decode(None)
    assert len(frames) == 4
    decoded = np.stack([f.to_ndarray(format="rgb24") for f in frames])
    assert np.abs(decoded.astype(int) - source).mean() < 4


@pytest.mark.parametrize(("width", "height", "threads"), [(64, 48, 1), (66, 34, 1), (832, 480, 2)])
def test_planes_are_free_once_encode_returns(width: int, height: int, threads: int) -> None:
    # The encoder wraps each frame's planes without copying them: x264 must have
    # taken its own copy by the time `encode` returns, or a caller reusing the
    # buffer (a CUDA decode's pinned staging memory) would change frames already sent.
    settings = EncoderSettings(threads=threads)
    frames = gradient_frames(6, width, height)
    chunks = [from_rgb(frames[i : i + 2]) for i in range(0, 6, 2)]
    kept = H264Encoder(width, height, Fraction(16), settings)
    expected = [s.data for chunk in chunks for s in kept.encode(chunk)]
    kept.close()
    reused = H264Encoder(width, height, Fraction(16), settings)
    got = []
    for chunk in chunks:
        planes = chunk.planes.copy()
        got += [s.data for s in reused.encode(Yuv420Frames(planes, height, width))]
        planes[:] = 255 - planes  # the caller's buffer, reused at once
    reused.close()
    assert got == expected


@pytest.mark.parametrize(("width", "height"), [(63, 48), (64, 47), (0, 48)])
def test_odd_or_empty_size_raises(width: int, height: int) -> None:
    with pytest.raises(ValueError, match="positive and even"):
        H264Encoder(width, height, Fraction(16))


@pytest.mark.parametrize(
    ("frames", "message"),
    [
        (gradient_frames(2), r"must be Yuv420Frames \(colour.from_rgb converts RGB\), got ndarray"),
        (
            Yuv420Frames(np.zeros((2, 72, 48), np.uint8), height=48, width=48),
            "must be 64x48, got 48x48",
        ),
    ],
)
def test_bad_frames_raise(encoder: H264Encoder, frames: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        encoder.encode(frames)  # type: ignore[arg-type]
    assert encoder.frames_encoded == 0


def test_close_twice_then_encode_raises(encoder: H264Encoder) -> None:
    encoder.close()
    encoder.close()
    with pytest.raises(RuntimeError, match="closed"):
        encoder.encode(gradient_yuv(1))


def options_used(settings: EncoderSettings) -> str:
    """What x264 says it encoded a frame with under `settings`."""
    enc = H264Encoder(WIDTH, HEIGHT, Fraction(16), settings)
    try:
        (sample,) = enc.encode(gradient_yuv(1))
    finally:
        enc.close()
    return x264_options(sample.data)


def test_quality_is_a_constant_quantizer_unless_a_crf_is_given() -> None:
    # A constant QP spares x264 the half-resolution look-ahead that CRF weighs frames on.
    default = options_used(EncoderSettings())
    assert " rc=cqp " in default and " qp=21 " in default
    assert EncoderSettings().rate_control == ("qp", 21)
    assert " qp=30 " in options_used(EncoderSettings(qp=30))
    with_crf = options_used(EncoderSettings(crf=18, qp=30))
    assert " rc=crf " in with_crf and " crf=18.0 " in with_crf
    assert EncoderSettings(crf=18).rate_control == ("crf", 18)


def test_settings_validation() -> None:
    for field in ("crf", "qp"):
        for value in (-1, 52):
            with pytest.raises(ValueError, match=rf"{field} must be in 0\.\.51, got {value}"):
                EncoderSettings(**{field: value})
    with pytest.raises(ValueError, match="keyframe_interval_s"):
        EncoderSettings(keyframe_interval_s=0)
    for threads in (-1, 17):
        with pytest.raises(ValueError, match=r"threads must be in 0\.\.16"):
            EncoderSettings(threads=threads)


@pytest.mark.parametrize(("width", "height"), [(64, 48), (66, 34), (40, 30), (32, 2)])
def test_every_even_height_encodes_its_own_pixels(width: int, height: int) -> None:
    # PyAV wraps I420 planes without a copy only for heights that are multiples of 4;
    # any other even height (34, 270) must still encode the frame it was given.
    frames = from_rgb(gradient_frames(3, width, height))
    encoder = H264Encoder(width, height, Fraction(16), EncoderSettings(qp=0))  # lossless
    samples = encoder.encode(frames)
    decoder = av.CodecContext.create("h264", "r")
    decoder.extradata = encoder.avcc
    encoder.close()
    decoded = [f for sample in samples for f in decoder.decode(av.Packet(sample.data))]
    decoded += decoder.decode(None)
    planes = np.stack([f.to_ndarray(format="yuv420p") for f in decoded])
    assert np.array_equal(planes, frames.planes)
