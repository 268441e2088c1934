"""A finished file's init segment: the durations its fragments hold, stated in place."""

from __future__ import annotations

import struct

import pytest

from tests.helpers.media import X264_BASELINE_AVCC
from vaecast.codecs import fmp4
from vaecast.codecs.fmp4 import AudioTrack, Sample, TrackRun, VideoTrack, box, full_box
from vaecast.codecs.fmp4_finish import (
    DurationTally,
    MovieDurations,
    as_live,
    read_durations,
    with_durations,
)
from vaecast.codecs.fragment import Fragment, FragmentFacts

VIDEO = VideoTrack(track_id=1, timescale=16000, width=64, height=48, avcc=X264_BASELINE_AVCC)
AUDIO = AudioTrack(track_id=2, sample_rate=48_000, channels=2, audio_specific_config=b"\x11\x90")
INIT = fmp4.init_segment([VIDEO, AUDIO])


def video_run(start: int, frames: int, ticks: int = 1000) -> TrackRun:
    samples = [Sample(b"\x00\x00\x00\x01\x65", ticks, index == 0) for index in range(frames)]
    return TrackRun(VIDEO.track_id, start, samples)


def audio_run(start: int, durations: list[int]) -> TrackRun:
    return TrackRun(AUDIO.track_id, start, [Sample(b"\x21", d, True) for d in durations])


def test_a_streamed_init_segment_states_no_duration() -> None:
    # Durations 0 (its moov holds no samples) and no mehd: the length is not known.
    assert read_durations(INIT) == MovieDurations(1000, 0, None, {1: 0, 2: 0})


@pytest.mark.parametrize(
    ("durations", "movie_ms", "tkhd_ms"),
    [
        # 33 frames at 16 kHz, 1000 ticks each: 2.0625 s; audio of the same length.
        ({1: 33_000, 2: 99_000}, 2063, {1: 2063, 2: 2063}),  # 2062.5 ms rounds up
        ({1: 16_000, 2: 48_000 + 1}, 1001, {1: 1000, 2: 1001}),  # the longer track
        ({1: 16_000}, 1000, {1: 1000, 2: 0}),  # a track without samples
        ({}, 0, {1: 0, 2: 0}),
    ],
)
def test_with_durations_states_each_track_and_the_movie(
    durations: dict[int, int], movie_ms: int, tkhd_ms: dict[int, int]
) -> None:
    finished = with_durations(INIT, durations)
    assert len(finished) == len(INIT)
    stated = read_durations(finished)
    assert stated == MovieDurations(
        1000, movie_ms, movie_ms, {1: durations.get(1, 0), 2: durations.get(2, 0)}
    )
    assert [_tkhd_duration(finished, index) for index in (0, 1)] == [tkhd_ms[1], tkhd_ms[2]]
    # Only the duration fields and the mehd's place changed: as live, the streamed bytes.
    assert as_live(finished) == INIT


def test_the_mehd_holds_64_bits_and_32_bit_fields_say_unknown_past_theirs() -> None:
    ticks = 16000 * 5_000_000  # 5e6 s: past 2**32 in ms, and in the video's clock
    finished = with_durations(INIT, {1: ticks})
    stated = read_durations(finished)
    assert stated.fragment_duration == 5_000_000_000  # mehd, version 1
    assert stated.movie_duration == 0xFFFFFFFF  # mvhd, version 0: "unknown"
    assert stated.tracks[1] == 0xFFFFFFFF  # mdhd, version 0
    assert len(finished) == len(INIT)


def _v1_init(mehd_version: int) -> bytes:
    """An init segment whose mvhd, tkhd and mdhd are version 1 (64-bit times), as
    other writers make them; only the boxes and fields the rewrite touches."""
    mvhd = full_box(b"mvhd", 1, 0, struct.pack(">QQIQ", 1, 2, 600, 0), bytes(80))
    tkhd = full_box(b"tkhd", 1, 3, struct.pack(">QQIIQ", 1, 2, 7, 0, 0), bytes(60))
    mdhd = full_box(b"mdhd", 1, 0, struct.pack(">QQIQ", 1, 2, 90_000, 0), bytes(4))
    trak = box(b"trak", tkhd, box(b"mdia", mdhd))
    mehd = full_box(b"mehd", mehd_version, 0, bytes(8 if mehd_version else 4))
    moov = box(b"moov", mvhd, trak, box(b"mvex", mehd, fmp4.trex(7)))
    return fmp4.ftyp() + moov


@pytest.mark.parametrize("mehd_version", [0, 1])
def test_version_1_boxes_get_64_bit_fields_in_their_own_places(mehd_version: int) -> None:
    init = _v1_init(mehd_version)
    finished = with_durations(init, {7: 90_000 * 10 + 1})  # 10 s and one tick
    assert len(finished) == len(init)
    assert read_durations(finished) == MovieDurations(600, 6001, 6001, {7: 900_001})
    # The fields around them are untouched: creation, modification, timescale, track_ID.
    moov = finished[len(fmp4.ftyp()) :]
    mvhd_fields = struct.unpack_from(">QQIQ", moov, 8 + 12)
    assert mvhd_fields == (1, 2, 600, 6001)
    tkhd_at = moov.index(b"tkhd") + 8
    assert struct.unpack_from(">QQIIQ", moov, tkhd_at) == (1, 2, 7, 0, 6001)
    mdhd_at = moov.index(b"mdhd") + 8
    assert struct.unpack_from(">QQIQ", moov, mdhd_at) == (1, 2, 90_000, 900_001)


def test_a_mehd_of_0_from_before_the_stand_in_is_stated_in_place() -> None:
    """A store's file written when a live init segment held a mehd of 0."""
    old = INIT.replace(fmp4.mehd_stand_in(), fmp4.mehd(0))
    assert read_durations(old).fragment_duration == 0
    finished = with_durations(old, {1: 16_000})
    assert finished == with_durations(INIT, {1: 16_000})


def test_an_init_segment_without_a_mehd_is_refused() -> None:
    moov = box(b"moov", fmp4.mvhd(2), fmp4._trak(VIDEO), box(b"mvex", fmp4.trex(1)))
    init = fmp4.ftyp() + moov
    assert read_durations(init).fragment_duration is None
    with pytest.raises(ValueError) as raised:
        with_durations(init, {1: 16_000})
    assert str(raised.value) == (
        "the init segment has no mehd: its duration cannot be stated in place"
    )


def fragment(number: int, runs: list[TrackRun]) -> Fragment:
    """The fragment of `runs` with the facts the encoder hands over with it."""
    ticks = tuple((run.track_id, sum(s.duration for s in run.samples)) for run in runs)
    return Fragment(fmp4.fragment(number, runs), FragmentFacts(0.0, False, ticks))


def test_the_tally_sums_each_track_over_the_fragments() -> None:
    tally = DurationTally()
    tally.add(INIT)
    tally.add(fragment(1, [video_run(0, 4), audio_run(0, [1024, 1024, 1024])]))
    tally.add(fragment(2, [video_run(4000, 5), audio_run(3072, [1024, 1024, 1024, 48])]))
    tally.add(fragment(3, [audio_run(6192, [1024])]))  # audio only, the tail
    assert tally.durations == {1: 9000, 2: 7216}
    finished = tally.finished_init()
    assert finished is not None
    assert read_durations(finished) == MovieDurations(1000, 563, 563, {1: 9000, 2: 7216})
    assert tally.unreadable is None


_MVEX = box(b"mvex", fmp4.mehd_stand_in(), fmp4.trex(1))


@pytest.mark.parametrize(
    ("segments", "why"),
    [
        ([fragment(1, [video_run(0, 1)])], "the first segment is not an init segment"),
        # Bytes read back, not handed over by the encoder: the tally parses nothing.
        ([INIT, fmp4.fragment(1, [video_run(0, 1)])], "a fragment came without its facts"),
        ([fmp4.ftyp() + box(b"moov", full_box(b"mvhd", 0, 0, bytes(8)), _MVEX)], "too short"),
        ([b"\x00\x00\x00\x10ftypisom" + bytes(4)], "an init segment needs a moov"),
        ([fmp4.ftyp() + box(b"moov", fmp4.mvhd(2), box(b"mvex", fmp4.trex(1)))], "no mehd"),
    ],
)
def test_a_stream_the_tally_cannot_read_is_left_as_it_streamed(
    segments: list[bytes], why: str
) -> None:
    tally = DurationTally()
    for segment in segments:
        tally.add(segment)
    tally.add(fragment(9, [video_run(0, 1)]))  # and nothing after it counts
    assert tally.finished_init() is None
    assert why in str(tally.unreadable)


def _tkhd_duration(init: bytes, index: int) -> int:
    at = -1
    for _ in range(index + 1):
        at = init.index(b"tkhd", at + 1)
    return struct.unpack_from(">I", init, at + 8 + 16)[0]  # version 0
