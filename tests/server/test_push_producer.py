"""A producer in another process pushes blocks with pauses; viewers play before it ends."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from tests.helpers import decode_mp4, safetensors_bytes, smooth_latents
from tests.helpers.server import StartServer
from vaecast.job.views import job_object

pytestmark = pytest.mark.slow


async def test_viewers_play_before_the_producer_pushes_its_last_block(
    start_server: StartServer, tmp_path: Path
):
    server = await start_server()
    latents = tmp_path / "z.safetensors"
    latents.write_bytes(safetensors_bytes({"fps": "8"}, latents=smooth_latents(frames=6)))
    # `vaecast push` as a generator would: a latent frame every 0.4 s, 2.4 s in all.
    producer = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "vaecast",
        "push",
        str(latents),
        "--url",
        server.url,
        "--latent-fps",
        "2.5",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert producer.stdout is not None
        watch = (await asyncio.wait_for(producer.stdout.readline(), 60)).decode()
        assert watch.startswith("watch: ")
        content_url = watch.split()[-1]
        job = server.manager.get(content_url.split("/")[-2])
        async with server.client.get(content_url) as first_viewer:
            first_bytes = await asyncio.wait_for(first_viewer.content.read(1), 60)
            # curl's view: the video plays while the producer has blocks left to push.
            assert first_bytes and not job.feed.ended
            async with server.client.get(content_url) as late_viewer:
                late = await asyncio.wait_for(late_viewer.read(), 60)
            streamed = first_bytes + await first_viewer.read()
        assert await asyncio.wait_for(producer.wait(), 60) == 0
    finally:
        if producer.returncode is None:
            producer.kill()
            await producer.wait()
    assert streamed == late
    assert len(decode_mp4(streamed)) == 21
    assert job_object(job.record)["status"] == "completed"
