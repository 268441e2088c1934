"""The AVC (H.264) bitstream as an `avc1` track needs it: pure functions over bytes.

libx264 speaks Annex B (NAL units after 00 00 01 start codes, parameter sets
in-band); an `avc1` sample entry wants each sample's NAL units length-prefixed, the
SPS and PPS once in an AVCDecoderConfigurationRecord (avcC, ISO/IEC 14496-15
5.3.3.1), and the RFC 6381 codec string (`avc1.PPCCLL`) for the page's MIME type.
This module converts between the two and reads the few SPS fields those need;
it knows nothing of encoders or boxes.
"""

from __future__ import annotations

import struct
from collections.abc import Collection, Sequence
from dataclasses import dataclass

# nal_unit_type values (ITU-T H.264 Table 7-1).
NAL_IDR_SLICE = 5
NAL_SEI = 6
NAL_SPS = 7
NAL_PPS = 8
NAL_AUD = 9
_PARAMETER_AND_DELIMITER_NALS = frozenset({NAL_SPS, NAL_PPS, NAL_AUD})

# Bytes in each NAL unit's length prefix in the samples (avcC lengthSizeMinusOne + 1).
NAL_LENGTH_SIZE = 4

# Profiles whose SPS (and so avcC) carries chroma format and bit depths.
_HIGH_PROFILES_WITH_CHROMA_INFO = frozenset({100, 110, 122, 144})
# Profiles whose SPS carries chroma format and bit depths but whose avcC does not
# (H.264 7.3.2.1.1; 14496-15 lists only the four above).
_OTHER_PROFILES_WITH_CHROMA_INFO = frozenset({244, 44, 83, 86, 118})

_START_CODE = b"\x00\x00\x01"


def split_annexb(data: bytes) -> list[bytes]:
    """NAL units of an Annex B byte stream (3- or 4-byte start codes), in order."""
    starts: list[int] = []
    index = data.find(_START_CODE)
    while index != -1:
        starts.append(index + 3)
        index = data.find(_START_CODE, index + 3)
    units = []
    for position, start in enumerate(starts):
        end = starts[position + 1] - 3 if position + 1 < len(starts) else len(data)
        # A 4-byte start code's leading zero (and trailing_zero_8bits) precede the
        # next start code; a NAL unit never ends in a zero byte, so strip them.
        unit = data[start:end].rstrip(b"\x00")
        if unit:
            units.append(unit)
    return units


def nal_unit_type(unit: bytes) -> int:
    return unit[0] & 0x1F


def length_prefixed(units: Sequence[bytes]) -> bytes:
    """An AVC sample: each NAL unit preceded by its 4-byte big-endian length."""
    return b"".join(struct.pack(">I", len(unit)) + unit for unit in units)


def split_length_prefixed(sample: bytes) -> list[bytes]:
    """The NAL units of an AVC sample; raises ValueError if the lengths do not tile it."""
    units, position = [], 0
    while position < len(sample):
        if position + NAL_LENGTH_SIZE > len(sample):
            raise ValueError(f"truncated NAL length at offset {position}")
        (length,) = struct.unpack_from(">I", sample, position)
        position += NAL_LENGTH_SIZE
        if length == 0 or position + length > len(sample):
            raise ValueError(f"NAL length {length} at offset {position} overruns the sample")
        units.append(sample[position : position + length])
        position += length
    return units


def annexb_to_sample(packet: bytes, parameter_sets: Collection[bytes] | None = None) -> bytes:
    """An Annex B access unit as an `avc1` sample, without in-band SPS/PPS/AUD.

    The avcC is where an `avc1` track declares its parameter sets, so in-band copies
    are dropped. With `parameter_sets` (the avcC's SPS and PPS), an in-band SPS/PPS
    must repeat one of them: a new one would change the stream mid-track, which the
    init segment's single sample entry cannot express, so it raises ValueError.
    """
    units = []
    for unit in split_annexb(packet):
        kind = nal_unit_type(unit)
        if kind not in _PARAMETER_AND_DELIMITER_NALS:
            units.append(unit)
        elif kind != NAL_AUD and parameter_sets is not None and unit not in parameter_sets:
            raise ValueError(f"in-band parameter set (NAL type {kind}) differs from the avcC's")
    return length_prefixed(units)


def _rbsp(unit: bytes) -> bytes:
    """The NAL payload with emulation prevention bytes (00 00 03 -> 00 00) removed."""
    return unit.replace(b"\x00\x00\x03", b"\x00\x00")


class _BitReader:
    __slots__ = ("_data", "_position")

    def __init__(self, data: bytes) -> None:
        self._data, self._position = data, 0

    def bit(self) -> int:
        byte_index = self._position >> 3
        if byte_index >= len(self._data):
            raise ValueError("SPS ends early")
        value = (self._data[byte_index] >> (7 - (self._position & 7))) & 1
        self._position += 1
        return value

    def bits(self, count: int) -> int:
        value = 0
        for _ in range(count):
            value = (value << 1) | self.bit()
        return value

    def ue(self) -> int:
        """Unsigned Exp-Golomb code (H.264 9.1)."""
        leading_zeros = 0
        while self.bit() == 0:
            leading_zeros += 1
            if leading_zeros > 31:
                raise ValueError("malformed Exp-Golomb code in SPS")
        return (1 << leading_zeros) - 1 + self.bits(leading_zeros)


@dataclass(frozen=True, slots=True)
class SequenceParameterSet:
    """The SPS fields that avcC and the RFC 6381 codec string need."""

    profile_idc: int
    constraint_flags: int
    level_idc: int
    chroma_format_idc: int
    bit_depth_luma: int
    bit_depth_chroma: int

    @property
    def codec_string(self) -> str:
        return f"avc1.{self.profile_idc:02X}{self.constraint_flags:02X}{self.level_idc:02X}"


def parse_sps(unit: bytes) -> SequenceParameterSet:
    """Read the head of an SPS NAL unit (header byte included)."""
    if not unit or nal_unit_type(unit) != NAL_SPS:
        raise ValueError("not an SPS NAL unit")
    rbsp = _rbsp(unit)
    if len(rbsp) < 5:
        raise ValueError("SPS too short")
    profile_idc, constraint_flags, level_idc = rbsp[1], rbsp[2], rbsp[3]
    # Other profiles imply 4:2:0 8-bit (H.264 7.4.2.1.1).
    chroma_format_idc, bit_depth_luma, bit_depth_chroma = 1, 8, 8
    if profile_idc in _HIGH_PROFILES_WITH_CHROMA_INFO | _OTHER_PROFILES_WITH_CHROMA_INFO:
        reader = _BitReader(rbsp[4:])
        reader.ue()  # seq_parameter_set_id
        chroma_format_idc = reader.ue()
        if chroma_format_idc == 3:
            reader.bit()  # separate_colour_plane_flag
        bit_depth_luma = reader.ue() + 8
        bit_depth_chroma = reader.ue() + 8
    return SequenceParameterSet(
        profile_idc,
        constraint_flags,
        level_idc,
        chroma_format_idc,
        bit_depth_luma,
        bit_depth_chroma,
    )


def parse_sps_codec_string(unit: bytes) -> str:
    """RFC 6381 `avc1.PPCCLL` for an SPS NAL unit, e.g. `avc1.42C01E`."""
    return parse_sps(unit).codec_string


def avc_decoder_configuration_record(
    sps_units: Sequence[bytes], pps_units: Sequence[bytes]
) -> bytes:
    """AVCDecoderConfigurationRecord (ISO/IEC 14496-15 5.3.3.1), the avcC payload."""
    if not sps_units or not pps_units:
        raise ValueError("avcC needs at least one SPS and one PPS")
    sps = parse_sps(sps_units[0])
    record = bytearray(
        [
            1,  # configurationVersion
            sps.profile_idc,  # AVCProfileIndication
            sps.constraint_flags,  # profile_compatibility
            sps.level_idc,  # AVCLevelIndication
            0xFC | (NAL_LENGTH_SIZE - 1),  # reserved '111111' + lengthSizeMinusOne
            0xE0 | len(sps_units),  # reserved '111' + numOfSequenceParameterSets
        ]
    )
    for unit in sps_units:
        record += struct.pack(">H", len(unit)) + unit
    record.append(len(pps_units))
    for unit in pps_units:
        record += struct.pack(">H", len(unit)) + unit
    if sps.profile_idc in _HIGH_PROFILES_WITH_CHROMA_INFO:
        record += bytes(
            [
                0xFC | sps.chroma_format_idc,
                0xF8 | (sps.bit_depth_luma - 8),
                0xF8 | (sps.bit_depth_chroma - 8),
                0,  # numOfSequenceParameterSetExt
            ]
        )
    return bytes(record)


def parse_avc_decoder_configuration_record(avcc: bytes) -> tuple[list[bytes], list[bytes]]:
    """(SPS units, PPS units) of an avcC payload."""
    if len(avcc) < 7 or avcc[0] != 1:
        raise ValueError("not an AVCDecoderConfigurationRecord")
    position = 5

    def read_units(count: int) -> list[bytes]:
        nonlocal position
        units = []
        for _ in range(count):
            if position + 2 > len(avcc):
                raise ValueError("truncated avcC")
            (length,) = struct.unpack_from(">H", avcc, position)
            position += 2
            if position + length > len(avcc):
                raise ValueError("truncated avcC")
            units.append(avcc[position : position + length])
            position += length
        return units

    sps_count = avcc[position] & 0x1F
    position += 1
    sps_units = read_units(sps_count)
    if position >= len(avcc):
        raise ValueError("truncated avcC")
    pps_count = avcc[position]
    position += 1
    return sps_units, read_units(pps_count)
