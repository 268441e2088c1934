"""Timed metadata in a fragmented MP4: an ID3 tag in an `emsg` box before a fragment.

The live rendition says which decoder made each of its fragments in the stream
itself, for players that read timed metadata: an `emsg` box (ISO/IEC 23009-1, version
1: its presentation time on the media timeline) of the Alliance for Open Media's ID3
scheme, whose message is an ID3v2.4 tag with one `TXXX` frame (a description and a
value, UTF-8). hls.js turns it into a cue on a metadata text track
(`FRAG_PARSING_METADATA`, `enableEmsgMetadataCues`); players that do not read it skip
a top-level box they do not know. Written here because neither PyAV's muxer nor any
Python ID3 library writes into a stream being cut by hand. Pure: bytes out, no I/O.
"""

from __future__ import annotations

import struct

ID3_SCHEME = "https://aomedia.org/emsg/ID3"
_U32 = 0xFFFFFFFF


def _syncsafe(size: int) -> bytes:
    """An ID3v2.4 size: 28 bits, 7 a byte."""
    if not 0 <= size < 1 << 28:
        raise ValueError(f"an ID3 size must fit 28 bits, got {size}")
    return bytes(((size >> shift) & 0x7F) for shift in (21, 14, 7, 0))


def id3_txxx(description: str, value: str) -> bytes:
    """An ID3v2.4 tag holding one user-defined text frame (`TXXX`), UTF-8."""
    body = b"\x03" + description.encode() + b"\x00" + value.encode()
    frame = b"TXXX" + _syncsafe(len(body)) + b"\x00\x00" + body
    return b"ID3\x04\x00\x00" + _syncsafe(len(frame)) + frame


def emsg_id3(
    presentation_time: int, timescale: int, duration: int, event_id: int, tag: bytes
) -> bytes:
    """An `emsg` box (version 1) of the AOM ID3 scheme: `tag` at `presentation_time`
    for `duration`, both in `timescale` ticks, with its id."""
    for name, value in (("timescale", timescale), ("duration", duration), ("id", event_id)):
        if not 0 <= value <= _U32:
            raise ValueError(f"an emsg {name} must fit 32 bits, got {value}")
    if timescale == 0 or not 0 <= presentation_time < 1 << 64:
        raise ValueError("an emsg needs a timescale and a 64-bit presentation time")
    payload = (
        struct.pack(">BxxxIQII", 1, timescale, presentation_time, duration, event_id)
        + ID3_SCHEME.encode()
        + b"\x00"
        + b"\x00"  # value: empty
        + tag
    )
    return struct.pack(">I4s", 8 + len(payload), b"emsg") + payload
