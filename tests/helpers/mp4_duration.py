"""The duration a finished MP4 states, as two independent readers report it.

ffprobe (FFmpeg's demuxer) and mp4box.js (the box parser browser-side players use,
from tools/node, installed by tools/install-test-deps): a fragmented file that says
nothing about its length reads as 0 in mp4box.js's `duration` (the mvhd's), and its
`fragment_duration` is the mehd's, or, with none, the sum of the fragments it read.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from vaecast.codecs.fmp4_boxes import iter_boxes
from vaecast.codecs.fmp4_finish import as_live

MP4BOX = Path(__file__).resolve().parents[2] / "tools/node/node_modules/mp4box/dist/mp4box.all.cjs"

_MP4BOX_INFO = """
const MP4Box = require(process.argv[1]);
const data = require("fs").readFileSync(process.argv[2]);
const buffer = data.buffer.slice(data.byteOffset, data.byteOffset + data.byteLength);
buffer.fileStart = 0;
const file = MP4Box.createFile();
file.onError = (error) => { console.error(String(error)); process.exit(1); };
file.onReady = (info) => console.log(JSON.stringify({
  duration: info.duration / info.timescale,
  fragment_duration: info.fragment_duration.num / info.fragment_duration.den,
  tracks: info.tracks.map((track) => [track.type, track.duration / track.timescale]),
}));
file.appendBuffer(buffer);
file.flush();
"""


def ffprobe_seconds(path: Path) -> float:
    """The format duration ffprobe reports."""
    command = ["ffprobe", "-v", "error", "-show_entries", "format=duration", "-of", "json"]
    done = subprocess.run([*command, str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return float(json.loads(done.stdout)["format"]["duration"])


def mp4box_info(path: Path) -> dict[str, Any]:
    """mp4box.js's movie duration, its fragment_duration and each track's (type,
    seconds), as a player reads them."""
    command = ["node", "-e", _MP4BOX_INFO, str(MP4BOX), str(path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def as_streamed(finished: bytes) -> bytes:
    """A finished MP4 as it went out live: the same bytes, but for its init segment,
    which states no duration yet (`fmp4_finish`)."""
    init_end = next(b.end for b in iter_boxes(finished) if b.type == "moov")
    return as_live(finished[:init_end]) + finished[init_end:]
