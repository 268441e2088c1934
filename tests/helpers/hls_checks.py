"""What any HLS player needs of a vaecast playlist, checked the way the strict tools do.

- `apple_rules(text)`: the rules Apple's Media Stream Validator applies to a media or
  multivariant playlist (read with the `m3u8` package), as a list of problems.
- `strict_errors(texts)`: hls-parser (npm) in strict mode, through node: its error for
  each playlist, or None.
- `segment_problems(...)`: every complete segment, fetched over HTTP, starts with an
  IDR picture (NAL type 5, not just a sync sample) and FFmpeg reads it, joined to the
  init segment, without a warning.
- `check_playlist(...)`: all of the above for one playlist URL.

tools/install-test-deps installs hls-parser under tools/node/ and ffmpeg from Debian.
"""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

import aiohttp
import m3u8

from vaecast.codecs.avc import split_length_prefixed
from vaecast.codecs.fmp4 import VideoTrack
from vaecast.codecs.fmp4_reader import iter_boxes, parse_fragment, parse_init_segment

HLS_PARSER = Path(__file__).resolve().parents[2] / "tools/node/node_modules/hls-parser"
# Reads a JSON list of playlists on stdin; writes a JSON list: each one's error or null.
STRICT_PARSE = """
const HLS = require(process.argv[1]);
HLS.setOptions({strictMode: true});
let input = "";
process.stdin.on("data", (chunk) => (input += chunk));
process.stdin.on("end", () => {
  const errors = JSON.parse(input).map((text) => {
    try { HLS.parse(text); return null; } catch (error) { return error.message; }
  });
  process.stdout.write(JSON.stringify(errors));
});
"""
IDR_NAL_TYPE = 5
# EXTINF against the parts it lists: printed with 5 decimals each.
DURATION_TOLERANCE_S = 1e-4
# Apple: PART-HOLD-BACK at least twice PART-TARGET (three times recommended).
MIN_PART_HOLD_BACK_TARGETS = 2
# Segments that may still list their parts (HLS: at most three target durations back).
SEGMENTS_WITH_PARTS = 3


def apple_rules(text: str) -> list[str]:
    """The problems Apple's validator would report in this playlist (empty: none)."""
    playlist = m3u8.loads(text)
    if playlist.is_variant:
        return _multivariant_rules(playlist)
    problems = []
    target = playlist.target_duration
    if target is None:
        return ["no EXT-X-TARGETDURATION"]
    if not playlist.segment_map:
        problems.append("no EXT-X-MAP (fMP4 segments need their init section)")
    part_target = playlist.part_inf.part_target if playlist.part_inf else None
    segments = list(playlist.segments)
    has_parts = any(s.parts for s in segments)
    if has_parts and part_target is None:
        problems.append("parts without EXT-X-PART-INF")
    if has_parts and part_target is not None:
        hold_back = playlist.server_control.part_hold_back if playlist.server_control else None
        if hold_back is None or hold_back < MIN_PART_HOLD_BACK_TARGETS * part_target:
            problems.append(f"PART-HOLD-BACK {hold_back} under twice PART-TARGET {part_target}")
    for number, segment in enumerate(segments):
        if segment.uri is not None and round(segment.duration) > target:
            problems.append(f"segment {number}: EXTINF {segment.duration} over target {target}")
        if segment.parts and number < len(segments) - SEGMENTS_WITH_PARTS:
            problems.append(f"segment {number}: parts listed more than three segments back")
        for index, part in enumerate(segment.parts):
            if part_target is not None and part.duration > part_target + DURATION_TOLERANCE_S:
                problems.append(f"segment {number} part {index}: over PART-TARGET")
        if segment.parts and segment.parts[0].independent != "YES":
            problems.append(f"segment {number}: its first part is not INDEPENDENT")
        if segment.uri is not None and segment.parts:
            listed = sum(part.duration for part in segment.parts)
            if not math.isclose(listed, segment.duration, abs_tol=DURATION_TOLERANCE_S * 10):
                problems.append(f"segment {number}: EXTINF {segment.duration} != parts {listed}")
    return problems


def _multivariant_rules(playlist: m3u8.M3U8) -> list[str]:
    problems = []
    if not playlist.playlists:
        problems.append("a multivariant playlist with no variant")
    for variant in playlist.playlists:
        info = variant.stream_info
        if not info.bandwidth:
            problems.append(f"{variant.uri}: no BANDWIDTH")
        if not info.codecs:
            problems.append(f"{variant.uri}: no CODECS")
        if not info.resolution:
            problems.append(f"{variant.uri}: no RESOLUTION")
        if not info.frame_rate:
            problems.append(f"{variant.uri}: no FRAME-RATE")
    return problems


async def strict_errors(texts: list[str]) -> list[str | None]:
    """hls-parser's strict-mode error for each playlist (None: it accepts it)."""
    node = await asyncio.create_subprocess_exec(
        "node", "-e", STRICT_PARSE, str(HLS_PARSER),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(node.communicate(json.dumps(texts).encode()), 60)
    assert node.returncode == 0, err.decode()
    return json.loads(out)


def starts_with_idr(segment: bytes) -> bool:
    """Whether the first video sample of this run of fragments holds an IDR slice (a
    fragment's timed metadata, `emsg` boxes before its `moof`, is passed over)."""
    boxes = [box for box in iter_boxes(segment) if box.type != "emsg"]
    for moof, mdat in zip(boxes[::2], boxes[1::2], strict=True):
        fragment = parse_fragment(segment[moof.offset : mdat.end])
        for run in fragment.runs:
            if run.track_id == 1 and run.sample_data:  # the video track
                units = split_length_prefixed(run.sample_data[0])
                return any(unit[0] & 0x1F == IDR_NAL_TYPE for unit in units)
    return False  # no video at all


async def ffprobe_warnings(media: bytes) -> str:
    """What FFmpeg says, at warning level, reading every packet of `media`."""
    probe = await asyncio.create_subprocess_exec(
        "ffprobe", "-v", "warning", "-show_packets", "-of", "csv", "-i", "pipe:0",
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(probe.communicate(media), 60)
    assert probe.returncode == 0, err.decode()
    assert out, "ffprobe read no packet"
    return err.decode().strip()


async def segment_problems(
    client: aiohttp.ClientSession, playlist_url: str, text: str
) -> list[str]:
    """Every complete segment of this media playlist starts with an IDR, and FFmpeg reads
    it, after the init segment, without a warning."""
    playlist = m3u8.loads(text)
    base = playlist_url.rsplit("/", 1)[0] + "/"
    problems: list[str] = []
    if not any(segment.uri for segment in playlist.segments):
        return problems  # nothing a player would fetch
    async with client.get(base + playlist.segment_map[0].uri) as response:
        assert response.status == 200
        init = await response.read()
    video = [t.track_id for t in parse_init_segment(init).tracks if isinstance(t, VideoTrack)]
    assert video == [1], "vaecast writes its video as track 1"
    for number, segment in enumerate(playlist.segments):
        if segment.uri is None:
            continue
        async with client.get(base + segment.uri) as response:
            assert response.status == 200, segment.uri
            media = await response.read()
        if not starts_with_idr(media):
            problems.append(f"segment {number} does not start with an IDR picture")
        warnings = await ffprobe_warnings(init + media)
        if warnings:
            problems.append(f"segment {number}: ffprobe: {warnings}")
    return problems


async def check_playlist(client: aiohttp.ClientSession, url: str) -> str:
    """Fetch the playlist at `url` and assert every rule above; its text."""
    async with client.get(url) as response:
        assert response.status == 200, await response.text()
        assert response.headers["Content-Type"].startswith("application/vnd.apple.mpegurl")
        text = await response.text()
    assert apple_rules(text) == [], text
    assert await strict_errors([text]) == [None], text
    if not m3u8.loads(text).is_variant:
        assert await segment_problems(client, url, text) == [], text
    return text
