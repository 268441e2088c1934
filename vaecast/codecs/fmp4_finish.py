"""A finished fragmented MP4's init segment: the durations a live stream cannot state.

While a video streams, its init segment goes out before any fragment exists, so it
states no length: durations 0 (its moov holds no samples) and no mehd (the movie's
length is not known: ISO/IEC 14496-12 8.8.2), only a `free` box in the mehd's place
(`fmp4.mehd_stand_in`). A file saved from a live stream says the same: Chromium's MSE
treats it as live, and a player that reads the whole file (Chromium's `<video>`,
ffprobe, mp4box.js's fragment_duration) sums the fragments it has. Once the last fragment is
written the file knows its length. `DurationTally` sums each track's sample
durations from the facts each fragment came with (`codecs.fragment`; every track
starts at decode time 0 and runs without a gap, as `codecs.stream` writes them, so
the sum is where it ends; AAC priming is trimmed and the audio fitted to end with
the video, see `aac`), and `with_durations` rewrites the init
segment to state them: mvhd.duration and a mehd's fragment_duration, put where its
stand-in was (the movie, its longest track), and each trak's tkhd.duration (movie
clock) and mdhd.duration (the track's own clock).

Every one of those fields is fixed width and the stand-in has the mehd's size, so
the rewritten init segment has the length of the first: written over it at the
start of the file, every later byte keeps its offset (the store's segment rows, byte
ranges, the ETag made of the size, the HLS parts). Pure: bytes in, bytes out.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass

from vaecast.codecs.fmp4 import MEHD_BYTES, mehd, mehd_stand_in
from vaecast.codecs.fmp4_boxes import Box, children, find_child, full_box_header, iter_boxes
from vaecast.codecs.fragment import facts_of

# A version-0 duration that does not fit its 32 bits: "unknown" (14496-12 8.2.2.3).
_UNKNOWN_32BIT_DURATION = 0xFFFFFFFF


@dataclass(frozen=True, slots=True)
class MovieDurations:
    """What an init segment states: the movie's length, in its own clock, and each
    track's (track_id -> ticks of its mdhd timescale)."""

    movie_timescale: int
    movie_duration: int  # mvhd
    fragment_duration: int | None  # mehd; None: no mehd
    tracks: Mapping[int, int]  # mdhd durations

    @property
    def seconds(self) -> float:
        """For messages and tests only; boxes hold ticks."""
        return self.movie_duration / self.movie_timescale if self.movie_timescale else 0.0


@dataclass(frozen=True, slots=True)
class _Field:
    """A field's place after the full-box header, in a version-0 box and in a
    version-1 one; `time`: a time field, 64-bit in version 1 (the rest stay 32-bit)."""

    v0_offset: int
    v1_offset: int
    time: bool


# mvhd and mdhd hold creation, modification, timescale, duration; tkhd creation,
# modification, track_ID, reserved, duration; mehd fragment_duration alone.
_TIMESCALE = _Field(8, 16, time=False)
_DURATION = _Field(12, 20, time=True)
_TRACK_ID = _Field(8, 16, time=False)
_TKHD_DURATION = _Field(16, 24, time=True)
_MEHD_DURATION = _Field(0, 0, time=True)


def _field_at(data: bytes | bytearray, b: Box, field: _Field) -> tuple[int, int]:
    """(absolute offset, width) of `field` in box `b`, placed by the box's version."""
    version, _ = full_box_header(data, b)
    offset = field.v1_offset if version == 1 else field.v0_offset
    width = 8 if version == 1 and field.time else 4
    start = b.payload_offset + 4 + offset
    if start + width > b.end:
        raise ValueError(f"{b.type!r} at offset {b.offset} is too short")
    return start, width


def _read(data: bytes | bytearray, field: tuple[int, int]) -> int:
    start, width = field
    return struct.unpack_from(">Q" if width == 8 else ">I", data, start)[0]


def _write(data: bytearray, field: tuple[int, int], value: int) -> None:
    start, width = field
    if width == 4:
        struct.pack_into(">I", data, start, min(value, _UNKNOWN_32BIT_DURATION))
    else:
        struct.pack_into(">Q", data, start, value)


@dataclass(frozen=True, slots=True)
class _Places:
    mvhd: Box
    mehd: Box | None
    # Where a mehd goes: the mehd, or the stand-in of a live movie (None: neither).
    mehd_place: Box | None
    traks: tuple[tuple[Box, Box], ...]  # (tkhd, mdhd) of each trak


def _places(data: bytes | bytearray) -> _Places:
    moov = next((b for b in iter_boxes(data) if b.type == "moov"), None)
    if moov is None:
        raise ValueError("an init segment needs a moov")
    inside = children(data, moov)
    mvex = next((b for b in inside if b.type == "mvex"), None)
    mehd = place = None
    if mvex is not None:
        in_mvex = children(data, mvex)
        mehd = next((b for b in in_mvex if b.type == "mehd"), None)
        stand_in = next(
            (b for b in in_mvex if b.type == "free" and b.end - b.offset == MEHD_BYTES), None
        )
        place = mehd or stand_in
    traks = tuple(
        (find_child(data, b, "tkhd"), find_child(data, find_child(data, b, "mdia"), "mdhd"))
        for b in inside
        if b.type == "trak"
    )
    return _Places(find_child(data, moov, "mvhd"), mehd, place, traks)


def read_durations(init: bytes) -> MovieDurations:
    """The durations an init segment states (0, and no mehd, in a live one)."""
    places = _places(init)
    tracks = {}
    for tkhd, mdhd in places.traks:
        track_id = _read(init, _field_at(init, tkhd, _TRACK_ID))
        tracks[track_id] = _read(init, _field_at(init, mdhd, _DURATION))
    return MovieDurations(
        _read(init, _field_at(init, places.mvhd, _TIMESCALE)),
        _read(init, _field_at(init, places.mvhd, _DURATION)),
        None if places.mehd is None else _read(init, _field_at(init, places.mehd, _MEHD_DURATION)),
        tracks,
    )


def with_durations(init: bytes, durations: Mapping[int, int]) -> bytes:
    """`init` (ftyp + moov) stating each track's `durations` (track_id -> ticks of its
    mdhd timescale; a track not named has none) and the movie's, the same length.

    Movie-clock values are rounded up (as ffmpeg does), so the movie is never said to
    end before its last sample. Raises ValueError for an init segment with neither a
    mehd nor its stand-in to state the movie's length in (one the rewrite would have to
    grow)."""
    places = _places(init)
    if places.mehd_place is None:
        raise ValueError("the init segment has no mehd: its duration cannot be stated in place")
    out = bytearray(init)
    if places.mehd is None:  # a live movie's stand-in becomes its mehd
        place = places.mehd_place
        out[place.offset : place.end] = mehd(0)
        places = _places(out)
    assert places.mehd is not None
    movie_timescale = _read(out, _field_at(out, places.mvhd, _TIMESCALE))
    movie_duration = 0
    for tkhd, mdhd in places.traks:
        track_id = _read(out, _field_at(out, tkhd, _TRACK_ID))
        timescale = _read(out, _field_at(out, mdhd, _TIMESCALE))
        ticks = durations.get(track_id, 0)
        if timescale == 0:
            raise ValueError(f"track {track_id} has timescale 0")
        in_movie = -(-ticks * movie_timescale // timescale)  # ceiling division
        movie_duration = max(movie_duration, in_movie)
        _write(out, _field_at(out, tkhd, _TKHD_DURATION), in_movie)
        _write(out, _field_at(out, mdhd, _DURATION), ticks)
    _write(out, _field_at(out, places.mvhd, _DURATION), movie_duration)
    _write(out, _field_at(out, places.mehd, _MEHD_DURATION), movie_duration)
    return bytes(out)


def as_live(init: bytes) -> bytes:
    """`init` as a live stream's: no length stated (durations 0, the mehd's stand-in in
    its place), the same size. What a finished file's init segment was when it went out."""
    out = bytearray(with_durations(init, {}))
    mehd_box = _places(out).mehd
    assert mehd_box is not None
    out[mehd_box.offset : mehd_box.end] = mehd_stand_in()
    return bytes(out)


class DurationTally:
    """One stream's track durations so far, from its segments in the order written.

    `add` takes the init segment first, then each fragment; `finished_init` is then
    the init segment stating what the fragments hold. A stream the tally cannot read
    (no init segment first, a fragment without its facts) leaves it without an
    answer (`finished_init` None) rather than failing the writer: the file is then
    as it was streamed, valid, only silent about its length.
    """

    __slots__ = ("_durations", "_init", "_unreadable")

    def __init__(self) -> None:
        self._init: bytes | None = None
        self._durations: dict[int, int] = {}
        self._unreadable: str | None = None

    @property
    def durations(self) -> dict[int, int]:
        return dict(self._durations)

    @property
    def unreadable(self) -> str | None:
        """Why the tally gave up, or None."""
        return self._unreadable

    def add(self, segment: bytes) -> None:
        if self._unreadable is not None:
            return
        if self._init is None:
            try:
                if segment[4:8] != b"ftyp":
                    raise ValueError("the first segment is not an init segment")
                _places(segment)
            except (ValueError, struct.error) as error:  # a box too short for its fields
                self._unreadable = str(error)
                return
            self._init = segment
            return
        facts = facts_of(segment)
        if facts is None:
            self._unreadable = "a fragment came without its facts (not from codecs.stream)"
            return
        for track_id, ticks in facts.track_ticks:
            self._durations[track_id] = self._durations.get(track_id, 0) + ticks

    def finished_init(self) -> bytes | None:
        """The init segment stating the durations so far; None: see the class docstring."""
        if self._init is None or self._unreadable is not None:
            return None
        try:
            return with_durations(self._init, self._durations)
        except (ValueError, struct.error) as error:
            self._unreadable = str(error)
            return None
