"""The fMP4 box writer: golden bytes, and round trips through the reader."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers.media import X264_BASELINE_AVCC
from vaecast.codecs import fmp4
from vaecast.codecs.fmp4 import (
    Sample,
    TrackRun,
    VideoTrack,
    box,
    fragment,
    full_box,
    init_segment,
)
from vaecast.codecs.fmp4_reader import (
    children,
    find_child,
    iter_boxes,
    parse_fragment,
    parse_init_segment,
)

TRACK = VideoTrack(track_id=1, timescale=16000, width=64, height=48, avcc=X264_BASELINE_AVCC)


def test_box_golden() -> None:
    assert box(b"free") == b"\x00\x00\x00\x08free"
    assert box(b"free", b"ab", b"c") == b"\x00\x00\x00\x0bfreeabc"


def test_full_box_golden() -> None:
    assert full_box(b"test", 1, 0x020000, b"\x07") == b"\x00\x00\x00\x0dtest\x01\x02\x00\x00\x07"


def test_box_rejects_bad_fourcc_and_fields() -> None:
    with pytest.raises(ValueError, match="4 bytes"):
        box(b"abc")
    with pytest.raises(ValueError, match="out of range"):
        full_box(b"test", 256, 0)
    with pytest.raises(ValueError, match="out of range"):
        full_box(b"test", 0, 1 << 24)


def test_mfhd_tfhd_tfdt_golden() -> None:
    assert fmp4.mfhd(7) == b"\x00\x00\x00\x10mfhd\x00\x00\x00\x00\x00\x00\x00\x07"
    assert fmp4.tfhd(1) == b"\x00\x00\x00\x10tfhd\x00\x02\x00\x00\x00\x00\x00\x01"
    assert fmp4.tfdt(0x1_0000_0002) == (
        b"\x00\x00\x00\x14tfdt\x01\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x02"
    )


def test_trun_two_samples_golden() -> None:
    samples = [Sample(b"abc", 1000, True), Sample(b"de", 1000, False, 2)]
    assert fmp4.trun(0x80, samples) == (
        b"\x00\x00\x00\x34trun\x00\x00\x0f\x01"  # size 52, version 0, flags
        b"\x00\x00\x00\x02\x00\x00\x00\x80"  # sample_count, data_offset
        b"\x00\x00\x03\xe8\x00\x00\x00\x03\x02\x00\x00\x00\x00\x00\x00\x00"
        b"\x00\x00\x03\xe8\x00\x00\x00\x02\x01\x01\x00\x00\x00\x00\x00\x02"
    )


def test_trun_negative_composition_offset_uses_version_1() -> None:
    written = fmp4.trun(0, [Sample(b"x", 10, True, -3)])
    assert written[8] == 1
    assert written[-4:] == struct.pack(">i", -3)


def tree(data: bytes, start: int = 0, end: int | None = None, depth: int = 0) -> list[str]:
    """Box types as indented paths, descending into the containers we write."""
    containers = {"moov", "trak", "mdia", "minf", "dinf", "stbl", "mvex", "moof", "traf"}
    skips = {"stsd": 8, "dref": 8, "avc1": 78}
    out = []
    for b in iter_boxes(data, start, end):
        out.append("  " * depth + b.type)
        if b.type in containers or b.type in skips:
            out += tree(data, b.payload_offset + skips.get(b.type, 0), b.end, depth + 1)
    return out


def test_init_segment_layout() -> None:
    data = init_segment([TRACK])
    assert tree(data) == [
        "ftyp",
        "moov",
        "  mvhd",
        "  trak",
        "    tkhd",
        "    mdia",
        "      mdhd",
        "      hdlr",
        "      minf",
        "        vmhd",
        "        dinf",
        "          dref",
        "            url ",
        "        stbl",
        "          stsd",
        "            avc1",
        "              avcC",
        "          stts",
        "          stsc",
        "          stsz",
        "          stco",
        "  mvex",
        "    free",
        "    trex",
    ]


def test_init_segment_round_trip_two_tracks() -> None:
    second = VideoTrack(track_id=3, timescale=30000, width=832, height=480, avcc=TRACK.avcc)
    data = init_segment([TRACK, second])
    parsed = parse_init_segment(data)
    assert parsed.major_brand == "isom"
    assert parsed.compatible_brands == ("isom", "iso6", "avc1", "mp41")
    assert parsed.tracks == (TRACK, second)
    moov = next(b for b in iter_boxes(data) if b.type == "moov")
    mvhd = find_child(data, moov, "mvhd")
    # next_track_ID is the last field of mvhd.
    assert struct.unpack_from(">I", data, mvhd.end - 4) == (4,)
    mvex = children(data, find_child(data, moov, "mvex"))
    # No mehd while it streams (its length is not known), but a free box of a
    # version-1 mehd's size in its place, for the finished file's.
    assert mvex[0].type == "free"
    assert data[mvex[0].offset : mvex[0].end] == b"\x00\x00\x00\x14free" + bytes(12)
    trex_ids = [struct.unpack_from(">I", data, b.payload_offset + 4)[0] for b in mvex[1:]]
    assert trex_ids == [1, 3]


def test_init_segment_rejects_duplicate_or_missing_tracks() -> None:
    with pytest.raises(ValueError, match="at least one track"):
        init_segment([])
    with pytest.raises(ValueError, match="unique"):
        init_segment([TRACK, TRACK])


def samples_of(*payloads: bytes, first_sync: bool = True) -> tuple[Sample, ...]:
    return tuple(Sample(p, 1000, first_sync and i == 0, 0) for i, p in enumerate(payloads))


def test_fragment_one_run_round_trip() -> None:
    run = TrackRun(1, 5000, samples_of(b"\x00\x00\x00\x01A", b"\x00\x00\x00\x02BC"))
    data = fragment(4, [run])
    assert [b.type for b in iter_boxes(data)] == ["moof", "mdat"]
    parsed = parse_fragment(data)
    assert parsed.sequence_number == 4
    (traf,) = parsed.runs
    assert traf.run == run
    assert traf.sample_flags == (0x02000000, 0x01010000)
    assert traf.sample_sizes == (5, 6)
    assert traf.duration == 2000
    # The first sample starts right after the mdat header, counted from the moof.
    assert traf.data_offset == parsed.mdat.payload_offset - parsed.moof.offset
    assert parsed.mdat.payload(data) == b"\x00\x00\x00\x01A\x00\x00\x00\x02BC"


def test_fragment_two_runs_share_one_mdat() -> None:
    video = TrackRun(1, 0, samples_of(b"v1", b"v22", b"v333"))
    other = TrackRun(2, 48000, (Sample(b"a1", 1024, True), Sample(b"a22", 1024, True)))
    data = fragment(1, [video, other])
    parsed = parse_fragment(data)
    assert [p.run for p in parsed.runs] == [video, other]
    first, second = parsed.runs
    assert second.data_offset == first.data_offset + len(b"v1v22v333")
    assert parsed.mdat.payload(data) == b"v1v22v333a1a22"


def test_fragment_rejects_empty_runs_and_bad_sequence_number() -> None:
    run = TrackRun(1, 0, samples_of(b"x"))
    with pytest.raises(ValueError, match="at least one track run"):
        fragment(1, [])
    with pytest.raises(ValueError, match="sequence_number"):
        fragment(0, [run])


@settings(max_examples=50, deadline=None)
@given(
    sequence_number=st.integers(1, 2**32 - 1),
    base=st.integers(0, 2**64 - 1),
    samples=st.lists(
        st.builds(
            Sample,
            data=st.binary(min_size=1, max_size=40),
            duration=st.integers(0, 2**32 - 1),
            is_sync=st.booleans(),
            composition_offset=st.integers(-(2**31), 2**31 - 1),
        ),
        min_size=1,
        max_size=8,
    ),
)
def test_fragment_round_trip_property(
    sequence_number: int, base: int, samples: list[Sample]
) -> None:
    run = TrackRun(7, base, tuple(samples))
    parsed = parse_fragment(fragment(sequence_number, [run]))
    assert parsed.sequence_number == sequence_number
    assert parsed.runs[0].run == run
