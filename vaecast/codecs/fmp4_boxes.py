"""MP4 boxes found in bytes, without I/O: box headers, walking, field reading, stream splitting.

The box layer under `fmp4_reader`, apart from the parsing of what the boxes hold:
`iter_boxes` walks the boxes that tile a buffer, `children` and `find_child` look
inside one, `full_box_header` and `FieldCursor` read a box's own fields, and
`TopLevelBoxSplitter` cuts a byte stream into whole top-level boxes as it arrives
(the test and benchmark clients that follow a job's `/content` use it). Anything
truncated or malformed raises ValueError rather than being guessed at.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Box:
    """Where a box lies in a buffer: `offset` of its first byte, total `size`."""

    type: str
    offset: int
    size: int
    header_size: int

    @property
    def payload_offset(self) -> int:
        return self.offset + self.header_size

    @property
    def end(self) -> int:
        return self.offset + self.size

    def payload(self, data: bytes) -> bytes:
        return bytes(data[self.payload_offset : self.end])


def parse_box_header(data: bytes | bytearray, offset: int, end: int) -> tuple[str, int, int]:
    """(type, size, header_size) of the box at `offset`; size 0 means "to the end"."""
    if end - offset < 8:
        raise ValueError(f"truncated box header at offset {offset}: {end - offset} bytes left")
    size, raw_type = struct.unpack_from(">I4s", data, offset)
    if any(byte < 0x20 or byte == 0x7F for byte in raw_type):
        raise ValueError(f"not a box at offset {offset}: type bytes {raw_type!r}")
    header_size = 8
    if size == 1:
        if end - offset < 16:
            raise ValueError(f"truncated largesize at offset {offset}")
        (size,) = struct.unpack_from(">Q", data, offset + 8)
        header_size = 16
    if raw_type == b"uuid":
        header_size += 16  # extended_type follows
    if size != 0 and size < header_size:
        raise ValueError(f"box {raw_type!r} at offset {offset} has impossible size {size}")
    return raw_type.decode("latin-1"), size, header_size


def iter_boxes(data: bytes | bytearray, start: int = 0, end: int | None = None) -> Iterator[Box]:
    """The boxes that tile data[start:end] exactly, in order (not descending into them)."""
    end = len(data) if end is None else end
    offset = start
    while offset < end:
        box_type, size, header_size = parse_box_header(data, offset, end)
        if size == 0:
            size = end - offset
        if offset + size > end:
            raise ValueError(
                f"truncated box {box_type!r} at offset {offset}: size {size}, "
                f"{end - offset} bytes available"
            )
        yield Box(box_type, offset, size, header_size)
        offset += size


def children(data: bytes | bytearray, parent: Box, skip: int = 0) -> list[Box]:
    """The boxes inside `parent`, after `skip` bytes of its own fields."""
    return list(iter_boxes(data, parent.payload_offset + skip, parent.end))


def find_child(data: bytes | bytearray, parent: Box, box_type: str, skip: int = 0) -> Box:
    for child in children(data, parent, skip):
        if child.type == box_type:
            return child
    raise ValueError(f"{parent.type!r} at offset {parent.offset} has no {box_type!r}")


def full_box_header(data: bytes | bytearray, b: Box) -> tuple[int, int]:
    if b.size - b.header_size < 4:
        raise ValueError(f"full box {b.type!r} at offset {b.offset} too short")
    (word,) = struct.unpack_from(">I", data, b.payload_offset)
    return word >> 24, word & 0xFFFFFF


class FieldCursor:
    """Reads big-endian fields from a box payload; raises ValueError past its end."""

    __slots__ = ("_data", "_end", "pos")

    def __init__(self, data: bytes | bytearray, start: int, end: int) -> None:
        self._data, self.pos, self._end = data, start, end

    def read(self, fmt: str) -> tuple[int, ...]:
        size = struct.calcsize(">" + fmt)
        if self.pos + size > self._end:
            raise ValueError(f"box field runs past its box end at offset {self.pos}")
        values = struct.unpack_from(">" + fmt, self._data, self.pos)
        self.pos += size
        return values

    def one(self, fmt: str) -> int:
        return self.read(fmt)[0]


class TopLevelBoxSplitter:
    """Cuts a byte stream into complete top-level boxes as they arrive.

    `feed` returns every box completed by the new bytes (possibly none), each as
    its full bytes, the same however the stream is split. A size-0 box ("extends
    to the end of the file") cannot be delimited in a stream and is an error.
    After an error the splitter refuses more input, since it has lost framing.
    """

    __slots__ = ("_buffer", "_error", "bytes_emitted")

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._error: ValueError | None = None
        self.bytes_emitted = 0

    @property
    def pending(self) -> int:
        """Bytes held that do not yet make a complete box."""
        return len(self._buffer)

    def feed(self, data: bytes) -> list[bytes]:
        if self._error is not None:
            raise ValueError("splitter failed earlier; it cannot resync") from self._error
        self._buffer += data
        boxes: list[bytes] = []
        while True:
            size = self._complete_box_size()
            if size is None:
                return boxes
            boxes.append(bytes(self._buffer[:size]))
            del self._buffer[:size]
            self.bytes_emitted += size

    def _complete_box_size(self) -> int | None:
        buffer = self._buffer
        if len(buffer) < 8 or (len(buffer) < 16 and buffer[:4] == b"\0\0\0\1"):
            return None
        try:
            # The header bytes are all here, so only garbage can raise.
            box_type, size, _ = parse_box_header(buffer, 0, len(buffer))
            if size == 0:
                raise ValueError(
                    f"box {box_type!r} at stream offset {self.bytes_emitted} has size 0 "
                    "(to end of file), which a stream cannot delimit"
                )
        except ValueError as error:
            self._error = error
            raise
        return size if len(buffer) >= size else None

    def close(self) -> None:
        """Declare the stream finished; raises if it ended inside a box."""
        if self._buffer:
            raise ValueError(
                f"stream ended inside a box: {len(self._buffer)} bytes after offset "
                f"{self.bytes_emitted}"
            )
