"""The live demo: a procedural scene produced block by block inside a push session.

`{"scene": ..., "live": true}` (the preview page's default) creates a push session
and a producer task that renders and encodes one latent frame's worth of video at a
time (vaecast.demo.live) and pushes it into the session's feed, as a generator would.
So the first frame plays within about a second of the click, where the whole-clip
demo first renders and encodes every frame before the job even exists.

`warm_up_demo` runs the first click's work once at server start, on a small scale:
the first two blocks of the default scene rendered and encoded, decoded, converted
and encoded to H.264 and AAC. The first call of each (oneDNN picking and building
its convolution kernels for these shapes, the decode thread's OpenMP start-up, the
scene's set-up, the codecs' opening) makes the first job after start slower than
later ones (~0.2 s to the first fragment on a quiet machine, more under load); paid
at start, it is not paid by the first viewer. It runs in threads, one step at a
time, never on the event loop and never before the server answers: the app starts
it as a background task.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from aiohttp import web

from vaecast.codecs.aac import AudioSettings
from vaecast.codecs.h264 import EncoderSettings
from vaecast.demo.live import latent_block_frames, scene_latent_blocks
from vaecast.demo.soundtrack import DEFAULT_SAMPLE_RATE_HZ
from vaecast.demo.sources import SceneSpec, parse_scene_spec, scene_audio_span
from vaecast.errors import DecodeFailedError
from vaecast.models.base import ChunkedDecoder, DecodedChunk
from vaecast.pipeline.bridge import chunk_to_host
from vaecast.pipeline.run import AudioFormat, Stages, TimedAudio, Workers
from vaecast.server.stream.job import Job, PushRequest

log = logging.getLogger("vaecast.demo")

# The app's warm-up task (`warm_up_demo`), or None when the app runs none.
DEMO_WARM_UP = web.AppKey("demo_warm_up", asyncio.Task)
WARM_UP_STEPS = ("scene", "audio", "decode", "encode")

DEMO_AUDIO = AudioFormat(DEFAULT_SAMPLE_RATE_HZ, 2)  # the scenes' soundtrack is stereo
AUDIO_LEAD_FRAMES = 4  # one later latent frame's worth of video
# Two blocks: the first (one video frame) and a later one (four) take different paths
# through the encoder, and each shape has its own kernels to build.
WARM_UP_BLOCKS = 2
# The warm-up is a few seconds of CPU; past this it is given up (logged), whatever the load.
WARM_UP_TIMEOUT_S = 120.0
# What /healthz quotes of a warm-up's error.
MAX_ERROR_CHARS = 200


@dataclass(frozen=True, slots=True)
class LiveDemoRequest:
    spec: SceneSpec
    model: str
    fps: Fraction
    sound: bool
    device: str
    preview: str | None = None
    webhook_url: str | None = None

    def session(self) -> PushRequest:
        audio = DEMO_AUDIO if self.sound else None
        return PushRequest(
            self.model, self.fps, audio, preview=self.preview, webhook_url=self.webhook_url
        )


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
        total = (1, shape[1], first_latent, *shape[3:])
        job.length_known(job.decoder.plan(total), total)
        await feed.end()
    except asyncio.CancelledError:
        raise  # the job ended first (cancelled, failed): nothing more to make
    except Exception as error:
        log.exception("live demo of job %s failed", job.id)
        job.abort(DecodeFailedError(f"the demo producer failed: {error}"))


def warm_up_state(task: asyncio.Task[dict[str, float] | None] | None) -> dict[str, Any]:
    """What `/healthz` says of the warm-up: `off` (none), `running`, `done` (every step),
    `stopped` (a job came first), `failed` (an error, with it, or its timeout); with the
    seconds of the steps done once it has ended."""
    if task is None:
        return {"state": "off"}
    if not task.done():
        return {"state": "running"}
    if not task.cancelled() and task.exception() is not None:
        return {"state": "failed", "error": str(task.exception())[:MAX_ERROR_CHARS]}
    seconds = None if task.cancelled() else task.result()
    if seconds is None:
        return {"state": "failed"}
    state = "done" if set(seconds) == set(WARM_UP_STEPS) else "stopped"
    return {"state": state, "seconds": seconds}


def warm_up_raised(task: asyncio.Task[dict[str, float] | None] | None) -> bool:
    """Whether the warm-up ended in an error: the default model or the encoder failed
    at what every job does, so the server is not ready (a timeout says only that the
    machine is busy)."""
    return task is not None and task.done() and not task.cancelled() and bool(task.exception())


async def warm_up_demo(
    decoder: ChunkedDecoder,
    device: str,
    fps: Fraction,
    settings: EncoderSettings,
    stages: Stages = Stages(),  # noqa: B008 (frozen, immutable)
    workers: Workers | None = None,
    busy: Callable[[], bool] = lambda: False,
    timeout_s: float = WARM_UP_TIMEOUT_S,
) -> dict[str, float] | None:
    """Run a demo click's first-call work once (see the module docstring): the seconds
    each step took, or None when it ran past `timeout_s` (logged: it costs the first
    viewer the first-call time, nothing more). An error in a step is logged and raised:
    the jobs would meet it too, so `/healthz` is then not ready (`warm_up_raised`).

    Each step runs in a thread; cancelling this stops it between steps. The decode
    and the encode run on `workers`, the job manager's own threads, when given: some
    first-call costs are per thread (each new thread that calls torch starts its own
    OpenMP team, ~0.3 s measured), and jobs decode on those threads. The scene runs
    where the live producer runs it, in the loop's default executor.

    It stops before its next step once `busy()` (a job exists): from then on it would
    only compete with that job for the CPU and for the decode thread. It returns the
    steps done so far.
    """
    steps = _warm_up_steps(decoder, device, fps, settings, stages, workers)
    loop = asyncio.get_running_loop()
    seconds: dict[str, float] = {}
    started = time.perf_counter()
    try:
        async with asyncio.timeout(timeout_s):
            for name, step, executor in steps:
                if busy():
                    log.info("demo warm-up stopped for a job (%s done)", seconds or "nothing")
                    return seconds
                began = time.perf_counter()
                await loop.run_in_executor(executor, step)
                seconds[name] = round(time.perf_counter() - began, 3)
    except TimeoutError:
        log.warning("demo warm-up gave up after %.0f s (%s done)", timeout_s, seconds)
        return None
    except Exception:
        log.exception("demo warm-up failed (%s done); /healthz is not ready", seconds)
        raise
    log.info(
        "demo warm-up done in %.2f s (%s)",
        time.perf_counter() - started,
        ", ".join(f"{name} {s:.2f} s" for name, s in seconds.items()),
    )
    return seconds


WarmUpStep = tuple[str, Callable[[], None], Executor | None]


def _warm_up_steps(
    decoder: ChunkedDecoder,
    device: str,
    fps: Fraction,
    settings: EncoderSettings,
    stages: Stages,
    workers: Workers | None,
) -> list[WarmUpStep]:
    """A demo click's steps, each with the threads it runs on (None: the loop's
    default executor): the scene, its audio, the decode and the encode."""
    spec = parse_scene_spec({})  # the preview page's default scene: 832x480
    made: dict[str, Any] = {}

    def scene() -> None:
        blocks = scene_latent_blocks(spec, 1, device)
        made["blocks"] = [next(blocks) for _ in range(WARM_UP_BLOCKS)]

    def audio() -> None:
        _, count = latent_block_frames(0, WARM_UP_BLOCKS)
        made["audio"] = scene_audio_span(spec, fps, 0, count + AUDIO_LEAD_FRAMES)

    def decode() -> None:
        pixels: list[object] = []

        def on_chunk(chunk: DecodedChunk) -> None:
            pixels.append(chunk_to_host(chunk, stages.to_host, decoder.value_range))

        decoder.decode_stream(iter(made["blocks"]), on_chunk)
        made["pixels"] = pixels

    def encode() -> None:
        encoder = stages.encoder_factory(
            spec.width,
            spec.height,
            fps,
            settings,
            audio=AudioSettings(DEMO_AUDIO.sample_rate, DEMO_AUDIO.channels),
        )
        try:
            encoder.append_audio(made["audio"], 0)
            for pixels in made["pixels"]:
                encoder.encode_chunk(pixels)
            encoder.finish()
        finally:
            encoder.close()

    return [
        ("scene", scene, None),
        ("audio", audio, None),
        ("decode", decode, None if workers is None else workers.decode),
        ("encode", encode, None if workers is None else workers.encode),
    ]
