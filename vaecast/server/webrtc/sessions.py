"""WHEP sessions: a WebRTC peer per viewer, fed from media its job's viewers share.

A session is made from a checked offer (`offer.py`): an aiortc `RTCPeerConnection`
whose transceivers exist before the offer is applied, so that their codec preferences
(the job's H.264, or VP8) decide the answer; its tracks are `PacedTrack`s over the
rendition's `JobMedia`, which every session of that rendition shares. ICE gathering
is done before the answer goes out (aiortc gathers host candidates in milliseconds),
so the answer carries every candidate and WHEP's PATCH (trickle ICE) is not needed.

Every peer, and what it does (SDP, ICE, DTLS, SRTP, pacing), lives on the peers' own
loop (`rtc_loop`), started by the first offer: the server's loop keeps the sessions'
table, the viewer cap and the shared media, and hands each peer's work over.

Every session ends, and frees what it holds, for one of these reasons, each counted in
`vaecast_webrtc_sessions{outcome}`:
- `ended`: its video was sent to the end (the job finished, or broke);
- `deleted`: the client's DELETE on the session's URL;
- `ice_timeout`: ICE and DTLS did not complete within `connect_timeout_s`;
- `peer_timeout`: a connected peer sent no RTCP receiver report for `peer_timeout_s`
  (it stopped reading, or vanished without a word);
- `failed`: ICE or DTLS failed, or the peer closed;
- `shutdown`: the server stopped.
A peer that is slow or loses packets costs only itself: RTP goes out over UDP without
waiting, and each track reads the shared logs at its own pace.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import datetime
import logging
import secrets
from collections import Counter as Tally
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from aiortc import (
    RTCConfiguration,
    RTCIceServer,
    RTCPeerConnection,
    RTCRtpSender,
    RTCSessionDescription,
)

from vaecast.codecs.h264 import EncoderSettings, H264Encoder
from vaecast.errors import MalformedRequestError, NotFoundError, ServerBusyError
from vaecast.server.metrics import Metrics
from vaecast.server.stream.segment_log import SegmentLog
from vaecast.server.webrtc.ice_addresses import use_host_addresses
from vaecast.server.webrtc.media import JobMedia, UnitLog
from vaecast.server.webrtc.offer import Offer, VideoCodec, is_constrained_baseline
from vaecast.server.webrtc.rtc_loop import Hop, RtcLoop, hop_to
from vaecast.server.webrtc.settings import WebRtcSettings
from vaecast.server.webrtc.tracks import PacedTrack, ViewerClock

log = logging.getLogger("vaecast.webrtc")

RETRY_AFTER_S = 5
WATCH_INTERVAL_S = 0.5
# After the last unit went out, the peer gets this long to receive it before the close.
LINGER_S = 1.0
_MIME_TYPES = {VideoCodec.H264: "video/H264", VideoCodec.VP8: "video/VP8"}


@dataclass(eq=False)
class WhepSession:
    id: str
    job_id: str
    variant: str
    video: VideoCodec
    pc: RTCPeerConnection
    tracks: list[PacedTrack]
    clock: ViewerClock
    media_key: tuple[str, str]
    opened_at: float  # on the peers' loop's clock
    watch: concurrent.futures.Future[None] | None = None
    outcome: str | None = None
    sending_since: float | None = field(default=None)


class WhepSessions:
    """The app's WHEP sessions and the shared media they read."""

    def __init__(self, settings: WebRtcSettings, encoder: EncoderSettings, metrics: Metrics):
        self.settings = settings
        self._metrics = metrics
        self._sessions: dict[str, WhepSession] = {}
        self._media: dict[tuple[str, str], tuple[JobMedia, int]] = {}
        self._closing = False
        self._reserved = 0  # places taken by offers whose peer is being set up
        self._rtc: RtcLoop | None = None  # the peers' loop, from the first offer on
        use_host_addresses(settings.host_addresses)
        # What profile a job's H.264 will have, before its first fragment says: the
        # server's encoder settings decide it (ultrafast: Constrained Baseline).
        self._expected_avcc = H264Encoder(64, 64, Fraction(16), encoder).avcc
        self._ice_servers = [
            RTCIceServer(s.url, username=s.username, credential=s.credential)
            for s in settings.ice_servers
        ]

    def __len__(self) -> int:
        return len(self._sessions)

    def counts(self) -> dict[str, int]:
        tally = Tally(session.video.value for session in self._sessions.values())
        return {codec.value: tally.get(codec.value, 0) for codec in VideoCodec}

    def session(self, job_id: str, session_id: str) -> WhepSession:
        session = self._sessions.get(session_id)
        if session is None or session.job_id != job_id:
            raise NotFoundError(f"no WHEP session {session_id[:64]!r} for video {job_id}")
        return session

    async def open(
        self, job_id: str, variant: str, segments: SegmentLog, offer: Offer
    ) -> tuple[WhepSession, str]:
        """A session for a viewer of `segments` (a job's rendition): it and its SDP answer."""
        if self._closing:
            raise ServerBusyError("the server is shutting down", RETRY_AFTER_S)
        # A place is reserved before the peer is set up (which awaits), and released on
        # every path: counted only once set up, concurrent offers would all pass the
        # check, and the cap would not hold.
        if len(self._sessions) + self._reserved >= self.settings.max_viewers:
            self._metrics.webrtc_sessions.labels("refused").inc()
            raise ServerBusyError(
                f"{self.settings.max_viewers} WebRTC viewers already (--max-webrtc-viewers)",
                RETRY_AFTER_S,
            )
        self._reserved += 1
        key = (job_id, variant)
        try:
            media = self._hold_media(key, segments)
            try:
                session, answer = await self._connect(job_id, variant, key, media, segments, offer)
            except BaseException:
                await self._release_media(key)
                raise
            self._sessions[session.id] = session
        finally:
            self._reserved -= 1
        self._count_viewers()
        on_server = hop_to(asyncio.get_running_loop())
        session.watch = self._peers().spawn(self._watch(session, on_server))
        return session, answer

    def _peers(self) -> RtcLoop:
        if self._rtc is None:
            self._rtc = RtcLoop()
        return self._rtc

    def peer_tasks(self) -> set[asyncio.Task[None]]:
        """What still runs on the peers' loop (tracks' senders, watches)."""
        return set() if self._rtc is None else self._rtc.tasks()

    async def close(self, session: WhepSession, outcome: str) -> None:
        """End a session (once: a second close of it is a no-op)."""
        if session.outcome is not None:
            return
        session.outcome = outcome
        self._sessions.pop(session.id, None)
        self._count_viewers()
        self._metrics.webrtc_sessions.labels(outcome).inc()
        await self._peers().call(_close_peer(session))
        await self._release_media(session.media_key)
        log.info(
            "whep session %s of %s ended: %s (%s, %d stalls)",
            session.id,
            session.job_id,
            outcome,
            session.video.value,
            session.clock.stalls,
        )
        # Its watch ends by itself once it sees the outcome (it may be what closed it).

    async def close_all(self) -> None:
        self._closing = True
        for session in list(self._sessions.values()):
            await self.close(session, "shutdown")
        for media, _ in list(self._media.values()):
            await media.close()
        self._media.clear()
        if self._rtc is not None:
            await self._rtc.close()

    async def _connect(
        self,
        job_id: str,
        variant: str,
        key: tuple[str, str],
        media: JobMedia,
        segments: SegmentLog,
        offer: Offer,
    ) -> tuple[WhepSession, str]:
        """The peer for `offer`, made on the peers' loop, and its SDP answer."""
        # The stream's real avcC once its init segment exists; until then, what the
        # server's encoder settings make (a queued job, a push session before its block).
        committed = len(segments) > 0
        reader = await media.ready() if committed else None
        video_codec = offer.video_codec(
            self._expected_avcc if reader is None else reader.video.avcc
        )
        join_s = await media.join_point_s() if committed else 0.0

        async def video_units() -> UnitLog | None:
            reader = await media.ready()
            if video_codec is VideoCodec.VP8:
                return media.vp8(join_s)
            if not is_constrained_baseline(reader.video.avcc):
                log.warning(
                    "whep: video %s is not Constrained Baseline as its server's encoder "
                    "settings made others; this viewer negotiated its H.264 and gets nothing",
                    job_id,
                )
                return None
            return media.h264

        async def audio_units() -> UnitLog | None:
            await media.ready()
            return media.opus(join_s)

        peer = _make_peer(
            PeerPlan(job_id, variant, key, video_codec, join_s, offer, self._ice_servers),
            video_units,
            audio_units,
            hop_to(asyncio.get_running_loop()),
        )
        return await self._peers().call(peer)

    async def _watch(self, session: WhepSession, on_server: Hop[Any]) -> None:
        """On the peers' loop: close the session (on the server's loop, `on_server`)
        when it has ended, failed or gone quiet (the module's list); ends once the
        session has an outcome, whoever closed it."""
        loop = asyncio.get_running_loop()
        settings = self.settings
        stalls_seen = 0
        while session.outcome is None:
            await asyncio.sleep(WATCH_INTERVAL_S)
            now = loop.time()
            state = session.pc.connectionState
            if session.clock.stalls > stalls_seen:
                self._metrics.webrtc_stalls.inc(session.clock.stalls - stalls_seen)
                stalls_seen = session.clock.stalls
            outcome = None
            if state in ("failed", "closed"):
                outcome = "failed"
            elif state != "connected":
                if now - session.opened_at > settings.connect_timeout_s:
                    outcome = "ice_timeout"
            elif all(track.readyState == "ended" for track in session.tracks):
                await asyncio.sleep(LINGER_S)
                outcome = "ended"
            elif session.sending_since is None:
                # Receivers report on what they received: nothing sent, nothing to
                # report (a push session waiting for its first block can take long).
                if any(track.sent for track in session.tracks):
                    session.sending_since = now
            elif min(await _quiet_for(session.pc), now - session.sending_since) > (
                settings.peer_timeout_s
            ):
                outcome = "peer_timeout"
            if outcome is not None:
                await on_server(self.close(session, outcome))

    def _hold_media(self, key: tuple[str, str], segments: SegmentLog) -> JobMedia:
        held = self._media.get(key)
        if held is None:
            media = JobMedia(segments, self._count_encode)
            self._media[key] = (media, 1)
            return media
        media, count = held
        self._media[key] = (media, count + 1)
        return media

    def _count_encode(self, codec: str) -> None:
        self._metrics.webrtc_shared_encodes.labels(codec).inc()

    async def _release_media(self, key: tuple[str, str]) -> None:
        held = self._media.get(key)
        if held is None:
            return
        media, count = held
        if count > 1:
            self._media[key] = (media, count - 1)
            return
        del self._media[key]
        await media.close()

    def _count_viewers(self) -> None:
        for codec, count in self.counts().items():
            self._metrics.webrtc_viewers.labels(codec).set(count)


@dataclass(frozen=True)
class PeerPlan:
    """What a viewer's peer is made of, decided on the server's loop."""

    job_id: str
    variant: str
    media_key: tuple[str, str]
    video_codec: VideoCodec
    join_s: float
    offer: Offer
    ice_servers: list[RTCIceServer]


UnitSource = Callable[[], Coroutine[Any, Any, UnitLog | None]]


async def _make_peer(
    plan: PeerPlan, video_units: UnitSource, audio_units: UnitSource, on_server: Hop[Any]
) -> tuple[WhepSession, str]:
    """On the peers' loop: the peer for `plan.offer`, and its SDP answer. Its tracks
    ask `video_units()`/`audio_units()`, and wait for units, on the server's loop."""
    clock = ViewerClock(plan.join_s)
    pc = RTCPeerConnection(RTCConfiguration(iceServers=plan.ice_servers))
    tracks: list[PacedTrack] = []
    try:
        video_track = PacedTrack("video", video_units, clock, leads=True, hop=on_server)
        transceiver = pc.addTransceiver(video_track, direction="sendonly")
        transceiver.setCodecPreferences(_capabilities("video", _MIME_TYPES[plan.video_codec]))
        tracks.append(video_track)
        if plan.offer.takes_audio:
            audio_track = PacedTrack("audio", audio_units, clock, leads=False, hop=on_server)
            audio = pc.addTransceiver(audio_track, direction="sendonly")
            audio.setCodecPreferences(_capabilities("audio", "audio/opus"))
            tracks.append(audio_track)
        try:
            await pc.setRemoteDescription(RTCSessionDescription(plan.offer.sdp, "offer"))
            await pc.setLocalDescription(await pc.createAnswer())
        except (ValueError, KeyError, IndexError, TypeError) as error:
            raise MalformedRequestError(f"the SDP offer was refused: {error!s:.200}") from error
        except Exception as error:  # aiortc's OperationError: no codec in common
            raise MalformedRequestError(
                f"no session could be made from the offer: {error!s:.200}"
            ) from error
    except BaseException:
        await pc.close()
        raise
    opened_at = asyncio.get_running_loop().time()
    session = WhepSession(
        secrets.token_urlsafe(16),
        plan.job_id,
        plan.variant,
        plan.video_codec,
        pc,
        tracks,
        clock,
        plan.media_key,
        opened_at,
    )
    return session, pc.localDescription.sdp


async def _close_peer(session: WhepSession) -> None:
    """On the peers' loop: stop the session's tracks and close its peer."""
    for track in session.tracks:
        track.stop()
    await session.pc.close()


def _capabilities(kind: str, mime_type: str) -> list:
    codecs = RTCRtpSender.getCapabilities(kind).codecs
    chosen = [c for c in codecs if c.mimeType.lower() == mime_type.lower()]
    rtx = [c for c in codecs if c.mimeType.lower().endswith("/rtx")]
    return chosen + rtx


async def _quiet_for(pc: RTCPeerConnection) -> float:
    """Seconds since the peer's last RTCP receiver report on any sender (inf if none)."""
    latest = None
    for sender in pc.getSenders():
        with contextlib.suppress(Exception):
            for stat in (await sender.getStats()).values():
                if stat.type == "remote-inbound-rtp" and (
                    latest is None or stat.timestamp > latest
                ):
                    latest = stat.timestamp
    if latest is None:
        return float("inf")
    return (datetime.datetime.now(datetime.UTC) - latest).total_seconds()
