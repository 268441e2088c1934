"""Turning an HTTP request into a DecodeRequest: body limits, form fields, parameters.

Three request shapes:
- `multipart/form-data`: a file part named `file` or `latents`, and text parts
  `model` and `fps` (what browsers and `curl -F` send);
- `application/json`: a demo request, `{"scene", "frames", "width", "height",
  "seed", "fps", "model", "sound"}` (`scene` required, the rest defaulted): a
  procedural scene rendered and encoded with the `tiny` encoder here
  (vaecast.demo.sources), so no latent file is needed; with its soundtrack unless
  `"sound": false`; or a push session, `{"input": "push", ...}`;
- any other body: the latent file itself as the raw body, parameters in the query
  string (`curl --data-binary @z.safetensors '.../v1/videos/stream?fps=16'`).
Parameters in the query string also apply to multipart requests; a form field wins.

The event loop only moves bytes: the body is read with a size limit and an idle
timeout, and everything that costs CPU in proportion to what a client sent
(multipart parsing, tensor parsing and checks, demo rendering) runs in a thread.
The caller holds an admission (a reserved job place) while this runs.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from aiohttp import web

from vaecast.codecs.aac import MAX_SAMPLE_RATE_HZ, MIN_SAMPLE_RATE_HZ
from vaecast.codecs.stream import Soundtrack
from vaecast.demo.scenes import SCENE_NAMES
from vaecast.demo.soundtrack import DEFAULT_SAMPLE_RATE_HZ
from vaecast.demo.sources import DEMO_DEFAULTS, parse_scene_spec, scene_audio, scene_latents
from vaecast.errors import (
    InvalidRequestError,
    MalformedRequestError,
    PayloadTooLargeError,
    UnsupportedMediaError,
    VaecastError,
)
from vaecast.job.transitions import JobInput
from vaecast.latent_files import AUDIO_RATE_KEY, check_audio, load_latents
from vaecast.latent_files.audio import MAX_AUDIO_CHANNELS
from vaecast.latent_files.latents import echo
from vaecast.models.crop import check_crop_size
from vaecast.models.frames import FramesDecoder
from vaecast.models.layouts import BCTHW, MAX_GEOMETRY_VALUE, BoundLayout, LatentLayout
from vaecast.models.sound import AUDIO_LATENTS_KEY, SoundDecoder, decode_sound
from vaecast.params import parse_fps, parse_int
from vaecast.pipeline.run import AudioFormat
from vaecast.server.config import MAX_FIELD_BYTES, MAX_PREVIEW_NAME, ServerConfig
from vaecast.server.edge.body_reading import body_chunks, read_limited, read_small_body, too_large
from vaecast.server.edge.multipart import boundary_of, parse_form
from vaecast.server.edge.outbound import check_webhook_url
from vaecast.server.intake.live_demo import LiveDemoRequest
from vaecast.server.stream.job import BatchRequest, DecodeRequest, PushKind, PushRequest

FILE_FIELDS = ("file", "latents")
FORM_URLENCODED = "application/x-www-form-urlencoded"
CURL_DATA_HINT = (
    "sent as a form (curl -d strips line breaks from a file): send the file's bytes as "
    "they are, with curl --data-binary @file"
)
READ_CHUNK_BYTES = 256 * 1024
MAX_FORM_PARTS = 32
MAX_JSON_BYTES = 64 * 1024
DEMO_FIELDS = frozenset(DEMO_DEFAULTS) | {
    "fps",
    "model",
    "sound",
    "live",
    "preview",
    "webhook_url",
}
PUSH_FIELDS = frozenset(
    {
        "input",
        "preview",
        "webhook_url",
        "batch",
        "kind",
        "fps",
        "model",
        "audio_sample_rate",
        "audio_channels",
        "value_range",
        "width",
        "height",
        "expected_frames",
    }
)
# The largest magnitude of a frames session's value_range ends.
MAX_VALUE_RANGE = 1e6
FRAMES_MODEL = FramesDecoder.name  # a frames session's "model": its pass-through
# Demo latents are in the embedded model's latent space: decode them with it.
DEMO_MODEL = "tiny"
# A demo scene is rendered whole as float32 RGB before it is encoded: bound that to
# the default demo's size (81 frames at 832x480, ~390 MB), whatever the limits.
MAX_DEMO_FRAME_PIXELS = 81 * 832 * 480

# (model or None, declared BCTHW latent shape) -> None, or raises PayloadTooLargeError.
ShapeCheck = Callable[[str | None, tuple[int, ...]], None]


@dataclass(frozen=True, slots=True)
class Upload:
    """The latent file as received, and the form's text fields.

    `data` is the one buffer the body was read into (or, for a form, the file part's
    slice of it): the loader's tensors may be views of it (`load_latents`), so it is
    handed over, never written to, and never copied into `bytes`.
    """

    data: bytearray
    fields: dict[str, str]


async def read_decode_request(
    request: web.Request,
    config: ServerConfig,
    check_shape: ShapeCheck,
    layout_for: Callable[[str], LatentLayout] = lambda model: BCTHW,
    check_names: Callable[[str | None, str | None], None] = lambda model, preview: None,
    sound_for: Callable[[str], SoundDecoder | None] = lambda model: None,
) -> DecodeRequest | BatchRequest | PushRequest | LiveDemoRequest:
    """The request a POST makes: a push session, a demo, or an upload of latents read in
    the layout of the model they are for (`layout_for`, by name); a batch of several
    videos makes a `BatchRequest`. `check_names(model, preview)` refuses what a demo
    names before it is rendered. Audio latents are decoded to the soundtrack here, by the
    model's `sound_for` decoder, while the upload is read."""
    if request.content_type == "application/json":
        body = await _read_json_object(request, config)
        push = body.get("input") == JobInput.PUSH
        # The query's, where the body has none (a webhook for any request: never ignored).
        for name in ("preview", "webhook_url") if push else ("webhook_url",):
            if name in request.query and name not in body:
                body = {**body, name: request.query[name]}
        if push:
            return _push_request(body, config)
        return await _demo_request(body, config, check_names)
    upload = await read_upload(request, config)
    named_model = upload.fields.get("model") or request.query.get("model") or None

    def layout(metadata: Mapping[str, str]) -> BoundLayout:
        params = {**metadata, **request.query, **upload.fields}
        return layout_for(params.get("model") or config.default_model).bind(params)

    def load_and_check() -> tuple[Any, dict[str, str], list[Soundtrack | None]]:
        latent_file = load_latents(
            upload.data,
            check_shape=lambda shape: check_shape(named_model, shape),
            layout=layout,
            max_batch=config.decode_slots + config.max_queued_jobs,
        )
        params = {**latent_file.metadata, **request.query, **upload.fields}
        batch = int(latent_file.latents.shape[0])
        soundtracks: list[Soundtrack | None] = [None] * batch
        if latent_file.audio is not None:
            soundtracks = _soundtracks(latent_file.audio, batch, params.get(AUDIO_RATE_KEY))
        if latent_file.audio_latents is not None:
            if batch != 1:
                raise InvalidRequestError(
                    f"{AUDIO_LATENTS_KEY} are taken with one video's latents; these hold {batch}"
                )
            model = params.get("model") or config.default_model
            waveform, rate = decode_sound(sound_for(model), model, latent_file.audio_latents)
            soundtracks = _soundtracks(torch.from_numpy(waveform), 1, str(rate))
        return latent_file.latents, params, soundtracks

    # Parsing and checking (a full pass for NaN/Inf) take seconds on a large upload.
    try:
        latents, params, soundtracks = await asyncio.to_thread(load_and_check)
    except (UnsupportedMediaError, InvalidRequestError) as error:
        raise _with_form_hint(error, request.content_type) from None
    videos = tuple(
        DecodeRequest(
            latents=latents[entry : entry + 1],
            model=params.get("model") or config.default_model,
            fps=parse_fps(params.get("fps"), config.default_fps),
            soundtrack=soundtrack,
            crop=_crop(params),
            preview=preview_name(params.get("preview")),
            webhook_url=webhook_target(params.get("webhook_url"), config),
        )
        for entry, soundtrack in enumerate(soundtracks)
    )
    return videos[0] if len(videos) == 1 else BatchRequest(videos)


def _with_form_hint(error: VaecastError, content_type: str) -> VaecastError:
    """The error, with a pointer at `--data-binary` where the body came as a form.

    `curl -d @z.safetensors` sends the file form-encoded, with every CR and LF byte
    taken out: a file that then fails to parse most likely went that way.
    (`--data-binary` also says form-urlencoded, but sends the bytes as they are.)"""
    if content_type != FORM_URLENCODED:
        return error
    hinted = error.detached()
    hinted.message = f"{error.message}; {CURL_DATA_HINT}"
    hinted.args = (hinted.message,)
    return hinted


def _soundtracks(audio: Any, batch: int, rate: str | None) -> list[Soundtrack | None]:
    """A batch's soundtracks: (B, channels, samples), one per video, or one for all."""
    if batch > 1 and audio.ndim == 3:
        if audio.shape[0] != batch:
            raise InvalidRequestError(
                f"audio of shape {tuple(audio.shape)} is for {audio.shape[0]} videos; the "
                f"latents hold {batch}: send (B, channels, samples) or one (channels, samples)"
            )
        entries = [check_audio(audio[entry], rate) for entry in range(batch)]
    else:
        entries = [check_audio(audio, rate)] * batch
    return [Soundtrack(waveform, sample_rate) for waveform, sample_rate in entries]


async def _read_json_object(request: web.Request, config: ServerConfig) -> dict[str, Any]:
    body_bytes = await read_small_body(request, config.body_pace(), MAX_JSON_BYTES)
    try:
        body = json.loads(body_bytes)
    except (ValueError, RecursionError) as error:  # RecursionError: "[[[[..." nested deep
        raise MalformedRequestError(f"the JSON body cannot be parsed: {error}") from None
    if not isinstance(body, dict):
        raise InvalidRequestError("a demo request is a JSON object")
    nulls = sorted(str(name) for name, value in body.items() if value is None)
    if nulls:  # the document has no null field: one left out takes its default
        raise InvalidRequestError(
            f"{', '.join(echo(name) for name in nulls[:8])}: null is no value here; "
            "leave a field out for its default"
        )
    return body


def _push_request(body: dict[str, Any], config: ServerConfig) -> PushRequest:
    """`{"input": "push", "kind", "fps", "model", "audio_sample_rate", "audio_channels",
    "value_range", "width", "height", "expected_frames"}`: `kind` "latents" (the
    default) or "frames"; `value_range` (frames only) the [low, high] of float frames,
    default [0, 1]; `width` and `height` crop the video to its top-left part;
    `expected_frames` the video's length as the producer expects it (a hint for the
    stall-free start; the video ends where its last block says)."""
    unknown = sorted(set(body) - PUSH_FIELDS)
    if unknown:
        raise InvalidRequestError(
            f"unknown field(s) {', '.join(unknown)}; a push session takes: "
            f"{', '.join(sorted(PUSH_FIELDS))}"
        )
    fps = parse_fps(_text_field(body, "fps", numbers=True), config.default_fps)
    rate, channels = body.get("audio_sample_rate"), body.get("audio_channels")
    audio_format = None
    if rate is not None or channels is not None:
        rate_text = _text_field(body, "audio_sample_rate", numbers=True) or ""
        channels_text = _text_field(body, "audio_channels", numbers=True) or "1"
        audio_format = AudioFormat(
            parse_int(rate_text, "audio_sample_rate", MIN_SAMPLE_RATE_HZ, MAX_SAMPLE_RATE_HZ),
            parse_int(channels_text, "audio_channels", 1, MAX_AUDIO_CHANNELS),
        )
    kind_text = _text_field(body, "kind") or PushKind.LATENTS.value
    try:
        kind = PushKind(kind_text)
    except ValueError:
        kinds = ", ".join(k.value for k in PushKind)
        raise InvalidRequestError(f"kind must be one of {kinds}, got {echo(kind_text)!r}") from None
    model = _text_field(body, "model")
    value_range = body.get("value_range")
    if kind is PushKind.FRAMES:
        if model is not None:
            raise InvalidRequestError("a frames session decodes nothing: it takes no model")
        model = FRAMES_MODEL
    elif value_range is not None:
        raise InvalidRequestError('value_range is for frames sessions ("kind": "frames")')
    return PushRequest(
        preview=preview_name(_text_field(body, "preview")),
        webhook_url=webhook_target(_text_field(body, "webhook_url"), config),
        model=model or config.default_model,
        fps=fps,
        audio_format=audio_format,
        kind=kind,
        value_range=(0.0, 1.0) if value_range is None else _value_range(value_range),
        expected_frames=_expected_frames(body, config),
        crop=_crop({key: _text_field(body, key, numbers=True) for key in ("width", "height")}),
        batch=parse_int(
            _text_field(body, "batch", numbers=True) or "1",
            "batch",
            1,
            config.decode_slots + config.max_queued_jobs,
        ),
    )


def _expected_frames(body: dict[str, Any], config: ServerConfig) -> int | None:
    text = _text_field(body, "expected_frames", numbers=True)
    if text is None:
        return None
    return parse_int(text, "expected_frames", 1, config.limits.max_frames)


def webhook_target(text: str | None, config: ServerConfig) -> str | None:
    """A request's `webhook_url`, checked (`edge.outbound`); refused where the server
    sends no webhooks."""
    if text is None:
        return None
    if config.webhooks.secret is None:
        raise InvalidRequestError(
            "this server sends no webhooks (it was started without --webhook-secret): "
            "leave webhook_url out, or follow the job's /events"
        )
    return check_webhook_url(text, config.webhooks.allow_private)


def preview_name(text: str | None) -> str | None:
    """A request's `preview`: a decoder's name (or "none"), as a name can be."""
    if text is None:
        return None
    if not text or len(text) > MAX_PREVIEW_NAME or not text.isprintable():
        raise InvalidRequestError(
            f"preview must name a decoder (at most {MAX_PREVIEW_NAME} characters), "
            f"got {echo(text)!r}"
        )
    return text


def _value_range(value: Any) -> tuple[float, float]:
    """A JSON [low, high] of finite numbers, low < high."""
    if (
        isinstance(value, list)
        and len(value) == 2
        and all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)
        and all(math.isfinite(v) and abs(v) <= MAX_VALUE_RANGE for v in value)
        and value[0] < value[1]
    ):
        return float(value[0]), float(value[1])
    raise InvalidRequestError(
        f"value_range must be [low, high], two numbers with low < high and |each| <= "
        f"{MAX_VALUE_RANGE:g}, got {echo(value)}"
    )


def _crop(params: Mapping[str, str | None]) -> tuple[int, int] | None:
    """The (width, height) a request crops its video to; None unless both are given."""
    width, height = params.get("width"), params.get("height")
    if not width and not height:
        return None
    if not (width and height):
        raise InvalidRequestError("a crop needs both width and height")
    size = (
        parse_int(width, "width", 1, MAX_GEOMETRY_VALUE),
        parse_int(height, "height", 1, MAX_GEOMETRY_VALUE),
    )
    check_crop_size(*size)
    return size


async def _demo_request(
    body: dict[str, Any],
    config: ServerConfig,
    check_names: Callable[[str | None, str | None], None],
) -> DecodeRequest | LiveDemoRequest:
    unknown = sorted(set(body) - DEMO_FIELDS)
    if unknown:
        raise InvalidRequestError(
            f"unknown field(s) {', '.join(unknown)}; a demo request takes: "
            f"{', '.join(sorted(DEMO_FIELDS))}"
        )
    if "scene" not in body:  # `{}` would otherwise render the largest demo there is
        raise InvalidRequestError(
            f'a demo request names its scene: "scene" (one of {", ".join(SCENE_NAMES)}); '
            f"frames, width, height, seed, fps, model, sound, live, preview and webhook_url "
            "are optional; "
            '{"input": "push"} starts a push session instead'
        )
    spec = parse_scene_spec(body)
    limits = config.limits
    if spec.frames > limits.max_frames or spec.width * spec.height > limits.max_pixels_per_frame:
        raise PayloadTooLargeError(
            f"{spec.frames} frames of {spec.width}x{spec.height} is over this server's limits "
            f"({limits.max_frames} frames, {limits.max_pixels_per_frame} pixels per frame)"
        )
    if spec.frames * spec.width * spec.height > MAX_DEMO_FRAME_PIXELS:
        raise PayloadTooLargeError(
            f"a demo renders at most {MAX_DEMO_FRAME_PIXELS} pixels in all (81 frames at "
            f"832x480); {spec.frames} frames of {spec.width}x{spec.height} is more"
        )
    model = _text_field(body, "model") or DEMO_MODEL
    fps = parse_fps(_text_field(body, "fps", numbers=True), config.default_fps)
    sound = body.get("sound", True)
    if not isinstance(sound, bool):
        raise InvalidRequestError(f"sound must be true or false, got {sound!r}")
    live = body.get("live", False)
    if not isinstance(live, bool):
        raise InvalidRequestError(f"live must be true or false, got {live!r}")
    preview = preview_name(_text_field(body, "preview"))
    webhook_url = webhook_target(_text_field(body, "webhook_url"), config)
    check_names(model, preview)  # an unknown one is 404 now, not after seconds of render
    if live:  # produced block by block inside a push session (vaecast.server.intake.live_demo)
        return LiveDemoRequest(spec, model, fps, sound, config.device, preview, webhook_url)
    # Rendering and encoding take seconds of CPU: never on the loop.
    latents = await asyncio.to_thread(scene_latents, spec, config.device)
    soundtrack = None
    if sound:
        waveform = await asyncio.to_thread(scene_audio, spec, fps)
        soundtrack = Soundtrack(waveform, DEFAULT_SAMPLE_RATE_HZ)
    return DecodeRequest(
        latents=latents,
        model=model,
        fps=fps,
        soundtrack=soundtrack,
        preview=preview,
        webhook_url=webhook_url,
    )


def _text_field(body: Mapping[str, Any], name: str, numbers: bool = False) -> str | None:
    """A JSON field that must be a string (or, with `numbers`, a number): None if absent."""
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if numbers and isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    kind = "a string or a number" if numbers else "a string"
    raise InvalidRequestError(f"{name} must be {kind}, got {type(value).__name__}")


async def read_upload(request: web.Request, config: ServerConfig) -> Upload:
    max_bytes = config.limits.max_upload_bytes
    if request.content_length is not None and request.content_length > max_bytes:
        raise too_large(max_bytes)
    body = await read_limited(body_chunks(request, config.body_pace()), max_bytes)
    if not request.content_type.startswith("multipart/"):
        return Upload(body, {})
    boundary = boundary_of(request.headers.get("Content-Type", ""))
    parts = await asyncio.to_thread(parse_form, body, boundary, max_parts=MAX_FORM_PARTS)
    del body  # the parts are slices of it: drop the whole body before the file is parsed
    data: bytearray | None = None
    fields: dict[str, str] = {}
    for part in parts:
        if part.name in FILE_FIELDS:
            # A slice of a bytearray is one: kept as is (the multipart parser made the
            # one copy); `bytearray()` of it would be a second.
            data = part.data if isinstance(part.data, bytearray) else bytearray(part.data)
        elif len(part.data) > MAX_FIELD_BYTES:
            raise PayloadTooLargeError(
                f"form field {part.name[:40]!r} is over {MAX_FIELD_BYTES} bytes"
            )
        else:
            fields[part.name] = bytes(part.data).decode("utf-8", "replace").strip()
    if data is None:
        raise InvalidRequestError(
            "the form has no latent file; send it in a part named 'file' or 'latents'"
        )
    return Upload(data, fields)
