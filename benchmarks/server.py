"""The measured server: vaecast's own app, plus one small handler per baseline arm.

    python -m benchmarks.server [--model tiny] [--device cpu] [--port 0]

Prints `bench server on http://HOST:PORT` once it listens. It runs the app the way
`vaecast serve` does (uvloop, handler_cancellation=True), so the vaecast arm is the
production code path; the baselines live on the same port and loop, one request at a
time, so every arm meets the same process, threads and torch settings.

Instrumentation (benchmark only, nothing in vaecast is edited): the decoder is
wrapped to time-stamp each chunk as it is published, the job's stream encoder is a
subclass that time-stamps its opening and each chunk's encode, and a middleware and
a response signal time-stamp the vaecast request's head and its response headers.
`GET /bench/trace` returns (and clears) those moments.

Routes besides vaecast's:
- `POST /bench/decode_then_encode`, `/bench/preencode`: the MP4 in one response body;
- `POST /bench/ffmpeg_pipe`: ffmpeg's fragmented MP4 stdout, streamed as it comes;
- `POST /bench/decode_only`, `/bench/encode_only`: JSON timings of each stage alone.
Each takes the same raw safetensors body as `POST /v1/videos/stream` (`?fps=`).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import subprocess
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction
from pathlib import Path
from typing import Any

import torch
from aiohttp import web

from benchmarks import pipelines
from vaecast.codecs.h264 import EncoderSettings
from vaecast.codecs.stream import VideoStreamEncoder
from vaecast.embed import (
    MIB,
    Limits,
    ServerConfig,
    Stages,
    create_app,
    runner_settings,
    serve_until_signalled,
)
from vaecast.latent_files import load_latents
from vaecast.models.base import ChunkCallback, ChunkedDecoder, DecodedChunk, DecodePlan, StreamPlan
from vaecast.models.registry import get_decoder
from vaecast.params import parse_fps

TRACE = pipelines.Trace()
VAECAST_ARM = "vaecast"
READ_BYTES = 1 << 16
STREAM_PATH = "/v1/videos/stream"


class TimedDecoder:
    """A decoder that time-stamps each chunk as it is published, then passes it on."""

    def __init__(self, inner: ChunkedDecoder, trace: pipelines.Trace, arm: str) -> None:
        self.inner, self.trace, self.arm = inner, trace, arm
        self.name = inner.name
        self.latent_channels = inner.latent_channels
        self.value_range = inner.value_range
        self.device = inner.device

    def plan(self, latent_shape: Sequence[int]) -> DecodePlan:
        return self.inner.plan(latent_shape)

    def plan_stream(self, first_block_shape: Sequence[int]) -> StreamPlan:
        return self.inner.plan_stream(first_block_shape)

    def decode_chunks(self, latents: torch.Tensor, on_chunk: ChunkCallback) -> None:
        self.trace.mark(self.arm, "decode_start")
        self.inner.decode_chunks(latents, self._timed(on_chunk))

    def decode_stream(self, blocks: Iterable[torch.Tensor], on_chunk: ChunkCallback) -> DecodePlan:
        self.trace.mark(self.arm, "decode_start")
        return self.inner.decode_stream(blocks, self._timed(on_chunk))

    def _timed(self, on_chunk: ChunkCallback) -> ChunkCallback:
        def timed(chunk: DecodedChunk) -> None:
            self.trace.mark(self.arm, "decoded", chunk.index)
            on_chunk(chunk)  # quantize, host copy, bounded put (may block)
            self.trace.mark(self.arm, "handed_off", chunk.index)

        return timed

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        return self.inner.decode(latents)


class TimedStreamEncoder(VideoStreamEncoder):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        TRACE.mark(VAECAST_ARM, "open_start")
        super().__init__(*args, **kwargs)
        TRACE.mark(VAECAST_ARM, "opened")

    def encode_chunk(self, frames: pipelines.HostFrames) -> bytes:
        index = self.fragments_written
        TRACE.mark(VAECAST_ARM, "encode_start", index)
        # `--host-frames rgb`: the encoder takes YUV 4:2:0 only, so RGB goes through
        # swscale here, on the encode thread, as it does in every other arm.
        data = super().encode_chunk(pipelines.as_yuv420(frames))
        TRACE.mark(VAECAST_ARM, "encoded", index)
        return data


@web.middleware
async def _mark_request(request: web.Request, handler: Any) -> web.StreamResponse:
    """The moment the request's head is parsed, before its body is read."""
    if request.path == STREAM_PATH:
        TRACE.mark(VAECAST_ARM, "request")
    return await handler(request)


async def _mark_response(request: web.Request, response: web.StreamResponse) -> None:
    if request.path == STREAM_PATH:
        TRACE.mark(VAECAST_ARM, "response_prepare")


def load_decoder(model: str, device: str, weights: str | Path | None = None) -> ChunkedDecoder:
    if model == "tiny":
        import vaecast.models.tiny  # noqa: F401  (registers itself on import)
    return get_decoder(model, device=device, weights=weights)


class Baselines:
    """The /bench/* handlers, sharing the decoder and settings the vaecast app uses."""

    def __init__(self, decoder: ChunkedDecoder, config: ServerConfig, host_format: str) -> None:
        self.decoder, self.config = decoder, config
        self.host_format = host_format
        self.to_host = pipelines.HOST_FORMATS[host_format]
        # One decode thread and one encode thread, as vaecast has with one decode slot.
        self.decode_pool = ThreadPoolExecutor(1, thread_name_prefix="bench-decode")
        self.encode_pool = ThreadPoolExecutor(1, thread_name_prefix="bench-encode")

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/bench/decode_then_encode", self.whole_file)
        app.router.add_post("/bench/preencode", self.whole_file)
        app.router.add_post("/bench/ffmpeg_pipe", self.ffmpeg_pipe)
        app.router.add_post("/bench/decode_only", self.decode_only)
        app.router.add_post("/bench/encode_only", self.encode_only)
        app.router.add_get("/bench/trace", self.trace)
        app.router.add_get("/bench/info", self.info)

    async def _request(self, request: web.Request) -> tuple[torch.Tensor, Fraction]:
        latent_file = load_latents(await request.read())
        fps = parse_fps(request.query.get("fps"), self.config.default_fps)
        return latent_file.latents, fps

    async def whole_file(self, request: web.Request) -> web.Response:
        latents, fps = await self._request(request)
        arm = request.path.rsplit("/", 1)[1]
        work = {
            "decode_then_encode": pipelines.decode_then_encode,
            "preencode": pipelines.preencode,
        }
        body = await asyncio.get_running_loop().run_in_executor(
            self.decode_pool,
            work[arm],
            self.decoder,
            latents,
            fps,
            self.config.encoder,
            TRACE,
            self.to_host,
        )
        TRACE.mark(arm, "send_start")
        return web.Response(body=body, content_type="video/mp4")

    async def ffmpeg_pipe(self, request: web.Request) -> web.StreamResponse:
        arm = "ffmpeg_pipe"
        latents, fps = await self._request(request)
        plan = self.decoder.plan(latents.shape)
        loop = asyncio.get_running_loop()
        command = pipelines.ffmpeg_command(
            plan.width,
            plan.height,
            fps,
            self.config.encoder,
            pipelines.FFMPEG_PIX_FMTS[self.host_format],
        )
        process = await loop.run_in_executor(
            None,
            functools.partial(
                subprocess.Popen,
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            ),
        )
        assert process.stdout is not None and process.stderr is not None
        stdout, stderr = process.stdout, process.stderr
        feeding = loop.run_in_executor(
            self.decode_pool,
            pipelines.feed_ffmpeg,
            self.decoder,
            latents,
            process,
            TRACE,
            self.to_host,
        )
        errors = loop.run_in_executor(None, stderr.read)
        response = web.StreamResponse(headers={"Content-Type": "video/mp4"})
        response.enable_chunked_encoding()
        try:
            await response.prepare(request)
            while data := await loop.run_in_executor(None, stdout.read1, READ_BYTES):
                TRACE.mark(arm, "stdout", bytes=len(data))
                await response.write(data)
            await feeding
            status = await loop.run_in_executor(None, process.wait)
            message = (await errors).decode(errors="replace").strip()
            if status != 0:
                raise RuntimeError(f"ffmpeg exited with {status}: {message}")
        except BaseException:
            process.kill()
            await loop.run_in_executor(None, process.wait)
            if request.transport is not None:
                request.transport.close()  # cut: the client sees a truncated stream
            raise
        await response.write_eof()
        return response

    async def decode_only(self, request: web.Request) -> web.Response:
        latents, _ = await self._request(request)
        result = await asyncio.get_running_loop().run_in_executor(
            self.decode_pool, pipelines.decode_only, self.decoder, latents, self.to_host
        )
        return web.json_response(result)

    async def encode_only(self, request: web.Request) -> web.Response:
        latents, fps = await self._request(request)
        loop = asyncio.get_running_loop()
        chunks = await loop.run_in_executor(
            self.decode_pool, pipelines.decoded_pixels, self.decoder, latents, self.to_host
        )
        result = await loop.run_in_executor(
            self.encode_pool, pipelines.encode_only, chunks, fps, self.config.encoder
        )
        return web.json_response(result)

    async def trace(self, request: web.Request) -> web.Response:
        return web.json_response(TRACE.take())

    async def info(self, request: web.Request) -> web.Response:
        info: dict[str, Any] = {
            "pid": os.getpid(),
            "torch_threads": torch.get_num_threads(),
            "model": self.decoder.name,
            "device": str(self.decoder.device),
            "host_format": self.host_format,
            "encoder": {
                "preset": self.config.encoder.preset,
                "rate_control": list(self.config.encoder.rate_control),
                "keyframe_interval_s": self.config.encoder.keyframe_interval_s,
            },
        }
        return web.json_response(info)

    def close(self) -> None:
        self.decode_pool.shutdown()
        self.encode_pool.shutdown()


async def serve(args: argparse.Namespace) -> None:
    # What the decode thread hands the encoder, the same for every arm.
    to_host = pipelines.HOST_FORMATS[args.host_frames]
    decoder = await asyncio.to_thread(load_decoder, args.model, args.device, args.weights)
    config = ServerConfig(
        default_model=decoder.name,
        device=args.device,
        encoder=EncoderSettings(),
        limits=Limits(max_upload_bytes=1024 * MIB, max_frames=100_000),
        max_queued_jobs=8,
    )
    app = create_app(
        config,
        {decoder.name: TimedDecoder(decoder, TRACE, VAECAST_ARM)},
        stages=Stages(to_host=to_host, encoder_factory=TimedStreamEncoder),
    )
    baselines = Baselines(decoder, config, args.host_frames)
    baselines.add_routes(app)
    app.middlewares.append(_mark_request)
    app.on_response_prepare.append(_mark_response)
    try:
        await serve_until_signalled(
            app,
            args.host,
            args.port,
            lambda host, port: print(f"bench server on http://{host}:{port}", flush=True),
            access_log=None,
            **runner_settings(config),
        )
    finally:
        baselines.close()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="the benchmarks' server process")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--weights", type=Path, default=None, help="the model's weights")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument(
        "--host-frames",
        choices=sorted(pipelines.HOST_FORMATS),
        default=pipelines.bridge_host_format(),
        help="what the decode thread hands the encoder (yuv420: converted in torch); "
        "default: what vaecast's pipeline does",
    )
    args = parser.parse_args(argv)
    import uvloop

    uvloop.run(serve(args))


if __name__ == "__main__":
    main()
