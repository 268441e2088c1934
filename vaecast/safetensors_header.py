"""Telling a safetensors file by its structure, and reading its header with bounded cost.

A safetensors file is an 8-byte little-endian header length, then a JSON object of
that many bytes starting at byte 8, then the tensor data. A file is taken for one
when that length fits in the file, byte 8 is `{` and the JSON parses to an object;
file names and Content-Types are never trusted. Latent uploads
(`vaecast.latent_files`) and weights files (`vaecast.models.weights_io`) both sniff
with this one rule. It must run before a pickle test: a header length of 640 starts
with the same two bytes as a protocol-2 pickle.

The header may be hostile (an upload), so what parsing it costs is bounded first.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from pathlib import Path

from vaecast.errors import UnsupportedMediaError

LENGTH_BYTES = 8
# safetensors' own limit; a longer header is not safetensors.
MAX_HEADER_BYTES = 100_000_000
# Python's JSON tree costs up to ~70 bytes per value (`[[],[],...]` is 3 bytes a value):
# bounding the values bounds the memory a hostile header can make us spend.
MAX_HEADER_VALUES = 1_000_000
CORRUPT = "the safetensors file is corrupt: "
# The smallest header, `{}`.
_MIN_HEADER_BYTES = 2
_JSON_STRINGS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')


@dataclass(frozen=True, slots=True)
class SafetensorsHeader:
    """A parsed header: its entries (tensor names, `__metadata__`) and its byte length."""

    entries: dict[str, object]
    length: int

    @property
    def data_start(self) -> int:
        """Where the tensor data begins in the file."""
        return LENGTH_BYTES + self.length


def header_length(prefix: bytes, file_size: int) -> int | None:
    """The declared header length if `prefix` (the file's first 9 bytes or more) starts
    like safetensors in a file of `file_size` bytes, else None."""
    if len(prefix) <= LENGTH_BYTES:
        return None
    (length,) = struct.unpack_from("<Q", prefix)
    fits = _MIN_HEADER_BYTES <= length <= min(MAX_HEADER_BYTES, file_size - LENGTH_BYTES)
    return length if fits and prefix[LENGTH_BYTES] == ord("{") else None


def parse_header(raw: bytes) -> dict[str, object] | None:
    """The header JSON if it is an object, else None.

    Raises `UnsupportedMediaError` for a header of more than `MAX_HEADER_VALUES`
    values, which could be safetensors but costs too much to parse.
    """
    if _json_values_bound(raw) > MAX_HEADER_VALUES:
        raise UnsupportedMediaError(
            f"{CORRUPT}its header holds more than {MAX_HEADER_VALUES} JSON values"
        )
    try:
        header = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):  # RecursionError: nesting deeper than the stack
        return None
    return header if isinstance(header, dict) else None


def read_header(data: bytes) -> SafetensorsHeader | None:
    """The header of the safetensors file `data`, or None when it is not one by structure."""
    length = header_length(data, len(data))
    if length is None:
        return None
    entries = parse_header(data[LENGTH_BYTES : LENGTH_BYTES + length])
    return None if entries is None else SafetensorsHeader(entries, length)


def read_file_header(path: Path) -> SafetensorsHeader | None:
    """`read_header` of a file, reading no more of it than the header."""
    with path.open("rb") as file:
        prefix = file.read(LENGTH_BYTES + 1)
        length = header_length(prefix, path.stat().st_size)
        if length is None:
            return None
        entries = parse_header(prefix[LENGTH_BYTES:] + file.read(length - 1))
    return None if entries is None else SafetensorsHeader(entries, length)


def _json_values_bound(raw: bytes) -> int:
    """At least the number of JSON values in `raw`: one per comma or container opener."""

    def count(text: bytes) -> int:
        return text.count(b",") + text.count(b"[") + text.count(b"{") + 1

    rough = count(raw)
    if rough <= MAX_HEADER_VALUES:
        return rough
    # Metadata strings (embedded workflows) may hold many commas; they cost no values.
    return count(_JSON_STRINGS.sub(b'""', raw))
