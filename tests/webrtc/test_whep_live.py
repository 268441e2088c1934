"""The live rendition over WHEP: a real aiortc peer watches `?variant=live` of a job
whose final decodes 1.5x slower than real time. Its frames are the live rendition's
own H.264 (so, chunk by chunk, the frames of the rendition each chunk came from), and
the server, told by the peers' process, counts no stall for it."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from benchmarks.paced import PacedDecoder
from tests.helpers import decode_mp4, smooth_latents
from tests.helpers.server import StartServer
from tests.helpers.whep import WhepViewer
from tests.server.test_preview import content, ended, upload
from vaecast.models.linear import LinearDecoder
from vaecast.models.tiny import TinyDecoder

pytestmark = pytest.mark.slow

FPS = 16
LATENTS = smooth_latents(frames=11, height=6, width=8)  # 41 frames of 64x48: 2.56 s
# aiortc's receiver gives a frame out once the next one begins: the last never comes.
SEEN = 40


async def test_a_whep_viewer_of_the_live_rendition_never_stalls(start_server: StartServer):
    final = PacedDecoder(TinyDecoder(), pace=1.5, fps=FPS)
    decoders: dict[str, Any] = {"tiny": final, "linear": LinearDecoder()}
    server = await start_server(decoders=decoders, default_model="tiny")
    try:
        job = await upload(server, LATENTS, preview="linear", fps=str(FPS))
        viewer, response, answer = await WhepViewer.connect(
            server.client, f"/v1/videos/{job['id']}/whep?variant=live", audio=False
        )
        try:
            assert response.status == 201, answer
            await viewer.wait_for_frames(SEEN)
            done = await ended(server, job["id"])

            async def summary() -> dict:
                async with server.client.get(f"/v1/videos/{job['id']}") as reply:
                    return (await reply.json())["viewers"]

            await asyncio.sleep(1.0)  # the peers' process reports every half second
            viewers = await summary()
        finally:
            await viewer.close(server.client)
    finally:
        final.release()
    assert viewers["seen"] == 1 and viewers["stalls"] == 0, viewers
    sources = done["variants"]["live"]["sources"]
    assert "final" in sources and "preview" in sources, sources
    live = decode_mp4(await content(server, job["id"], "live"))
    received = [frame.to_ndarray(format="rgb24") for frame in viewer.frames]
    # The live rendition's bitstream, decoded by the peer: its pixels exactly.
    assert all(np.array_equal(a, b) for a, b in zip(received, live[:SEEN], strict=True))
