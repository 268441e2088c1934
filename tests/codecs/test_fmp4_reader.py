"""The fMP4 box reader: walking boxes, reading fragments back, and splitting streams."""

from __future__ import annotations

import itertools
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers.media import X264_BASELINE_AVCC
from vaecast.codecs import fmp4
from vaecast.codecs.fmp4 import Sample, TrackRun, VideoTrack, box, fragment, full_box, init_segment
from vaecast.codecs.fmp4_reader import (
    Box,
    RunTiming,
    TopLevelBoxSplitter,
    fragment_timing,
    iter_boxes,
    parse_fragment,
)

TRACK = VideoTrack(track_id=1, timescale=16000, width=64, height=48, avcc=X264_BASELINE_AVCC)


def samples_of(*payloads: bytes) -> tuple[Sample, ...]:
    return tuple(Sample(p, 1000, i == 0, 0) for i, p in enumerate(payloads))


def test_parse_fragment_reads_tfhd_defaults_and_first_sample_flags() -> None:
    # Another writer's style: sizes, durations and flags as tfhd defaults, the
    # first sample's flags apart, a 32-bit tfdt.
    tf_flags = (
        fmp4.TFHD_DEFAULT_BASE_IS_MOOF
        | fmp4.TFHD_DEFAULT_SAMPLE_DURATION_PRESENT
        | fmp4.TFHD_DEFAULT_SAMPLE_SIZE_PRESENT
        | fmp4.TFHD_DEFAULT_SAMPLE_FLAGS_PRESENT
    )
    tr_flags = fmp4.TRUN_DATA_OFFSET_PRESENT | fmp4.TRUN_FIRST_SAMPLE_FLAGS_PRESENT

    def moof(data_offset: int) -> bytes:
        traf = box(
            b"traf",
            full_box(b"tfhd", 0, tf_flags, struct.pack(">IIII", 1, 512, 3, 0x01010000)),
            full_box(b"tfdt", 0, 0, struct.pack(">I", 7)),
            full_box(b"trun", 0, tr_flags, struct.pack(">IiI", 2, data_offset, 0x02000000)),
        )
        return box(b"moof", fmp4.mfhd(9), traf)

    data = moof(len(moof(0)) + 8) + box(b"mdat", b"abcdef")
    parsed = parse_fragment(data)
    assert parsed.sequence_number == 9
    (run,) = parsed.runs
    assert run.base_media_decode_time == 7
    assert run.sample_durations == (512, 512)
    assert run.sample_sizes == (3, 3)
    assert run.sample_flags == (0x02000000, 0x01010000)
    assert run.sample_data == (b"abc", b"def")
    assert [s.is_sync for s in run.run.samples] == [True, False]
    # The timing-only reader agrees: durations from the tfhd default, the first flags.
    assert fragment_timing(data) == [RunTiming(1, 1024, 0x02000000)]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.lists(
            st.tuples(st.integers(1, 50_000), st.booleans(), st.integers(-3, 3)),
            min_size=1,
            max_size=6,
        ),
        min_size=1,
        max_size=3,
    )
)
def test_fragment_timing_agrees_with_the_full_parse(tracks: list[list[tuple]]) -> None:
    runs = [
        TrackRun(
            track_id,
            0,
            tuple(
                Sample(b"x" * (i + 1), duration, sync, offset)
                for i, (duration, sync, offset) in enumerate(samples)
            ),
        )
        for track_id, samples in enumerate(tracks, start=1)
    ]
    data = fragment(5, runs)
    expected = [
        RunTiming(run.track_id, sum(run.sample_durations), run.sample_flags[0])
        for run in parse_fragment(data).runs
    ]
    assert fragment_timing(data) == expected


def test_fragment_timing_refuses_what_it_cannot_read() -> None:
    data = fragment(1, [TrackRun(1, 0, samples_of(b"abcdef", b"gh"))])
    with pytest.raises(ValueError, match="truncated"):
        fragment_timing(data[:-1])
    with pytest.raises(ValueError, match="moof \\+ mdat"):
        fragment_timing(data + box(b"free"))
    # A trun whose sample count runs past its box.
    broken = bytearray(data)
    struct.pack_into(">I", broken, broken.index(b"trun") + 8, 1_000_000)
    with pytest.raises(ValueError, match="past its box end"):
        fragment_timing(bytes(broken))


def test_parse_fragment_rejects_data_offset_outside_mdat() -> None:
    data = bytearray(fragment(1, [TrackRun(1, 0, samples_of(b"abcd"))]))
    trun = data.index(b"trun")
    # data_offset follows size/type (already passed), version/flags and sample_count.
    struct.pack_into(">i", data, trun + 4 + 4 + 4, 4)
    with pytest.raises(ValueError, match="outside the mdat"):
        parse_fragment(bytes(data))


def test_parse_fragment_needs_moof_then_mdat() -> None:
    with pytest.raises(ValueError, match="moof \\+ mdat"):
        parse_fragment(box(b"mdat", b"x"))


def test_iter_boxes_sizes_and_nesting() -> None:
    inner = box(b"abcd", b"12") + box(b"efgh")
    data = box(b"free", b"xyz") + box(b"wrap", inner)
    boxes = list(iter_boxes(data))
    assert boxes == [Box("free", 0, 11, 8), Box("wrap", 11, 26, 8)]
    assert boxes[0].payload(data) == b"xyz"
    assert list(iter_boxes(data, boxes[1].payload_offset, boxes[1].end)) == [
        Box("abcd", 19, 10, 8),
        Box("efgh", 29, 8, 8),
    ]


def test_iter_boxes_largesize_and_size_zero() -> None:
    large = b"\x00\x00\x00\x01free" + struct.pack(">Q", 18) + b"ab"
    assert list(iter_boxes(large)) == [Box("free", 0, 18, 16)]
    to_end = b"\x00\x00\x00\x00mdat" + b"xyz"
    assert list(iter_boxes(to_end)) == [Box("mdat", 0, 11, 8)]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (box(b"free", b"abc")[:-1], "truncated box"),
        (b"\x00\x00\x00\x08fr", "truncated box header"),
        (b"\x00\x00\x00\x01free\x00\x00", "truncated largesize"),
        (b"\x00\x00\x00\x04free", "impossible size"),
        (b"\x00\x00\x00\x08\x00\x01\x02\x03", "not a box"),
    ],
)
def test_iter_boxes_rejects_truncation_and_garbage(data: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        list(iter_boxes(data))


def test_truncated_fragment_raises() -> None:
    data = fragment(1, [TrackRun(1, 0, samples_of(b"abcdef"))])
    with pytest.raises(ValueError, match="truncated"):
        parse_fragment(data[:-1])


def stream_bytes() -> tuple[bytes, list[bytes]]:
    parts = [
        fmp4.ftyp(),
        init_segment([TRACK])[len(fmp4.ftyp()) :],
        *iter_top_level(fragment(1, [TrackRun(1, 0, samples_of(b"one"))])),
        *iter_top_level(fragment(2, [TrackRun(1, 1000, samples_of(b"two", b"three"))])),
    ]
    return b"".join(parts), parts


def iter_top_level(data: bytes) -> list[bytes]:
    return [data[b.offset : b.end] for b in iter_boxes(data)]


def test_splitter_all_at_once_and_byte_by_byte_agree() -> None:
    data, parts = stream_bytes()
    whole = TopLevelBoxSplitter()
    assert whole.feed(data) == parts
    whole.close()

    bytewise = TopLevelBoxSplitter()
    boxes = []
    for index in range(len(data)):
        boxes += bytewise.feed(data[index : index + 1])
    assert boxes == parts
    assert bytewise.pending == 0
    assert bytewise.bytes_emitted == len(data)


@settings(max_examples=30, deadline=None)
@given(cuts=st.lists(st.integers(0, 2000), max_size=12))
def test_splitter_any_split_agrees(cuts: list[int]) -> None:
    data, parts = stream_bytes()
    bounds = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    splitter = TopLevelBoxSplitter()
    boxes = []
    for start, end in itertools.pairwise(bounds):
        boxes += splitter.feed(data[start:end])
    assert boxes == parts


def test_splitter_largesize_box() -> None:
    large = b"\x00\x00\x00\x01free" + struct.pack(">Q", 18) + b"ab"
    splitter = TopLevelBoxSplitter()
    assert [splitter.feed(large[i : i + 1]) for i in range(len(large))][-1] == [large]


def test_splitter_garbage_fails_for_good() -> None:
    splitter = TopLevelBoxSplitter()
    with pytest.raises(ValueError, match="not a box"):
        splitter.feed(b"\x00\x00\x00\x08\x00\x01\x02\x03")
    with pytest.raises(ValueError, match="cannot resync"):
        splitter.feed(box(b"free"))


def test_splitter_refuses_size_zero_box() -> None:
    with pytest.raises(ValueError, match="size 0"):
        TopLevelBoxSplitter().feed(b"\x00\x00\x00\x00mdatxyz")


def test_splitter_close_detects_truncated_stream() -> None:
    splitter = TopLevelBoxSplitter()
    assert splitter.feed(box(b"free", b"abc")[:-1]) == []
    with pytest.raises(ValueError, match="stream ended inside a box: 10 bytes"):
        splitter.close()
