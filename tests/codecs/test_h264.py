"""libx264 through PyAV: parameter sets, codec strings, one sample per frame."""

from __future__ import annotations

import re
from collections.abc import Iterator
from fractions import Fraction

import av
import numpy as np
import pytest

from tests.helpers.media import gradient_frames
from vaecast.codecs import h264
from vaecast.codecs.h264 import EncoderSettings, H264Encoder, media_timescale

WIDTH, HEIGHT = 64, 48

# libx264's SPS/PPS for 64x48: ultrafast (Constrained Baseline) and veryfast (High).
BASELINE_SPS = bytes.fromhex("6742c00ada11e9a830302a000003000200000300411e244d40")
BASELINE_PPS = bytes.fromhex("68ce0fc8")
HIGH_SPS = bytes.fromhex("6764000aacb423d350606054000003000400000300823c489a80")


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


def test_split_annexb_three_and_four_byte_start_codes() -> None:
    stream = b"\x00\x00\x00\x01\x67AB\x00\x00\x01\x68C\x00\x00\x00\x01\x65DE\x00"
    assert h264.split_annexb(stream) == [b"\x67AB", b"\x68C", b"\x65DE"]


def test_annexb_to_sample_drops_parameter_sets_and_delimiters() -> None:
    packet = b"\x00\x00\x00\x01\x09\xf0\x00\x00\x01\x67S\x00\x00\x01\x68P\x00\x00\x01\x65IDR"
    assert h264.annexb_to_sample(packet) == b"\x00\x00\x00\x04\x65IDR"
    assert h264.annexb_to_sample(packet, {b"\x67S", b"\x68P"}) == b"\x00\x00\x00\x04\x65IDR"


def test_annexb_to_sample_refuses_a_new_parameter_set() -> None:
    packet = b"\x00\x00\x01\x67T\x00\x00\x01\x65IDR"
    with pytest.raises(ValueError, match="differs from the avcC"):
        h264.annexb_to_sample(packet, {b"\x67S", b"\x68P"})


def test_split_length_prefixed_rejects_overrun() -> None:
    assert h264.split_length_prefixed(b"\x00\x00\x00\x01A\x00\x00\x00\x02BC") == [b"A", b"BC"]
    with pytest.raises(ValueError, match="overruns"):
        h264.split_length_prefixed(b"\x00\x00\x00\x05AB")


def test_avcc_golden_baseline() -> None:
    avcc = h264.avc_decoder_configuration_record([BASELINE_SPS], [BASELINE_PPS])
    assert avcc == bytes.fromhex("0142c00affe10019") + BASELINE_SPS + b"\x01\x00\x04" + BASELINE_PPS
    assert h264.parse_avc_decoder_configuration_record(avcc) == ([BASELINE_SPS], [BASELINE_PPS])


def test_avcc_high_profile_has_chroma_and_bit_depth_bytes() -> None:
    sps = h264.parse_sps(HIGH_SPS)
    assert (sps.profile_idc, sps.chroma_format_idc, sps.bit_depth_luma) == (100, 1, 8)
    avcc = h264.avc_decoder_configuration_record([HIGH_SPS], [BASELINE_PPS])
    # chroma_format_idc 1 (4:2:0), luma and chroma 8 bit, no SPS extensions.
    assert avcc[-4:] == b"\xfd\xf8\xf8\x00"


def test_codec_strings() -> None:
    assert h264.parse_sps_codec_string(BASELINE_SPS) == "avc1.42C00A"
    assert h264.parse_sps_codec_string(HIGH_SPS) == "avc1.64000A"
    with pytest.raises(ValueError, match="not an SPS"):
        h264.parse_sps_codec_string(BASELINE_PPS)


@pytest.mark.parametrize(
    ("preset", "pattern"),
    [("ultrafast", r"avc1\.42C0[0-9A-F]{2}"), ("veryfast", r"avc1\.6400[0-9A-F]{2}")],
)
def test_real_encoder_parameter_sets(preset: str, pattern: str) -> None:
    enc = H264Encoder(WIDTH, HEIGHT, Fraction(16), EncoderSettings(preset=preset))
    try:
        assert re.fullmatch(pattern, enc.codec_string)
        sps_units, pps_units = h264.parse_avc_decoder_configuration_record(enc.avcc)
        assert len(sps_units) == len(pps_units) == 1
        assert enc.avcc[1:4] == sps_units[0][1:4]
        assert enc.avcc[4] == 0xFF  # 4-byte NAL lengths
        assert h264.parse_sps_codec_string(sps_units[0]) == enc.codec_string
    finally:
        enc.close()


def test_one_sample_per_frame_length_prefixed(encoder: H264Encoder) -> None:
    samples = encoder.encode(gradient_frames(5))
    assert len(samples) == 5
    assert [s.duration for s in samples] == [1000] * 5
    assert [s.is_sync for s in samples] == [True, False, False, False, False]
    assert all(s.composition_offset == 0 for s in samples)
    for index, sample in enumerate(samples):
        types = [h264.nal_unit_type(u) for u in h264.split_length_prefixed(sample.data)]
        assert not {h264.NAL_SPS, h264.NAL_PPS, h264.NAL_AUD} & set(types)
        assert (h264.NAL_IDR_SLICE in types) == (index == 0)
    assert encoder.frames_encoded == 5


def test_encoder_continues_across_calls(encoder: H264Encoder) -> None:
    encoder.encode(gradient_frames(2))
    later = encoder.encode(gradient_frames(3))
    assert [s.is_sync for s in later] == [False, False, False]
    assert encoder.frames_encoded == 5


def test_keyframe_interval() -> None:
    settings = EncoderSettings(keyframe_interval_s=0.5)
    enc = H264Encoder(WIDTH, HEIGHT, Fraction(16), settings)
    try:
        samples = enc.encode(gradient_frames(20))
    finally:
        enc.close()
    assert [i for i, s in enumerate(samples) if s.is_sync] == [0, 8, 16]


def test_samples_decode_with_avcc_as_extradata() -> None:
    # At this size on a multi-core machine, x264's sliced threads cut each frame
    # into several slices, so samples hold several NAL units to walk.
    encoder = H264Encoder(832, 480, Fraction(16))
    source = gradient_frames(4, 832, 480)
    samples = encoder.encode(source)
    encoder.close()
    decoder = av.CodecContext.create("h264", "r")
    decoder.extradata = encoder.avcc  # avcC extradata switches FFmpeg to length prefixes
    frames = []
    for sample in samples:
        frames += decoder.decode(av.Packet(sample.data))
    frames += decoder.decode(None)
    assert len(frames) == 4
    decoded = np.stack([f.to_ndarray(format="rgb24") for f in frames])
    assert np.abs(decoded.astype(int) - source).mean() < 4


@pytest.mark.parametrize(("width", "height"), [(63, 48), (64, 47), (0, 48)])
def test_odd_or_empty_size_raises(width: int, height: int) -> None:
    with pytest.raises(ValueError, match="positive and even"):
        H264Encoder(width, height, Fraction(16))


@pytest.mark.parametrize(
    "frames",
    [
        np.zeros((2, HEIGHT, WIDTH, 3), np.float32),
        np.zeros((HEIGHT, WIDTH, 3), np.uint8),
        np.zeros((2, WIDTH, HEIGHT, 3), np.uint8),
        np.zeros((2, HEIGHT, WIDTH, 4), np.uint8),
    ],
)
def test_bad_frames_raise(encoder: H264Encoder, frames: np.ndarray) -> None:
    with pytest.raises(ValueError, match=r"uint8 array of shape \(T, 48, 64, 3\)"):
        encoder.encode(frames)
    assert encoder.frames_encoded == 0


def test_close_twice_then_encode_raises(encoder: H264Encoder) -> None:
    encoder.close()
    encoder.close()
    with pytest.raises(RuntimeError, match="closed"):
        encoder.encode(gradient_frames(1))


def test_settings_validation() -> None:
    with pytest.raises(ValueError, match="crf"):
        EncoderSettings(crf=52)
    with pytest.raises(ValueError, match="keyframe_interval_s"):
        EncoderSettings(keyframe_interval_s=0)
