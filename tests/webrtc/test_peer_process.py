"""The WebRTC peers' process: it lives and dies with its server, and a dead one is
replaced without taking the server down.

The peers run in a process the server starts with its first offer. If the server
stops (SIGTERM) or dies (SIGKILL), no peer process is left behind; if the peer process
dies, its sessions end as `failed` and the next offer starts a new one.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import aiohttp
import pytest
import torch

from tests.helpers import safetensors_bytes, smooth_latents, until
from tests.helpers.serve_process import vaecast_serve_process
from tests.helpers.server import StartServer
from tests.helpers.whep import WhepViewer
from tests.webrtc.test_whep import _settings, metric, metrics, push_all, push_session
from vaecast.server.faces.standard import standard_faces
from vaecast.server.faces.whep.routes import WHEP_SESSIONS

RATE = 16000
PEER_HOST = b"vaecast.server.faces.whep.peer_host"


def children_of(pid: int) -> list[int]:
    """The processes whose parent is `pid` and that run the peers' host."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            command = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        if parent == pid and PEER_HOST in command:
            found.append(int(entry))
    return found


def running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


async def watch_live_push(url: str, client: aiohttp.ClientSession) -> WhepViewer:
    """A push session with its first block, and a connected viewer of it."""
    fields = {"input": "push", "fps": 16, "audio_sample_rate": RATE, "audio_channels": 1}
    async with client.post(f"{url}v1/videos", json=fields) as response:
        assert response.status == 201, await response.text()
        session = await response.json()
    block = safetensors_bytes(
        {"audio_sample_rate": str(RATE)},
        latents=smooth_latents(frames=2),
        audio=torch.zeros(1, 5 * RATE // 16),
    )
    headers = {"X-Push-Token": session["push"]["token"]}
    async with client.post(f"{url}{session['push']['url'][1:]}", data=block, headers=headers) as r:
        assert r.status == 202, await r.text()
    viewer, response, body = await WhepViewer.connect(
        client, f"{url}v1/videos/{session['id']}/whep"
    )
    assert response.status == 201, body
    await until(lambda: viewer.pc.connectionState == "connected", 20)
    return viewer


@pytest.mark.slow
@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
async def test_no_peers_process_outlives_its_server(tmp_path: Path, stop: signal.Signals):
    # A short grace: the push session waits for blocks that never come.
    arguments = ["--model", "linear", "--store", "none", "--shutdown-grace", "1"]
    with vaecast_serve_process(arguments, tmp_path / "serve.log") as (url, server):
        async with aiohttp.ClientSession() as client:
            viewer = await watch_live_push(url, client)
            try:
                (peers,) = children_of(server.pid)
                os.kill(server.pid, stop)
                await asyncio.to_thread(server.wait, 30)
                # A killed server closes nothing: its pipe's end is what the peers read.
                await until(lambda: not running(peers), 15)
            finally:
                await viewer.pc.close()
    if stop == signal.SIGTERM:
        assert server.returncode == 0, (tmp_path / "serve.log").read_text()[-2000:]


@pytest.mark.slow
async def test_ctrl_c_stops_the_server_and_its_peers_in_order(tmp_path: Path):
    """SIGINT to the whole process group, as a terminal's Ctrl-C sends it (and as a
    service manager signals every process of a unit): the peers' process does not die
    first under the server's viewers; the server ends their sessions and then it."""
    arguments = ["--model", "linear", "--store", "none", "--shutdown-grace", "1"]
    log = tmp_path / "serve.log"
    with vaecast_serve_process(arguments, log, own_group=True) as (url, server):
        async with aiohttp.ClientSession() as client:
            viewer = await watch_live_push(url, client)
            try:
                (peers,) = children_of(server.pid)
                os.killpg(server.pid, signal.SIGINT)
                await asyncio.to_thread(server.wait, 30)
                await until(lambda: not running(peers), 15)
            finally:
                await viewer.pc.close()
    text = log.read_text()
    assert server.returncode == 0, text[-2000:]
    assert "ended: shutdown" in text, text[-2000:]
    assert "Traceback" not in text and " ERROR " not in text, text[-2000:]


@pytest.mark.slow
async def test_a_dead_peers_process_ends_its_sessions_and_the_next_offer_starts_another(
    start_server: StartServer,
):
    server = await start_server(faces=standard_faces(webrtc=_settings()))
    sessions = server.app[WHEP_SESSIONS]
    session = await push_session(server)
    whep = f"/v1/videos/{session['id']}/whep"
    first, response, body = await WhepViewer.connect(server.client, whep)
    assert response.status == 201, body
    second = None
    try:
        await until(lambda: first.pc.connectionState == "connected", 20)
        dead = sessions.peers_pid
        assert dead is not None
        os.kill(dead, signal.SIGKILL)
        await until(lambda: len(sessions) == 0, 10)
        text = await metrics(server)
        assert metric(text, 'vaecast_webrtc_sessions_total{outcome="failed"}') == 1
        # The server went on, and the next viewer gets a new process and the video.
        second, response, body = await WhepViewer.connect(server.client, whep)
        assert response.status == 201, body
        assert sessions.peers_pid not in (None, dead)
        await push_all(server, session)
        await second.wait_for_frames(10)
    finally:
        await first.pc.close()
        if second is not None:
            await second.close(server.client)
