"""The live demo: a procedural scene produced block by block inside a push session.

`{"scene": ..., "live": true}` (the preview page's default) creates a push session
and a producer task that renders and encodes one latent frame's worth of video at a
time (vaecast.demo.live) and pushes it into the session's feed, as a generator would.
So the first frame plays within about a second of the click, where the whole-clip
demo first renders and encodes every frame before the job even exists.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from fractions import Fraction

from vaecast.demo.live import latent_block_frames, scene_latent_blocks
from vaecast.demo.soundtrack import DEFAULT_SAMPLE_RATE_HZ
from vaecast.demo.sources import SceneSpec, scene_audio_span
from vaecast.errors import DecodeFailedError
from vaecast.pipeline import AudioFormat, TimedAudio
from vaecast.server.job import Job, PushRequest

log = logging.getLogger("vaecast.demo")

DEMO_AUDIO = AudioFormat(DEFAULT_SAMPLE_RATE_HZ, 2)  # the scenes' soundtrack is stereo
AUDIO_LEAD_FRAMES = 4  # one later latent frame's worth of video


@dataclass(frozen=True, slots=True)
class LiveDemoRequest:
    spec: SceneSpec
    model: str
    fps: Fraction
    sound: bool
    device: str

    def session(self) -> PushRequest:
        return PushRequest(self.model, self.fps, DEMO_AUDIO if self.sound else None)


def start_producer(job: Job, demo: LiveDemoRequest) -> None:
    """Produce the scene into `job`'s feed in a task that ends with the job."""
    task = asyncio.create_task(_produce(job, demo), name=f"live-demo-{job.id}")
    job.on_end(lambda: task.cancel())


async def _produce(job: Job, demo: LiveDemoRequest) -> None:
    feed = job.feed
    assert feed is not None, "a live demo's job is a push session"
    blocks = scene_latent_blocks(demo.spec, 1, demo.device)
    first_latent = 0
    shape: tuple[int, ...] | None = None
    try:
        while (block := await asyncio.to_thread(next, blocks, None)) is not None:
            audio = None
            if demo.sound:
                # The soundtrack is known ahead: send the next block's span too, so the
                # AAC encoder's two-frame delay never holds a fragment's audio back.
                first, count = latent_block_frames(first_latent, int(block.shape[2]))
                count = min(count + AUDIO_LEAD_FRAMES, demo.spec.frames - first)
                samples = await asyncio.to_thread(
                    scene_audio_span, demo.spec, demo.fps, first, count
                )
                audio = TimedAudio(samples, first)
            await feed.put(block, audio)
            first_latent += int(block.shape[2])
            shape = tuple(block.shape)
        assert shape is not None, "a scene has at least one frame"
        job.length_known(job.decoder.plan((1, shape[1], first_latent, *shape[3:])))
        await feed.end()
    except asyncio.CancelledError:
        raise  # the job ended first (cancelled, failed): nothing more to make
    except Exception as error:
        log.exception("live demo of job %s failed", job.id)
        job.abort(DecodeFailedError(f"the demo producer failed: {error}"))
