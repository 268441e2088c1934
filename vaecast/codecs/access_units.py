"""A job's fragments read back as access units, the form RTP senders packetize: no I/O.

WebRTC carries each encoded frame on its own, timestamped, with no container: so a
WHEP viewer (`vaecast.server.faces.whep`) gets the job's own H.264 as the fragments hold
it, taken apart here rather than encoded again. A video access unit is turned from an
`avc1` sample (length-prefixed NAL units, parameter sets in the avcC) into Annex B
(start codes), with the SPS and PPS in front of every keyframe: an RTP receiver has no
init segment, and a viewer who joins at a keyframe needs them there. An audio access
unit is one raw AAC frame, which the Opus encode shared by a job's viewers decodes.

Times are in each track's own timescale: `pts` is the decode time plus the
composition offset, which for vaecast's encodes (no B-frames) is the decode time.
"""

from __future__ import annotations

from dataclasses import dataclass

from vaecast.codecs.avc import parse_avc_decoder_configuration_record, split_length_prefixed
from vaecast.codecs.fmp4 import AudioTrack, VideoTrack
from vaecast.codecs.fmp4_reader import InitSegment, parse_fragment

_START_CODE = b"\x00\x00\x00\x01"


@dataclass(frozen=True, slots=True)
class AccessUnit:
    pts: int  # in its track's timescale
    duration: int
    keyframe: bool
    data: bytes  # video: Annex B; audio: one raw AAC frame


@dataclass(frozen=True, slots=True)
class FragmentUnits:
    video: tuple[AccessUnit, ...]
    audio: tuple[AccessUnit, ...]


def annexb(units: list[bytes]) -> bytes:
    return b"".join(_START_CODE + unit for unit in units)


class AccessUnitReader:
    """Reads one stream's fragments, given its init segment: `read(fragment)` gives that
    fragment's video and audio access units in presentation order."""

    def __init__(self, init: InitSegment) -> None:
        videos = [t for t in init.tracks if isinstance(t, VideoTrack)]
        audios = [t for t in init.tracks if isinstance(t, AudioTrack)]
        if len(videos) != 1 or len(audios) > 1:
            raise ValueError(
                f"expected one video track and at most one audio track, found "
                f"{len(videos)} and {len(audios)}"
            )
        self.video: VideoTrack = videos[0]
        self.audio: AudioTrack | None = audios[0] if audios else None
        sps, pps = parse_avc_decoder_configuration_record(self.video.avcc)
        self._parameter_sets = annexb([*sps, *pps])

    def read(self, fragment: bytes) -> FragmentUnits:
        """Raises ValueError on a fragment that is not one of this stream's."""
        video: list[AccessUnit] = []
        audio: list[AccessUnit] = []
        audio_id = None if self.audio is None else self.audio.track_id
        for run in parse_fragment(fragment).runs:
            if run.track_id not in (self.video.track_id, audio_id):
                raise ValueError(f"fragment carries unknown track {run.track_id}")
            is_video = run.track_id == self.video.track_id
            decode_time = run.base_media_decode_time
            for sample in run.run.samples:
                pts = decode_time + sample.composition_offset
                if is_video:
                    data = annexb(split_length_prefixed(sample.data))
                    if sample.is_sync:
                        data = self._parameter_sets + data
                    video.append(AccessUnit(pts, sample.duration, sample.is_sync, data))
                else:
                    audio.append(AccessUnit(pts, sample.duration, True, sample.data))
                decode_time += sample.duration
        return FragmentUnits(tuple(video), tuple(audio))
