"""`vaecast serve`: build the server's config from the options and serve until a signal.

In Ray mode (`--ray`) it first joins the cluster and deploys the decoder replicas,
and the job manager runs its jobs there (`vaecast.cluster.runners`). Ray, the app
and the manager are imported only when the command runs: `vaecast decode` and
`vaecast push` load none of them.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from vaecast.cli.decode_options import (
    DEFAULT_MODEL,
    DEFAULTS,
    encoder_settings,
    load_decoder,
    resolve_diffusers,
    weights_by_model,
)
from vaecast.cli.start_checks import check_encoder, check_listen_address, check_writable_folder
from vaecast.cluster.records import ReplicaOptions
from vaecast.errors import InvalidRequestError
from vaecast.params import parse_fps
from vaecast.pipeline.heap import retain_decode_heap
from vaecast.server.config import MIB, Limits, ServerConfig, WebhookSettings
from vaecast.server.edge.outbound import check_webhook_url
from vaecast.server.edge.security_config import (
    API_KEY_ENV,
    SecurityConfig,
    for_bind_address,
    is_loopback_bind,
)
from vaecast.server.faces.standard import standard_faces
from vaecast.server.faces.whep.settings import WebRtcSettings, host_addresses_for


def run_serve(args: argparse.Namespace) -> int:
    check_listen_address(args.host)  # before anything heavy is imported
    # Before other threads allocate (the models load in threads, Ray starts its own):
    # set later, the settings left a worker thread's decode slower (pipeline/heap.py).
    retain_decode_heap()
    models = args.model or [DEFAULT_MODEL]
    # Checked before any model loads: a --weights mistake is a usage error.
    models, weights = resolve_diffusers(models, weights_by_model(args.weights, models))
    previews = preview_pairs(args.preview, models)
    config = _server_config(args, models[0], previews, _security(args))
    # Before the port opens (as the models below): a setting that would fail every job
    # ends the start with one line.
    check_encoder(config.encoder, config.default_fps)
    check_writable_folder("--spill-dir", config.spill_dir)
    replicas = None if args.ray is None else start_replicas(args, models, weights)
    run_loop(_serve(args, config, models, weights, previews, replicas))
    return 0


def _security(args: argparse.Namespace) -> SecurityConfig:
    """The API key, Host and Origin rules for the bind address (warnings printed)."""
    if args.require_api_key and args.api_key is None and not is_loopback_bind(args.host):
        raise InvalidRequestError(
            f"--require-api-key: listening on {args.host or 'all interfaces'} needs a key: "
            f"set {API_KEY_ENV} (or --api-key KEY)"
        )
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
    return security


def _webhooks(args: argparse.Namespace) -> WebhookSettings:
    if args.ray is not None and args.webhook_secret is not None:
        raise InvalidRequestError(
            "--webhook-secret is not taken with --ray yet: no webhook is sent"
        )
    if args.webhook_url is not None and args.webhook_secret is None:
        raise InvalidRequestError("--webhook-url needs --webhook-secret to sign what it sends")
    if args.webhook_url is not None:
        check_webhook_url(args.webhook_url, args.webhook_allow_private)
    return WebhookSettings(
        secret=args.webhook_secret,
        default_url=args.webhook_url,
        allow_private=args.webhook_allow_private,
    )


def _server_config(
    args: argparse.Namespace,
    default_model: str,
    previews: tuple[tuple[str, str], ...],
    security: SecurityConfig,
) -> ServerConfig:
    return ServerConfig(
        default_model=default_model,
        default_fps=parse_fps(args.fps, DEFAULTS.default_fps),
        device=args.device,
        encoder=encoder_settings(args),
        limits=Limits(
            max_upload_bytes=args.max_upload_mb * MIB,
            max_frames=args.max_frames,
            max_pixels_per_frame=args.max_pixels,
        ),
        decode_slots=args.decode_slots if args.ray is None else cluster_slots(args),
        max_queued_jobs=args.max_queued,
        reader_write_timeout_s=args.reader_timeout,
        header_timeout_s=args.header_timeout,
        push_queue_blocks=args.push_queue_blocks,
        push_idle_timeout_s=args.push_idle_timeout,
        body_timeout_s=args.body_timeout,
        min_body_rate=args.min_body_rate,
        body_rate_grace_s=args.body_rate_grace,
        max_pending=args.max_pending,
        max_pending_per_client=args.max_pending_per_client,
        push_first_block_timeout_s=args.push_first_block_timeout,
        retention_s=args.retention,
        retention_memory_bytes=args.retention_memory_mb * MIB,
        spill_threshold_bytes=args.spill_threshold_mb * MIB,
        spill_dir=args.spill_dir,
        store_dir=store_dir(args.store),
        store_max_bytes=int(args.store_max_gb * 1024**3),
        shutdown_grace_s=args.shutdown_grace,
        security=security,
        webhooks=_webhooks(args),
        previews=previews,
        preview_device=args.preview_device,
        faces=standard_faces(
            webrtc=WebRtcSettings(
                ice_servers=tuple(args.ice_server or ()),
                host_addresses=host_addresses_for(args.host),
                max_viewers=args.max_webrtc_viewers,
            )
        ),
    )


async def _serve(
    args: argparse.Namespace,
    config: ServerConfig,
    models: list[str],
    weights: dict[str, str],
    previews: tuple[tuple[str, str], ...],
    replicas: Any,
) -> None:
    """Load the models (in threads: the loop already handles signals), then serve
    until SIGTERM or SIGINT."""
    from vaecast.server.app import (
        ACCESS_LOG_FORMAT,
        create_app,
        runner_settings,
        serve_until_signalled,
    )
    from vaecast.server.faces.face import MANAGER
    from vaecast.server.stream.manager import JobManager

    decoders = {
        name: await asyncio.to_thread(load_decoder, name, args.device, weights.get(name))
        for name in models
    }
    preview_decoders = None
    if args.preview_device is not None:  # a copy of each --preview decoder there
        preview_decoders = {
            name: await asyncio.to_thread(
                load_decoder, name, args.preview_device, weights.get(name)
            )
            for name in sorted({decoder for _, decoder in previews})
        }
    manager = JobManager(
        config,
        decoders,
        runners=None if replicas is None else cluster_runners(replicas),
        preview_decoders=preview_decoders,
    )
    manager.previews.check_defaults()  # before the port opens: one line, exit 2
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


def preview_pairs(specs: list[str], models: list[str]) -> tuple[tuple[str, str], ...]:
    """Each `--preview MODEL=DECODER`, of a served model, once per model."""
    pairs: dict[str, str] = {}
    for spec in specs:
        model, equals, decoder = spec.partition("=")
        if not equals or not model or not decoder:
            raise InvalidRequestError(f"--preview {spec!r}: give MODEL=DECODER, e.g. wan2.1=taehv")
        if model not in models:
            raise InvalidRequestError(
                f"--preview {spec!r}: model {model!r} is not served (--model {', '.join(models)})"
            )
        if model in pairs:
            raise InvalidRequestError(f"--preview: model {model!r} is given twice")
        pairs[model] = decoder
    return tuple(pairs.items())


def cluster_runners(replicas: Any) -> Any:
    """Jobs that run in the Ray cluster, mirrored here (imports Ray only then)."""
    from vaecast.cluster.runners import ClusterRunners

    return ClusterRunners(replicas)


def store_dir(option: str | None) -> str | None:
    """`--store`: a folder, 'none' (memory only), or by default the user's data directory."""
    if option is None:
        from vaecast.store import default_store_dir

        return str(default_store_dir())
    return None if option.lower() == "none" else option


def cluster_slots(args: argparse.Namespace) -> int:
    """Ray mode: the jobs the replicas decode at once, for this front end's admission."""
    return max(args.replicas, args.max_replicas or 0) * args.max_ongoing


def start_replicas(
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


def run_loop(main_coroutine: object) -> None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency, absent only on Windows
        asyncio.run(main_coroutine)  # type: ignore[arg-type]
    else:
        uvloop.run(main_coroutine)  # type: ignore[arg-type]
