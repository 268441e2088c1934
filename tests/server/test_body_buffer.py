"""BodyBuffer: the body byte for byte however it is chunked, and held once in RSS.

The RSS cases run in fresh interpreters with the server's heap settings
(vaecast.pipeline.heap), where `bytearray +=` leaves holes in the malloc arena that stay
mapped; each reads the same body in the same chunks, one with `+=`, one with
BodyBuffer.
"""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from vaecast.server.edge.body_buffer import (
    MAPPED_ROOM_BYTES,
    SMALL_BODY_BYTES,
    BodyBuffer,
    advise_huge_pages,
)

MIB = 1 << 20


def body_of(size: int) -> bytes:
    return bytes(i * 7 % 251 for i in range(251)) * (size // 251) + b"x" * (size % 251)


@pytest.mark.parametrize(
    "size, chunk",
    [
        (0, 1),
        (10, 3),
        (SMALL_BODY_BYTES, 4096),  # exactly the small limit: stays a plain bytearray
        (SMALL_BODY_BYTES + 1, 65536),  # one byte past it: moves to a mapping
        (3 * MIB + 17, 1_000_003),  # chunks that straddle the move
        (MAPPED_ROOM_BYTES + 5 * MIB + 3, 2 * MIB + 1),  # past the first room: mremap
        (MAPPED_ROOM_BYTES + 1, MAPPED_ROOM_BYTES + 1),  # one chunk bigger than the room
    ],
)
def test_the_body_comes_back_byte_for_byte(size: int, chunk: int) -> None:
    body = body_of(size)
    buffer = BodyBuffer()
    for start in range(0, size, chunk):
        buffer.append(body[start : start + chunk])
        assert len(buffer) == min(size, start + chunk)
    taken = buffer.take()
    assert type(taken) is bytearray and taken == body
    assert len(buffer) == 0 and buffer.take() == bytearray()


def test_a_taken_body_is_a_plain_writable_bytearray() -> None:
    buffer = BodyBuffer()
    buffer.append(body_of(2 * MIB))
    taken = buffer.take()
    taken += b"more"  # resizable again: no views of it are left behind
    with memoryview(taken) as view:
        assert not view.readonly and view.nbytes == 2 * MIB + 4


PROBE = textwrap.dedent(
    """
    import json, sys
    from vaecast.pipeline.heap import retain_decode_heap
    from vaecast.server.edge.body_buffer import BodyBuffer

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096

    retain_decode_heap()
    size, chunk = 96 << 20, 256 << 10
    before = rss()
    if sys.argv[1] == "bytearray":
        body = bytearray()
        for _ in range(size // chunk):
            body += b"\\x01" * chunk  # a new chunk object between growths, as from a socket
    else:
        buffer = BodyBuffer()
        for _ in range(size // chunk):
            buffer.append(b"\\x01" * chunk)
        body = buffer.take()
    assert len(body) == size
    print(json.dumps({"held_over_body": (rss() - before) / size}))
    """
)


def _held_over_body(way: str) -> float:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, way], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["held_over_body"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
def test_a_big_body_is_held_once_where_bytearray_growth_leaves_holes() -> None:
    grown = _held_over_body("bytearray")
    buffered = _held_over_body("buffer")
    assert buffered < 1.05, buffered  # the body, and nothing left behind by its growth
    assert grown > buffered + 0.1, (grown, buffered)


def test_a_mapped_body_is_advised_for_huge_pages_and_still_resizes() -> None:
    """The body's own mapping carries the advice (the kernel's `hg` flag, where it has
    transparent huge pages), also after it grew past its room, and the advice leaves no
    export behind: the buffer still grows and is cut to size."""
    with_thp = Path("/sys/kernel/mm/transparent_hugepage/enabled").exists()
    buffer = BodyBuffer()
    for _ in range(3):
        buffer.append(b"\x02" * MIB)  # moved into its own mapping at the second
    assert ("hg" in mapping_flags(buffer._data)) == with_thp
    buffer.append(b"\x03" * (40 * MIB))  # past the room: grown, and advised again
    assert ("hg" in mapping_flags(buffer._data)) == with_thp
    body = buffer.take()
    assert len(body) == 43 * MIB and body[-1] == 3 and body[0] == 2
    assert not advise_huge_pages(bytearray())


def mapping_flags(data: bytearray) -> set[str]:
    """The VmFlags of the mapping that holds `data`'s first byte (/proc/self/smaps)."""
    address = ctypes.addressof(ctypes.c_char.from_buffer(data))
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            start, end = (int(x, 16) for x in head.split("-"))
            inside = start <= address < end
        elif inside and head == "VmFlags:":
            return set(line.split()[1:])
    raise AssertionError("no mapping holds the buffer")
