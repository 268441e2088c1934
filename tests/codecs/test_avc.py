"""The AVC bitstream helpers: tables of bytes in, bytes (or errors) out."""

from __future__ import annotations

import pytest

from tests.helpers.media import (
    X264_BASELINE_AVCC,
    X264_BASELINE_PPS,
    X264_BASELINE_SPS,
    X264_HIGH_SPS,
)
from vaecast.codecs import avc
from vaecast.codecs.avc import SequenceParameterSet

# High 4:4:4 (profile 244): sps_id 0, chroma_format_idc 3, no separate planes, 10 bit.
HIGH_444_10BIT_SPS = b"\x67\xf4\x00\x1e\x90\xdc"


@pytest.mark.parametrize(
    ("stream", "units"),
    [
        (b"", []),
        (b"\x65AB", []),
        (b"\x00\x00\x01\x65AB", [b"\x65AB"]),
        (
            b"\x00\x00\x00\x01\x67AB\x00\x00\x01\x68C\x00\x00\x00\x01\x65DE\x00",
            [b"\x67AB", b"\x68C", b"\x65DE"],
        ),
        (b"junk\x00\x00\x01\x65A", [b"\x65A"]),
        (b"\x00\x00\x01\x00\x00\x01\x65A", [b"\x65A"]),
        (b"\x00\x00\x01\x65A\x00\x00", [b"\x65A"]),
    ],
)
def test_split_annexb(stream: bytes, units: list[bytes]) -> None:
    assert avc.split_annexb(stream) == units


@pytest.mark.parametrize(
    ("unit", "kind"),
    [(b"\x65", 5), (b"\x41", 1), (b"\x06", 6), (b"\x67", 7), (b"\x68", 8), (b"\x09", 9)],
)
def test_nal_unit_type(unit: bytes, kind: int) -> None:
    assert avc.nal_unit_type(unit) == kind


@pytest.mark.parametrize(
    ("units", "sample"),
    [
        ([], b""),
        ([b"A"], b"\x00\x00\x00\x01A"),
        ([b"A", b"BC"], b"\x00\x00\x00\x01A\x00\x00\x00\x02BC"),
    ],
)
def test_length_prefixed_round_trip(units: list[bytes], sample: bytes) -> None:
    assert avc.length_prefixed(units) == sample
    assert avc.split_length_prefixed(sample) == units


@pytest.mark.parametrize(
    ("sample", "message"),
    [
        (b"\x00\x00\x00", "truncated NAL length at offset 0"),
        (b"\x00\x00\x00\x01A\x00", "truncated NAL length at offset 5"),
        (b"\x00\x00\x00\x00", "NAL length 0 at offset 4 overruns"),
        (b"\x00\x00\x00\x05AB", "NAL length 5 at offset 4 overruns"),
    ],
)
def test_split_length_prefixed_refuses(sample: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        avc.split_length_prefixed(sample)


AUD_SPS_PPS_IDR = b"\x00\x00\x00\x01\x09\xf0\x00\x00\x01\x67S\x00\x00\x01\x68P\x00\x00\x01\x65IDR"


@pytest.mark.parametrize(
    ("packet", "parameter_sets", "sample"),
    [
        (AUD_SPS_PPS_IDR, None, b"\x00\x00\x00\x04\x65IDR"),
        (AUD_SPS_PPS_IDR, {b"\x67S", b"\x68P"}, b"\x00\x00\x00\x04\x65IDR"),
        # SEI and non-IDR slices are sample data; an AUD needs no avcC to match.
        (
            b"\x00\x00\x01\x09\xf0\x00\x00\x01\x06E\x00\x00\x01\x41P",
            set(),
            b"\x00\x00\x00\x02\x06E\x00\x00\x00\x02\x41P",
        ),
    ],
)
def test_annexb_to_sample(packet: bytes, parameter_sets: set[bytes] | None, sample: bytes) -> None:
    assert avc.annexb_to_sample(packet, parameter_sets) == sample


@pytest.mark.parametrize(
    "packet",
    [b"\x00\x00\x01\x67T\x00\x00\x01\x65IDR", b"\x00\x00\x01\x68Q\x00\x00\x01\x65IDR"],
)
def test_annexb_to_sample_refuses_a_new_parameter_set(packet: bytes) -> None:
    with pytest.raises(ValueError, match="differs from the avcC"):
        avc.annexb_to_sample(packet, {b"\x67S", b"\x68P"})


@pytest.mark.parametrize(
    ("unit", "sps", "codec_string"),
    [
        (X264_BASELINE_SPS, SequenceParameterSet(66, 0xC0, 10, 1, 8, 8), "avc1.42C00A"),
        (X264_HIGH_SPS, SequenceParameterSet(100, 0x00, 10, 1, 8, 8), "avc1.64000A"),
        (HIGH_444_10BIT_SPS, SequenceParameterSet(244, 0x00, 30, 3, 10, 10), "avc1.F4001E"),
    ],
)
def test_parse_sps(unit: bytes, sps: SequenceParameterSet, codec_string: str) -> None:
    assert avc.parse_sps(unit) == sps
    assert avc.parse_sps_codec_string(unit) == sps.codec_string == codec_string


@pytest.mark.parametrize(
    ("unit", "message"),
    [
        (b"", "not an SPS"),
        (X264_BASELINE_PPS, "not an SPS"),
        (b"\x67\x42\xc0", "SPS too short"),
        (b"\x67\x64\x00\x0a\x00", "SPS ends early"),
        (b"\x67\x64\x00\x0a\x00\x00\x00\x00\x80", "malformed Exp-Golomb"),
    ],
)
def test_parse_sps_refuses(unit: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        avc.parse_sps(unit)


@pytest.mark.parametrize(
    ("sps_units", "pps_units", "avcc"),
    [
        ([X264_BASELINE_SPS], [X264_BASELINE_PPS], X264_BASELINE_AVCC),
        (
            [X264_BASELINE_SPS],
            [X264_BASELINE_PPS, b"\x68\x01"],
            bytes.fromhex("0142c00affe10019")
            + X264_BASELINE_SPS
            + b"\x02\x00\x04"
            + X264_BASELINE_PPS
            + b"\x00\x02\x68\x01",
        ),
        # High profile adds chroma_format_idc 1 (4:2:0), luma and chroma 8 bit, and
        # no SPS extensions.
        (
            [X264_HIGH_SPS],
            [X264_BASELINE_PPS],
            bytes.fromhex("0164000affe1001a")
            + X264_HIGH_SPS
            + b"\x01\x00\x04"
            + X264_BASELINE_PPS
            + b"\xfd\xf8\xf8\x00",
        ),
    ],
)
def test_avcc_round_trip(sps_units: list[bytes], pps_units: list[bytes], avcc: bytes) -> None:
    assert avc.avc_decoder_configuration_record(sps_units, pps_units) == avcc
    assert avc.parse_avc_decoder_configuration_record(avcc) == (sps_units, pps_units)


def test_avcc_needs_both_parameter_sets() -> None:
    with pytest.raises(ValueError, match="at least one SPS and one PPS"):
        avc.avc_decoder_configuration_record([], [X264_BASELINE_PPS])
    with pytest.raises(ValueError, match="at least one SPS and one PPS"):
        avc.avc_decoder_configuration_record([X264_BASELINE_SPS], [])


@pytest.mark.parametrize(
    ("avcc", "message"),
    [
        (b"", "not an AVCDecoderConfigurationRecord"),
        (b"\x02" + X264_BASELINE_AVCC[1:], "not an AVCDecoderConfigurationRecord"),
        (X264_BASELINE_AVCC[:-1], "truncated avcC"),
        (X264_BASELINE_AVCC[:8] + X264_BASELINE_SPS, "truncated avcC"),
        (b"\x01\x42\xc0\x0a\xff\xe1\x00", "truncated avcC"),
    ],
)
def test_parse_avcc_refuses(avcc: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        avc.parse_avc_decoder_configuration_record(avcc)
