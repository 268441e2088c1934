"""WHEP over real HTTP and real WebRTC: aiortc peers on 127.0.0.1 watch running jobs.

The job's own H.264 reaches a peer that takes it unchanged (its frames decode to the
MP4's pixels exactly), a peer that only takes VP8 shares one VP8 encode with the
others, a late viewer starts at a keyframe, and every bad offer gets its 4xx.
"""

from __future__ import annotations

import asyncio
import gc
import os
import sys
from fractions import Fraction

import numpy as np
import pytest
import torch

from tests.helpers import (
    decode_mp4,
    psnr,
    safetensors_bytes,
    smooth_latents,
    split_stream,
    until,
)
from tests.helpers.server import Server, StartServer
from tests.helpers.whep import WhepViewer
from tests.server.test_playback_deadlines import PacedDecoder
from tests.server.test_preview import upload
from vaecast.codecs.fmp4_reader import parse_fragment
from vaecast.codecs.h264 import EncoderSettings
from vaecast.server.faces.standard import standard_faces
from vaecast.server.faces.whep.routes import WHEP_SESSIONS

LATENTS = smooth_latents(frames=6)  # linear: 21 frames, 6 chunks
FPS = 16
RATE = 16000
# aiortc's receiver gives a frame out once the next one begins, so a stream's last
# frame never comes out of it: a peer sees 20 of the 21.
SEEN = 20


async def push_session(server: Server, audio: bool = True) -> dict:
    fields = {"input": "push", "fps": FPS}
    if audio:
        fields |= {"audio_sample_rate": RATE, "audio_channels": 1}
    async with server.client.post("/v1/videos", json=fields) as response:
        assert response.status == 201, await response.text()
        return await response.json()


async def push_all(server: Server, session: dict, audio: bool = True) -> None:
    """LATENTS in three blocks, each with its span's audio (a 440 Hz tone)."""
    token = {"X-Push-Token": session["push"]["token"]}
    for first, last, frames in [(0, 2, 5), (2, 4, 8), (4, 6, 8)]:
        tensors = {"latents": LATENTS[:, :, first:last].contiguous()}
        if audio:
            t = torch.arange(frames * RATE // FPS) / RATE
            tensors["audio"] = (0.3 * torch.sin(2 * torch.pi * 440 * t))[None]
        body = safetensors_bytes({"audio_sample_rate": str(RATE)} if audio else None, **tensors)
        params = {"final": "1"} if last == 6 else {}
        async with server.client.post(
            session["push"]["url"], data=body, headers=token, params=params
        ) as response:
            assert response.status == 202, await response.text()


def metric(text: str, name: str) -> float:
    return sum(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith(name) and not line.startswith("#")
    )


async def metrics(server: Server) -> str:
    return await (await server.client.get("/metrics")).text()


@pytest.mark.slow
async def test_a_push_session_plays_over_whep_as_its_own_h264_with_opus_audio(
    start_server: StartServer,
):
    server = await start_server(faces=standard_faces(webrtc=_settings(peer_timeout_s=1.0)))
    session = await push_session(server)
    whep = f"/v1/videos/{session['id']}/whep"
    viewer, response, answer = await WhepViewer.connect(server.client, whep)
    try:
        assert response.status == 201, answer
        assert response.headers["Content-Type"] == "application/sdp"
        assert response.headers["Location"].startswith(f"{whep}/")
        assert viewer.video == "h264"
        # Loopback server: loopback candidates only.
        candidates = [line for line in answer.splitlines() if line.startswith("a=candidate")]
        assert candidates and all(" 127.0.0.1 " in line for line in candidates), candidates
        health = await (await server.client.get("/healthz")).json()
        assert health["webrtc"] == {"viewers": {"h264": 1, "vp8": 0}, "max": 32}
        # Waiting for the producer's first block longer than the peer timeout: a peer
        # has nothing to report on yet, and is not dropped for its silence.
        await until(lambda: viewer.pc.connectionState == "connected", 10)
        await asyncio.sleep(2.0)
        assert len(server.app[WHEP_SESSIONS]) == 1
        await push_all(server, session)
        await viewer.wait_for_frames(SEEN)
        await until(lambda: viewer.audio_frames > 0, 10)
    finally:
        await viewer.close(server.client)
    async with server.client.get(session["urls"]["content"]) as content:
        mp4_frames = decode_mp4(await content.read())
    assert len(mp4_frames) == 21
    received = [frame.to_ndarray(format="rgb24") for frame in viewer.frames]
    # The same bitstream decoded twice: the same pixels (no encode in between).
    assert all(np.array_equal(a, b) for a, b in zip(received, mp4_frames[:SEEN], strict=True))
    # Frames went out paced at their timestamps: 19 frame intervals take ~1.2 s.
    assert viewer.frame_times[SEEN - 1] - viewer.frame_times[0] > 1.0
    text = await metrics(server)
    assert metric(text, 'vaecast_webrtc_shared_encodes_total{codec="opus"}') == 1
    assert metric(text, 'vaecast_webrtc_shared_encodes_total{codec="vp8"}') == 0
    await until(lambda: len(server.app[WHEP_SESSIONS]) == 0, 10)


@pytest.mark.slow
async def test_peers_without_h264_share_one_vp8_encode(start_server: StartServer):
    server = await start_server()
    session = await push_session(server, audio=False)
    whep = f"/v1/videos/{session['id']}/whep"
    viewers = []
    try:
        for codecs in (["video/VP8"], ["video/VP8"], ["video/VP8"], None):
            viewer, response, answer = await WhepViewer.connect(
                server.client, whep, codecs=codecs, audio=False
            )
            assert response.status == 201, answer
            viewers.append(viewer)
        assert [v.video for v in viewers] == ["vp8", "vp8", "vp8", "h264"]
        text = await metrics(server)
        assert metric(text, 'vaecast_webrtc_viewers{video="vp8"}') == 3
        assert metric(text, 'vaecast_webrtc_viewers{video="h264"}') == 1
        await push_all(server, session, audio=False)
        for viewer in viewers:
            await viewer.wait_for_frames(SEEN)
    finally:
        for viewer in viewers:
            await viewer.close(server.client)
    async with server.client.get(session["urls"]["content"]) as content:
        mp4_frames = decode_mp4(await content.read())
    vp8 = [frame.to_ndarray(format="rgb24") for frame in viewers[0].frames[:SEEN]]
    assert min(psnr(a, b) for a, b in zip(vp8, mp4_frames[:SEEN], strict=True)) > 30
    text = await metrics(server)
    assert metric(text, 'vaecast_webrtc_shared_encodes_total{codec="vp8"}') == 1


@pytest.mark.slow
async def test_a_viewer_joining_a_running_job_starts_at_its_next_keyframe(
    start_server: StartServer,
):
    # Keyframes every 0.5 s (8 frames at 16 fps); chunks of 4 frames made in 0.2 s each.
    server = await start_server(
        decoders={"paced": PacedDecoder()},
        default_model="paced",
        default_fps=Fraction(FPS),
        encoder=EncoderSettings(keyframe_interval_s=0.5),
    )
    job = await upload(server, smooth_latents(frames=13))  # 49 frames, 13 chunks
    record = server.manager.get(job["id"])
    await until(lambda: len(record.final.log) >= 4, 30)  # init + 3 fragments (9 frames)
    committed = len(record.final.log) - 1
    viewer, response, answer = await WhepViewer.connect(
        server.client, f"/v1/videos/{job['id']}/whep", audio=False
    )
    try:
        assert response.status == 201, answer
        await asyncio.wait_for(record.wait(), 30)
        await until(lambda: len(server.app[WHEP_SESSIONS]) == 0, 15)
    finally:
        await viewer.close(server.client)
    async with server.client.get(f"/v1/videos/{job['id']}/content") as content:
        mp4 = await content.read()
    mp4_frames = decode_mp4(mp4)
    first = viewer.frames[0].to_ndarray(format="rgb24")
    start = next(i for i, frame in enumerate(mp4_frames) if np.array_equal(frame, first))
    _, fragments = split_stream(mp4)
    sync = [s.is_sync for f in fragments for r in parse_fragment(f).runs for s in r.run.samples]
    frames_committed = 1 + 4 * (committed - 1)
    # The first keyframe at or after what was committed when the viewer came.
    assert start == sync.index(True, frames_committed), (start, frames_committed)
    assert len(viewer.frames) == len(mp4_frames) - start - 1  # (SEEN says why - 1)


async def test_bad_whep_requests_get_their_4xx(start_server: StartServer):
    server = await start_server(faces=standard_faces(webrtc=_settings(max_viewers=1)))
    session = await push_session(server, audio=False)
    whep = f"/v1/videos/{session['id']}/whep"
    sdp = {"Content-Type": "application/sdp"}

    async def post(body: bytes, headers: dict[str, str] = sdp, url: str = whep) -> tuple:
        async with server.client.post(url, data=body, headers=headers) as response:
            return response.status, (await response.json())["error"]["type"]

    assert await post(b"v=0", {"Content-Type": "text/plain"}) == (415, "unsupported_media_type")
    assert await post(b"\xff\xfe garbage") == (400, "bad_request")
    assert (await post(b"not sdp at all\r\n"))[0] in (400, 422)
    assert await post(b"v=0\r\n" + b"a=x\r\n" * 20_000) == (413, "payload_too_large")
    assert await post(b"v=0\r\n" + b"m=video 9 UDP/TLS/RTP/SAVPF 96\r\n" * 5) == (
        422,
        "invalid_request",
    )
    assert (await post(b"v=0", url="/v1/videos/video_nope/whep"))[0] == 404
    # An offer that only sends (no recvonly video): nothing to watch.
    sender, response, _ = await WhepViewer.connect(server.client, whep, audio=False)
    assert response.status == 201
    try:
        # The second viewer is over --max-webrtc-viewers 1.
        other, response, body = await WhepViewer.connect(server.client, whep, audio=False)
        await other.close()
        assert response.status == 429 and response.headers["Retry-After"] == "5", body
        async with server.client.patch(sender.location, data=b"a=end-of-candidates") as patch:
            assert patch.status == 405
        async with server.client.delete(f"{whep}/nope") as missing:
            assert missing.status == 404
    finally:
        assert await sender.close(server.client) == 200
    async with server.client.delete(sender.location) as again:
        assert again.status == 404
    # A finished job is not live: its MP4 is at /content.
    async with server.client.delete(f"/v1/videos/{session['id']}") as cancel:
        assert cancel.status == 200
    assert (await post(b"v=0"))[0] == 409


def _settings(**changes: object):  # type: ignore[no-untyped-def]
    from dataclasses import replace

    from vaecast.server.faces.whep.settings import WebRtcSettings

    return replace(WebRtcSettings(), **changes)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


# The peers' process, started by the first offer, keeps its two pipes until the app stops.
PEER_PROCESS_FDS = 2


async def peers_idle(server: Server, timeout_s: float) -> None:
    """Until the peers' process holds nothing: no peer, stream or task is left there."""

    async def idle() -> None:
        while True:
            census = await server.app[WHEP_SESSIONS].peer_census()
            if census is None or not any(census.values()):
                return
            await asyncio.sleep(0.05)

    await asyncio.wait_for(idle(), timeout_s)


def sending_peers_here() -> int:
    """Peer connections in this process that send media: the server's kind (the tests'
    viewers only receive)."""
    from aiortc import RTCPeerConnection

    return sum(
        type(o) is RTCPeerConnection and any(t.direction == "sendonly" for t in o.getTransceivers())
        for o in gc.get_objects()
    )


@pytest.mark.slow
async def test_peers_that_vanish_or_never_connect_are_dropped_and_freed(
    start_server: StartServer,
):
    """One peer's process is killed mid-stream (no BYE, no DTLS close: it just stops
    answering), another never completes ICE; a third watches on, unaffected."""
    server = await start_server(
        decoders={"paced": PacedDecoder()},
        default_model="paced",
        default_fps=Fraction(FPS),
        faces=standard_faces(webrtc=_settings(connect_timeout_s=1.5, peer_timeout_s=1.5)),
    )
    # 997 frames, 250 chunks: ~50 s, cancelled once seen. A job that ends while a
    # peer's timeout runs (a busy machine slows the set-up) would end that peer's
    # session as `ended` instead.
    job = await upload(server, smooth_latents(frames=250))
    whep = f"/v1/videos/{job['id']}/whep"
    sessions = server.app[WHEP_SESSIONS]
    fds_before = open_fds()
    watcher, response, body = await WhepViewer.connect(server.client, whep, audio=False)
    assert response.status == 201, body
    killed = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.helpers.whep_peer",
        server.url + whep,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert killed.stdout is not None
        line = await asyncio.wait_for(killed.stdout.readline(), 30)
        assert line.strip() == b"connected", line
        # A peer that sends its offer and never looks at the answer: no ICE checks answered.
        mute, response, body = await _offer_only(server, whep)
        assert response.status == 201, body
        await until(lambda: len(sessions) == 3, 5)
        # The peers live in a process of their own, never the server's (whose requests
        # would wait behind their DTLS and SRTP).
        census = await sessions.peer_census()
        assert census is not None and census["peers"] == 3, census
        assert sessions.peers_pid not in (None, os.getpid())
        assert sending_peers_here() == 0
        frames_before = len(watcher.frames)
        killed.kill()
        await killed.wait()
        text = await metrics(server)
        await until(lambda: len(sessions) == 1, 10)
        text = await metrics(server)
        assert metric(text, 'vaecast_webrtc_sessions_total{outcome="ice_timeout"}') == 1
        assert metric(text, 'vaecast_webrtc_sessions_total{outcome="peer_timeout"}') == 1
        # The one left kept receiving meanwhile, and the job went on.
        assert len(watcher.frames) > frames_before
        record = server.manager.get(job["id"]).record
        assert record.status.value == "in_progress"  # neither held nor failed
        await mute.close()
    finally:
        if killed.returncode is None:
            killed.kill()
            await killed.wait()
        await watcher.close(server.client)
        async with server.client.delete(f"/v1/videos/{job['id']}") as response:
            assert response.status == 200
    await until(lambda: len(sessions) == 0, 10)
    await peers_idle(server, 10)
    # Sockets (ICE, the killed peer's pipes) are closed again; the peers' process, made
    # by the first offer, keeps its pipes until the app stops.
    await until(lambda: open_fds() <= fds_before + 2 + PEER_PROCESS_FDS, 10)


async def _offer_only(server: Server, whep: str) -> tuple:
    from aiortc import RTCPeerConnection

    pc = RTCPeerConnection()
    pc.addTransceiver("video", direction="recvonly")
    await pc.setLocalDescription(await pc.createOffer())
    async with server.client.post(
        whep, data=pc.localDescription.sdp.encode(), headers={"Content-Type": "application/sdp"}
    ) as response:
        return pc, response, await response.text()


async def test_the_viewer_cap_holds_against_100_offers_at_once(start_server: StartServer):
    """A place is taken before the peer is set up: concurrent offers all passed a check
    made before it (100 offers against a cap of 32 made 44 viewers)."""
    from aiortc import RTCPeerConnection

    server = await start_server(
        faces=standard_faces(webrtc=_settings(max_viewers=32, connect_timeout_s=60))
    )
    # Live until the end of the test (a push session without a block): an uploaded
    # job could end before the offers arrive, and be 409 to all of them.
    job = await push_session(server)
    whep = f"/v1/videos/{job['id']}/whep"
    sessions = server.app[WHEP_SESSIONS]
    client_pc = RTCPeerConnection()
    client_pc.addTransceiver("video", direction="recvonly")
    await client_pc.setLocalDescription(await client_pc.createOffer())
    sdp = client_pc.localDescription.sdp.encode()
    most = 0

    async def offer() -> tuple[int, str | None]:
        nonlocal most
        headers = {"Content-Type": "application/sdp"}
        async with server.client.post(whep, data=sdp, headers=headers) as response:
            most = max(most, len(sessions))
            return response.status, response.headers.get("Location")

    try:
        answers = await asyncio.gather(*(offer() for _ in range(100)))
        statuses = sorted(status for status, _ in answers)
        assert set(statuses) <= {201, 429}, statuses
        assert 0 < statuses.count(201) <= 32 and most <= 32 and len(sessions) <= 32
        for status, location in answers:
            if status == 201 and location is not None:
                async with server.client.delete(location) as response:
                    assert response.status in (200, 204, 404)
    finally:
        await client_pc.close()
    await until(lambda: len(sessions) == 0, 30)
    await peers_idle(server, 30)
