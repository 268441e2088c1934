"""A lossy WebRTC peer costs only itself: the job, a normal peer and an HTTP viewer of
the same job get what they would have got without it, and the lossy peer is either
served or dropped, and freed either way.

The loss is on the lossy peer's side only (a share of the datagrams it receives is
dropped, picked by a seeded generator): the server sees what it would see of a viewer
on a bad network, its receiver reports and NACKs included.
"""

from __future__ import annotations

import asyncio
from fractions import Fraction

import aiohttp
import numpy as np
import pytest

from tests.helpers import decode_mp4, smooth_latents, split_stream, until
from tests.helpers.mp4_duration import as_streamed
from tests.helpers.server import StartServer
from tests.helpers.whep import WhepViewer
from tests.server.test_playback_deadlines import PacedDecoder
from tests.server.test_preview import upload
from tests.webrtc.test_whep import FPS, PEER_PROCESS_FDS, _settings, open_fds, peers_idle
from vaecast.server.faces.standard import standard_faces
from vaecast.server.faces.whep.routes import WHEP_SESSIONS

LOSS = 0.3
CHUNKS = 25  # 97 frames, one fragment a chunk: ~5 s of paced decode
FRAMES = 1 + 4 * (CHUNKS - 1)
# What the lossy session may end as: served to the end, or dropped for a silence or a
# handshake lost on its way; never `shutdown` (left behind until the server stops).
CLEAN_ENDS = {"ended", "peer_timeout", "ice_timeout", "failed"}


@pytest.mark.slow
async def test_a_lossy_peer_slows_neither_the_job_nor_the_other_viewers(
    start_server: StartServer,
):
    server = await start_server(
        decoders={"paced": PacedDecoder()},
        default_model="paced",
        default_fps=Fraction(FPS),
        faces=standard_faces(webrtc=_settings(connect_timeout_s=5.0, peer_timeout_s=3.0)),
    )
    job = await upload(server, smooth_latents(frames=CHUNKS))
    whep = f"/v1/videos/{job['id']}/whep"
    sessions = server.app[WHEP_SESSIONS]
    fds_before = open_fds()
    # The HTTP viewer on a connection of its own, closed at the end (its fds counted).
    http = aiohttp.ClientSession(server.url)

    async def watch_content() -> bytes:
        async with http.get(job["urls"]["content"]) as response:
            assert response.status == 200
            return await response.read()

    content = asyncio.create_task(watch_content())
    watcher, response, body = await WhepViewer.connect(server.client, whep, audio=False)
    assert response.status == 201, body
    lossy, response, body = await WhepViewer.connect(
        server.client, whep, audio=False, loss=LOSS, seed=34
    )
    assert response.status == 201, body
    watched, dropped = (
        sessions.session(job["id"], viewer.location.rsplit("/", 1)[-1])
        for viewer in (watcher, lossy)
    )
    try:
        record = server.manager.get(job["id"])
        await asyncio.wait_for(record.wait(), 60)
        mp4 = await asyncio.wait_for(content, 30)
        await until(lambda: len(sessions) == 0, 30)
    finally:
        await watcher.close(server.client)
        await lossy.close(server.client)
        await http.close()
        content.cancel()

    # The job ended as it would have alone: completed, every fragment, every frame.
    async with server.client.get(f"/v1/videos/{job['id']}") as response:
        state = await response.json()
    assert (state["status"], state.get("error")) == ("completed", None), state
    _, fragments = split_stream(mp4)
    assert len(fragments) == CHUNKS
    mp4_frames = decode_mp4(mp4)
    assert len(mp4_frames) == FRAMES
    async with server.client.get(job["urls"]["content"]) as response:
        # The HTTP viewer got the whole stream: the finished file but for the duration
        # its init segment states once the job completed.
        assert as_streamed(await response.read()) == mp4

    # The normal peer got every frame from its keyframe on, the job's own pixels.
    assert watched.outcome == "ended"
    received = [frame.to_ndarray(format="rgb24") for frame in watcher.frames]
    start = next(i for i, f in enumerate(mp4_frames) if np.array_equal(f, received[0]))
    assert len(received) == FRAMES - start - 1  # the stream's last frame stays in aiortc
    shown = mp4_frames[start : start + len(received)]
    assert all(np.array_equal(a, b) for a, b in zip(received, shown, strict=True))

    # The loss was real, and its peer ended cleanly, whatever it got.
    assert lossy.datagrams_dropped > 0 and lossy.datagrams_delivered > 0
    assert dropped.outcome in CLEAN_ENDS, dropped.outcome
    await peers_idle(server, 10)
    await until(lambda: open_fds() <= fds_before + PEER_PROCESS_FDS, 10)  # its pipes stay
