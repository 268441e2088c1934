"""A WHEP client's SDP offer, checked before any peer connection exists: no I/O.

An offer is the one thing a WHEP client sends, and it is the client's to make worst:
it is bounded in size and in media sections, must be UTF-8 text that aiortc's parser
reads, and must ask to receive video. What this module decides from it is the codec
the viewer gets: the job's own H.264 when the offer takes packetization mode 1 in a
profile that decodes the job's stream, else VP8 from the encode the job's WebRTC
viewers share.

aiortc negotiates H.264 only in Baseline and Constrained Baseline (profile-level-id
42001f and 42e01f), so the job's own H.264 can pass through only when it is
Constrained Baseline, which ultrafast (vaecast's default preset) writes; another
preset's Main or High profile is sent as VP8.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from aiortc import sdp as aiortc_sdp

from vaecast.errors import InvalidRequestError, MalformedRequestError, UnsupportedMediaError

MEDIA_TYPE = "application/sdp"
MAX_OFFER_BYTES = 32 * 1024  # a browser's offer is 4-8 KiB
MAX_MEDIA_SECTIONS = 4
MAX_CODECS_PER_SECTION = 64
_RECEIVING = frozenset({"recvonly", "sendrecv"})
# Constrained Baseline: profile_idc 66 with constraint_set1 (H.264 A.2.1.1).
_BASELINE = 66
_CONSTRAINT_SET1 = 0x40
_DECODES_CONSTRAINED_BASELINE = frozenset(
    {aiortc_sdp.H264Profile.PROFILE_BASELINE, aiortc_sdp.H264Profile.PROFILE_CONSTRAINED_BASELINE}
)


class VideoCodec(enum.StrEnum):
    H264 = "h264"  # the job's own access units, packetized per viewer
    VP8 = "vp8"  # one VP8 encode per job, shared by its viewers


@dataclass(frozen=True, slots=True)
class Offer:
    sdp: str
    takes_audio: bool
    takes_h264: bool  # an H.264 the job's Constrained Baseline stream can pass through

    def video_codec(self, stream_avcc: bytes) -> VideoCodec:
        """What this viewer gets of a stream whose avcC is `stream_avcc`."""
        return (
            VideoCodec.H264
            if self.takes_h264 and is_constrained_baseline(stream_avcc)
            else (VideoCodec.VP8)
        )


def is_constrained_baseline(avcc: bytes) -> bool:
    return len(avcc) > 2 and avcc[1] == _BASELINE and bool(avcc[2] & _CONSTRAINT_SET1)


def read_offer(content_type: str, body: bytes) -> Offer:
    """The offer in a WHEP POST; raises the error its client should see (415, 400)."""
    if content_type.split(";")[0].strip().lower() != MEDIA_TYPE:
        raise UnsupportedMediaError(f"a WHEP offer is sent as {MEDIA_TYPE}, not {content_type!r}")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as error:
        raise MalformedRequestError("the SDP offer is not UTF-8 text") from error
    if text.count("\nm=") + text.startswith("m=") > MAX_MEDIA_SECTIONS:
        raise InvalidRequestError(f"an offer may have at most {MAX_MEDIA_SECTIONS} media sections")
    try:
        description = aiortc_sdp.SessionDescription.parse(text)
    except Exception as error:  # the parser raises whatever garbage makes it raise
        raise MalformedRequestError(f"the SDP offer could not be read: {error!s:.200}") from error
    receiving = [m for m in description.media if m.direction in _RECEIVING]
    videos = [m for m in receiving if m.kind == "video"]
    if not videos:
        raise InvalidRequestError(
            "the offer receives no video: add a recvonly video transceiver before createOffer"
        )
    for media in description.media:
        if len(media.rtp.codecs) > MAX_CODECS_PER_SECTION:
            raise InvalidRequestError(
                f"a media section may list at most {MAX_CODECS_PER_SECTION} codecs"
            )
        if not media.ice.usernameFragment or not media.ice.password:
            raise InvalidRequestError("every media section needs ICE credentials")
        if media.dtls is None or not media.dtls.fingerprints:
            raise InvalidRequestError("every media section needs a DTLS fingerprint")
    return Offer(
        text,
        takes_audio=any(m.kind == "audio" for m in receiving),
        takes_h264=any(_takes_h264(codec) for codec in videos[0].rtp.codecs),
    )


def _takes_h264(codec: aiortc_sdp.RTCRtpCodecParameters) -> bool:
    if codec.mimeType.lower() != "video/h264":
        return False
    if str(codec.parameters.get("packetization-mode", "0")) != "1":
        return False
    try:
        profile, _ = aiortc_sdp.parse_h264_profile_level_id(
            str(codec.parameters.get("profile-level-id", "42e01f"))
        )
    except ValueError:
        return False
    return profile in _DECODES_CONSTRAINED_BASELINE
