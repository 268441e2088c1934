"""The live rendition's timed metadata: an ID3v2.4 tag in a version-1 `emsg` box, read
back field by field (hls.js reading it in Chromium: tests/browser/test_live_players.py)."""

from __future__ import annotations

import pytest

from vaecast.codecs.fmp4_reader import iter_boxes
from vaecast.codecs.timed_metadata import ID3_SCHEME, emsg_id3, id3_txxx


def test_a_txxx_tag_is_id3v24_with_syncsafe_sizes():
    tag = id3_txxx("vaecast_source", "final")
    assert tag[:6] == b"ID3\x04\x00\x00"
    frame_size = len(tag) - 10
    assert tag[6:10] == bytes([0, 0, 0, frame_size])
    assert tag[10:14] == b"TXXX" and tag[14:18] == bytes([0, 0, 0, frame_size - 10])
    assert tag[20:] == b"\x03vaecast_source\x00final"
    long = id3_txxx("k", "v" * 300)  # sizes of 7 bits a byte
    assert long[6:10] == bytes([0, 0, (len(long) - 10) >> 7, (len(long) - 10) & 0x7F])


def test_an_emsg_box_carries_the_tag_at_its_time():
    tag = id3_txxx("vaecast_source", "preview")
    box = emsg_id3(presentation_time=5000, timescale=16000, duration=4000, event_id=3, tag=tag)
    (parsed,) = iter_boxes(box)
    assert (parsed.type, parsed.size) == ("emsg", len(box))
    body = box[parsed.payload_offset :]
    assert body[:4] == b"\x01\x00\x00\x00"  # version 1, no flags
    assert int.from_bytes(body[4:8], "big") == 16000
    assert int.from_bytes(body[8:16], "big") == 5000
    assert int.from_bytes(body[16:20], "big") == 4000
    assert int.from_bytes(body[20:24], "big") == 3
    assert body[24:] == ID3_SCHEME.encode() + b"\x00\x00" + tag


@pytest.mark.parametrize(
    "fields",
    [
        {"timescale": 0},
        {"timescale": 1 << 32},
        {"duration": -1},
        {"event_id": 1 << 32},
        {"presentation_time": 1 << 64},
    ],
)
def test_fields_that_do_not_fit_are_refused(fields: dict):
    values = {"presentation_time": 0, "timescale": 16000, "duration": 1, "event_id": 0} | fields
    with pytest.raises(ValueError):
        emsg_id3(**values, tag=b"")
