"""The WebRTC peers' process: every aiortc peer of a server, and all that it costs.

A peer costs CPU in Python: a certificate per peer, the SDP, ICE checks, the DTLS
handshake, then SRTP and pacing for every packet. In the server's process that work
held the GIL, and every request waited behind a burst of offers, even with the peers
on a thread of their own (`benchmarks.whep_offers` measures it). So the peers live
here, in a process the server starts with its first offer (`peer_process`), niced so
that the server's requests come first; it ends when the server closes its pipe.

The server decides everything a client can get wrong (the offer's checks, the viewer
cap, the codec) and sends what the peers need over the pipe (`peer_wire`): each offer,
and the units of each stream its sessions send, as they are appended. Here each
session's tracks pace those units (`tracks`), and a watch per session says when the
server should end it (`WhepSessions`' list of outcomes).

    python -m vaecast.server.faces.whep.peer_host   (the server starts it; not for users)
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import os
import signal
import sys
from dataclasses import dataclass, field
from typing import Any

from aiortc import (
    RTCConfiguration,
    RTCIceServer,
    RTCPeerConnection,
    RTCRtpSender,
    RTCSessionDescription,
)

from vaecast.errors import DecodeFailedError
from vaecast.server.faces.whep.ice_addresses import use_host_addresses
from vaecast.server.faces.whep.media import UnitLog
from vaecast.server.faces.whep.peer_wire import Message, PeerPlan, frame, read_message
from vaecast.server.faces.whep.settings import WebRtcSettings
from vaecast.server.faces.whep.tracks import PacedTrack, ViewerClock

log = logging.getLogger("vaecast.webrtc")

# The peers' share of a busy CPU: a request to the server wakes and runs first, and
# pacing still gets the little it needs (the server's decode threads are not niced
# either, so a saturated machine shares with them as before).
NICENESS = 10
WATCH_INTERVAL_S = 0.5
# After the last unit went out, the peer gets this long to receive it before the close.
LINGER_S = 1.0
_MIME_TYPES = {"h264": "video/H264", "vp8": "video/VP8"}

StreamKey = tuple[str, str, str]  # job id, variant, codec


@dataclass(eq=False)
class Peer:
    pc: RTCPeerConnection
    tracks: list[PacedTrack]
    clock: ViewerClock
    opened_at: float
    watch: asyncio.Task[None] | None = None
    sending_since: float | None = field(default=None)


class PeerHost:
    """The peers, the streams they send, and the messages that drive them."""

    def __init__(self, settings: WebRtcSettings, send: Any) -> None:
        self.settings = settings
        self._send = send
        self._peers: dict[str, Peer] = {}
        self._opening: dict[str, asyncio.Task[None]] = {}
        self._streams: dict[StreamKey, UnitLog] = {}
        self._bound: dict[tuple[str, str], asyncio.Future[UnitLog | None]] = {}
        self._closing: set[asyncio.Task[None]] = set()
        self._ice_servers = [
            RTCIceServer(s.url, username=s.username, credential=s.credential)
            for s in settings.ice_servers
        ]

    def handle(self, message: Message) -> None:
        kind, *fields = message
        if kind == "open":
            session_id, plan = fields
            task = asyncio.ensure_future(self._open(session_id, plan))
            self._opening[session_id] = task
            task.add_done_callback(lambda _: self._opening.pop(session_id, None))
        elif kind == "stream":
            key, time_base = fields
            self._streams[key] = UnitLog(time_base)
        elif kind == "units":
            key, units = fields
            stream = self._streams.get(key)
            if stream is not None and not stream.closed:
                stream.receive(units, asyncio.get_running_loop().time())
        elif kind == "end":
            self._end(*fields)
        elif kind == "bind":
            session_id, track_kind, key = fields
            bound = self._binding(session_id, track_kind)
            if not bound.done():
                bound.set_result(None if key is None else self._streams.get(key))
        elif kind == "close":
            (session_id,) = fields
            task = asyncio.ensure_future(self._close(session_id))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)
        elif kind == "drop":
            (media_key,) = fields
            for key in [k for k in self._streams if k[:2] == tuple(media_key)]:
                self._end(key, "no session reads this stream any more")
                del self._streams[key]
        elif kind == "census":
            (request_id,) = fields
            self._send(("census", request_id, self.census()))
        else:
            raise ValueError(f"no such message on the peers' pipe: {kind!r}")

    def census(self) -> dict[str, int]:
        """What is held here: for tests (nothing is left once every session ended)."""
        current = asyncio.current_task()
        return {
            "peers": len(self._peers),
            "opening": len(self._opening),
            "streams": len(self._streams),
            "bindings": len(self._bound),
            "tasks": sum(1 for t in asyncio.all_tasks() if t is not current and not t.done()),
        }

    async def close_all(self) -> None:
        for session_id in list(self._opening) + list(self._peers):
            await self._close(session_id)
        await asyncio.gather(*self._closing, return_exceptions=True)

    def _end(self, key: StreamKey, error: str | None) -> None:
        stream = self._streams.get(key)
        if stream is None:
            return
        if error is None:
            stream.finish()
        else:
            stream.abort(DecodeFailedError(error))

    def _binding(self, session_id: str, track_kind: str) -> asyncio.Future[UnitLog | None]:
        key = (session_id, track_kind)
        if key not in self._bound:
            self._bound[key] = asyncio.get_running_loop().create_future()
        return self._bound[key]

    async def _open(self, session_id: str, plan: PeerPlan) -> None:
        try:
            peer, answer = await self._make_peer(session_id, plan)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            self._forget(session_id)
            self._send(("refused", session_id, str(error)[:200] or type(error).__name__))
            return
        self._peers[session_id] = peer
        peer.watch = asyncio.ensure_future(self._watch(session_id, peer))
        self._send(("answer", session_id, answer))

    async def _make_peer(self, session_id: str, plan: PeerPlan) -> tuple[Peer, str]:
        clock = ViewerClock(plan.join_s)
        pc = RTCPeerConnection(RTCConfiguration(iceServers=self._ice_servers))
        tracks: list[PacedTrack] = []

        def source(track_kind: str) -> Any:
            async def bound() -> UnitLog | None:
                return await self._binding(session_id, track_kind)

            return bound

        try:
            video_track = PacedTrack("video", source("video"), clock, leads=True)
            transceiver = pc.addTransceiver(video_track, direction="sendonly")
            transceiver.setCodecPreferences(_capabilities("video", _MIME_TYPES[plan.video_codec]))
            tracks.append(video_track)
            if plan.takes_audio:
                audio_track = PacedTrack("audio", source("audio"), clock, leads=False)
                audio = pc.addTransceiver(audio_track, direction="sendonly")
                audio.setCodecPreferences(_capabilities("audio", "audio/opus"))
                tracks.append(audio_track)
            try:
                await pc.setRemoteDescription(RTCSessionDescription(plan.offer_sdp, "offer"))
                await pc.setLocalDescription(await pc.createAnswer())
            except (ValueError, KeyError, IndexError, TypeError) as error:
                raise ValueError(f"the SDP offer was refused: {error!s:.200}") from error
            except Exception as error:  # aiortc's OperationError: no codec in common
                reason = f"no session could be made from the offer: {error!s:.200}"
                raise ValueError(reason) from error
        except BaseException:
            await pc.close()
            raise
        opened_at = asyncio.get_running_loop().time()
        return Peer(pc, tracks, clock, opened_at), pc.localDescription.sdp

    async def _close(self, session_id: str) -> None:
        opening = self._opening.get(session_id)
        if opening is not None:
            opening.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await opening
        peer = self._peers.pop(session_id, None)
        self._forget(session_id)
        if peer is None:
            return
        if peer.watch is not None and peer.watch is not asyncio.current_task():
            peer.watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await peer.watch
        for track in peer.tracks:
            track.stop()
        await peer.pc.close()

    def _forget(self, session_id: str) -> None:
        for track_kind in ("video", "audio"):
            bound = self._bound.pop((session_id, track_kind), None)
            if bound is not None and not bound.done():
                bound.set_result(None)

    async def _watch(self, session_id: str, peer: Peer) -> None:
        """Tell the server when a session has ended, failed or gone quiet (the outcomes
        `WhepSessions` counts); the server's close ends this watch."""
        loop = asyncio.get_running_loop()
        settings = self.settings
        reported: tuple[int, float, int, bool] | None = None
        while True:
            await asyncio.sleep(WATCH_INTERVAL_S)
            now = loop.time()
            state = peer.pc.connectionState
            clock = peer.clock
            playout = (
                clock.stalls,
                round(clock.stalled_s, 3),
                clock.late_sends,
                clock.start_s is not None,
            )
            if playout != reported:  # its stalls and late sends so far, whether it plays
                self._send(("playout", session_id, *playout))
                reported = playout
            outcome = None
            if state in ("failed", "closed"):
                outcome = "failed"
            elif state != "connected":
                if now - peer.opened_at > settings.connect_timeout_s:
                    outcome = "ice_timeout"
            elif all(track.readyState == "ended" for track in peer.tracks):
                await asyncio.sleep(LINGER_S)
                outcome = "ended"
            elif peer.sending_since is None:
                # Receivers report on what they received: nothing sent, nothing to
                # report (a push session waiting for its first block can take long).
                if any(track.sent for track in peer.tracks):
                    peer.sending_since = now
            elif min(await _quiet_for(peer.pc), now - peer.sending_since) > (
                settings.peer_timeout_s
            ):
                outcome = "peer_timeout"
            if outcome is not None:
                self._send(("ended", session_id, outcome))
                return


def _capabilities(kind: str, mime_type: str) -> list[Any]:
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


class _PipeLogHandler(logging.Handler):
    """This process's log records, sent to the server to log as its own."""

    def __init__(self, send: Any) -> None:
        super().__init__()
        self._send = send

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(Exception):
            self._send(("log", record.levelno, record.name, record.getMessage()))


async def serve(wire_in: int, wire_out: int) -> None:
    """Read messages from `wire_in` until the server closes it or says exit."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=2**20)
    await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(wire_in, "rb", 0)
    )
    transport, protocol = await loop.connect_write_pipe(
        asyncio.streams.FlowControlMixin, os.fdopen(wire_out, "wb", 0)
    )
    writer = asyncio.StreamWriter(transport, protocol, None, loop)

    def send(message: Message) -> None:
        if not writer.is_closing():
            writer.write(frame(message))

    first = await read_message(reader)
    if first is None or first[0] != "start":
        return
    _, settings, log_level = first
    root = logging.getLogger()
    root.handlers[:] = [_PipeLogHandler(send)]
    root.setLevel(log_level)
    use_host_addresses(settings.host_addresses)
    host = PeerHost(settings, send)
    try:
        while (message := await read_message(reader)) is not None and message[0] != "exit":
            host.handle(message)
    finally:
        await host.close_all()
        with contextlib.suppress(Exception):
            await writer.drain()
        writer.close()


def main() -> None:
    # The pipe is stdin and stdout; whatever else might print goes to stderr instead,
    # never between two frames.
    wire_in, wire_out = os.dup(0), os.dup(1)
    os.dup2(2, 1)
    # A terminal's Ctrl-C, and a service manager's stop, signal every process of the
    # server: this one ends when the server closes its pipe, after it has ended its
    # sessions, not first under their viewers (a SIGKILL of the server closes it too).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.nice(NICENESS)
    asyncio.run(serve(wire_in, wire_out))


if __name__ == "__main__":
    sys.exit(main())
