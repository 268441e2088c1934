"""Turning an HTTP request into a DecodeRequest: body limits, form fields, parameters.

Three request shapes:
- `multipart/form-data`: a file part named `file` or `latents`, and text parts
  `model` and `fps` (what browsers and `curl -F` send);
- `application/json`: a demo request, `{"scene", "frames", "width", "height",
  "seed", "fps", "model", "sound"}`: a procedural scene rendered and encoded with
  the `tiny` encoder here (vaecast.latent_sources), so no latent file is needed;
  with its soundtrack unless `"sound": false`;
- any other body: the latent file itself as the raw body, parameters in the query
  string (`curl --data-binary @z.safetensors '.../v1/videos/stream?fps=16'`).
Parameters in the query string also apply to multipart requests; a form field wins.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from fractions import Fraction

from aiohttp import BodyPartReader, web

from vaecast.codecs.stream import Soundtrack
from vaecast.errors import InvalidRequestError, MalformedRequestError, PayloadTooLargeError
from vaecast.latent_files import AUDIO_RATE_KEY, check_audio, load_latents
from vaecast.latent_sources import DEMO_DEFAULTS, parse_scene_spec, scene_audio, scene_latents
from vaecast.models.soundtrack import DEFAULT_SAMPLE_RATE_HZ
from vaecast.server.config import ServerConfig
from vaecast.server.jobs import DecodeRequest

MIN_FPS = Fraction(1)
MAX_FPS = Fraction(240)
FILE_FIELDS = ("file", "latents")
READ_CHUNK_BYTES = 256 * 1024
MAX_FIELD_BYTES = 1024
MAX_JSON_BYTES = 64 * 1024
DEMO_FIELDS = frozenset(DEMO_DEFAULTS) | {"fps", "model", "sound"}


@dataclass(frozen=True, slots=True)
class Upload:
    data: bytes
    fields: dict[str, str]


async def read_decode_request(request: web.Request, config: ServerConfig) -> DecodeRequest:
    if request.content_type == "application/json":
        return await _read_demo_request(request, config)
    upload = await read_upload(request, config.limits.max_upload_bytes)
    # Parsing and checking (a full pass for NaN/Inf) take seconds on a large upload:
    # never on the loop.
    latent_file = await asyncio.to_thread(load_latents, upload.data)
    params = {**latent_file.metadata, **request.query, **upload.fields}
    soundtrack = None
    if latent_file.audio is not None:
        waveform, sample_rate = await asyncio.to_thread(
            check_audio, latent_file.audio, params.get(AUDIO_RATE_KEY)
        )
        soundtrack = Soundtrack(waveform, sample_rate)
    return DecodeRequest(
        latents=latent_file.latents,
        model=params.get("model") or config.default_model,
        fps=parse_fps(params.get("fps"), config.default_fps),
        soundtrack=soundtrack,
    )


async def _read_demo_request(request: web.Request, config: ServerConfig) -> DecodeRequest:
    body_bytes = await _read_limited(request.content.iter_chunked(READ_CHUNK_BYTES), MAX_JSON_BYTES)
    try:
        body = json.loads(body_bytes)
    except ValueError as error:
        raise MalformedRequestError(f"the JSON body cannot be parsed: {error}") from None
    if not isinstance(body, dict):
        raise InvalidRequestError("a demo request is a JSON object")
    unknown = sorted(set(body) - DEMO_FIELDS)
    if unknown:
        raise InvalidRequestError(
            f"unknown field(s) {', '.join(unknown)}; a demo request takes: "
            f"{', '.join(sorted(DEMO_FIELDS))}"
        )
    spec = parse_scene_spec(body)
    limits = config.limits
    if spec.frames > limits.max_frames or spec.width * spec.height > limits.max_pixels_per_frame:
        raise PayloadTooLargeError(
            f"{spec.frames} frames of {spec.width}x{spec.height} is over this server's limits "
            f"({limits.max_frames} frames, {limits.max_pixels_per_frame} pixels per frame)"
        )
    fps_field = body.get("fps")
    fps = parse_fps(None if fps_field is None else str(fps_field), config.default_fps)
    sound = body.get("sound", True)
    if not isinstance(sound, bool):
        raise InvalidRequestError(f"sound must be true or false, got {sound!r}")
    # Rendering and encoding take seconds of CPU: never on the loop.
    latents = await asyncio.to_thread(scene_latents, spec, config.device)
    soundtrack = None
    if sound:
        waveform = await asyncio.to_thread(scene_audio, spec, fps)
        soundtrack = Soundtrack(waveform, DEFAULT_SAMPLE_RATE_HZ)
    return DecodeRequest(
        latents=latents,
        model=body.get("model") or config.default_model,
        fps=fps,
        soundtrack=soundtrack,
    )


async def read_upload(request: web.Request, max_bytes: int) -> Upload:
    if request.content_length is not None and request.content_length > max_bytes:
        raise _too_large(max_bytes)
    if request.content_type.startswith("multipart/"):
        return await _read_multipart(request, max_bytes)
    return Upload(
        await _read_limited(request.content.iter_chunked(READ_CHUNK_BYTES), max_bytes), {}
    )


async def _read_multipart(request: web.Request, max_bytes: int) -> Upload:
    try:
        reader = await request.multipart()
        data: bytes | None = None
        fields: dict[str, str] = {}
        while (part := await reader.next()) is not None:
            if not isinstance(part, BodyPartReader):
                raise MalformedRequestError("nested multipart bodies are not supported")
            if part.name in FILE_FIELDS:
                data = await _read_limited(_part_chunks(part), max_bytes)
            elif part.name:
                value = await _read_limited(_part_chunks(part), MAX_FIELD_BYTES)
                fields[part.name] = value.decode("utf-8", "replace").strip()
    except (ValueError, AssertionError) as error:
        raise MalformedRequestError(f"the multipart body cannot be parsed: {error}") from None
    if data is None:
        raise InvalidRequestError(
            "the form has no latent file; send it in a part named 'file' or 'latents'"
        )
    return Upload(data, fields)


async def _part_chunks(part: BodyPartReader) -> AsyncIterator[bytes]:
    while chunk := await part.read_chunk(READ_CHUNK_BYTES):
        yield chunk


async def _read_limited(chunks: AsyncIterator[bytes], max_bytes: int) -> bytes:
    body = bytearray()
    async for chunk in chunks:
        body += chunk
        if len(body) > max_bytes:
            raise _too_large(max_bytes)
    return bytes(body)


def _too_large(max_bytes: int) -> PayloadTooLargeError:
    return PayloadTooLargeError(f"the upload is over this server's limit of {max_bytes} bytes")


def parse_fps(value: str | None, default: Fraction) -> Fraction:
    if value is None or value == "":
        return default
    try:
        fps = Fraction(value)
    except (ValueError, ZeroDivisionError):
        raise InvalidRequestError(
            f"fps must be a number or a ratio like 30000/1001, got {value!r}"
        ) from None
    if not MIN_FPS <= fps <= MAX_FPS:
        raise InvalidRequestError(f"fps must be between {MIN_FPS} and {MAX_FPS}, got {value}")
    # Media time uses an integer timescale derived from fps: keep it representable.
    return fps.limit_denominator(1001)
