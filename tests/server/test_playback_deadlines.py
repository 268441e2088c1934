"""`stall_free_start_s` over real HTTP: a decoder paced below real time publishes a
start delay in its chunk events and job object that plays stall-free against the
fragments' actual commit times, and the metrics count the stalls of a viewer who
started at the first fragment."""

from __future__ import annotations

import asyncio
import time
from fractions import Fraction

import pytest

from tests.helpers import smooth_latents
from tests.helpers.server import StartServer
from tests.server.test_preview import events_of, upload
from vaecast.models.linear import LinearDecoder
from vaecast.playback_deadlines import slack

FPS = 32  # a chunk of 4 frames is 0.125 s of video
CHUNK_DECODE_S = 0.2  # each made in 0.2 s: 0.625 of real time


class PacedDecoder(LinearDecoder):
    """`linear`, slowed to CHUNK_DECODE_S a chunk."""

    name = "paced"

    def decode_chunks(self, latents, on_chunk):  # type: ignore[no-untyped-def]
        def paced(chunk):  # type: ignore[no-untyped-def]
            time.sleep(CHUNK_DECODE_S)
            on_chunk(chunk)

        super().decode_chunks(latents, paced)


@pytest.mark.slow
async def test_a_decode_below_real_time_publishes_a_start_that_plays_stall_free(
    start_server: StartServer,
):
    server = await start_server(
        decoders={"paced": PacedDecoder()}, default_model="paced", default_fps=Fraction(FPS)
    )
    job = await upload(server, smooth_latents(frames=9, height=6, width=8))  # 33 frames
    events = await events_of(server, job["id"])
    chunks = [e for e in events if e["event"] == "chunk"]
    assert len(chunks) == 9
    done = events[-1]["job"]
    commits = server.manager.jobs[job["id"]].record.commits
    first = commits[0]
    smallest = max(-slack(first, commit) for commit in commits)
    assert done["stall_free_start_s"] == pytest.approx(smallest, abs=1e-3)
    # Predicted from the first three chunks: enough to play through, and within 25% of
    # the smallest start that would have worked.
    predicted = chunks[2]["stall_free_start_s"]
    assert predicted >= smallest * 0.95
    assert predicted <= smallest * 1.25
    early = 0.8 * smallest
    assert any(first.at + early + commit.pts_s < commit.at for commit in commits)
    metrics = await (await server.client.get("/metrics")).text()
    stalls = next(
        float(line.split()[-1])
        for line in metrics.splitlines()
        if line.startswith("vaecast_predicted_stalls_total")
    )
    assert stalls >= 7  # every chunk after the first two came late for an eager viewer
    assert "vaecast_fragment_slack_seconds_bucket" in metrics


@pytest.mark.slow
async def test_a_producer_slower_than_real_time_states_a_start_that_never_stalls(
    start_server: StartServer,
):
    """A push session that says how long it will be (`expected_frames`): its producer
    pushes at half real time, and the start it states a few blocks in is one from which
    a viewer never stalls while that rate holds, to the video's end."""
    from tests.server.test_push import create_session, push

    latents = smooth_latents(frames=11, height=6, width=8)  # 41 frames: 1, then 4 a block
    fps = 16
    server = await start_server()
    session = await create_session(server, fps=fps, expected_frames=41)
    assert session["expected_frames"] == 41
    stated = None
    began = time.perf_counter()
    for index in range(11):
        # Each block once twice its video's span has passed since the last: half real time.
        made = 1 + 4 * index
        await asyncio.sleep(max(0.0, began + 2 * made / fps - time.perf_counter()))
        status, _ = await push(server, session, latents[:, :, index : index + 1], index == 10)
        assert status == 202
        if index == 4:  # four chunks in: the rate is known
            async with server.client.get(session["urls"]["self"]) as response:
                stated = (await response.json())["stall_free_start_s"]
    job = server.manager.jobs[session["id"]]
    await asyncio.wait_for(job.wait(), 30)
    commits = job.record.commits
    needed = max(-slack(commits[0], commit) for commit in commits)
    assert stated is not None
    # Predicted over the whole expected length: the last chunk comes about 2.6 s late.
    assert stated > 2.0
    assert needed <= stated + 0.15  # a viewer who started then never waited (the jitter)
