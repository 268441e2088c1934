"""A real WHEP client peer in Python (aiortc), for tests and benchmarks.

`WhepViewer.connect` offers to receive video (and audio), POSTs the offer to a job's
WHEP URL over real HTTP, applies the answer, and counts the frames it decodes; `close`
DELETEs the session and closes the peer. `codecs` limits the video codecs offered
(["video/VP8"]: a peer the job's H.264 cannot pass through to). `loss` drops that share
of the datagrams the peer receives (DTLS, SRTP, SRTCP; not STUN), picked by a
`random.Random(seed)`: a lossy network on the viewer's side only.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiortc import RTCPeerConnection, RTCRtpReceiver, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError


@dataclass
class WhepViewer:
    pc: RTCPeerConnection
    location: str | None = None
    video: str | None = None  # the server's X-WebRTC-Video
    frames: list[Any] = field(default_factory=list)
    audio_frames: int = 0
    first_frame_at: float | None = None
    datagrams_dropped: int = 0
    datagrams_delivered: int = 0
    frame_times: list[float] = field(default_factory=list)
    _readers: list[asyncio.Task[None]] = field(default_factory=list)

    @classmethod
    async def connect(
        cls,
        client: aiohttp.ClientSession,
        url: str,
        *,
        codecs: list[str] | None = None,
        audio: bool = True,
        headers: dict[str, str] | None = None,
        loss: float = 0.0,
        seed: int = 0,
    ) -> tuple[WhepViewer, aiohttp.ClientResponse, str]:
        """The viewer, the WHEP POST's response and its body (on any status)."""
        pc = RTCPeerConnection()
        viewer = cls(pc)
        video = pc.addTransceiver("video", direction="recvonly")
        if codecs is not None:
            available = RTCRtpReceiver.getCapabilities("video").codecs
            video.setCodecPreferences([c for c in available if c.mimeType in codecs])
        if audio:
            pc.addTransceiver("audio", direction="recvonly")
        if loss:
            viewer._drop_inbound(loss, random.Random(seed))

        @pc.on("track")
        def on_track(track: Any) -> None:
            viewer._readers.append(asyncio.ensure_future(viewer._read(track)))

        await pc.setLocalDescription(await pc.createOffer())
        response = await client.post(
            url,
            data=pc.localDescription.sdp.encode(),
            headers={"Content-Type": "application/sdp", **(headers or {})},
        )
        body = await response.text()
        if response.status == 201:
            viewer.location = response.headers["Location"]
            viewer.video = response.headers.get("X-WebRTC-Video")
            await pc.setRemoteDescription(RTCSessionDescription(body, "answer"))
        return viewer, response, body

    def _drop_inbound(self, rate: float, rng: random.Random) -> None:
        # aiortc has no hook on what its ICE connection hands up, so this wraps aioice's
        # `Connection.data_received`, which its UDP protocol calls for every datagram
        # that is not STUN; the ICE checks themselves are left alone.
        connections = {
            id(c): c
            for t in self.pc.getTransceivers()
            for c in [t.receiver.transport.transport.iceGatherer._connection]
        }
        for connection in connections.values():
            deliver = connection.data_received

            def lossy(data: bytes, component: int, deliver: Any = deliver) -> None:
                if rng.random() < rate:
                    self.datagrams_dropped += 1
                    return
                self.datagrams_delivered += 1
                deliver(data, component)

            connection.data_received = lossy

    async def _read(self, track: Any) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            if track.kind == "video":
                now = loop.time()
                self.first_frame_at = self.first_frame_at or now
                self.frame_times.append(now)
                self.frames.append(frame)
            else:
                self.audio_frames += 1

    async def wait_for_frames(self, count: int, timeout_s: float = 30.0) -> None:
        async with asyncio.timeout(timeout_s):
            while len(self.frames) < count:  # noqa: ASYNC110 - frames come from aiortc's task
                await asyncio.sleep(0.05)

    async def close(self, client: aiohttp.ClientSession | None = None) -> int | None:
        """DELETE the session (with `client`), close the peer; the DELETE's status."""
        status = None
        if client is not None and self.location is not None:
            async with client.delete(self.location) as response:
                status = response.status
        await self.pc.close()
        for reader in self._readers:
            reader.cancel()
        with contextlib.suppress(Exception):
            await asyncio.gather(*self._readers, return_exceptions=True)
        return status
