"""H.264 encoding of RGB frames into fMP4-ready samples, through libx264 in PyAV.

The encoder is PyAV's bare `CodecContext` (no container: `fmp4.py` writes the
boxes). Two settings carry the streaming design:
- `tune=zerolatency`: no lookahead and no B-frames, so every frame in gives its
  packet out at once and a chunk's frames all land in that chunk's fragment. The
  alternative, draining the encoder at each chunk end, ends it for good.
- `GLOBAL_HEADER`: SPS/PPS go to `extradata` at `open()`, so the avcC (and the
  init segment) exist before the first frame is decoded, and keyframes do not
  repeat them. Any SPS/PPS/AUD that still shows up in a packet is dropped from the
  sample (after checking it repeats the avcC's): the avcC is where an `avc1`
  track declares its parameter sets.

Defaults, measured 2026-11-29 on this machine (2 cores, x264 build 165) with
benchmarks/encode_presets.py: 832x480, tune=zerolatency, frames/s including the
RGB->YUV conversion, bitrate at 16 fps. Two clips bracket VAE output: a smooth
drifting gradient, and the same with per-pixel texture (sigma 4 levels). The
machine was shared with other jobs (load ~2.5), so these are pessimistic; an
earlier run on the idle machine gave ultrafast ~145-165, superfast ~90-130,
veryfast ~65-98 fps.

    preset     crf   smooth fps  Mbit/s   textured fps  Mbit/s
    ultrafast   20      110       0.68        67         5.61
    ultrafast   23       92       0.48        83         2.14
    ultrafast   26       97       0.45        89         0.57
    superfast   23       66       0.41        58         3.77
    veryfast    23       44       0.55        45         2.28

The encoder shares these 2 cores with the decoder (the small VAE decodes 480x832
at ~13 fps), so the default is ultrafast, the only preset with room to spare on a
loaded machine: ~1.5-2x the throughput of superfast/veryfast, and its Constrained
Baseline profile (avc1.42C0xx) is the most widely decodable. CRF 23 is x264's
own default quality point (~36-38 dB on smooth test clips); ultrafast spends more
bits for it than the slower presets (no CABAC, no B-frames), a price paid in
bandwidth rather than latency. A keyframe every 2 s bounds how far a viewer
seeking into the stream has to decode.

Colour: RGB is converted to yuv420p with the BT.601 matrix in limited (MPEG)
range by swscale, and the same is written into the SPS VUI, so players invert
exactly what was applied.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from fractions import Fraction

import av
import numpy as np
from av.codec.context import Flags
from av.video.frame import PictureType
from av.video.reformatter import ColorPrimaries, ColorRange, Colorspace, ColorTrc

from vaecast.codecs.colour import Yuv420Frames
from vaecast.codecs.fmp4 import Sample

DEFAULT_PRESET = "ultrafast"
DEFAULT_CRF = 23
DEFAULT_KEYFRAME_INTERVAL_S = 2.0

# Media timescales are 32-bit in mdhd.
_MAX_TIMESCALE_HZ = 0xFFFFFFFF
# Frame durations of at least this many ticks keep timestamps exact and fine-grained.
_MIN_FRAME_DURATION_TICKS = 1000

# nal_unit_type values (ITU-T H.264 Table 7-1).
NAL_IDR_SLICE = 5
NAL_SEI = 6
NAL_SPS = 7
NAL_PPS = 8
NAL_AUD = 9
_PARAMETER_AND_DELIMITER_NALS = frozenset({NAL_SPS, NAL_PPS, NAL_AUD})

# FFmpeg's AVColorSpace for the BT.601 (525-line) matrix. PyAV's `Colorspace` enum
# holds swscale's SWS_CS_* numbers, where 5 is BT.601 but AVColorSpace 5 would
# tag BT.470BG; the matrices agree, the tag should match the primaries/trc below.
_AVCOL_SPC_SMPTE170M = 6

# Profiles whose SPS (and so avcC) carries chroma format and bit depths.
_HIGH_PROFILES_WITH_CHROMA_INFO = frozenset({100, 110, 122, 144})

# Bytes in each NAL unit's length prefix in the samples (avcC lengthSizeMinusOne + 1).
NAL_LENGTH_SIZE = 4


@dataclass(frozen=True, slots=True)
class EncoderSettings:
    """x264 knobs a deployment may change; see the module docstring for why these."""

    preset: str = DEFAULT_PRESET
    crf: int = DEFAULT_CRF
    keyframe_interval_s: float = DEFAULT_KEYFRAME_INTERVAL_S

    def __post_init__(self) -> None:
        if not 0 <= self.crf <= 51:
            raise ValueError(f"crf must be in 0..51, got {self.crf}")
        if not self.keyframe_interval_s > 0:
            raise ValueError(f"keyframe_interval_s must be > 0, got {self.keyframe_interval_s}")


def media_timescale(fps: Fraction) -> tuple[int, int]:
    """(timescale, frame_duration) in integer ticks with fps == timescale / frame_duration.

    The frame duration is scaled up to at least 1000 ticks so that integer
    timestamps stay exact and readable: 16 fps -> (16000, 1000), 30000/1001 ->
    (30000, 1001), 25/2 -> (12500, 1000).
    """
    fps = Fraction(fps)
    if fps <= 0:
        raise ValueError(f"fps must be positive, got {fps}")
    factor = math.ceil(_MIN_FRAME_DURATION_TICKS / fps.denominator)
    timescale, frame_duration = fps.numerator * factor, fps.denominator * factor
    if timescale > _MAX_TIMESCALE_HZ:
        raise ValueError(f"fps {fps} needs a timescale of {timescale} Hz, over 32 bits")
    return timescale, frame_duration


# ---------------------------------------------------------------------------
# Pure bitstream helpers (no PyAV)


def split_annexb(data: bytes) -> list[bytes]:
    """NAL units of an Annex B byte stream (3- or 4-byte start codes), in order."""
    starts: list[int] = []
    index = data.find(b"\x00\x00\x01")
    while index != -1:
        starts.append(index + 3)
        index = data.find(b"\x00\x00\x01", index + 3)
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
    if profile_idc in _HIGH_PROFILES_WITH_CHROMA_INFO or profile_idc in {244, 44, 83, 86, 118}:
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


def annexb_to_sample(packet: bytes, parameter_sets: Collection[bytes] | None = None) -> bytes:
    """An Annex B access unit as an `avc1` sample, without in-band SPS/PPS/AUD.

    With `parameter_sets` (the avcC's SPS and PPS), an in-band SPS/PPS must repeat
    one of them: a new one would change the stream mid-track, which the init
    segment's single sample entry cannot express, so it raises ValueError.
    """
    units = []
    for unit in split_annexb(packet):
        kind = nal_unit_type(unit)
        if kind not in _PARAMETER_AND_DELIMITER_NALS:
            units.append(unit)
        elif kind != NAL_AUD and parameter_sets is not None and unit not in parameter_sets:
            raise ValueError(f"in-band parameter set (NAL type {kind}) differs from the avcC's")
    return length_prefixed(units)


# ---------------------------------------------------------------------------
# The encoder (the only PyAV encoder in vaecast)


class H264Encoder:
    """One libx264 encoder for one whole stream; frames in, `Sample`s out.

    Not thread-safe by design: a stream owns one encoder and calls it from one
    thread at a time (the server runs `encode` in an executor, one job at a time).
    The codec is never drained mid-stream: draining ends it for good, and
    zerolatency makes it unnecessary.
    """

    def __init__(
        self,
        width: int,
        height: int,
        fps: Fraction,
        settings: EncoderSettings = EncoderSettings(),
    ) -> None:
        if width <= 0 or height <= 0 or width % 2 or height % 2:
            # yuv420p subsamples chroma 2x2, so x264 needs even dimensions.
            raise ValueError(f"width and height must be positive and even, got {width}x{height}")
        self.width, self.height = width, height
        self.fps = Fraction(fps)
        self.settings = settings
        self.timescale, self.frame_duration = media_timescale(self.fps)
        self.keyframe_interval_frames = max(1, round(settings.keyframe_interval_s * self.fps))
        self.frames_encoded = 0

        context = av.CodecContext.create("libx264", "w")
        context.width, context.height = width, height
        context.pix_fmt = "yuv420p"
        context.time_base = Fraction(1, self.timescale)
        context.framerate = self.fps
        context.gop_size = self.keyframe_interval_frames
        context.max_b_frames = 0
        context.flags |= Flags.global_header
        # What goes into the SPS VUI: the conversion in _to_yuv applies exactly this.
        context.colorspace = _AVCOL_SPC_SMPTE170M
        context.color_range = ColorRange.MPEG
        context.color_primaries = ColorPrimaries.SMPTE170M
        context.color_trc = ColorTrc.SMPTE170M
        context.options = {
            "preset": settings.preset,
            "tune": "zerolatency",
            "crf": str(settings.crf),
        }
        context.open()
        self._context: av.VideoCodecContext | None = context

        units = split_annexb(bytes(context.extradata or b""))
        sps_units = [u for u in units if nal_unit_type(u) == NAL_SPS]
        pps_units = [u for u in units if nal_unit_type(u) == NAL_PPS]
        if not sps_units or not pps_units:
            raise RuntimeError("libx264 gave no SPS/PPS in extradata despite GLOBAL_HEADER")
        self._parameter_sets = frozenset(sps_units + pps_units)
        self.avcc = avc_decoder_configuration_record(sps_units, pps_units)
        self.codec_string = parse_sps_codec_string(sps_units[0])

    def check_frames(self, frames: np.ndarray | Yuv420Frames) -> None:
        """Raise ValueError unless `frames` is (T, H, W, 3) uint8 RGB or `Yuv420Frames`
        at this encoder's size."""
        if isinstance(frames, Yuv420Frames):
            if (frames.height, frames.width) != (self.height, self.width):
                raise ValueError(
                    f"YUV 4:2:0 frames must be {self.width}x{self.height}, "
                    f"got {frames.width}x{frames.height}"
                )
            return
        expected = (self.height, self.width, 3)
        if (
            not isinstance(frames, np.ndarray)
            or frames.dtype != np.uint8
            or frames.ndim != 4
            or frames.shape[1:] != expected
        ):
            shape = getattr(frames, "shape", None)
            dtype = getattr(frames, "dtype", type(frames).__name__)
            raise ValueError(
                f"frames must be a uint8 array of shape (T, {self.height}, {self.width}, 3), "
                f"got {dtype} {shape}"
            )

    def encode(self, frames: np.ndarray | Yuv420Frames) -> list[Sample]:
        """Encode (T, H, W, 3) uint8 RGB frames, or `Yuv420Frames` (BT.601 limited
        range, as the stream declares: no conversion left to do); one Sample per
        frame, in order."""
        if self._context is None:
            raise RuntimeError("encoder is closed")
        self.check_frames(frames)
        samples = []
        for index in range(len(frames)):
            if isinstance(frames, Yuv420Frames):
                frame = self._from_i420(frames.planes[index])
            else:
                frame = self._to_yuv(frames[index])
            frame.pts = self.frames_encoded * self.frame_duration
            if self.frames_encoded % self.keyframe_interval_frames == 0:
                # Keyframes at fixed positions, whatever x264's scenecut does between.
                frame.pict_type = PictureType.I
            packets = self._context.encode(frame)
            if len(packets) != 1:
                raise RuntimeError(
                    f"libx264 returned {len(packets)} packets for one frame; "
                    "zerolatency should give exactly one"
                )
            (packet,) = packets
            composition_offset = 0
            if packet.pts is not None and packet.dts is not None:
                composition_offset = packet.pts - packet.dts
            if composition_offset:
                raise RuntimeError(
                    f"unexpected frame reordering (pts - dts = {composition_offset})"
                )
            samples.append(
                Sample(
                    data=annexb_to_sample(bytes(packet), self._parameter_sets),
                    duration=self.frame_duration,
                    is_sync=packet.is_keyframe,
                    composition_offset=composition_offset,
                )
            )
            self.frames_encoded += 1
        return samples

    def _to_yuv(self, rgb: np.ndarray) -> av.VideoFrame:
        frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")
        return frame.reformat(
            format="yuv420p",
            dst_colorspace=Colorspace.ITU601,
            dst_color_range=ColorRange.MPEG,
        )

    def _from_i420(self, planes: np.ndarray) -> av.VideoFrame:
        frame = av.VideoFrame.from_ndarray(planes, format="yuv420p")
        # Tags only, as reformat() leaves them on the swscale path; the VUI comes
        # from the codec context either way.
        frame.colorspace = Colorspace.ITU601
        frame.color_range = ColorRange.MPEG
        return frame

    def close(self) -> None:
        """Release the codec; later calls to close() do nothing."""
        # PyAV has no explicit close for a CodecContext: dropping the last
        # reference frees the x264 encoder (deterministically, by refcount).
        self._context = None
