"""WHEP sessions: a WebRTC peer per viewer, fed from media its job's viewers share.

A session is made from a checked offer (`offer.py`): an aiortc `RTCPeerConnection`
whose transceivers exist before the offer is applied, so that their codec preferences
(the job's H.264, or VP8) decide the answer; its tracks are `PacedTrack`s over the
rendition's `JobMedia`, which every session of that rendition shares. ICE gathering
is done before the answer goes out (aiortc gathers host candidates in milliseconds),
so the answer carries every candidate and WHEP's PATCH (trickle ICE) is not needed.

Every peer, and what it does (SDP, ICE, DTLS, SRTP, pacing), lives in the peers'
process (`peer_process`, `peer_host`), started by the first offer: the server keeps the
sessions' table, the viewer cap and the shared media, and sends each stream's units
over once, however many sessions send it.

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
import logging
import secrets
import time
from collections import Counter as Tally
from dataclasses import dataclass
from fractions import Fraction

from vaecast.codecs.h264 import EncoderSettings, H264Encoder
from vaecast.errors import NotFoundError, ServerBusyError, VaecastError
from vaecast.job.transitions import Variant
from vaecast.server.faces.whep.media import JobMedia, UnitLog
from vaecast.server.faces.whep.offer import Offer, VideoCodec, is_constrained_baseline
from vaecast.server.faces.whep.peer_process import PeerProcess
from vaecast.server.faces.whep.peer_wire import PeerPlan
from vaecast.server.faces.whep.settings import WebRtcSettings
from vaecast.server.metrics import Metrics
from vaecast.server.stream.segment_log import SegmentLog
from vaecast.server.stream.viewers import JobViewers, ViewerPlayout

log = logging.getLogger("vaecast.webrtc")
FACE = "webrtc"  # its viewers' playouts are labelled so

RETRY_AFTER_S = 5


@dataclass(eq=False)
class WhepSession:
    id: str
    job_id: str
    variant: Variant
    video: VideoCodec
    media_key: tuple[str, str]
    binding: asyncio.Task[None] | None = None  # finds the streams its tracks send
    outcome: str | None = None
    stalls: int = 0
    late_sends: int = 0
    # Its viewer's playout among its job's (vaecast.server.stream.viewers), if told one.
    playouts: JobViewers | None = None
    playout: ViewerPlayout | None = None


class WhepSessions:
    """The app's WHEP sessions and the shared media they read."""

    def __init__(self, settings: WebRtcSettings, encoder: EncoderSettings, metrics: Metrics):
        self.settings = settings
        self._metrics = metrics
        self._sessions: dict[str, WhepSession] = {}
        self._media: dict[tuple[str, str], tuple[JobMedia, int]] = {}
        self._closing = False
        self._reserved = 0  # places taken by offers whose peer is being set up
        self._peers: PeerProcess | None = None  # from the first offer on
        self._starting: asyncio.Lock | None = None
        self._ending: set[asyncio.Task[None]] = set()
        # What profile a job's H.264 will have, before its first fragment says: the
        # server's encoder settings decide it (ultrafast: Constrained Baseline).
        self._expected_avcc = H264Encoder(64, 64, Fraction(16), encoder).avcc

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
        self,
        job_id: str,
        variant: Variant,
        segments: SegmentLog,
        offer: Offer,
        playouts: JobViewers | None = None,
    ) -> tuple[WhepSession, str]:
        """A session for a viewer of `segments` (a job's rendition): it and its SDP answer.
        `playouts`: the job's viewers' playouts, which this viewer's joins."""
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
            if playouts is not None:
                session.playouts = playouts
                session.playout = playouts.open(FACE, time.perf_counter())
        finally:
            self._reserved -= 1
        self._count_viewers()
        return session, answer

    async def peer_census(self) -> dict[str, int] | None:
        """What the peers' process holds (None before the first offer): tests check that
        nothing is left there once the sessions have ended."""
        if self._peers is None or not self._peers.alive:
            return None
        return await self._peers.census()

    @property
    def peers_pid(self) -> int | None:
        return None if self._peers is None else self._peers.pid

    async def close(self, session: WhepSession, outcome: str) -> None:
        """End a session (once: a second close of it is a no-op)."""
        if session.outcome is not None:
            return
        session.outcome = outcome
        self._sessions.pop(session.id, None)
        self._count_viewers()
        self._metrics.webrtc_sessions.labels(outcome).inc()
        if session.playouts is not None and session.playout is not None:
            session.playouts.close(session.playout)
        if session.binding is not None:
            session.binding.cancel()
        if self._peers is not None:
            self._peers.close_peer(session.id)
        await self._release_media(session.media_key)
        log.info(
            "whep session %s of %s ended: %s (%s, %d stalls, %d late sends)",
            session.id,
            session.job_id,
            outcome,
            session.video.value,
            session.stalls,
            session.late_sends,
        )

    async def close_all(self) -> None:
        self._closing = True
        for session in list(self._sessions.values()):
            await self.close(session, "shutdown")
        await asyncio.gather(*self._ending, return_exceptions=True)
        for media, _ in list(self._media.values()):
            await media.close()
        self._media.clear()
        if self._peers is not None:
            await self._peers.close()

    async def _peer_process(self) -> PeerProcess:
        """The peers' process: started by the first offer, and again after one died."""
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if self._peers is None or not self._peers.alive:
                self._peers = await PeerProcess.start(
                    self.settings, self._on_ended, self._on_playout, self._on_lost
                )
            return self._peers

    async def _connect(
        self,
        job_id: str,
        variant: Variant,
        key: tuple[str, str],
        media: JobMedia,
        segments: SegmentLog,
        offer: Offer,
    ) -> tuple[WhepSession, str]:
        """The peer for `offer`, made in the peers' process, and its SDP answer."""
        # The stream's real avcC once its init segment exists; until then, what the
        # server's encoder settings make (a queued job, a push session before its block).
        committed = len(segments) > 0
        reader = await media.ready() if committed else None
        video_codec = offer.video_codec(
            self._expected_avcc if reader is None else reader.video.avcc
        )
        join_s = await media.join_point_s() if committed else 0.0
        peers = await self._peer_process()
        session = WhepSession(secrets.token_urlsafe(16), job_id, variant, video_codec, key)
        plan = PeerPlan(video_codec.value, join_s, offer.sdp, offer.takes_audio)
        answer = await peers.open(session.id, plan)
        session.binding = asyncio.ensure_future(
            self._bind(peers, session, media, join_s, offer.takes_audio)
        )
        return session, answer

    async def _bind(
        self,
        peers: PeerProcess,
        session: WhepSession,
        media: JobMedia,
        join_s: float,
        takes_audio: bool,
    ) -> None:
        """Once the rendition's first fragment exists: the streams the session's tracks
        send, forwarded to the peers' process (None ends a track: a broken rendition, no
        audio, or an H.264 its peer did not negotiate)."""
        try:
            await media.ready()
        except VaecastError:
            peers.bind(session.id, "video", None)
            peers.bind(session.id, "audio", None)
            return
        video = self._video_units(session, media, join_s)
        audio = media.opus(join_s) if takes_audio else None
        streams = (("video", session.video.value, video), ("audio", "opus", audio))
        for track_kind, codec, units in streams:
            stream = None
            if units is not None:
                stream = (*session.media_key, codec)
                peers.forward(stream, units)
            peers.bind(session.id, track_kind, stream)

    def _video_units(self, session: WhepSession, media: JobMedia, join_s: float) -> UnitLog | None:
        if session.video is VideoCodec.VP8:
            return media.vp8(join_s)
        assert media.reader is not None
        if not is_constrained_baseline(media.reader.video.avcc):
            log.warning(
                "whep: video %s is not Constrained Baseline as its server's encoder "
                "settings made others; this viewer negotiated its H.264 and gets nothing",
                session.job_id,
            )
            return None
        return media.h264

    def _on_ended(self, session_id: str, outcome: str) -> None:
        session = self._sessions.get(session_id)
        if session is not None:
            self._end_later(session, outcome)

    def _on_playout(
        self, session_id: str, stalls: int, stalled_s: float, late_sends: int, playing: bool
    ) -> None:
        session = self._sessions.get(session_id)
        if session is None:
            return
        self._metrics.webrtc_stalls.inc(max(0, stalls - session.stalls))
        self._metrics.webrtc_late_sends.inc(max(0, late_sends - session.late_sends))
        session.stalls, session.late_sends = stalls, late_sends
        if session.playouts is not None and session.playout is not None and playing:
            session.playouts.paced(session.playout, stalls, stalled_s, time.perf_counter())

    def _on_lost(self) -> None:
        for session in list(self._sessions.values()):
            self._end_later(session, "failed")

    def _end_later(self, session: WhepSession, outcome: str) -> None:
        task = asyncio.ensure_future(self.close(session, outcome))
        self._ending.add(task)
        task.add_done_callback(self._ending.discard)

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
        if self._peers is not None:
            await self._peers.drop(key)
        await media.close()

    def _count_viewers(self) -> None:
        for codec, count in self.counts().items():
            self._metrics.webrtc_viewers.labels(codec).set(count)
