"""Fragmented MP4 (ISO/IEC 14496-12) boxes, written without I/O.

Why we write boxes ourselves: PyAV's mp4 muxer cannot cut a fragment per chunk.
On a non-seekable sink it emits a chunk's fragment only when the *next* keyframe
arrives with `frag_keyframe` (a chunk late), one frame late with
`frag_every_frame`, and nothing until the muxer closes with `frag_custom`; and it
has no call that flushes a fragment. vaecast's latency promise is "a chunk is
playable as soon as it is encoded", so each chunk becomes exactly one
`moof`+`mdat` written here.

Everything is built from `box()` and `full_box()`; the one offset that matters
(`trun.data_offset`, the distance from the `moof` to a run's first sample byte) is
computed from the lengths of the boxes actually built. Names of fields follow the
spec (`base_media_decode_time`, `sample_composition_time_offset`, ...).

Tracks are a closed union (`Track`) dispatched in `_trak`: a new track type slots
in there (and in `fmp4_reader`) without changing `init_segment`, `fragment` or
`TrackRun`. `fmp4_reader` reads these boxes back (the HLS face, tests and tools).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeAlias

# The 32-bit size field cannot describe boxes this large; they get a 64-bit largesize.
_MAX_32BIT_BOX_BYTES = 0xFFFFFFFF

# Movie-level clock (mvhd, tkhd and mehd durations): 0 while a movie streams (its moov
# holds no samples, and it has no mehd), the finished file's length once
# `fmp4_finish` states it; 1 ms ticks, as ffmpeg writes.
MOVIE_TIMESCALE_HZ = 1000

# ISO/IEC 14496-12 8.8.3.1 sample_flags.
SAMPLE_FLAGS_SYNC = 0x02000000  # sample_depends_on = 2 (depends on no other sample)
SAMPLE_FLAGS_NON_SYNC = 0x01010000  # sample_depends_on = 1, sample_is_non_sync_sample = 1
SAMPLE_IS_NON_SYNC_SAMPLE = 0x00010000

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
ES_DESCRIPTOR_TAG = 0x03
DECODER_CONFIG_DESCRIPTOR_TAG = 0x04
DECODER_SPECIFIC_INFO_TAG = 0x05
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
        DECODER_CONFIG_DESCRIPTOR_TAG,
        struct.pack(">B", _OBJECT_TYPE_MPEG4_AUDIO),
        # streamType (6 bits), upStream 0, reserved 1.
        struct.pack(">B", (_STREAM_TYPE_AUDIO << 2) | 1),
        bytes(3),  # bufferSizeDB: unknown
        struct.pack(">II", 0, 0),  # maxBitrate, avgBitrate: unknown
        _descriptor(DECODER_SPECIFIC_INFO_TAG, track.audio_specific_config),
    )
    es = _descriptor(
        ES_DESCRIPTOR_TAG,
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


def mehd(fragment_duration: int) -> bytes:
    # Version 1 (64-bit): it can state any length, in the place its stand-in kept.
    return full_box(b"mehd", 1, 0, struct.pack(">Q", fragment_duration))


# A version-1 mehd's size: header, version and flags, a 64-bit fragment_duration.
MEHD_BYTES = 20


def mehd_stand_in() -> bytes:
    """A `free` box the size of a mehd, where a live movie's mehd would be.

    A live movie has no mehd: its length is not known (14496-12 8.8.2), which is how a
    live recorder's file says it (ffmpeg's `empty_moov`), and how mp4box.js then sums
    the fragments it read. A mehd of 0 would say the movie is 0 s long. The stand-in
    keeps the place, so the finished file's init segment can put the mehd there
    without changing size (`fmp4_finish.with_durations`); a `free` box may sit in
    any container, and players skip it."""
    return box(b"free", bytes(MEHD_BYTES - 8))


def trex(track_id: int) -> bytes:
    # Defaults are unused: every trun carries its own durations, sizes and flags.
    return full_box(b"trex", 0, 0, struct.pack(">IIIII", track_id, 1, 0, 0, 0))


def init_segment(tracks: Sequence[Track]) -> bytes:
    """ftyp + moov for a fragmented movie of `tracks` (durations 0, samples in moofs).

    A live movie's: its length not known, so its mvex has no mehd, only the stand-in
    that keeps the mehd's place (`mehd_stand_in`) for the finished file's."""
    if not tracks:
        raise ValueError("an init segment needs at least one track")
    ids = [track.track_id for track in tracks]
    if len(set(ids)) != len(ids) or min(ids) < 1:
        raise ValueError(f"track ids must be unique and >= 1, got {ids}")
    moov = box(
        b"moov",
        mvhd(next_track_id=max(ids) + 1),
        *(_trak(track) for track in tracks),
        box(b"mvex", mehd_stand_in(), *(trex(track.track_id) for track in tracks)),
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
