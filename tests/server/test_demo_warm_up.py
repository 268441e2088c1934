"""The demo warm-up: run once in the background at start, while the server answers."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator
from fractions import Fraction

import aiohttp
import pytest
import torch
from aiohttp import web

from tests.helpers import safetensors_bytes
from tests.helpers.server import serve_on_loopback
from vaecast.codecs.h264 import EncoderSettings
from vaecast.models.base import DecodedChunk
from vaecast.models.linear import LinearDecoder
from vaecast.models.tiny import TinyDecoder
from vaecast.server.app import DEMO_WARM_UP, create_app, runner_settings
from vaecast.server.config import ServerConfig
from vaecast.server.intake.live_demo import warm_up_demo, warm_up_state

CONFIG = ServerConfig(default_model="tiny")
WARM_UP_WAIT_S = 300.0  # seconds of CPU on an idle machine; far more on a loaded one


class CountingTiny(TinyDecoder):
    """`tiny`, counting what it decodes: the warm-up's decode is visible."""

    def __init__(self) -> None:
        super().__init__()
        self.chunk_shapes: list[tuple[int, ...]] = []
        self.threads: set[str] = set()

    def decode_stream(self, blocks, on_chunk):  # type: ignore[no-untyped-def]
        self.threads.add(threading.current_thread().name)

        def counting(chunk: DecodedChunk) -> None:
            self.chunk_shapes.append(tuple(chunk.frames.shape))
            on_chunk(chunk)

        return super().decode_stream(blocks, counting)


@contextlib.asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[aiohttp.ClientSession]:
    runner = web.AppRunner(app, **runner_settings(CONFIG))
    url = await serve_on_loopback(app, runner)
    try:
        async with aiohttp.ClientSession(url, timeout=aiohttp.ClientTimeout(total=10)) as client:
            yield client
    finally:
        await runner.cleanup()


@pytest.mark.slow
async def test_the_warm_up_runs_in_the_background_while_healthz_answers(
    caplog: pytest.LogCaptureFixture,
):
    caplog.set_level(logging.INFO, logger="vaecast.demo")
    decoder = CountingTiny()
    app = create_app(CONFIG, {"tiny": decoder}, warm_demo=True)
    async with serving(app) as client:
        warm_up = app[DEMO_WARM_UP]
        assert warm_up is not None
        # The server was ready before the warm-up ended, and answers while it runs.
        answered = 0
        while not warm_up.done() and answered < 3:
            began = time.perf_counter()
            async with client.get("/healthz") as response:
                assert response.status == 200
                health = await response.json()
            assert time.perf_counter() - began < 2.0
            # (It may have ended between the check above and this answer.)
            assert health["warm_up"]["state"] in ("running", "done")
            answered += 1
            await asyncio.sleep(0.05)
        assert answered >= 1, "the warm-up ended before the server answered once"
        seconds = await asyncio.wait_for(warm_up, WARM_UP_WAIT_S)
        async with client.get("/healthz") as response:
            assert (await response.json())["warm_up"] == {"state": "done", "seconds": seconds}
    assert seconds is not None and set(seconds) == {"scene", "audio", "decode", "encode"}
    # It decoded the demo's geometry: 832x480 frames from the scene's first two blocks.
    assert decoder.chunk_shapes and all(s[-2:] == (480, 832) for s in decoder.chunk_shapes)
    assert sum(s[2] for s in decoder.chunk_shapes) == 5  # video frame 0, then 1..4
    # On the thread jobs decode on: some first-call costs are per thread.
    assert len(decoder.threads) == 1 and decoder.threads.pop().startswith("vaecast-decode")
    assert any("demo warm-up done" in r.getMessage() for r in caplog.records)


@pytest.mark.slow
async def test_a_job_stops_the_warm_up_and_runs():
    decoder = CountingTiny()
    app = create_app(CONFIG, {"tiny": decoder}, warm_demo=True)
    async with serving(app) as client:
        warm_up = app[DEMO_WARM_UP]
        assert warm_up is not None and not warm_up.done()
        latents = torch.zeros(1, 16, 2, 8, 8)
        async with client.post(
            "/v1/videos/stream", data=safetensors_bytes(latents=latents)
        ) as response:
            assert response.status == 200
            assert (await response.read())[4:8] == b"ftyp"
        seconds = await asyncio.wait_for(warm_up, WARM_UP_WAIT_S)
        async with client.get("/healthz") as response:
            said = (await response.json())["warm_up"]
    # Stopped before its decode (the job came during its first step), or done first.
    assert seconds is not None and "scene" in seconds
    assert said == {"state": "done" if len(seconds) == 4 else "stopped", "seconds": seconds}


async def test_no_warm_up_without_the_demo_model_as_the_default():
    config = ServerConfig(default_model="linear")
    app = create_app(config, {"linear": LinearDecoder(), "tiny": TinyDecoder()}, warm_demo=True)
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        assert app[DEMO_WARM_UP] is None
    finally:
        await runner.cleanup()


class Broken(TinyDecoder):
    def decode_stream(self, blocks, on_chunk):  # type: ignore[no-untyped-def]
        raise RuntimeError("no decoder today")


@pytest.mark.slow
async def test_a_failing_warm_up_is_logged_and_raised(caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.INFO, logger="vaecast.demo")
    with pytest.raises(RuntimeError, match="no decoder today"):
        await warm_up_demo(
            Broken(), "cpu", Fraction(16), EncoderSettings(), timeout_s=WARM_UP_WAIT_S
        )
    assert any("demo warm-up failed" in r.getMessage() for r in caplog.records)


@pytest.mark.slow
async def test_healthz_is_not_ready_once_the_warm_up_failed():
    """What failed the warm-up (the default model's decode) fails every job of it."""
    app = create_app(CONFIG, {"tiny": Broken()}, warm_demo=True)
    async with serving(app) as client:
        warm_up = app[DEMO_WARM_UP]
        assert warm_up is not None
        await asyncio.wait(  # the scene step runs first: a second or two
            [warm_up], timeout=WARM_UP_WAIT_S
        )
        async with client.get("/healthz") as response:
            assert response.status == 503
            health = await response.json()
    assert (health["status"], health["ready"]) == ("failing", False)
    assert health["warm_up"] == {"state": "failed", "error": "no decoder today"}


@pytest.mark.slow
async def test_a_warm_up_past_its_time_is_given_up(caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.INFO, logger="vaecast.demo")
    result = await warm_up_demo(
        TinyDecoder(), "cpu", Fraction(16), EncoderSettings(), timeout_s=0.01
    )
    assert result is None
    assert any("demo warm-up gave up" in r.getMessage() for r in caplog.records)


@pytest.mark.slow
async def test_the_warm_up_stops_once_a_job_exists(caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.INFO, logger="vaecast.demo")
    asked: list[int] = []

    def busy() -> bool:  # a job arrives after the first step
        asked.append(1)
        return len(asked) > 1

    decoder = CountingTiny()
    result = await warm_up_demo(
        decoder, "cpu", Fraction(16), EncoderSettings(), busy=busy, timeout_s=WARM_UP_WAIT_S
    )
    assert result is not None and set(result) == {"scene"}
    assert decoder.chunk_shapes == []
    assert any("demo warm-up stopped for a job" in r.getMessage() for r in caplog.records)


async def test_no_warm_up_unless_asked():
    """Off by default: tests and benchmarks would see its decode and its CPU."""
    decoders = {"tiny": TinyDecoder()}
    for warm_demo, expected in [(False, False), (True, True)]:
        app = create_app(CONFIG, decoders, warm_demo=warm_demo)
        runner = web.AppRunner(app)
        await runner.setup()
        try:
            assert (app[DEMO_WARM_UP] is not None) == expected, warm_demo
        finally:
            await runner.cleanup()  # cancels a warm-up between its steps
    app = create_app(CONFIG, decoders)
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        assert app[DEMO_WARM_UP] is None
    finally:
        await runner.cleanup()


async def test_what_healthz_says_of_each_way_the_warm_up_ends():
    async def returning(value):
        return value

    async def forever():
        await asyncio.Event().wait()

    assert warm_up_state(None) == {"state": "off"}
    pending = asyncio.create_task(forever())
    assert warm_up_state(pending) == {"state": "running"}
    pending.cancel()
    await asyncio.gather(pending, return_exceptions=True)
    assert warm_up_state(pending) == {"state": "failed"}

    async def raising():
        raise RuntimeError("x264 said no")

    failed = asyncio.create_task(raising())
    await asyncio.gather(failed, return_exceptions=True)
    assert warm_up_state(failed) == {"state": "failed", "error": "x264 said no"}
    all_steps = dict.fromkeys(("scene", "audio", "decode", "encode"), 0.1)
    for value, expected in [
        (None, {"state": "failed"}),
        (all_steps, {"state": "done", "seconds": all_steps}),
        ({"scene": 1.4}, {"state": "stopped", "seconds": {"scene": 1.4}}),
    ]:
        ended = asyncio.create_task(returning(value))
        await ended
        assert warm_up_state(ended) == expected
