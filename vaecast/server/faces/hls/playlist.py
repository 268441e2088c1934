"""Low-Latency HLS over a job's own fragments: the playlist, as a pure function.

The fragments vaecast writes are CMAF chunks already: an init segment, then one
`moof`+`mdat` per decoded chunk. So the HLS view of a job is only a playlist:
`#EXT-X-MAP` names the init segment, each fragment is an `#EXT-X-PART`, and parts
are grouped into segments at keyframes (`--keyframe-interval`), each listed with
`#EXTINF` once it is complete. Every URI is served from the job's segment log; no
fragment is copied.

Players that read whole segments only (FFmpeg's HLS demuxer, VLC, AVPlayer-style
clients) need a complete segment in the first playlist they load. The encoder starts
a stream's second chunk with an IDR (vaecast.codecs.h264), so segment 0 is the first
fragment alone and is complete as soon as the second exists; a plain playlist request
waits, bounded, for that (vaecast.server.faces.hls.routes). An audio-only fragment (the
sound after a push session's last frame) is never independent: it ends the segment it
follows rather than making one with no picture.

The playlist keeps to what Apple's validator and hls-parser's strict mode check:
TARGETDURATION bounds every EXTINF, PART-TARGET every part, and `EXT-X-PART` tags are
listed for the last three segments only (the rest are listed by their EXTINF).

Media URIs are files of their own (`hls/init.mp4`, `hls/part/N.m4s`,
`hls/segment/K.m4s`) rather than byte ranges of `/content`: FFmpeg's HLS demuxer
refuses a URI without a media extension, and over byte ranges of a remote `/content`
it lost a frame where the same layout as files decoded whole.

A job with a preview has a media playlist per rendition, and `multivariant_playlist`
lists them: the final ranked above the preview (`SCORE`), both of one resolution.

Each part's duration and whether it starts with a keyframe are its fragment's facts,
which the encoder handed over with its bytes (`server.stream.fragment_index`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from vaecast.codecs.fragment import FragmentFacts

MEDIA_TYPE = "application/vnd.apple.mpegurl"
PLAYLIST_VERSION = 9
# A blocking request for a segment this far past the last one is refused (400), as the
# HLS specification says a server should for more than two segments ahead.
MAX_MSN_AHEAD = 2
# Segments whose parts the playlist lists (HLS: remove EXT-X-PART tags more than three
# target durations from the end; hls-parser's strict mode counts it in segments).
SEGMENTS_WITH_PARTS = 3
# Every part but a segment's last lasts at least this share of PART-TARGET (HLS exempts
# independent parts too; hls-parser's strict mode does not).
MIN_PART_SHARE = 0.85


# A part is one fragment, read from the facts the encoder handed over with it: its
# duration, and whether it starts on a keyframe (independent; never an audio-only one).
Part = FragmentFacts


@dataclass(frozen=True, slots=True)
class Segment:
    first_part: int
    parts: tuple[Part, ...]
    complete: bool

    @property
    def duration_s(self) -> float:
        return sum(part.duration_s for part in self.parts)


def segments(parts: Sequence[Part], ended: bool) -> list[Segment]:
    """Parts grouped into segments, each starting at an independent part. A segment is
    complete once the next has begun, or when `ended` (no part will follow)."""
    starts = [i for i, part in enumerate(parts) if part.keyframe or i == 0]
    grouped = []
    for number, start in enumerate(starts):
        end = starts[number + 1] if number + 1 < len(starts) else len(parts)
        complete = number + 1 < len(starts) or ended
        grouped.append(Segment(start, tuple(parts[start:end]), complete))
    return grouped


def part_target(parts: Sequence[Part], part_target_s: float) -> float:
    """PART-TARGET: the longest part the rendition makes, or has made."""
    return max([part_target_s, *(part.duration_s for part in parts)])


def listed_parts(parts: Sequence[Part], ended: bool, part_target_s: float) -> Sequence[Part]:
    """The parts a playlist lists now: all of them, but for a running rendition's last
    part while it is shorter than MIN_PART_SHARE of PART-TARGET, which waits for the
    next part (or the end). A preload hint counts as one more part of the running
    segment, so a short part may only be listed once it is known to end its segment.
    In practice this is the first chunk's single frame, listed with the second chunk
    (the first segment's whole content, which is what a player can start on anyway)."""
    short = parts and parts[-1].duration_s < MIN_PART_SHARE * part_target(parts, part_target_s)
    return parts[:-1] if short and not ended else parts


def has_complete_segment(parts: Sequence[Part], ended: bool) -> bool:
    """Whether a player that reads only whole segments can start on these parts."""
    grouped = segments(parts, ended)
    return bool(grouped) and grouped[0].complete


def media_playlist(
    parts: Sequence[Part],
    *,
    ended: bool,
    target_duration_s: float,
    part_target_s: float,
) -> str:
    """The LL-HLS media playlist of `parts`, the `listed_parts` of a rendition (URIs
    relative to the playlist).

    `ended`: the rendition will have no more parts, whether it completed, failed or was
    cancelled (`#EXT-X-ENDLIST`, its last segment complete, no preload hint): the
    playlist ends where its video ends. `target_duration_s` bounds every segment (the
    keyframe interval); `part_target_s` every part (the longest chunk the decoder makes).
    """
    grouped = segments(parts, ended)
    longest_segment = max((s.duration_s for s in grouped if s.complete), default=0.0)
    longest_part = part_target(parts, part_target_s)
    # Every segment's EXTINF, rounded, must be at most the target: a segment runs from
    # a keyframe to the first chunk past the interval, so up to a part longer.
    target = max(1, round(longest_segment), round(target_duration_s + longest_part))
    lines = [
        "#EXTM3U",
        f"#EXT-X-VERSION:{PLAYLIST_VERSION}",
        f"#EXT-X-TARGETDURATION:{target}",
        f"#EXT-X-PART-INF:PART-TARGET={longest_part:.5f}",
        f"#EXT-X-SERVER-CONTROL:CAN-BLOCK-RELOAD=YES,PART-HOLD-BACK={3 * longest_part:.5f}",
        "#EXT-X-PLAYLIST-TYPE:EVENT",
        "#EXT-X-MEDIA-SEQUENCE:0",
        "#EXT-X-INDEPENDENT-SEGMENTS",
        # A generated video is watched from its start, not joined at its live edge
        # (Safari, AVPlayer, ExoPlayer and hls.js honour this; Chromium's own HLS does not).
        "#EXT-X-START:TIME-OFFSET=0,PRECISE=YES",
        '#EXT-X-MAP:URI="hls/init.mp4"',
    ]
    first_with_parts = len(grouped) - SEGMENTS_WITH_PARTS
    for number, segment in enumerate(grouped):
        for offset, part in enumerate(segment.parts if number >= first_with_parts else ()):
            uri = f"hls/part/{segment.first_part + offset}.m4s"
            attributes = f'DURATION={part.duration_s:.5f},URI="{uri}"'
            if part.keyframe:
                attributes += ",INDEPENDENT=YES"
            lines.append(f"#EXT-X-PART:{attributes}")
        if segment.complete:
            lines.append(f"#EXTINF:{segment.duration_s:.5f},")
            lines.append(f"hls/segment/{number}.m4s")
    if ended:
        lines.append("#EXT-X-ENDLIST")
    else:
        lines.append(f'#EXT-X-PRELOAD-HINT:TYPE=PART,URI="hls/part/{len(parts)}.m4s"')
    return "\n".join(lines) + "\n"


# A rendition's bandwidth before it has a part to measure: what a multivariant
# playlist must name (BANDWIDTH is required); players re-measure as they play.
DEFAULT_BITS_PER_SECOND = 2_000_000


@dataclass(frozen=True, slots=True)
class Variant:
    """One rendition as the multivariant playlist lists it."""

    uri: str
    name: str
    codecs: str | None
    width: int | None
    height: int | None
    fps: float
    bits_per_second: float | None  # measured so far; None before the first part
    score: float  # a player prefers the higher (HLS SCORE)


def multivariant_playlist(variants: list[Variant]) -> str:
    """The multivariant (master) playlist of a job's renditions, best first."""
    lines = ["#EXTM3U", f"#EXT-X-VERSION:{PLAYLIST_VERSION}", "#EXT-X-INDEPENDENT-SEGMENTS"]
    for variant in variants:
        bandwidth = round(variant.bits_per_second or DEFAULT_BITS_PER_SECOND)
        attributes = [f"BANDWIDTH={bandwidth}", f"AVERAGE-BANDWIDTH={bandwidth}"]
        if variant.codecs:
            attributes.append(f'CODECS="{variant.codecs}"')
        if variant.width and variant.height:
            attributes.append(f"RESOLUTION={variant.width}x{variant.height}")
        attributes += [
            f"FRAME-RATE={variant.fps:.3f}",
            f"SCORE={variant.score:g}",
            f'STABLE-VARIANT-ID="{variant.name}"',
        ]
        lines.append(f"#EXT-X-STREAM-INF:{','.join(attributes)}")
        lines.append(variant.uri)
    return "\n".join(lines) + "\n"


def part_position(parts: Sequence[Part], ended: bool, msn: int, part: int | None) -> int | None:
    """How many parts must be listed for segment `msn` (and its part `part`) to be in
    the playlist; None if they already are."""
    grouped = segments(parts, ended)
    if msn < len(grouped):
        segment = grouped[msn]
        if part is None:
            return None if segment.complete else segment.first_part + len(segment.parts) + 1
        needed = segment.first_part + part + 1
        return None if part < len(segment.parts) or segment.complete else needed
    return len(parts) + 1  # a later segment: at least one more part


def too_far_ahead(parts: Sequence[Part], ended: bool, msn: int) -> bool:
    last = len(segments(parts, ended)) - 1
    return msn > last + MAX_MSN_AHEAD
