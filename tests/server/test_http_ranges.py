"""Byte-range and ETag rules, as a table (RFC 9110 section 14 and 13.1.2)."""

from __future__ import annotations

import pytest

from vaecast.server.http_ranges import ByteRange, Unsatisfiable, etag_matches, parse_range

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
