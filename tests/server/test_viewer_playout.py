"""Each live viewer's playout as the server pictures it (`stream.viewers`): a model
checked by hand, then a real slow reader whose slack goes negative in `/metrics` and in
the job's `viewers`, beside a fast one whose slack stays positive."""

from __future__ import annotations

import asyncio
import io
import re
import socket
import time

import pytest
import torch

from tests.helpers import safetensors_bytes
from tests.helpers.server import Server, StartServer
from vaecast.server.stream.viewers import JobViewers, ViewerPlayout


def test_the_pictured_player_plays_in_real_time_and_stalls_when_it_runs_out() -> None:
    player = ViewerPlayout("progressive", opened_at=0.0, clock=0.0)
    assert player.slack_s(0.0) is None  # nothing sent: no player yet
    assert not player.sent(1.0, at=0.2)  # starts at 0.2 with 1 s of media
    assert not player.sent(1.5, at=0.7)  # 0.5 s played, 1 s left: no stall
    assert player.slack_s(0.7) == pytest.approx(1.0)
    assert player.sent(2.0, at=3.2)  # ran out at 1.7 (1.5 s played): stalled 1.5 s
    assert (player.stalls, player.stalled_s) == (1, pytest.approx(1.5))
    assert player.slack_s(3.2) == pytest.approx(-1.0)  # behind real time since its start
    assert not player.sent(2.5, at=3.4)  # plays on from where it stopped
    assert player.playhead_s == pytest.approx(1.7)
    assert not player.sent(2.5, at=3.5)  # nothing new: still playing its 0.6 s left


def test_a_jobs_viewers_summary_counts_those_gone() -> None:
    seen: list[tuple[str, float, bool]] = []
    viewers = JobViewers(lambda face, slack, stall: seen.append((face, slack, stall)))
    fast, slow = viewers.open("progressive", 0.0), viewers.open("webrtc", 0.0)
    viewers.sent(fast, 4.0, 0.1)
    viewers.sent(slow, 0.5, 0.1)
    viewers.sent(slow, 0.55, 0.2)  # within a second of the last: not observed
    viewers.sent(slow, 1.0, 2.1)  # ran out at 0.65: one stall of 1.45 s
    assert viewers.summary(2.1) == {
        "watching": 2,
        "seen": 2,
        "min_slack_s": -1.0,
        "stalls": 1,
        "stalled_s": 1.45,
    }
    assert [slack for face, slack, _ in seen if face == "webrtc"] == [0.5, -1.0]
    viewers.close(slow)
    viewers.close(slow)  # twice: counted once
    assert viewers.summary(2.1) | {"min_slack_s": 2.0} == {
        "watching": 1,
        "seen": 2,
        "min_slack_s": 2.0,
        "stalls": 1,
        "stalled_s": 1.45,
    }
    assert seen[-1] == ("webrtc", pytest.approx(-1.0), True)


FPS = 16
# Noise decodes to frames x264 cannot squeeze: MBs of MP4 for 65 frames (4 s) of
# 1280x960, more than the kernel's socket buffers hold, encoded faster than real time.
# A reader of 1.5 MB/s then holds back the server's writes, and ends seconds behind.
NOISY = torch.randn(1, 16, 17, 120, 160, generator=torch.Generator().manual_seed(3)) * 3


def slack_observations(metrics: str, below_zero: bool) -> float:
    """How many slack observations of progressive viewers were <= 0 (or all)."""
    bucket = 'le="0.0"' if below_zero else 'le="+Inf"'
    name = f'vaecast_viewer_slack_seconds_bucket{{face="progressive",{bucket}}}'
    pattern = re.escape(name) + r" (\S+)"
    found = re.search(pattern, metrics)
    return 0.0 if found is None else float(found.group(1))


async def read_slowly(server: Server, path: str, bytes_per_s: int) -> int:
    """GET `path` over a socket with a small receive buffer, read at `bytes_per_s`."""
    host, port = server.url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, (host, int(port)))
    await loop.sock_sendall(sock, f"GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    got, started = 0, time.monotonic()
    try:
        while True:
            data = await loop.sock_recv(sock, 2048)
            if not data or data.endswith(b"0\r\n\r\n"):
                return got + len(data)
            got += len(data)
            ahead = got / bytes_per_s - (time.monotonic() - started)
            if ahead > 0:
                await asyncio.sleep(ahead)
    finally:
        sock.close()


async def test_a_viewer_slower_than_real_time_shows_negative_slack(start_server: StartServer):
    server = await start_server()
    body = io.BytesIO(safetensors_bytes(latents=NOISY))
    async with server.client.post("/v1/videos", data=body, params={"fps": str(FPS)}) as r:
        job = await r.json()
    content = f"/v1/videos/{job['id']}/content"
    slow = asyncio.create_task(read_slowly(server, content, bytes_per_s=1_500_000))
    fast = asyncio.create_task(read_slowly(server, content, bytes_per_s=1 << 30))
    summaries = []
    while not slow.done():
        async with server.client.get(job["urls"]["self"]) as response:
            summaries.append((await response.json())["viewers"])
        await asyncio.sleep(0.25)
    total = await slow
    assert total == await fast and total > 8_000_000
    async with server.client.get("/metrics") as response:
        metrics = await response.text()
    assert slack_observations(metrics, below_zero=True) > 0
    assert slack_observations(metrics, below_zero=False) > slack_observations(metrics, True)
    assert re.search(r'vaecast_viewer_stalls_total\{face="progressive"\} [1-9]', metrics)
    watched = [s for s in summaries if s["watching"] == 1 and s["min_slack_s"] is not None]
    assert watched and min(s["min_slack_s"] for s in watched) < 0
    assert summaries[-1]["seen"] == 2 and summaries[-1]["stalls"] >= 1
