"""The argparse types of the command line's numbers and checked strings: a bad value is
one usage line naming the option, never a traceback or a silently changed value."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def at_least(
    kind: Callable[[str], float], low: float, above: bool = False, high: float | None = None
) -> Callable[[str], float]:
    """A finite number of `kind`, at least `low` (more, `above`), at most `high`, as an
    argparse type: 'nan', 'inf' or -1 is one usage line, not a traceback."""

    def convert(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text[:40]!r}") from None
        if not math.isfinite(value) or value < low or (above and value == low):
            bound = f"more than {low:g}" if above else f"at least {low:g}"
            raise argparse.ArgumentTypeError(f"must be a finite number {bound}, got {text[:40]}")
        if high is not None and value > high:
            raise argparse.ArgumentTypeError(f"must be at most {high:g}, got {text[:40]}")
        return value

    return convert


MAX_PORT = 65535


def port_number(text: str) -> int:
    """--port: a TCP port, 0-65535, as an argparse type (the socket layer would take
    70000 as 70000 - 65536, and -1 as an unreadable resolver error)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text[:40]!r}") from None
    if not 0 <= port <= MAX_PORT:
        raise argparse.ArgumentTypeError(f"a port is 0-{MAX_PORT} (0: any free one), got {port}")
    return port


def option_type(parse: Callable[[str], str]) -> Callable[[str], str]:
    """`parse` as an argparse type: argparse shows the message of a ValueError only
    when it is an ArgumentTypeError."""

    def convert(text: str) -> str:
        try:
            return parse(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    return convert
