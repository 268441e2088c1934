"""Parsing the numbers a client writes as text, in bounded time. Pure.

Python's own parsers are not safe on hostile text: `Fraction("1e10000000")` builds
10**10000000 (seconds of CPU with the GIL held, so every other request waits), and
`int()` accepts digits that are not ASCII (`"²".isdigit()` is true, `int("²")`
raises) and refuses more than 4,300 digits with a ValueError. Every number that
comes from a request goes through here: the text is matched against a short ASCII
pattern of bounded length first, and only then converted.
"""

from __future__ import annotations

import re
from fractions import Fraction

from vaecast.errors import InvalidRequestError

MAX_NUMBER_CHARS = 32
MIN_FPS = Fraction(1)
MAX_FPS = Fraction(240)
# Media time uses an integer timescale derived from fps: keep it representable.
FPS_MAX_DENOMINATOR = 1001

_ASCII_INT = re.compile(r"[0-9]+")
# A decimal or a ratio, as Fraction reads them, with an exponent of at most 3 digits:
# "16", "29.97", "30000/1001", "2.4e1". Length is checked before matching.
_RATIONAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]{1,3})?(?:/[0-9]+)?")


def parse_int(text: str, name: str, low: int, high: int) -> int:
    """An integer from `low` to `high` written in ASCII digits, or a 422 naming `name`."""
    stripped = text.strip()
    if (
        len(stripped) > MAX_NUMBER_CHARS
        or not _ASCII_INT.fullmatch(stripped)
        or not low <= int(stripped) <= high
    ):
        raise InvalidRequestError(
            f"{name} must be an integer from {low} to {high}, got {_shorten(text)}"
        )
    return int(stripped)


def leading_int(text: str) -> int | None:
    """The non-negative integer `text` holds in ASCII digits; None for anything else.

    For headers where a bad value is ignored rather than refused (Last-Event-ID);
    an absurd count of digits reads as None too, never as a huge int.
    """
    stripped = text.strip()
    if len(stripped) > MAX_NUMBER_CHARS or not _ASCII_INT.fullmatch(stripped):
        return None
    return int(stripped)


def parse_fps(value: str | None, default: Fraction) -> Fraction:
    """Frames per second: a decimal or a ratio like 30000/1001, from 1 to 240."""
    if value is None or value == "":
        return default
    stripped = value.strip()
    if len(stripped) > MAX_NUMBER_CHARS or not _RATIONAL.fullmatch(stripped):
        raise InvalidRequestError(
            f"fps must be a number or a ratio like 30000/1001, got {_shorten(value)}"
        )
    try:
        fps = Fraction(stripped)
    except ZeroDivisionError:
        raise InvalidRequestError(
            f"fps must be a number or a ratio like 30000/1001, got {_shorten(value)}"
        ) from None
    if not MIN_FPS <= fps <= MAX_FPS:
        raise InvalidRequestError(f"fps must be between {MIN_FPS} and {MAX_FPS}, got {value}")
    return fps.limit_denominator(FPS_MAX_DENOMINATOR)


def _shorten(text: str, keep: int = 40) -> str:
    """`text` as a repr, cut so an error message never echoes a megabyte back."""
    if len(text) <= keep:
        return repr(text)
    return f"{text[:keep]!r}... ({len(text)} characters)"
