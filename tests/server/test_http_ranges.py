"""Byte-range and ETag rules, as a table (RFC 9110 section 14 and 13.1.2)."""

from __future__ import annotations

import pytest

from vaecast.server.edge.http_ranges import (
    ByteRange,
    Unsatisfiable,
    WaitFor,
    etag_matches,
    growing_range,
    parse_range,
)

SIZE = 1000


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (None, None),
        ("", None),
        ("bytes=0-", ByteRange(0, 999)),
        ("bytes=0-0", ByteRange(0, 0)),
        ("bytes=10-19", ByteRange(10, 19)),
        ("bytes=990-5000", ByteRange(990, 999)),  # clamped to the end
        ("bytes=-100", ByteRange(900, 999)),  # the last 100 bytes
        ("bytes=-5000", ByteRange(0, 999)),
        ("BYTES = 5 - 6", ByteRange(5, 6)),
        ("bytes=0-1,5-6", None),  # several ranges: the whole resource, as RFC allows
        ("items=0-1", None),  # unknown unit: ignored
        ("bytes=20-10", None),  # invalid: ignored
        ("bytes=-", None),
    ],
)
def test_parse_range(header, expected):
    assert parse_range(header, SIZE) == expected


@pytest.mark.parametrize("header", ["bytes=1000-", "bytes=5000-6000", "bytes=-0"])
def test_unsatisfiable_ranges(header):
    with pytest.raises(Unsatisfiable):
        parse_range(header, SIZE)


def test_content_range_and_length():
    byte_range = ByteRange(10, 19)
    assert byte_range.length == 10
    assert byte_range.content_range(SIZE) == "bytes 10-19/1000"
    assert byte_range.content_range(None) == "bytes 10-19/*"  # complete length unknown


COMMITTED = 1000  # bytes of a still-growing representation written so far
BEYOND = 10**18  # where positions of more than 18 digits land


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        # The whole representation as it grows (200).
        (None, None),
        ("", None),
        ("bytes=0-", None),  # Chromium's first request for a media URL
        ("BYTES = 0 - ", None),
        ("bytes=0-1,5-6", None),  # several ranges: ignored, as for a finished file
        ("items=0-1", None),
        ("bytes=20-10", None),
        ("bytes=-", None),
        # Bytes that exist: at once.
        ("bytes=10-19", ByteRange(10, 19)),
        ("bytes=0-0", ByteRange(0, 0)),
        ("bytes=0-999", ByteRange(0, 999)),  # the last committed byte
        ("bytes=500-", ByteRange(500, 999)),  # open: to the current end
        ("bytes=999-", ByteRange(999, 999)),
        # Bytes that do not exist yet: wait for the last one asked for.
        ("bytes=0-1000", WaitFor(1001)),
        ("bytes=990-5000", WaitFor(5001)),
        ("bytes=1000-", WaitFor(1001)),  # at the current end: the next byte
        ("bytes=5000-", WaitFor(5001)),
        ("bytes=5000-6000", WaitFor(6001)),
        ("bytes=1" + "0" * 30 + "-", WaitFor(BEYOND + 1)),  # in effect, the end
        # A suffix is relative to an end that is not known yet.
        ("bytes=-100", WaitFor(None)),
    ],
)
def test_growing_range(header, expected):
    assert growing_range(header, COMMITTED) == expected


@pytest.mark.parametrize("committed", [0, COMMITTED])
@pytest.mark.parametrize("header", ["bytes=-0", "bytes=-00", "BYTES = - 0"])
def test_a_zero_length_suffix_of_a_growing_representation_is_unsatisfiable_at_once(
    header, committed
):
    """No end the representation could reach makes `bytes=-0` select a byte."""
    with pytest.raises(Unsatisfiable):
        growing_range(header, committed)


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("bytes=0-", None),
        ("bytes=0-0", WaitFor(1)),
        ("bytes=5-", WaitFor(6)),
        ("bytes=-10", WaitFor(None)),
    ],
)
def test_growing_range_before_any_byte(header, expected):
    assert growing_range(header, 0) == expected


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("bytes=" + "9" * 24, None),  # no dash: not a range, ignored (the whole file)
        ("bytes=" + "9" * 24 + "-", Unsatisfiable),
        ("bytes=5000-", Unsatisfiable),  # at the bound: no video gets there
        ("bytes=5000-5001", Unsatisfiable),
        ("bytes=4999-", WaitFor(5000)),  # the last byte a video could have
        ("bytes=0-9999999", WaitFor(10000000)),  # starts within: its first bytes come
        ("bytes=-10", WaitFor(None)),
    ],
)
def test_a_range_that_starts_where_no_video_reaches_is_unsatisfiable_at_once(header, expected):
    if expected is Unsatisfiable:
        with pytest.raises(Unsatisfiable):  # said at once, not after waiting to the end
            growing_range(header, COMMITTED, never_reaches=5000)
    else:
        assert growing_range(header, COMMITTED, never_reaches=5000) == expected


@pytest.mark.parametrize(
    ("if_none_match", "matches"),
    [
        (None, False),
        ('"a-1"', True),
        ('W/"a-1"', True),
        ('"b", "a-1"', True),
        ("*", True),
        ('"a-2"', False),
    ],
)
def test_etag_matches(if_none_match, matches):
    assert etag_matches(if_none_match, '"a-1"') is matches
