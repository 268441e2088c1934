"""HTTP byte ranges (RFC 9110 section 14): of a resource of known length, and of one
that is still growing (a running job's MP4, whose complete length is unknown). Pure.

One range per request: a `Range` with several ranges is answered with the whole
representation (200), which the RFC allows, and an unparseable `Range` is ignored
the same way. A syntactically valid range that starts past the end is
unsatisfiable (416).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_SINGLE_RANGE = re.compile(r"^\s*bytes\s*=\s*([0-9]*)\s*-\s*([0-9]*)\s*$", re.IGNORECASE)
# Past this many digits a position is beyond any resource: read it as this bound
# instead of building (or failing to build, past 4,300 digits) a huge int.
_MAX_POSITION_DIGITS = 18
_BEYOND_ANY_SIZE = 10**_MAX_POSITION_DIGITS


@dataclass(frozen=True, slots=True)
class ByteRange:
    first: int
    last: int  # inclusive

    @property
    def length(self) -> int:
        return self.last - self.first + 1

    def content_range(self, size: int | None) -> str:
        """The `Content-Range` of these bytes; `size` None: the complete length is unknown."""
        return f"bytes {self.first}-{self.last}/{'*' if size is None else size}"


@dataclass(frozen=True, slots=True)
class WaitFor:
    """Not answerable yet: ask again once the representation holds `size` bytes, or
    once it is complete (`size` None), whichever comes first."""

    size: int | None


class Unsatisfiable(Exception):
    """The range asks for bytes the resource does not have (answer 416)."""


def parse_range(header: str | None, size: int) -> ByteRange | None:
    """The range `header` asks of a `size`-byte resource; None means "send it whole".

    Raises Unsatisfiable for a valid range outside the resource.
    """
    spec = _range_spec(header)
    if spec is None:
        return None
    first, last = spec
    if first is None:  # the last `last` bytes
        if not last or size == 0:
            raise Unsatisfiable
        return ByteRange(max(size - last, 0), size - 1)
    if first >= size:
        raise Unsatisfiable
    return ByteRange(first, size - 1 if last is None else min(last, size - 1))


def growing_range(
    header: str | None, committed: int, never_reaches: int | None = None
) -> ByteRange | WaitFor | None:
    """How to answer `header` now, for a representation that has `committed` bytes so
    far and is still growing (its complete length unknown), and can never reach
    `never_reaches` bytes (None: no bound is known).

    - None: no usable range, or `bytes=0-`: send the whole representation as it grows
      (200; Chromium's first request for a media URL is `bytes=0-`).
    - A ByteRange: bytes that exist, to send at once as 206 `bytes a-b/*`.
    - WaitFor: ask again once that many bytes exist, or once the representation is
      complete (and then answer with `parse_range` and the real length).

    An open range `bytes=N-` means N to the *current* end (RFC 9110 section 14.1.2:
    last-pos absent means one less than the current length), so it gets the bytes
    committed so far. No 206 can follow the growth in one response: `Content-Range`
    has no form for an end that is not known yet (`incl-range` needs both positions)
    and a single-part 206 must say which bytes it encloses (section 15.3.7.1); 200
    would claim the body starts at byte 0. A client follows the growth by asking again
    from where the last answer ended (as RFC 8673 section 2.1 describes); at the
    current end it waits for the next bytes, since a 416 would need the complete length.
    A suffix range `bytes=-N` names bytes relative to an end that does not exist yet,
    so it waits for completion; `bytes=-0` names none whatever the end, so it raises
    Unsatisfiable at once, as does a first byte at or past `never_reaches` (waiting for
    it would hold the request until the end for nothing). A closed range waits for its
    last byte.
    """
    spec = _range_spec(header)
    if spec is None:
        return None
    first, last = spec
    if first is None:
        if not last:
            raise Unsatisfiable
        return WaitFor(None)
    if never_reaches is not None and first >= never_reaches:
        raise Unsatisfiable
    if last is None:
        if first == 0:
            return None
        return ByteRange(first, committed - 1) if first < committed else WaitFor(first + 1)
    return ByteRange(first, last) if last < committed else WaitFor(last + 1)


def _range_spec(header: str | None) -> tuple[int | None, int | None] | None:
    """The one byte-range-spec of `header` as (first, last); None: no range to honour.

    (None, n) is the suffix range of the last n bytes; (first, None) an open range.
    """
    if not header:
        return None
    match = _SINGLE_RANGE.match(header)
    if match is None:
        return None
    first_text, last_text = match.groups()
    last = _position(last_text) if last_text else None
    if not first_text:
        return None if last is None else (None, last)
    first = _position(first_text)
    if last is not None and last < first:
        return None  # invalid syntax: ignored
    return first, last


def _position(digits: str) -> int:
    return _BEYOND_ANY_SIZE if len(digits) > _MAX_POSITION_DIGITS else int(digits)


def etag_matches(if_none_match: str | None, etag: str) -> bool:
    """Whether an `If-None-Match` list names `etag` (weak comparison, as for GET)."""
    if not if_none_match:
        return False
    if if_none_match.strip() == "*":
        return True
    candidates = (tag.strip().removeprefix("W/") for tag in if_none_match.split(","))
    return etag.removeprefix("W/") in candidates
