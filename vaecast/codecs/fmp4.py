"""Fragmented MP4 (ISO/IEC 14496-12) boxes, written and read without I/O.

Why we write boxes ourselves: PyAV's mp4 muxer on a non-seekable sink can only
fragment with `frag_keyframe`, which emits a chunk's fragment when the *next*
keyframe arrives (one chunk late); `frag_every_frame` is a frame late,
`frag_custom` emits nothing until the muxer closes, and PyAV has no call that
flushes a fragment (it never calls `av_write_frame(ctx, NULL)`; see
FIELD_NOTES.md). vaecast's latency promise is "a chunk is playable as soon as it
is encoded", so each chunk becomes exactly one `moof`+`mdat` written here.

Everything is built from `box()` and `full_box()`; the one offset that matters
(`trun.data_offset`, the distance from the `moof` to a run's first sample byte) is
computed from the lengths of the boxes actually built. Names of fields follow the
spec (`base_media_decode_time`, `sample_composition_time_offset`, ...).

Tracks are a closed union (`Track`) dispatched in `_trak`: an audio track type
(mp4a/esds, `smhd`, handler `soun`) slots in there and in `_parse_trak` without
changing `init_segment`, `fragment` or `TrackRun`.

The reader half (`iter_boxes`, `parse_init_segment`, `parse_fragment`,
`TopLevelBoxSplitter`) exists for tests and tools; it reads what this module
writes plus the common optional fields of other writers, and raises ValueError on
anything truncated or malformed rather than guessing.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TypeAlias

# The 32-bit size field cannot describe boxes this large; they get a 64-bit largesize.
_MAX_32BIT_BOX_BYTES = 0xFFFFFFFF

# Movie-level clock (mvhd); only used for durations, which are 0 in a fragmented
# movie, so its value is conventional (1 ms ticks, as ffmpeg writes).
MOVIE_TIMESCALE_HZ = 1000

# ISO/IEC 14496-12 8.8.3.1 sample_flags.
SAMPLE_FLAGS_SYNC = 0x02000000  # sample_depends_on = 2 (depends on no other sample)
SAMPLE_FLAGS_NON_SYNC = 0x01010000  # sample_depends_on = 1, sample_is_non_sync_sample = 1
_SAMPLE_IS_NON_SYNC_SAMPLE = 0x00010000

# tfhd tf_flags (8.8.7.1).
TFHD_BASE_DATA_OFFSET_PRESENT = 0x000001
TFHD_SAMPLE_DESCRIPTION_INDEX_PRESENT = 0x000002
TFHD_DEFAULT_SAMPLE_DURATION_PRESENT = 0x000008
TFHD_DEFAULT_SAMPLE_SIZE_PRESENT = 0x000010
TFHD_DEFAULT_SAMPLE_FLAGS_PRESENT = 0x000020
TFHD_DEFAULT_BASE_IS_MOOF = 0x020000

# trun tr_flags (8.8.8.1).
TRUN_DATA_OFFSET_PRESENT = 0x000001
TRUN_FIRST_SAMPLE_FLAGS_PRESENT = 0x000004
TRUN_SAMPLE_DURATION_PRESENT = 0x000100
TRUN_SAMPLE_SIZE_PRESENT = 0x000200
TRUN_SAMPLE_FLAGS_PRESENT = 0x000400
TRUN_SAMPLE_COMPOSITION_TIME_OFFSET_PRESENT = 0x000800

# 0x00010000 is 1.0 in 16.16 fixed point; the unity matrix of mvhd/tkhd (8.2.2.3).
_FIXED_16_16_ONE = 0x00010000
_UNITY_MATRIX = struct.pack(">9i", 0x00010000, 0, 0, 0, 0x00010000, 0, 0, 0, 0x40000000)
# ISO-639-2/T "und", packed as three 5-bit letters (mdhd.language).
_LANGUAGE_UND = ((ord("u") - 0x60) << 10) | ((ord("n") - 0x60) << 5) | (ord("d") - 0x60)

# Brands Chromium's MSE and plain <video> accept for avc1 in fragmented MP4.
FTYP_MAJOR_BRAND = b"isom"
FTYP_MINOR_VERSION = 0x200
FTYP_COMPATIBLE_BRANDS = (b"isom", b"iso6", b"avc1", b"mp41")


# ---------------------------------------------------------------------------
# Values


@dataclass(frozen=True, slots=True)
class Sample:
    """One access unit: `data` is the length-prefixed AVC sample (or any codec's)."""

    data: bytes
    duration: int
    is_sync: bool
    composition_offset: int = 0


@dataclass(frozen=True, slots=True)
class VideoTrack:
    """An H.264 video track; `avcc` is the AVCDecoderConfigurationRecord payload."""

    track_id: int
    timescale: int
    width: int
    height: int
    avcc: bytes


@dataclass(frozen=True, slots=True)
class AudioTrack:
    """An AAC track; `audio_specific_config` is the MPEG-4 AudioSpecificConfig.

    Its timescale is the sample rate, so sample durations count audio samples.
    """

    track_id: int
    sample_rate: int
    channels: int
    audio_specific_config: bytes

    @property
    def timescale(self) -> int:
        return self.sample_rate


# The track types init_segment() knows.
Track: TypeAlias = VideoTrack | AudioTrack


@dataclass(frozen=True, slots=True)
class TrackRun:
    """The samples of one track inside one fragment, starting at its decode time."""

    track_id: int
    base_media_decode_time: int
    samples: Sequence[Sample]


# ---------------------------------------------------------------------------
# Writer


def box(fourcc: bytes, *payloads: bytes) -> bytes:
    """One box: size, type, then the payloads concatenated."""
    if len(fourcc) != 4:
        raise ValueError(f"box type must be 4 bytes, got {fourcc!r}")
    body = b"".join(payloads)
    size = 8 + len(body)
    if size > _MAX_32BIT_BOX_BYTES:
        # size == 1 announces a 64-bit largesize after the type.
        return struct.pack(">I4sQ", 1, fourcc, size + 8) + body
    return struct.pack(">I4s", size, fourcc) + body


def full_box(fourcc: bytes, version: int, flags: int, *payloads: bytes) -> bytes:
    """A FullBox: a box whose payload starts with an 8-bit version and 24-bit flags."""
    if not 0 <= version <= 0xFF or not 0 <= flags <= 0xFFFFFF:
        raise ValueError(f"version {version} / flags {flags:#x} out of range")
    return box(fourcc, struct.pack(">I", (version << 24) | flags), *payloads)


def _u32(value: int) -> bytes:
    return struct.pack(">I", value)


def ftyp() -> bytes:
    return box(
        b"ftyp",
        FTYP_MAJOR_BRAND,
        _u32(FTYP_MINOR_VERSION),
        *FTYP_COMPATIBLE_BRANDS,
    )


def mvhd(next_track_id: int) -> bytes:
    return full_box(
        b"mvhd",
        0,
        0,
        struct.pack(">IIII", 0, 0, MOVIE_TIMESCALE_HZ, 0),  # creation, modification, ts, dur
        struct.pack(">iH", _FIXED_16_16_ONE, 0x0100),  # rate 1.0, volume 1.0
        bytes(2 + 4 * 2),  # reserved
        _UNITY_MATRIX,
        bytes(4 * 6),  # pre_defined
        _u32(next_track_id),
    )


def tkhd(track_id: int, width: int, height: int, volume: int) -> bytes:
    # flags 0x3 = track_enabled | track_in_movie: a player shows the track.
    return full_box(
        b"tkhd",
        0,
        0x000003,
        struct.pack(">IIII", 0, 0, track_id, 0),  # creation, modification, track_ID, reserved
        _u32(0),  # duration: unknown up front, fragments carry the samples
        bytes(4 * 2),  # reserved
        struct.pack(">hhhH", 0, 0, volume, 0),  # layer, alternate_group, volume, reserved
        _UNITY_MATRIX,
        struct.pack(">II", width << 16, height << 16),  # 16.16 fixed point
    )


def mdhd(timescale: int) -> bytes:
    return full_box(
        b"mdhd",
        0,
        0,
        struct.pack(">IIII", 0, 0, timescale, 0),  # creation, modification, timescale, dur
        struct.pack(">HH", _LANGUAGE_UND, 0),  # pad + language, pre_defined
    )


def hdlr(handler_type: bytes, name: str) -> bytes:
    return full_box(
        b"hdlr",
        0,
        0,
        _u32(0),  # pre_defined
        handler_type,
        bytes(4 * 3),  # reserved
        name.encode("utf-8") + b"\0",
    )


def dinf() -> bytes:
    # One self-contained data reference (flags 1): samples live in this file.
    return box(b"dinf", full_box(b"dref", 0, 0, _u32(1), full_box(b"url ", 0, 0x000001)))


def avc1(track: VideoTrack) -> bytes:
    """VisualSampleEntry 'avc1' (14496-12 12.1.3, 14496-15 5.4.2) with its avcC."""
    compressorname = bytes(32)  # Pascal string, empty
    return box(
        b"avc1",
        bytes(6),  # reserved
        struct.pack(">H", 1),  # data_reference_index -> the dref entry above
        bytes(2 + 2 + 4 * 3),  # pre_defined, reserved, pre_defined
        struct.pack(">HH", track.width, track.height),
        struct.pack(">II", 0x00480000, 0x00480000),  # 72 dpi, as the spec fixes
        _u32(0),  # reserved
        struct.pack(">H", 1),  # frame_count: one frame per sample
        compressorname,
        struct.pack(">Hh", 0x0018, -1),  # depth 24 (colour, no alpha), pre_defined
        box(b"avcC", track.avcc),
    )


# MPEG-4 Systems (14496-1) descriptor tags and values used by esds.
_ES_DESCRIPTOR_TAG = 0x03
_DECODER_CONFIG_DESCRIPTOR_TAG = 0x04
_DECODER_SPECIFIC_INFO_TAG = 0x05
_SL_CONFIG_DESCRIPTOR_TAG = 0x06
_OBJECT_TYPE_MPEG4_AUDIO = 0x40
_STREAM_TYPE_AUDIO = 0x05
_SL_PREDEFINED_MP4 = 0x02


def _descriptor(tag: int, *payloads: bytes) -> bytes:
    """A 14496-1 descriptor: tag, size as 7-bit groups (high bit = more), payload."""
    body = b"".join(payloads)
    size, groups = len(body), []
    while True:
        groups.append(size & 0x7F)
        size >>= 7
        if not size:
            break
    size_bytes = bytes(g | 0x80 for g in reversed(groups[1:])) + bytes([groups[0]])
    return bytes([tag]) + size_bytes + body


def esds(track: AudioTrack) -> bytes:
    """The elementary stream descriptor of an AAC track (14496-14 5.6)."""
    decoder_config = _descriptor(
        _DECODER_CONFIG_DESCRIPTOR_TAG,
        struct.pack(">B", _OBJECT_TYPE_MPEG4_AUDIO),
        # streamType (6 bits), upStream 0, reserved 1.
        struct.pack(">B", (_STREAM_TYPE_AUDIO << 2) | 1),
        bytes(3),  # bufferSizeDB: unknown
        struct.pack(">II", 0, 0),  # maxBitrate, avgBitrate: unknown
        _descriptor(_DECODER_SPECIFIC_INFO_TAG, track.audio_specific_config),
    )
    es = _descriptor(
        _ES_DESCRIPTOR_TAG,
        struct.pack(">HB", 0, 0),  # ES_ID (0 in MP4 files), no optional fields
        decoder_config,
        _descriptor(_SL_CONFIG_DESCRIPTOR_TAG, bytes([_SL_PREDEFINED_MP4])),
    )
    return full_box(b"esds", 0, 0, es)


def mp4a(track: AudioTrack) -> bytes:
    """AudioSampleEntry 'mp4a' (14496-12 12.2.3, 14496-14 5.6) with its esds."""
    return box(
        b"mp4a",
        bytes(6),  # reserved
        struct.pack(">H", 1),  # data_reference_index
        bytes(4 * 2),  # reserved
        struct.pack(">HH", track.channels, 16),  # channelcount, samplesize
        struct.pack(">HH", 0, 0),  # pre_defined, reserved
        _u32(track.sample_rate << 16),  # samplerate, 16.16 fixed point
        esds(track),
    )


def _empty_sample_tables(sample_entry: bytes) -> bytes:
    # A fragmented movie keeps no samples in moov; the tables exist, each empty.
    return box(
        b"stbl",
        full_box(b"stsd", 0, 0, _u32(1), sample_entry),
        full_box(b"stts", 0, 0, _u32(0)),
        full_box(b"stsc", 0, 0, _u32(0)),
        full_box(b"stsz", 0, 0, _u32(0), _u32(0)),  # sample_size, sample_count
        full_box(b"stco", 0, 0, _u32(0)),
    )


def _trak(track: Track) -> bytes:
    match track:
        case VideoTrack():
            header = tkhd(track.track_id, track.width, track.height, volume=0)
            handler = hdlr(b"vide", "VideoHandler")
            # vmhd flags must be 1 (14496-12 12.1.2.2); graphicsmode copy, opcolor 0.
            media_header = full_box(b"vmhd", 0, 0x000001, bytes(2 + 2 * 3))
            sample_entry = avc1(track)
        case AudioTrack():
            header = tkhd(track.track_id, 0, 0, volume=0x0100)  # volume 1.0 (8.8)
            handler = hdlr(b"soun", "SoundHandler")
            media_header = full_box(b"smhd", 0, 0, bytes(2 + 2))  # balance, reserved
            sample_entry = mp4a(track)
        case _:
            raise TypeError(f"unsupported track type {type(track).__name__}")
    minf = box(b"minf", media_header, dinf(), _empty_sample_tables(sample_entry))
    return box(b"trak", header, box(b"mdia", mdhd(track.timescale), handler, minf))


def trex(track_id: int) -> bytes:
    # Defaults are unused: every trun carries its own durations, sizes and flags.
    return full_box(b"trex", 0, 0, struct.pack(">IIIII", track_id, 1, 0, 0, 0))


def init_segment(tracks: Sequence[Track]) -> bytes:
    """ftyp + moov for a fragmented movie of `tracks` (durations 0, samples in moofs)."""
    if not tracks:
        raise ValueError("an init segment needs at least one track")
    ids = [track.track_id for track in tracks]
    if len(set(ids)) != len(ids) or min(ids) < 1:
        raise ValueError(f"track ids must be unique and >= 1, got {ids}")
    moov = box(
        b"moov",
        mvhd(next_track_id=max(ids) + 1),
        *(_trak(track) for track in tracks),
        box(b"mvex", *(trex(track.track_id) for track in tracks)),
    )
    return ftyp() + moov


def mfhd(sequence_number: int) -> bytes:
    return full_box(b"mfhd", 0, 0, _u32(sequence_number))


def tfhd(track_id: int) -> bytes:
    # default-base-is-moof: data offsets count from this moof's first byte, so a
    # fragment is self-contained and can be cut out or appended anywhere (MSE).
    return full_box(b"tfhd", 0, TFHD_DEFAULT_BASE_IS_MOOF, _u32(track_id))


def tfdt(base_media_decode_time: int) -> bytes:
    # Version 1 (64-bit) so a long stream in a fine timescale never wraps.
    return full_box(b"tfdt", 1, 0, struct.pack(">Q", base_media_decode_time))


def trun(data_offset: int, samples: Sequence[Sample]) -> bytes:
    # Version 1 makes composition offsets signed; only needed when one is negative,
    # and version 0 is what every player has handled longest.
    version = 1 if any(s.composition_offset < 0 for s in samples) else 0
    offset_format = "i" if version else "I"
    flags = (
        TRUN_DATA_OFFSET_PRESENT
        | TRUN_SAMPLE_DURATION_PRESENT
        | TRUN_SAMPLE_SIZE_PRESENT
        | TRUN_SAMPLE_FLAGS_PRESENT
        | TRUN_SAMPLE_COMPOSITION_TIME_OFFSET_PRESENT
    )
    entries = b"".join(
        struct.pack(
            ">III" + offset_format,
            s.duration,
            len(s.data),
            SAMPLE_FLAGS_SYNC if s.is_sync else SAMPLE_FLAGS_NON_SYNC,
            s.composition_offset,
        )
        for s in samples
    )
    return full_box(b"trun", version, flags, struct.pack(">Ii", len(samples), data_offset), entries)


def _moof(sequence_number: int, runs: Sequence[TrackRun], data_offsets: Sequence[int]) -> bytes:
    trafs = (
        box(
            b"traf", tfhd(run.track_id), tfdt(run.base_media_decode_time), trun(offset, run.samples)
        )
        for run, offset in zip(runs, data_offsets, strict=True)
    )
    return box(b"moof", mfhd(sequence_number), *trafs)


def fragment(sequence_number: int, runs: Sequence[TrackRun]) -> bytes:
    """moof + one mdat holding every run's samples, runs in the order given."""
    if not runs:
        raise ValueError("a fragment needs at least one track run")
    if sequence_number < 1:
        raise ValueError(f"sequence_number must be >= 1, got {sequence_number}")
    mdat = box(b"mdat", *(sample.data for run in runs for sample in run.samples))
    mdat_header_size = len(mdat) - sum(len(s.data) for run in runs for s in run.samples)
    # Offsets of each run inside the mdat payload, from the real sample lengths.
    run_starts, position = [], 0
    for run in runs:
        run_starts.append(position)
        position += sum(len(sample.data) for sample in run.samples)
    # The moof's length does not depend on the data_offset values (fixed-width
    # fields), so build it once to learn its length, then again with real offsets.
    moof_size = len(_moof(sequence_number, runs, [0] * len(runs)))
    offsets = [moof_size + mdat_header_size + start for start in run_starts]
    moof = _moof(sequence_number, runs, offsets)
    if len(moof) != moof_size:
        raise AssertionError("moof length changed with its data offsets")
    return moof + mdat


# ---------------------------------------------------------------------------
# Reader


@dataclass(frozen=True, slots=True)
class Box:
    """Where a box lies in a buffer: `offset` of its first byte, total `size`."""

    type: str
    offset: int
    size: int
    header_size: int

    @property
    def payload_offset(self) -> int:
        return self.offset + self.header_size

    @property
    def end(self) -> int:
        return self.offset + self.size

    def payload(self, data: bytes) -> bytes:
        return bytes(data[self.payload_offset : self.end])


def _parse_box_header(data: bytes | bytearray, offset: int, end: int) -> tuple[str, int, int]:
    """(type, size, header_size) of the box at `offset`; size 0 means "to the end"."""
    if end - offset < 8:
        raise ValueError(f"truncated box header at offset {offset}: {end - offset} bytes left")
    size, raw_type = struct.unpack_from(">I4s", data, offset)
    if any(byte < 0x20 or byte == 0x7F for byte in raw_type):
        raise ValueError(f"not a box at offset {offset}: type bytes {raw_type!r}")
    header_size = 8
    if size == 1:
        if end - offset < 16:
            raise ValueError(f"truncated largesize at offset {offset}")
        (size,) = struct.unpack_from(">Q", data, offset + 8)
        header_size = 16
    if raw_type == b"uuid":
        header_size += 16  # extended_type follows
    if size != 0 and size < header_size:
        raise ValueError(f"box {raw_type!r} at offset {offset} has impossible size {size}")
    return raw_type.decode("latin-1"), size, header_size


def iter_boxes(data: bytes | bytearray, start: int = 0, end: int | None = None) -> Iterator[Box]:
    """The boxes that tile data[start:end] exactly, in order (not descending into them)."""
    end = len(data) if end is None else end
    offset = start
    while offset < end:
        box_type, size, header_size = _parse_box_header(data, offset, end)
        if size == 0:
            size = end - offset
        if offset + size > end:
            raise ValueError(
                f"truncated box {box_type!r} at offset {offset}: size {size}, "
                f"{end - offset} bytes available"
            )
        yield Box(box_type, offset, size, header_size)
        offset += size


def children(data: bytes | bytearray, parent: Box, skip: int = 0) -> list[Box]:
    """The boxes inside `parent`, after `skip` bytes of its own fields."""
    return list(iter_boxes(data, parent.payload_offset + skip, parent.end))


def find_child(data: bytes | bytearray, parent: Box, box_type: str, skip: int = 0) -> Box:
    for child in children(data, parent, skip):
        if child.type == box_type:
            return child
    raise ValueError(f"{parent.type!r} at offset {parent.offset} has no {box_type!r}")


def _full_box_header(data: bytes | bytearray, b: Box) -> tuple[int, int]:
    if b.size - b.header_size < 4:
        raise ValueError(f"full box {b.type!r} at offset {b.offset} too short")
    (word,) = struct.unpack_from(">I", data, b.payload_offset)
    return word >> 24, word & 0xFFFFFF


class _Cursor:
    """Reads big-endian fields from a box payload; raises ValueError past its end."""

    __slots__ = ("_data", "_end", "pos")

    def __init__(self, data: bytes | bytearray, start: int, end: int) -> None:
        self._data, self.pos, self._end = data, start, end

    def read(self, fmt: str) -> tuple[int, ...]:
        size = struct.calcsize(">" + fmt)
        if self.pos + size > self._end:
            raise ValueError(f"box field runs past its box end at offset {self.pos}")
        values = struct.unpack_from(">" + fmt, self._data, self.pos)
        self.pos += size
        return values

    def one(self, fmt: str) -> int:
        return self.read(fmt)[0]


@dataclass(frozen=True, slots=True)
class InitSegment:
    major_brand: str
    compatible_brands: tuple[str, ...]
    tracks: tuple[Track, ...]


def parse_init_segment(data: bytes) -> InitSegment:
    """Read back ftyp and the tracks of a moov (as the value objects that wrote them)."""
    top = {b.type: b for b in iter_boxes(data)}
    if "ftyp" not in top or "moov" not in top:
        raise ValueError(f"init segment needs ftyp and moov, found {sorted(top)}")
    ftyp_payload = top["ftyp"].payload(data)
    if len(ftyp_payload) < 8 or len(ftyp_payload) % 4:
        raise ValueError("malformed ftyp")
    brands = tuple(
        ftyp_payload[i : i + 4].decode("latin-1") for i in range(8, len(ftyp_payload), 4)
    )
    tracks = tuple(_parse_trak(data, b) for b in children(data, top["moov"]) if b.type == "trak")
    find_child(data, top["moov"], "mvex")  # a moov without mvex cannot be fragmented
    return InitSegment(ftyp_payload[:4].decode("latin-1"), brands, tracks)


def _parse_trak(data: bytes, trak: Box) -> Track:
    tkhd_box = find_child(data, trak, "tkhd")
    version, _ = _full_box_header(data, tkhd_box)
    cursor = _Cursor(data, tkhd_box.payload_offset + 4, tkhd_box.end)
    cursor.read("QQ" if version == 1 else "II")  # creation, modification
    track_id = cursor.one("I")
    mdia = find_child(data, trak, "mdia")
    mdhd_box = find_child(data, mdia, "mdhd")
    version, _ = _full_box_header(data, mdhd_box)
    cursor = _Cursor(data, mdhd_box.payload_offset + 4, mdhd_box.end)
    cursor.read("QQ" if version == 1 else "II")
    timescale = cursor.one("I")
    hdlr_box = find_child(data, mdia, "hdlr")
    handler_type = data[hdlr_box.payload_offset + 8 : hdlr_box.payload_offset + 12]
    stbl = find_child(data, find_child(data, mdia, "minf"), "stbl")
    stsd = find_child(data, stbl, "stsd")
    # stsd: full box header + entry_count before the sample entries.
    entries = children(data, stsd, skip=8)
    if not entries:
        raise ValueError("stsd has no sample entry")
    entry = entries[0]
    match handler_type, entry.type:
        case b"vide", "avc1" | "avc3":
            # VisualSampleEntry: 6 reserved + 2 dri + 16 pre_defined/reserved, then w, h;
            # child boxes start after its 78 bytes of fields.
            width, height = struct.unpack_from(">HH", data, entry.payload_offset + 24)
            avcc = find_child(data, entry, "avcC", skip=78).payload(data)
            return VideoTrack(track_id, timescale, width, height, avcc)
        case b"soun", "mp4a":
            # AudioSampleEntry: 6 reserved + 2 dri + 8 reserved, then channelcount,
            # samplesize, 4 bytes, samplerate (16.16); child boxes after 28 bytes.
            channels = struct.unpack_from(">H", data, entry.payload_offset + 16)[0]
            sample_rate = struct.unpack_from(">I", data, entry.payload_offset + 24)[0] >> 16
            esds_box = find_child(data, entry, "esds", skip=28)
            config = _audio_specific_config(esds_box.payload(data)[4:])
            return AudioTrack(track_id, sample_rate, channels, config)
    raise ValueError(f"unsupported track: handler {handler_type!r}, sample entry {entry.type!r}")


def _read_descriptor(data: bytes, offset: int) -> tuple[int, int, int]:
    """(tag, payload start, payload end) of the 14496-1 descriptor at `offset`."""
    tag, size, position = data[offset], 0, offset + 1
    while True:
        byte = data[position]
        position += 1
        size = (size << 7) | (byte & 0x7F)
        if not byte & 0x80:
            return tag, position, position + size


def _audio_specific_config(es_descriptor: bytes) -> bytes:
    tag, start, _ = _read_descriptor(es_descriptor, 0)
    if tag != _ES_DESCRIPTOR_TAG:
        raise ValueError(f"esds holds descriptor tag {tag}, expected an ES_Descriptor")
    tag, start, end = _read_descriptor(es_descriptor, start + 3)  # after ES_ID and flags
    if tag != _DECODER_CONFIG_DESCRIPTOR_TAG:
        raise ValueError(f"expected a DecoderConfigDescriptor, found tag {tag}")
    tag, start, end = _read_descriptor(es_descriptor, start + 13)  # after its fixed fields
    if tag != _DECODER_SPECIFIC_INFO_TAG:
        raise ValueError(f"expected a DecoderSpecificInfo, found tag {tag}")
    return es_descriptor[start:end]


@dataclass(frozen=True, slots=True)
class ParsedTrackRun:
    """One traf as read back: every per-sample field, and the sample bytes resolved."""

    track_id: int
    base_media_decode_time: int
    data_offset: int
    sample_durations: tuple[int, ...]
    sample_sizes: tuple[int, ...]
    sample_flags: tuple[int, ...]
    sample_composition_time_offsets: tuple[int, ...]
    sample_data: tuple[bytes, ...]

    @property
    def run(self) -> TrackRun:
        """The TrackRun that `fragment()` would need to write these samples."""
        samples = tuple(
            Sample(data, duration, not flags & _SAMPLE_IS_NON_SYNC_SAMPLE, offset)
            for data, duration, flags, offset in zip(
                self.sample_data,
                self.sample_durations,
                self.sample_flags,
                self.sample_composition_time_offsets,
                strict=True,
            )
        )
        return TrackRun(self.track_id, self.base_media_decode_time, samples)

    @property
    def duration(self) -> int:
        return sum(self.sample_durations)


@dataclass(frozen=True, slots=True)
class ParsedFragment:
    sequence_number: int
    runs: tuple[ParsedTrackRun, ...]
    moof: Box
    mdat: Box


def parse_fragment(data: bytes) -> ParsedFragment:
    """Read one `moof` + `mdat` (exactly those two top-level boxes)."""
    boxes = list(iter_boxes(data))
    if [b.type for b in boxes] != ["moof", "mdat"]:
        raise ValueError(f"a fragment is moof + mdat, found {[b.type for b in boxes]}")
    moof, mdat = boxes
    mfhd_box = find_child(data, moof, "mfhd")
    _full_box_header(data, mfhd_box)
    sequence_number = _Cursor(data, mfhd_box.payload_offset + 4, mfhd_box.end).one("I")
    runs, previous_end = [], moof.offset
    for traf in children(data, moof):
        if traf.type == "traf":
            parsed = _parse_traf(data, traf, moof, mdat, previous_end)
            previous_end = parsed.data_offset + moof.offset + sum(parsed.sample_sizes)
            runs.append(parsed)
    return ParsedFragment(sequence_number, tuple(runs), moof, mdat)


def _parse_traf(data: bytes, traf: Box, moof: Box, mdat: Box, previous_end: int) -> ParsedTrackRun:
    tfhd_box = find_child(data, traf, "tfhd")
    _, tf_flags = _full_box_header(data, tfhd_box)
    cursor = _Cursor(data, tfhd_box.payload_offset + 4, tfhd_box.end)
    track_id = cursor.one("I")
    # Without either flag the base is the end of the previous traf's data (or the
    # moof for the first one), per 14496-12 8.8.7.1.
    base = previous_end
    if tf_flags & TFHD_BASE_DATA_OFFSET_PRESENT:
        base = cursor.one("Q")
    elif tf_flags & TFHD_DEFAULT_BASE_IS_MOOF:
        base = moof.offset
    if tf_flags & TFHD_SAMPLE_DESCRIPTION_INDEX_PRESENT:
        cursor.one("I")
    default_duration = cursor.one("I") if tf_flags & TFHD_DEFAULT_SAMPLE_DURATION_PRESENT else 0
    default_size = cursor.one("I") if tf_flags & TFHD_DEFAULT_SAMPLE_SIZE_PRESENT else 0
    default_flags = cursor.one("I") if tf_flags & TFHD_DEFAULT_SAMPLE_FLAGS_PRESENT else 0

    tfdt_box = find_child(data, traf, "tfdt")
    version, _ = _full_box_header(data, tfdt_box)
    cursor = _Cursor(data, tfdt_box.payload_offset + 4, tfdt_box.end)
    base_media_decode_time = cursor.one("Q" if version == 1 else "I")

    trun_boxes = [b for b in children(data, traf) if b.type == "trun"]
    if len(trun_boxes) != 1:
        raise ValueError(f"expected one trun in traf, found {len(trun_boxes)}")
    trun_box = trun_boxes[0]
    version, tr_flags = _full_box_header(data, trun_box)
    cursor = _Cursor(data, trun_box.payload_offset + 4, trun_box.end)
    sample_count = cursor.one("I")
    data_offset = cursor.one("i") if tr_flags & TRUN_DATA_OFFSET_PRESENT else 0
    first_flags = cursor.one("I") if tr_flags & TRUN_FIRST_SAMPLE_FLAGS_PRESENT else None
    durations, sizes, flags, offsets = [], [], [], []
    for index in range(sample_count):
        durations.append(
            cursor.one("I") if tr_flags & TRUN_SAMPLE_DURATION_PRESENT else default_duration
        )
        sizes.append(cursor.one("I") if tr_flags & TRUN_SAMPLE_SIZE_PRESENT else default_size)
        sample_flags = cursor.one("I") if tr_flags & TRUN_SAMPLE_FLAGS_PRESENT else default_flags
        if index == 0 and first_flags is not None:
            sample_flags = first_flags
        flags.append(sample_flags)
        offsets.append(
            cursor.one("i" if version else "I")
            if tr_flags & TRUN_SAMPLE_COMPOSITION_TIME_OFFSET_PRESENT
            else 0
        )

    start = base + data_offset
    if start < mdat.payload_offset or start + sum(sizes) > mdat.end:
        raise ValueError(
            f"track {track_id}: samples at [{start}, {start + sum(sizes)}) fall outside "
            f"the mdat payload [{mdat.payload_offset}, {mdat.end})"
        )
    sample_data, position = [], start
    for size in sizes:
        sample_data.append(bytes(data[position : position + size]))
        position += size
    return ParsedTrackRun(
        track_id=track_id,
        base_media_decode_time=base_media_decode_time,
        data_offset=start - moof.offset,
        sample_durations=tuple(durations),
        sample_sizes=tuple(sizes),
        sample_flags=tuple(flags),
        sample_composition_time_offsets=tuple(offsets),
        sample_data=tuple(sample_data),
    )


class TopLevelBoxSplitter:
    """Cuts a byte stream into complete top-level boxes as they arrive.

    `feed` returns every box completed by the new bytes (possibly none), each as
    its full bytes, the same however the stream is split. A size-0 box ("extends
    to the end of the file") cannot be delimited in a stream and is an error.
    After an error the splitter refuses more input, since it has lost framing.
    """

    __slots__ = ("_buffer", "_error", "bytes_emitted")

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._error: ValueError | None = None
        self.bytes_emitted = 0

    @property
    def pending(self) -> int:
        """Bytes held that do not yet make a complete box."""
        return len(self._buffer)

    def feed(self, data: bytes) -> list[bytes]:
        if self._error is not None:
            raise ValueError("splitter failed earlier; it cannot resync") from self._error
        self._buffer += data
        boxes: list[bytes] = []
        while True:
            size = self._complete_box_size()
            if size is None:
                return boxes
            boxes.append(bytes(self._buffer[:size]))
            del self._buffer[:size]
            self.bytes_emitted += size

    def _complete_box_size(self) -> int | None:
        buffer = self._buffer
        if len(buffer) < 8 or (len(buffer) < 16 and buffer[:4] == b"\0\0\0\1"):
            return None
        try:
            # The header bytes are all here, so only garbage can raise.
            box_type, size, _ = _parse_box_header(buffer, 0, len(buffer))
            if size == 0:
                raise ValueError(
                    f"box {box_type!r} at stream offset {self.bytes_emitted} has size 0 "
                    "(to end of file), which a stream cannot delimit"
                )
        except ValueError as error:
            self._error = error
            raise
        return size if len(buffer) >= size else None

    def close(self) -> None:
        """Declare the stream finished; raises if it ended inside a box."""
        if self._buffer:
            raise ValueError(
                f"stream ended inside a box: {len(self._buffer)} bytes after offset "
                f"{self.bytes_emitted}"
            )
