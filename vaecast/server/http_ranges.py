"""HTTP byte ranges (RFC 9110 section 14) for a resource of known length. Pure.

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

    def content_range(self, size: int) -> str:
        return f"bytes {self.first}-{self.last}/{size}"


class Unsatisfiable(Exception):
    """The range asks for bytes the resource does not have (answer 416)."""


def parse_range(header: str | None, size: int) -> ByteRange | None:
    """The range `header` asks of a `size`-byte resource; None means "send it whole".

    Raises Unsatisfiable for a valid range outside the resource.
    """
    if not header:
        return None
    match = _SINGLE_RANGE.match(header)
    if match is None:
        return None
    first_text, last_text = match.groups()
    if not first_text:
        if not last_text:
            return None
        suffix = _position(last_text)
        if suffix == 0 or size == 0:
            raise Unsatisfiable
        return ByteRange(max(size - suffix, 0), size - 1)
    first = _position(first_text)
    if last_text and _position(last_text) < first:
        return None  # invalid syntax: ignored
    if first >= size:
        raise Unsatisfiable
    last = _position(last_text) if last_text else size - 1
    return ByteRange(first, min(last, size - 1))


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
