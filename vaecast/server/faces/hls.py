"""Low-Latency HLS over a job's own fragments: the playlist, as a pure function.

The fragments vaecast writes are CMAF chunks already: an init segment, then one
`moof`+`mdat` per decoded chunk. So the HLS view of a job is only a playlist:
`#EXT-X-MAP` names the init segment, each fragment is an `#EXT-X-PART`, and parts
are grouped into segments at keyframes (`--keyframe-interval`), each listed with
`#EXTINF` once it is complete. Every URI is served from the job's segment log; no
fragment is copied. Media URIs are files of their own (`hls/init.mp4`,
`hls/part/N.m4s`, `hls/segment/K.m4s`) rather than byte ranges of `/content`:
FFmpeg's HLS demuxer refuses a URI without a media extension, and over byte ranges of
a remote `/content` it lost a frame where the same layout as files decoded whole.

A job with a preview has a media playlist per rendition, and `multivariant_playlist`
lists them: the final ranked above the preview (`SCORE`), both of one resolution.

`PartIndex` learns each part's duration and whether it starts with a keyframe from
the fragment's own boxes as the job appends it (a moof is a few hundred bytes).
"""

from __future__ import annotations

from dataclasses import dataclass

from vaecast.codecs.fmp4 import SAMPLE_IS_NON_SYNC_SAMPLE, VideoTrack
from vaecast.codecs.fmp4_reader import fragment_timing, parse_init_segment

MEDIA_TYPE = "application/vnd.apple.mpegurl"
PLAYLIST_VERSION = 9
# A blocking request for a segment this far past the last one is refused (400), as the
# HLS specification says a server should for more than two segments ahead.
MAX_MSN_AHEAD = 2


@dataclass(frozen=True, slots=True)
class Part:
    duration_s: float
    independent: bool  # starts with a keyframe (or carries audio only)


@dataclass(frozen=True, slots=True)
class Segment:
    first_part: int
    parts: tuple[Part, ...]
    complete: bool

    @property
    def duration_s(self) -> float:
        return sum(part.duration_s for part in self.parts)


class PartIndex:
    """Every part of one job's MP4 as it is appended: fed each segment in order."""

    def __init__(self) -> None:
        self.parts: list[Part] = []
        self._timescales: dict[int, int] = {}
        self._video_track: int | None = None

    def add(self, segment: bytes) -> None:
        if not self._timescales:
            for track in parse_init_segment(segment).tracks:
                if isinstance(track, VideoTrack):
                    self._timescales[track.track_id] = track.timescale
                    self._video_track = track.track_id
                else:  # an AAC track counts in samples
                    self._timescales[track.track_id] = track.sample_rate
            return
        # The moof's timing alone: this runs on the event loop for every fragment.
        runs = {run.track_id: run for run in fragment_timing(segment)}
        run = runs.get(self._video_track) if self._video_track is not None else None
        if run is None:  # audio only: the tail of a stream whose length came last
            run = next(iter(runs.values()))
            independent = True
        else:
            independent = not run.first_sample_flags & SAMPLE_IS_NON_SYNC_SAMPLE
        duration = run.duration / self._timescales[run.track_id]
        self.parts.append(Part(duration, independent))


def segments(parts: list[Part], finished: bool) -> list[Segment]:
    """Parts grouped into segments, each starting at an independent part."""
    starts = [i for i, part in enumerate(parts) if part.independent or i == 0]
    grouped = []
    for number, start in enumerate(starts):
        end = starts[number + 1] if number + 1 < len(starts) else len(parts)
        complete = number + 1 < len(starts) or finished
        grouped.append(Segment(start, tuple(parts[start:end]), complete))
    return grouped


def media_playlist(
    parts: list[Part],
    *,
    finished: bool,
    target_duration_s: float,
    part_target_s: float,
    ended_early: bool = False,
) -> str:
    """The LL-HLS media playlist of `parts` (URIs relative to the playlist).

    `finished`: the job ended (`#EXT-X-ENDLIST`; no preload hint). `ended_early`: it
    failed or was cancelled, and the playlist ends where its video ends.
    `target_duration_s` bounds every segment (the keyframe interval); `part_target_s`
    every part (the longest chunk the decoder makes).
    """
    grouped = segments(parts, finished)
    longest_segment = max((s.duration_s for s in grouped if s.complete), default=0.0)
    part_target = max([part_target_s, *(p.duration_s for p in parts)])
    # Every segment's EXTINF, rounded, must be at most the target: a segment runs from
    # a keyframe to the first chunk past the interval, so up to a part longer.
    target = max(1, round(longest_segment), round(target_duration_s + part_target))
    lines = [
        "#EXTM3U",
        f"#EXT-X-VERSION:{PLAYLIST_VERSION}",
        f"#EXT-X-TARGETDURATION:{target}",
        f"#EXT-X-PART-INF:PART-TARGET={part_target:.5f}",
        f"#EXT-X-SERVER-CONTROL:CAN-BLOCK-RELOAD=YES,PART-HOLD-BACK={3 * part_target:.5f}",
        "#EXT-X-PLAYLIST-TYPE:EVENT",
        "#EXT-X-MEDIA-SEQUENCE:0",
        "#EXT-X-INDEPENDENT-SEGMENTS",
        # A generated video is watched from its start, not joined at its live edge
        # (Safari, AVPlayer, ExoPlayer and hls.js honour this; Chromium's own HLS does not).
        "#EXT-X-START:TIME-OFFSET=0,PRECISE=YES",
        '#EXT-X-MAP:URI="hls/init.mp4"',
    ]
    for number, segment in enumerate(grouped):
        for offset, part in enumerate(segment.parts):
            uri = f"hls/part/{segment.first_part + offset}.m4s"
            attributes = f'DURATION={part.duration_s:.5f},URI="{uri}"'
            if part.independent:
                attributes += ",INDEPENDENT=YES"
            lines.append(f"#EXT-X-PART:{attributes}")
        if segment.complete:
            lines.append(f"#EXTINF:{segment.duration_s:.5f},")
            lines.append(f"hls/segment/{number}.m4s")
    if finished or ended_early:
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


def part_position(parts: list[Part], finished: bool, msn: int, part: int | None) -> int | None:
    """How many parts must exist for segment `msn` (and its part `part`) to be in the
    playlist; None if they already are."""
    grouped = segments(parts, finished)
    if msn < len(grouped):
        segment = grouped[msn]
        if part is None:
            return None if segment.complete else segment.first_part + len(segment.parts) + 1
        needed = segment.first_part + part + 1
        return None if part < len(segment.parts) or segment.complete else needed
    return len(parts) + 1  # a later segment: at least one more part


def too_far_ahead(parts: list[Part], finished: bool, msn: int) -> bool:
    last = len(segments(parts, finished)) - 1
    return msn > last + MAX_MSN_AHEAD
