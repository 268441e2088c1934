"""The baselines' work, synchronous and thread-confined, on the decoder vaecast serves.

Every pipeline here uses vaecast's own encoder path (`to_host`: the server's
quantizer, `quantize_to_host` for RGB or `quantize_yuv420_to_host`, then
`VideoStreamEncoder`, x264 with the server's settings), except the FFmpeg CLI
pipe, which hands the same host frames as raw video to `/usr/bin/ffmpeg` with the
same x264 settings. So the arms differ only in *when* work happens and bytes
leave, not in what the encoder does. Each records per-chunk moments into a
`Trace` (one clock for the whole machine: `time.monotonic`, CLOCK_MONOTONIC,
shared by the client process).
"""

from __future__ import annotations

import queue
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np
import torch

from vaecast.codecs.colour import Yuv420Frames, from_rgb
from vaecast.codecs.h264 import EncoderSettings
from vaecast.codecs.quantize import quantize_to_host, quantize_yuv420_to_host
from vaecast.codecs.stream import VideoStreamEncoder
from vaecast.models.base import ChunkedDecoder, DecodedChunk
from vaecast.pipeline.bridge import chunk_to_host

FFMPEG = "/usr/bin/ffmpeg"
# Chunks that may wait between decode and encode in the pre-encode arm: vaecast's
# own default (ServerConfig.queue_chunks), so both overlap the same way.
PREENCODE_QUEUE_CHUNKS = 2
_END = object()

HostFrames = np.ndarray | Yuv420Frames
ToHost = Callable[[torch.Tensor, tuple[float, float]], HostFrames]
# What the decode thread hands the encode thread: uint8 RGB (swscale converts it
# there, `as_yuv420`), or YUV 4:2:0 made in torch on the decoder's device.
HOST_FORMATS: dict[str, ToHost] = {"rgb": quantize_to_host, "yuv420": quantize_yuv420_to_host}
FFMPEG_PIX_FMTS = {"rgb": "rgb24", "yuv420": "yuv420p"}


def bridge_host_format() -> str:
    """What vaecast's own bridge hands its encoder: the default for every arm."""
    from vaecast.pipeline.run import Stages

    return "yuv420" if Stages().to_host is quantize_yuv420_to_host else "rgb"


def as_yuv420(frames: HostFrames) -> Yuv420Frames:
    """The frames as the encoder takes them: RGB goes through swscale (`from_rgb`)."""
    return frames if isinstance(frames, Yuv420Frames) else from_rgb(frames)


def raw_bytes(frames: HostFrames) -> memoryview:
    """The frames as ffmpeg's rawvideo reads them (rgb24 or yuv420p)."""
    array = frames.planes if isinstance(frames, Yuv420Frames) else frames
    return memoryview(np.ascontiguousarray(array)).cast("B")


@dataclass
class Trace:
    """Moments of one run, appended from any thread: (arm, event, chunk, t, extra)."""

    events: list[dict[str, Any]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def mark(self, arm: str, event: str, chunk: int | None = None, **extra: Any) -> None:
        entry = {"arm": arm, "event": event, "chunk": chunk, "t": time.monotonic(), **extra}
        with self._lock:
            self.events.append(entry)

    def take(self) -> list[dict[str, Any]]:
        with self._lock:
            events, self.events = self.events, []
        return events


def _decode(
    decoder: ChunkedDecoder,
    latents: torch.Tensor,
    on_chunk: Callable[[DecodedChunk], None],
) -> None:
    with torch.inference_mode():
        decoder.decode_chunks(latents.to(decoder.device), on_chunk)


def decode_then_encode(
    decoder: ChunkedDecoder,
    latents: torch.Tensor,
    fps: Fraction,
    settings: EncoderSettings,
    trace: Trace,
    to_host: ToHost = quantize_to_host,
    arm: str = "decode_then_encode",
) -> bytes:
    """A plain pipeline: the whole decode (one tensor), quantize it, encode it, return it."""
    plan = decoder.plan(latents.shape)
    parts: list[torch.Tensor] = []
    trace.mark(arm, "decode_start")

    def keep(chunk: DecodedChunk) -> None:
        parts.append(chunk.frames.clone())  # the chunk is borrowed; a full decode keeps it
        trace.mark(arm, "decoded", chunk.index)

    _decode(decoder, latents, keep)
    video = torch.cat(parts, dim=2)
    parts.clear()
    pixels = to_host(video, decoder.value_range)
    del video
    trace.mark(arm, "quantized")
    encoder = VideoStreamEncoder(plan.width, plan.height, fps, settings)
    try:
        out = [encoder.init_segment]
        for index, start in enumerate(plan.chunk_starts):
            trace.mark(arm, "encode_start", index)
            chunk = pixels[start : start + plan.chunk_frames[index]]
            out.append(encoder.encode_chunk(as_yuv420(chunk)))
            trace.mark(arm, "encoded", index)
    finally:
        encoder.close()
    return b"".join(out)


def preencode(
    decoder: ChunkedDecoder,
    latents: torch.Tensor,
    fps: Fraction,
    settings: EncoderSettings,
    trace: Trace,
    to_host: ToHost = quantize_to_host,
    arm: str = "preencode",
) -> bytes:
    """vLLM-Omni `preencode_mp4` style: a second thread encodes each chunk as the
    decode publishes it (a bounded queue between them), the MP4 is returned whole."""
    plan = decoder.plan(latents.shape)
    encoder = VideoStreamEncoder(plan.width, plan.height, fps, settings)
    chunks: queue.Queue[Any] = queue.Queue(maxsize=PREENCODE_QUEUE_CHUNKS)
    out = [encoder.init_segment]
    failure: list[BaseException] = []

    def encode_loop() -> None:
        try:
            while (item := chunks.get()) is not _END:
                index, pixels = item
                trace.mark(arm, "encode_start", index)
                out.append(encoder.encode_chunk(as_yuv420(pixels)))
                trace.mark(arm, "encoded", index)
        except BaseException as error:  # handed to the decoding thread below
            failure.append(error)
            while chunks.get() is not _END:  # unblock the producer
                pass

    def on_chunk(chunk: DecodedChunk) -> None:
        trace.mark(arm, "decoded", chunk.index)
        chunks.put((chunk.index, chunk_to_host(chunk, to_host, decoder.value_range)))
        trace.mark(arm, "handed_off", chunk.index)

    worker = threading.Thread(target=encode_loop, name="bench-preencode")
    worker.start()
    trace.mark(arm, "decode_start")
    try:
        _decode(decoder, latents, on_chunk)
    finally:
        chunks.put(_END)
        worker.join()
        encoder.close()
    if failure:
        raise failure[0]
    return b"".join(out)


def ffmpeg_command(
    width: int, height: int, fps: Fraction, settings: EncoderSettings, pix_fmt: str = "rgb24"
) -> list[str]:
    """Raw video on stdin (`pix_fmt` rgb24, or yuv420p: no conversion left) -> H.264
    fragmented MP4 on stdout, x264 set up as vaecast's.

    `frag_keyframe+empty_moov+default_base_moof` is the usual way to stream MP4 from
    the CLI; `frag_duration` cuts a fragment about every 4 frames (one chunk) between
    keyframes, and `flush_packets` pushes each one to the pipe at once. The muxer still
    closes a fragment only when the next packet arrives, so each
    fragment leaves one frame later than its last frame is encoded.
    """
    gop = max(1, round(settings.keyframe_interval_s * fps))
    rate_control, quality = settings.rate_control  # -qp or -crf, as vaecast's encoder
    chunk_us = round(4 * 1_000_000 / fps)
    return [
        FFMPEG, "-hide_banner", "-loglevel", "error", "-nostdin",
        "-f", "rawvideo", "-pix_fmt", pix_fmt, "-video_size", f"{width}x{height}",
        "-framerate", str(fps), "-i", "pipe:0",
        "-c:v", "libx264", "-preset", settings.preset, "-tune", "zerolatency",
        f"-{rate_control}", str(quality), "-g", str(gop), "-pix_fmt", "yuv420p",
        "-colorspace", "smpte170m", "-color_primaries", "smpte170m",
        "-color_trc", "smpte170m", "-color_range", "tv",
        "-movflags", "frag_keyframe+empty_moov+default_base_moof",
        "-frag_duration", str(chunk_us), "-flush_packets", "1",
        "-f", "mp4", "pipe:1",
    ]  # fmt: skip


def feed_ffmpeg(
    decoder: ChunkedDecoder,
    latents: torch.Tensor,
    process: subprocess.Popen[bytes],
    trace: Trace,
    to_host: ToHost = quantize_to_host,
    arm: str = "ffmpeg_pipe",
) -> None:
    """Decode, quantize and write each chunk's raw frames to ffmpeg's stdin (blocks when
    ffmpeg is behind: the pipe is the backpressure); closes stdin at the end."""
    assert process.stdin is not None
    stdin = process.stdin

    def on_chunk(chunk: DecodedChunk) -> None:
        trace.mark(arm, "decoded", chunk.index)
        stdin.write(raw_bytes(chunk_to_host(chunk, to_host, decoder.value_range)))
        stdin.flush()
        trace.mark(arm, "piped", chunk.index)

    trace.mark(arm, "decode_start")
    try:
        _decode(decoder, latents, on_chunk)
    finally:
        stdin.close()


def decode_only(
    decoder: ChunkedDecoder, latents: torch.Tensor, to_host: ToHost = quantize_to_host
) -> dict[str, Any]:
    """The decode thread's work alone (decode + quantize + the one host copy), per chunk."""
    decode_s: list[float] = []
    quantize_s: list[float] = []
    last = time.perf_counter()

    def on_chunk(chunk: DecodedChunk) -> None:
        nonlocal last
        decoded = time.perf_counter()
        chunk_to_host(chunk, to_host, decoder.value_range)
        done = time.perf_counter()
        decode_s.append(decoded - last)
        quantize_s.append(done - decoded)
        last = done

    start = last
    _decode(decoder, latents, on_chunk)
    total = time.perf_counter() - start
    per_chunk = [d + q for d, q in zip(decode_s, quantize_s, strict=True)]
    return {
        "total_s": total,
        "chunk_s": per_chunk,
        "model_s": sum(decode_s),
        "quantize_s": sum(quantize_s),
    }


def decoded_pixels(
    decoder: ChunkedDecoder, latents: torch.Tensor, to_host: ToHost = quantize_to_host
) -> list[HostFrames]:
    """Every chunk as host frames (the encoder's input), untimed."""
    chunks: list[HostFrames] = []
    _decode(
        decoder,
        latents,
        lambda chunk: chunks.append(chunk_to_host(chunk, to_host, decoder.value_range)),
    )
    return chunks


def encode_only(
    chunks: list[HostFrames], fps: Fraction, settings: EncoderSettings
) -> dict[str, Any]:
    """The encode thread's work alone (x264 incl. colour conversion, fMP4 boxes), per chunk."""
    height, width = chunks[0].shape[1:3]
    start = time.perf_counter()
    encoder = VideoStreamEncoder(width, height, fps, settings)
    opened = time.perf_counter()
    per_chunk = []
    size = len(encoder.init_segment)
    try:
        for pixels in chunks:
            before = time.perf_counter()
            size += len(encoder.encode_chunk(as_yuv420(pixels)))
            per_chunk.append(time.perf_counter() - before)
    finally:
        encoder.close()
    return {
        "total_s": time.perf_counter() - start,
        "open_s": opened - start,
        "chunk_s": per_chunk,
        "bytes": size,
    }
