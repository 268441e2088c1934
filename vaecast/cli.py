"""The `vaecast` command: `serve` the HTTP API, or `decode` latents to an MP4 file."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from vaecast.cluster.records import ReplicaOptions
from vaecast.codecs.h264 import MAX_QP, EncoderSettings
from vaecast.codecs.stream import Soundtrack
from vaecast.decode_file import decode_to_file
from vaecast.errors import InvalidRequestError, VaecastError
from vaecast.latent_files import AUDIO_RATE_KEY, check_audio, load_latents
from vaecast.models.base import ChunkedDecoder
from vaecast.models.layouts import layout_of
from vaecast.models.registry import (
    DIFFUSERS_MODEL,
    available_decoders,
    diffusers_model,
    get_decoder,
    takes_weights,
)
from vaecast.params import parse_fps
from vaecast.pipeline import VideoOutput
from vaecast.server.config import MIB, Limits, ServerConfig
from vaecast.server.edge.security_config import (
    API_KEY_ENV,
    SecurityConfig,
    check_api_key,
    for_bind_address,
    normalize_host_pattern,
    normalize_origin,
)

DEFAULT_MODEL = "tiny"
DEFAULTS = ServerConfig()


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        return int(args.run(args))
    except VaecastError as error:
        print(f"vaecast: error: {error.message}", file=sys.stderr)
        return 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vaecast", description=__doc__)
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

    serve = commands.add_parser("serve", help="run the HTTP server")
    serve.set_defaults(run=_serve)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    serve.add_argument(
        "--model",
        action="append",
        help="model to serve (repeatable; the first is the default; default "
        f"{DEFAULT_MODEL}): a built-in name, 'diffusers' (the model of the --weights "
        "folder's config.json), or a plugin as package.module:factory",
    )
    serve.add_argument("--max-upload-mb", type=int, default=DEFAULTS.limits.max_upload_bytes // MIB)
    serve.add_argument("--max-frames", type=int, default=DEFAULTS.limits.max_frames)
    serve.add_argument(
        "--max-pixels",
        type=int,
        default=DEFAULTS.limits.max_pixels_per_frame,
        help="largest width x height of a decoded frame",
    )
    serve.add_argument("--decode-slots", type=int, default=DEFAULTS.decode_slots)
    serve.add_argument(
        "--max-queued",
        type=int,
        default=DEFAULTS.max_queued_jobs,
        help="jobs that may wait for a decode slot before POST answers 429",
    )
    serve.add_argument(
        "--reader-timeout",
        type=float,
        default=DEFAULTS.reader_write_timeout_s,
        metavar="SECONDS",
        help="drop a viewer whose socket accepts nothing for this long",
    )
    serve.add_argument(
        "--push-queue-blocks",
        type=int,
        default=DEFAULTS.push_queue_blocks,
        help="push sessions: latent blocks that may wait for the decoder before a push waits",
    )
    serve.add_argument(
        "--push-idle-timeout",
        type=float,
        default=DEFAULTS.push_idle_timeout_s,
        metavar="SECONDS",
        help="a push session that receives nothing this long fails",
    )
    serve.add_argument(
        "--header-timeout",
        type=float,
        default=DEFAULTS.header_timeout_s,
        metavar="SECONDS",
        help="close a connection whose request head is not complete this long after it "
        "opened or after its previous response (idle keep-alive connections too)",
    )
    serve.add_argument(
        "--body-timeout",
        type=float,
        default=DEFAULTS.body_timeout_s,
        metavar="SECONDS",
        help="answer 408 when no part of a request body arrives for this long",
    )
    serve.add_argument(
        "--retention",
        type=float,
        default=DEFAULTS.retention_s,
        metavar="SECONDS",
        help="keep finished videos this long",
    )
    serve.add_argument(
        "--retention-memory-mb",
        type=int,
        default=DEFAULTS.retention_memory_bytes // MIB,
        help="RAM that finished videos may hold; the oldest are evicted past it",
    )
    serve.add_argument(
        "--spill-threshold-mb",
        type=int,
        default=DEFAULTS.spill_threshold_bytes // MIB,
        help="a video's bytes past this go to a temporary file instead of RAM",
    )
    serve.add_argument("--spill-dir", default=None, help="where spill files go (default: $TMPDIR)")
    serve.add_argument(
        "--shutdown-grace",
        type=float,
        default=DEFAULTS.shutdown_grace_s,
        metavar="SECONDS",
        help="on SIGTERM/SIGINT, let running jobs finish this long before cancelling them",
    )
    # Security (vaecast.server.edge.security; README: Security).
    serve.add_argument(
        "--api-key",
        default=os.environ.get(API_KEY_ENV) or None,
        type=_option_type(check_api_key),
        metavar="KEY",
        help="require 'Authorization: Bearer KEY' on /v1 (the page, /healthz and /metrics "
        f"stay open); default ${API_KEY_ENV}, which other users cannot read in `ps`",
    )
    serve.add_argument(
        "--allowed-host",
        action="append",
        type=_option_type(normalize_host_pattern),
        metavar="NAME",
        help="also answer to this Host (repeatable): a name, '*.domain', an IP address or "
        "network, or '*' for any; others get 421 (default: localhost and loopback addresses)",
    )
    serve.add_argument(
        "--cors-origin",
        action="append",
        type=_option_type(normalize_origin),
        metavar="ORIGIN",
        help="let pages of this origin (https://app.example.com) call the API (repeatable); "
        "other origins' POST and DELETE get 403",
    )
    # Ray mode (vaecast.cluster; README: Across machines).
    cluster = serve.add_argument_group(
        "across machines (Ray Serve)",
        "decode on a Ray Serve deployment of decoder replicas; any front end attached to "
        "the same cluster serves any job (needs: pip install 'vaecast[ray]')",
    )
    cluster.add_argument(
        "--ray",
        metavar="ADDRESS",
        default=None,
        help="local (a Ray instance in this process), auto (the cluster this machine "
        "joined with `ray start`) or ray://HOST:PORT",
    )
    cluster.add_argument("--replicas", type=int, default=1, help="decoder replicas (default 1)")
    cluster.add_argument(
        "--max-replicas",
        type=int,
        default=None,
        help="autoscale between --replicas and this many replicas",
    )
    cluster.add_argument(
        "--replica-gpus", type=float, default=0.0, help="GPUs per replica (default 0)"
    )
    cluster.add_argument(
        "--replica-cpus", type=float, default=1.0, help="CPUs per replica (default 1)"
    )
    cluster.add_argument(
        "--replica-models",
        action="append",
        metavar="MODEL",
        help="a model each replica loads (repeatable; default: the --model list)",
    )
    cluster.add_argument(
        "--max-ongoing",
        type=int,
        default=2,
        help="jobs one replica decodes at once: Serve's max_ongoing_requests (default 2)",
    )
    _add_common(serve)

    latents = commands.add_parser(
        "latents", help="make a latent file: a demo scene or a video, encoded with tiny"
    )
    latents.set_defaults(run=_latents)
    source = latents.add_mutually_exclusive_group(required=True)
    source.add_argument("--scene", help="a demo scene: " + ", ".join(_scene_names()))
    source.add_argument("--video", type=Path, help="a video file to encode (read with PyAV)")
    latents.add_argument("-o", "--output", type=Path, required=True)
    latents.add_argument("--frames", type=int, default=81, help="1 + 4k (scene only)")
    latents.add_argument("--width", type=int, default=832, help="multiple of 8 (scene only)")
    latents.add_argument("--height", type=int, default=480, help="multiple of 8 (scene only)")
    latents.add_argument("--seed", type=int, default=0, help="scene only")
    latents.add_argument("--fps", default="16", help="stored in the file's metadata")
    latents.add_argument(
        "--no-sound", action="store_true", help="scene only: leave out the soundtrack"
    )
    latents.add_argument(
        "--max-frames", type=int, default=None, help="video only: read at most this many"
    )
    latents.add_argument("--device", default="cpu")

    decode = commands.add_parser("decode", help="decode a latent file to an MP4 file")
    decode.set_defaults(run=_decode)
    decode.add_argument("latents", type=Path, help=".safetensors (tensor 'latents') or .npy")
    decode.add_argument("-o", "--output", type=Path, required=True)
    decode.add_argument("--model", default=DEFAULT_MODEL)
    _add_common(decode)

    push = commands.add_parser(
        "push", help="push a latent file to a server block by block, as a generator would"
    )
    push.set_defaults(run=_push)
    push.add_argument("latents", type=Path, help=".safetensors (tensor 'latents', 'audio') or .npy")
    push.add_argument("--url", default="http://127.0.0.1:8000", help="the server's base URL")
    push.add_argument(
        "--latent-fps",
        type=float,
        default=4.0,
        help="latent frames the simulated generator makes per second (default 4; 0: no wait)",
    )
    push.add_argument("--block-frames", type=int, default=1, help="latent frames per block")
    push.add_argument("--model", default=None, help="default: the file's, else the server's")
    push.add_argument("--fps", default=None, help="video fps (default: the file's, else 16)")
    push.add_argument(
        "--api-key",
        default=os.environ.get(API_KEY_ENV) or None,
        metavar="KEY",
        help=f"the server's API key (default ${API_KEY_ENV})",
    )
    push.add_argument(
        "--timeout", type=float, default=300.0, metavar="SECONDS", help="wait per request"
    )
    return parser


def _add_common(parser: argparse.ArgumentParser) -> None:
    encoder = EncoderSettings()
    parser.add_argument("--device", default="cpu", help="torch device of the decoder")
    parser.add_argument(
        "--weights",
        action="append",
        default=[],
        metavar="[MODEL=]PATH",
        help="weights of a model that needs them (taehv: taew2_1.safetensors; the diffusers "
        "models: a local diffusers folder); PATH alone is for the first --model",
    )
    parser.add_argument(
        "--fps", default=None, help=f"frames per second (default {DEFAULTS.default_fps})"
    )
    parser.add_argument("--preset", default=encoder.preset, help="x264 preset")
    parser.add_argument(
        "--qp",
        type=_quantizer,
        default=encoder.qp,
        help=f"x264 constant quantizer, 0-{MAX_QP} (default {encoder.qp})",
    )
    parser.add_argument(
        "--crf", type=_quantizer, default=None, help="x264 constant rate factor instead of --qp"
    )
    parser.add_argument(
        "--keyframe-interval", type=float, default=encoder.keyframe_interval_s, metavar="SECONDS"
    )


def _encoder_settings(args: argparse.Namespace) -> EncoderSettings:
    return EncoderSettings(
        preset=args.preset, crf=args.crf, qp=args.qp, keyframe_interval_s=args.keyframe_interval
    )


def _quantizer(text: str) -> int:
    """--qp and --crf: an integer on x264's 8-bit scale."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text[:40]!r}") from None
    if not 0 <= value <= MAX_QP:
        raise argparse.ArgumentTypeError(f"must be in 0..{MAX_QP}, got {value}")
    return value


def _option_type(parse: Callable[[str], str]) -> Callable[[str], str]:
    """`parse` as an argparse type: argparse shows the message of a ValueError only
    when it is an ArgumentTypeError."""

    def convert(text: str) -> str:
        try:
            return parse(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    return convert


def _serve(args: argparse.Namespace) -> int:
    from vaecast.server.app import (
        ACCESS_LOG_FORMAT,
        create_app,
        runner_settings,
        serve_until_signalled,
    )
    from vaecast.server.faces.routes import MANAGER
    from vaecast.server.stream.manager import JobManager

    models = args.model or [DEFAULT_MODEL]
    # Checked before any model loads: a --weights mistake is a usage error.
    models, weights = _resolve_diffusers(models, _weights_by_model(args.weights, models))
    security, warnings = for_bind_address(
        SecurityConfig(
            api_key=args.api_key,
            allowed_hosts=tuple(args.allowed_host) if args.allowed_host else None,
            cors_origins=tuple(args.cors_origin or ()),
        ),
        args.host,
    )
    for warning in warnings:
        print(f"vaecast: warning: {warning}", file=sys.stderr, flush=True)
    config = ServerConfig(
        default_model=models[0],
        default_fps=parse_fps(args.fps, DEFAULTS.default_fps),
        device=args.device,
        encoder=_encoder_settings(args),
        limits=Limits(
            max_upload_bytes=args.max_upload_mb * MIB,
            max_frames=args.max_frames,
            max_pixels_per_frame=args.max_pixels,
        ),
        decode_slots=args.decode_slots if args.ray is None else _cluster_slots(args),
        max_queued_jobs=args.max_queued,
        reader_write_timeout_s=args.reader_timeout,
        header_timeout_s=args.header_timeout,
        push_queue_blocks=args.push_queue_blocks,
        push_idle_timeout_s=args.push_idle_timeout,
        body_timeout_s=args.body_timeout,
        retention_s=args.retention,
        retention_memory_bytes=args.retention_memory_mb * MIB,
        spill_threshold_bytes=args.spill_threshold_mb * MIB,
        spill_dir=args.spill_dir,
        shutdown_grace_s=args.shutdown_grace,
        security=security,
    )

    replicas = None if args.ray is None else _start_replicas(args, models, weights)

    async def serve() -> None:
        # Weights load in a thread: the loop is already running signal handling.
        decoders = {
            name: await asyncio.to_thread(_load_decoder, name, args.device, weights.get(name))
            for name in models
        }
        manager = None
        if replicas is not None:  # jobs run in the Ray cluster, mirrored here
            from vaecast.cluster.runners import ClusterRunners

            manager = JobManager(config, decoders, runners=ClusterRunners(replicas))
        app = create_app(config, decoders, manager=manager, warm_demo=True)

        def announce(host: str, port: int) -> None:
            print(f"vaecast serving {', '.join(models)} on http://{host}:{port}/", flush=True)

        async def drain() -> None:
            print("vaecast: shutting down: no new jobs, waiting for running ones", flush=True)
            await app[MANAGER].drain(config.shutdown_grace_s)

        await serve_until_signalled(
            app,
            args.host,
            args.port,
            announce,
            drain,
            access_log_format=ACCESS_LOG_FORMAT,
            **runner_settings(config),
        )

    _run_loop(serve())
    return 0


def _cluster_slots(args: argparse.Namespace) -> int:
    """Ray mode: the jobs the replicas decode at once, for this front end's admission."""
    return max(args.replicas, args.max_replicas or 0) * args.max_ongoing


def _start_replicas(
    args: argparse.Namespace, models: list[str], weights: dict[str, str]
) -> ReplicaOptions:
    """Join the cluster and deploy the decoder replicas (unless another front end did)."""
    from vaecast.cluster.connect import check_address, connect

    check_address(args.ray)
    if args.replicas < 1 or (args.max_replicas is not None and args.max_replicas < args.replicas):
        raise InvalidRequestError("--replicas must be >= 1 and --max-replicas >= --replicas")
    replica_models = tuple(args.replica_models or models)
    options = ReplicaOptions(
        models=replica_models,
        device="cuda" if args.replica_gpus > 0 else args.device,
        weights=tuple((name, path) for name, path in weights.items() if name in replica_models),
        replicas=args.replicas,
        max_replicas=args.max_replicas,
        gpus=args.replica_gpus,
        cpus=args.replica_cpus,
        max_ongoing=args.max_ongoing,
    )
    connect(args.ray)
    from vaecast.cluster.replica import deploy

    print(f"vaecast: starting decoder replicas on Ray ({args.ray})", flush=True)
    deployed = deploy(options)
    if not deployed:
        print(
            "vaecast: the cluster already runs vaecast's decoder replicas: using them", flush=True
        )
    return options


def _weights_by_model(specs: list[str], models: list[str]) -> dict[str, str]:
    """The path each `--weights [MODEL=]PATH` gives a model in `models`.

    MODEL is a known model's name; anything else before a `=` is part of a path, which
    is for the first model. Raises for weights of a model not in `models` and for a
    model that takes no weights file.
    """
    known = set(available_decoders())
    weights: dict[str, str] = {}
    for spec in specs:
        name, separator, path = spec.partition("=")
        if not separator or (name not in known and name not in models):
            name, path = models[0], spec
        elif name not in models:
            raise InvalidRequestError(
                f"--weights {spec}: model {name!r} is not served here (served: {', '.join(models)})"
            )
        if not takes_weights(name):
            raise InvalidRequestError(f"model {name!r} takes no --weights")
        weights[name] = path
    return weights


def _resolve_diffusers(
    models: list[str], weights: dict[str, str]
) -> tuple[list[str], dict[str, str]]:
    """`--model diffusers` named as the model its `--weights` folder holds (its
    config.json's class), so that requests and the page name the real model."""
    if DIFFUSERS_MODEL not in models:
        return models, weights
    folder = weights.pop(DIFFUSERS_MODEL, None)
    if folder is None:
        raise InvalidRequestError(
            "--model diffusers needs --weights DIR: a local diffusers folder of a video VAE"
        )
    name = diffusers_model(Path(folder))
    if name in models:
        raise InvalidRequestError(
            f"--model diffusers: {folder} holds a {name} VAE, and {name} is served already"
        )
    weights[name] = folder
    return [name if model == DIFFUSERS_MODEL else model for model in models], weights


def _load_decoder(name: str, device: str, weights: str | None) -> ChunkedDecoder:
    return get_decoder(name, device=device, weights=weights)


def _run_loop(main_coroutine: object) -> None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency, absent only on Windows
        asyncio.run(main_coroutine)  # type: ignore[arg-type]
    else:
        uvloop.run(main_coroutine)  # type: ignore[arg-type]


def _scene_names() -> tuple[str, ...]:
    from vaecast.demo.scenes import SCENE_NAMES

    return SCENE_NAMES


def _latents(args: argparse.Namespace) -> int:
    import torch
    from safetensors.torch import save_file

    from vaecast.demo.soundtrack import DEFAULT_SAMPLE_RATE_HZ
    from vaecast.demo.sources import (
        parse_scene_spec,
        scene_audio,
        scene_latents,
        video_file_latents,
    )

    tensors: dict[str, torch.Tensor] = {}
    metadata: dict[str, str] = {"model": "tiny"}

    if args.scene is not None:
        fields = {
            "scene": args.scene,
            "frames": args.frames,
            "width": args.width,
            "height": args.height,
            "seed": args.seed,
        }
        spec = parse_scene_spec(fields)
        latents = scene_latents(spec, device=args.device)
        fps = parse_fps(args.fps, DEFAULTS.default_fps)
        if not args.no_sound:
            tensors["audio"] = torch.from_numpy(scene_audio(spec, fps))
            metadata["audio_sample_rate"] = str(DEFAULT_SAMPLE_RATE_HZ)
    else:
        latents, fps = video_file_latents(args.video, args.max_frames, device=args.device)
    tensors["latents"] = latents.cpu().contiguous()
    metadata["fps"] = str(fps)
    save_file(tensors, str(args.output), metadata=metadata)
    sound = " with sound" if "audio" in tensors else ""
    print(f"wrote {args.output}: latents {tuple(latents.shape)}, {float(fps):g} fps{sound}")
    return 0


def _decode(args: argparse.Namespace) -> int:
    data = args.latents.read_bytes()
    models, weights = _resolve_diffusers(
        [args.model], _weights_by_model(args.weights, [args.model])
    )
    decoder = _load_decoder(models[0], args.device, weights.get(models[0]))
    layout = layout_of(decoder)
    latent_file = load_latents(data, layout=layout.bind)
    fps = parse_fps(args.fps or latent_file.metadata.get("fps"), DEFAULTS.default_fps)
    soundtrack = None
    if latent_file.audio is not None:  # muxed as the server muxes it
        waveform, sample_rate = check_audio(
            latent_file.audio, latent_file.metadata.get(AUDIO_RATE_KEY)
        )
        soundtrack = Soundtrack(waveform, sample_rate)
    output = VideoOutput(fps, _encoder_settings(args), soundtrack)
    plan = decode_to_file(latent_file.latents, decoder, output, args.output)
    sound = "" if soundtrack is None else f", {soundtrack.channels} audio channel(s)"
    print(
        f"wrote {args.output} ({plan.frames} frames, {plan.width}x{plan.height}, "
        f"{float(fps):g} fps{sound})"
    )
    return 0


def _push(args: argparse.Namespace) -> int:
    from vaecast.push_file import push_file  # the client: no server, no model loaded

    return push_file(
        args.latents,
        args.url,
        latent_fps=args.latent_fps,
        block_frames=args.block_frames,
        model=args.model,
        fps=args.fps,
        api_key=args.api_key,
        timeout=args.timeout,
    )


if __name__ == "__main__":
    sys.exit(main())
