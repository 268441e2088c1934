"""Fragmented MP4 read back, without I/O: an init segment's tracks, a fragment's runs.

The counterpart of `fmp4`, which writes these boxes. The server reads with it only
where it needs the samples themselves: WHEP takes a job's tracks from its init segment
(`parse_init_segment`) and each fragment apart into access units (`parse_fragment`,
`codecs.access_units`). A fragment's duration and keyframe come with it from the
encoder (`codecs.fragment`) and are never read back. Tests, benchmarks and tools read
fragments back, whole or their timing only (`fragment_timing`), to check what was
written. It reads what `fmp4`
writes plus the common optional fields of other writers, and raises ValueError on
anything truncated or malformed rather than guessing. The box layer below it
(`iter_boxes`, `children`, `find_child`, `TopLevelBoxSplitter`) is `fmp4_boxes`,
re-exported here.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from vaecast.codecs.fmp4 import (
    DECODER_CONFIG_DESCRIPTOR_TAG,
    DECODER_SPECIFIC_INFO_TAG,
    ES_DESCRIPTOR_TAG,
    SAMPLE_IS_NON_SYNC_SAMPLE,
    TFHD_BASE_DATA_OFFSET_PRESENT,
    TFHD_DEFAULT_BASE_IS_MOOF,
    TFHD_DEFAULT_SAMPLE_DURATION_PRESENT,
    TFHD_DEFAULT_SAMPLE_FLAGS_PRESENT,
    TFHD_DEFAULT_SAMPLE_SIZE_PRESENT,
    TFHD_SAMPLE_DESCRIPTION_INDEX_PRESENT,
    TRUN_DATA_OFFSET_PRESENT,
    TRUN_FIRST_SAMPLE_FLAGS_PRESENT,
    TRUN_SAMPLE_COMPOSITION_TIME_OFFSET_PRESENT,
    TRUN_SAMPLE_DURATION_PRESENT,
    TRUN_SAMPLE_FLAGS_PRESENT,
    TRUN_SAMPLE_SIZE_PRESENT,
    AudioTrack,
    Sample,
    Track,
    TrackRun,
    VideoTrack,
)
from vaecast.codecs.fmp4_boxes import (
    Box,
    FieldCursor,
    TopLevelBoxSplitter,
    children,
    find_child,
    full_box_header,
    iter_boxes,
)

__all__ = [
    "Box",
    "InitSegment",
    "ParsedFragment",
    "ParsedTrackRun",
    "RunTiming",
    "TopLevelBoxSplitter",
    "children",
    "find_child",
    "fragment_timing",
    "iter_boxes",
    "parse_fragment",
    "parse_init_segment",
]


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
    version, _ = full_box_header(data, tkhd_box)
    cursor = FieldCursor(data, tkhd_box.payload_offset + 4, tkhd_box.end)
    cursor.read("QQ" if version == 1 else "II")  # creation, modification
    track_id = cursor.one("I")
    mdia = find_child(data, trak, "mdia")
    mdhd_box = find_child(data, mdia, "mdhd")
    version, _ = full_box_header(data, mdhd_box)
    cursor = FieldCursor(data, mdhd_box.payload_offset + 4, mdhd_box.end)
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
    if tag != ES_DESCRIPTOR_TAG:
        raise ValueError(f"esds holds descriptor tag {tag}, expected an ES_Descriptor")
    tag, start, end = _read_descriptor(es_descriptor, start + 3)  # after ES_ID and flags
    if tag != DECODER_CONFIG_DESCRIPTOR_TAG:
        raise ValueError(f"expected a DecoderConfigDescriptor, found tag {tag}")
    tag, start, end = _read_descriptor(es_descriptor, start + 13)  # after its fixed fields
    if tag != DECODER_SPECIFIC_INFO_TAG:
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
            Sample(data, duration, not flags & SAMPLE_IS_NON_SYNC_SAMPLE, offset)
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
    """Read one `moof` + `mdat` (exactly those two top-level boxes, after any `emsg`:
    timed metadata, as the live rendition puts before each fragment)."""
    boxes = list(iter_boxes(data))
    while boxes and boxes[0].type == "emsg":
        boxes.pop(0)
    if [b.type for b in boxes] != ["moof", "mdat"]:
        raise ValueError(f"a fragment is moof + mdat, found {[b.type for b in boxes]}")
    moof, mdat = boxes
    mfhd_box = find_child(data, moof, "mfhd")
    full_box_header(data, mfhd_box)
    sequence_number = FieldCursor(data, mfhd_box.payload_offset + 4, mfhd_box.end).one("I")
    runs, previous_end = [], moof.offset
    for traf in children(data, moof):
        if traf.type == "traf":
            parsed = _parse_traf(data, traf, moof, mdat, previous_end)
            previous_end = parsed.data_offset + moof.offset + sum(parsed.sample_sizes)
            runs.append(parsed)
    return ParsedFragment(sequence_number, tuple(runs), moof, mdat)


@dataclass(frozen=True, slots=True)
class _Tfhd:
    track_id: int
    base_data_offset: int | None  # None: not in the tfhd
    default_base_is_moof: bool
    default_duration: int
    default_size: int
    default_flags: int


def _read_tfhd(data: bytes, box: Box) -> _Tfhd:
    _, flags = full_box_header(data, box)
    cursor = FieldCursor(data, box.payload_offset + 4, box.end)
    track_id = cursor.one("I")
    base = cursor.one("Q") if flags & TFHD_BASE_DATA_OFFSET_PRESENT else None
    if flags & TFHD_SAMPLE_DESCRIPTION_INDEX_PRESENT:
        cursor.one("I")
    return _Tfhd(
        track_id,
        base,
        bool(flags & TFHD_DEFAULT_BASE_IS_MOOF),
        cursor.one("I") if flags & TFHD_DEFAULT_SAMPLE_DURATION_PRESENT else 0,
        cursor.one("I") if flags & TFHD_DEFAULT_SAMPLE_SIZE_PRESENT else 0,
        cursor.one("I") if flags & TFHD_DEFAULT_SAMPLE_FLAGS_PRESENT else 0,
    )


# A trun's per-sample fields, in the order each sample's entry holds those present.
_TRUN_FIELDS = (
    TRUN_SAMPLE_DURATION_PRESENT,
    TRUN_SAMPLE_SIZE_PRESENT,
    TRUN_SAMPLE_FLAGS_PRESENT,
    TRUN_SAMPLE_COMPOSITION_TIME_OFFSET_PRESENT,
)


@dataclass(frozen=True, slots=True)
class _Trun:
    version: int
    count: int
    data_offset: int
    first_sample_flags: int | None
    fields: tuple[int, ...]  # the _TRUN_FIELDS present
    table: tuple[int, ...]  # count entries of len(fields) values, read unsigned

    def column(self, field: int, default: int) -> tuple[int, ...]:
        """One field of every sample: the table's, or `default` where it is absent."""
        if field not in self.fields:
            return (default,) * self.count
        return self.table[self.fields.index(field) :: len(self.fields)]


def _read_trun(data: bytes, box: Box) -> _Trun:
    """A trun's header and whole sample table, in one `struct` call."""
    version, flags = full_box_header(data, box)
    cursor = FieldCursor(data, box.payload_offset + 4, box.end)
    count = cursor.one("I")
    data_offset = cursor.one("i") if flags & TRUN_DATA_OFFSET_PRESENT else 0
    first_flags = cursor.one("I") if flags & TRUN_FIRST_SAMPLE_FLAGS_PRESENT else None
    fields = tuple(field for field in _TRUN_FIELDS if flags & field)
    if cursor.pos + 4 * len(fields) * count > box.end:  # before a format that long
        raise ValueError(f"box field runs past its box end at offset {cursor.pos}")
    table = cursor.read("I" * (len(fields) * count)) if fields else ()
    return _Trun(version, count, data_offset, first_flags, fields, table)


def _one_trun(data: bytes, traf: Box) -> Box:
    truns = [b for b in children(data, traf) if b.type == "trun"]
    if len(truns) != 1:
        raise ValueError(f"expected one trun in traf, found {len(truns)}")
    return truns[0]


def _parse_traf(data: bytes, traf: Box, moof: Box, mdat: Box, previous_end: int) -> ParsedTrackRun:
    tfhd = _read_tfhd(data, find_child(data, traf, "tfhd"))
    track_id = tfhd.track_id
    # Without either flag the base is the end of the previous traf's data (or the
    # moof for the first one), per 14496-12 8.8.7.1.
    base = previous_end
    if tfhd.base_data_offset is not None:
        base = tfhd.base_data_offset
    elif tfhd.default_base_is_moof:
        base = moof.offset

    tfdt_box = find_child(data, traf, "tfdt")
    version, _ = full_box_header(data, tfdt_box)
    cursor = FieldCursor(data, tfdt_box.payload_offset + 4, tfdt_box.end)
    base_media_decode_time = cursor.one("Q" if version == 1 else "I")

    trun = _read_trun(data, _one_trun(data, traf))
    data_offset = trun.data_offset
    durations = trun.column(TRUN_SAMPLE_DURATION_PRESENT, tfhd.default_duration)
    sizes = trun.column(TRUN_SAMPLE_SIZE_PRESENT, tfhd.default_size)
    flags = list(trun.column(TRUN_SAMPLE_FLAGS_PRESENT, tfhd.default_flags))
    if flags and trun.first_sample_flags is not None:
        flags[0] = trun.first_sample_flags
    offsets = trun.column(TRUN_SAMPLE_COMPOSITION_TIME_OFFSET_PRESENT, 0)
    if trun.version:  # signed in version 1
        offsets = tuple(o - (1 << 32) if o >= 1 << 31 else o for o in offsets)

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


@dataclass(frozen=True, slots=True)
class RunTiming:
    """What an index of a stream's parts needs of one track run: no sample table."""

    track_id: int
    duration: int  # the run's samples' durations summed, in the track's timescale
    first_sample_flags: int


def fragment_timing(data: bytes) -> list[RunTiming]:
    """Each track run's duration and first sample's flags, from the `moof` alone.

    `parse_fragment` reads every field and copies every sample's bytes, ~100 us for a
    fragment of 4 frames; the server's HLS index reads this much of every fragment
    it writes, on the event loop, so this reads the one table it needs in one
    `struct` call per run and never looks inside the `mdat`. Raises ValueError where
    `parse_fragment` would on the boxes it reads.
    """
    boxes = list(iter_boxes(data))
    if [b.type for b in boxes] != ["moof", "mdat"]:
        raise ValueError(f"a fragment is moof + mdat, found {[b.type for b in boxes]}")
    timings = []
    for traf in children(data, boxes[0]):
        if traf.type != "traf":
            continue
        tfhd = _read_tfhd(data, find_child(data, traf, "tfhd"))
        trun = _read_trun(data, _one_trun(data, traf))
        duration = sum(trun.column(TRUN_SAMPLE_DURATION_PRESENT, tfhd.default_duration))
        first_flags = trun.first_sample_flags
        if first_flags is None:
            column = trun.column(TRUN_SAMPLE_FLAGS_PRESENT, tfhd.default_flags)
            first_flags = column[0] if column else tfhd.default_flags
        timings.append(RunTiming(tfhd.track_id, duration, first_flags))
    return timings
