"""A WHEP viewer's playout in its job's `viewers` and in /metrics: a real aiortc peer
watches a push session whose producer pauses longer than the video it had sent, so the
viewer's paced tracks stall, and the server hears of it from the peers' process. A
peers' process that gets no CPU for a while (stopped with SIGSTOP, as a busy host would
leave it) sends late units it had in time: late sends, not stalls."""

from __future__ import annotations

import asyncio
import os
import re
import signal

import pytest

from tests.helpers import smooth_latents, until
from tests.helpers.server import StartServer
from tests.helpers.whep import WhepViewer
from tests.server.test_push import push as push_block
from tests.webrtc.test_peer_process import children_of
from tests.webrtc.test_whep import LATENTS, metric, metrics, push_session

pytestmark = pytest.mark.slow


async def test_a_webrtc_viewer_that_stalls_shows_in_viewers_and_metrics(
    start_server: StartServer,
):
    server = await start_server()
    session = await push_session(server, audio=False)

    async def push(first: int, last: int, final: bool = False) -> None:
        status, answer = await push_block(server, session, LATENTS[:, :, first:last], final)
        assert status == 202, answer

    viewer, response, answer = await WhepViewer.connect(
        server.client, f"/v1/videos/{session['id']}/whep"
    )
    try:
        assert response.status == 201, answer
        await until(lambda: viewer.pc.connectionState == "connected", 10)
        await push(0, 2)  # 5 frames: 0.31 s of video at 16 fps
        await viewer.wait_for_frames(3)
        await asyncio.sleep(1.5)  # the producer pauses: the viewer runs out and waits
        await push(2, 6, final=True)
        await viewer.wait_for_frames(19)

        async def viewers() -> dict:
            async with server.client.get(session["urls"]["self"]) as reply:
                return (await reply.json())["viewers"]

        for _ in range(100):  # the peers' process reports every half second
            summary = await viewers()
            if summary["stalls"] >= 1:
                break
            await asyncio.sleep(0.1)
        assert summary["watching"] == 1 and summary["stalls"] >= 1
        assert summary["stalled_s"] > 0.5 and summary["min_slack_s"] <= -0.5
    finally:
        await viewer.close(server.client)
    text = await metrics(server)
    stalls = re.search(r'vaecast_viewer_stalls_total\{face="webrtc"\} (\S+)', text)
    assert stalls is not None and float(stalls.group(1)) >= 1
    async with server.client.get(session["urls"]["self"]) as reply:
        after = (await reply.json())["viewers"]
    assert after["watching"] == 0 and after["seen"] == 1 and after["stalls"] >= 1


async def test_a_peers_process_without_cpu_sends_late_but_does_not_stall(
    start_server: StartServer,
):
    server = await start_server()
    session = await push_session(server, audio=False)
    viewer, response, answer = await WhepViewer.connect(
        server.client, f"/v1/videos/{session['id']}/whep", audio=False
    )
    try:
        assert response.status == 201, answer
        await until(lambda: viewer.pc.connectionState == "connected", 10)
        # The whole video at once (61 frames: 3.8 s at 16 fps): every unit reaches the
        # peers' process long before it is due.
        status, pushed = await push_block(server, session, smooth_latents(frames=16), True)
        assert status == 202, pushed
        await viewer.wait_for_frames(8)

        async def job() -> dict:
            async with server.client.get(session["urls"]["self"]) as reply:
                return await reply.json()

        for _ in range(600):  # (a linear decode: done within a second but under load)
            if (state := (await job())["status"]) == "completed":
                break
            await asyncio.sleep(0.05)
        # Units that came during the pause would count as stalls: all are in before it.
        assert state == "completed", state
        await asyncio.sleep(0.6)  # its last units on their way; a report at least
        before = (await job())["viewers"]
        (peers,) = children_of(os.getpid())
        seen = len(viewer.frames)
        os.kill(peers, signal.SIGSTOP)
        try:
            await asyncio.sleep(0.5)
        finally:
            os.kill(peers, signal.SIGCONT)
        assert seen < 40, seen  # it stopped with more than a second still to play
        await viewer.wait_for_frames(60)
        for _ in range(100):  # the peers' process reports every half second
            late_sends = metric(await metrics(server), "vaecast_webrtc_late_sends_total")
            if late_sends >= 1:
                break
            await asyncio.sleep(0.1)
        after = (await job())["viewers"]
    finally:
        await viewer.close(server.client)
    assert late_sends >= 1
    assert after["stalls"] == before["stalls"], (before, after)
