"""The `vaecast` command line: every command's options, as one argparse parser.

Each command's parser sets `run`, the function that carries it out (`vaecast.cli.serve`,
`vaecast.cli.files`); `vaecast.cli.main` parses and calls it. The options `serve`
and `decode` share are `vaecast.cli.decode_options`'.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import os
from collections.abc import Callable
from pathlib import Path

from vaecast.cli.checks import defaults_from_environment
from vaecast.cli.decode_options import DEFAULT_MODEL, DEFAULTS, add_common_options, torch_device
from vaecast.cli.help import DefaultsShown, ReasonOnly
from vaecast.cli.option_types import at_least, option_type, port_number
from vaecast.demo.scene_names import SCENE_NAMES
from vaecast.log_format import FORMATS, LEVELS
from vaecast.server.config import MIB
from vaecast.server.edge.outbound import check_url_syntax, check_webhook_secret
from vaecast.server.edge.security_config import (
    API_KEY_ENV,
    check_api_key,
    normalize_host_pattern,
    normalize_origin,
)
from vaecast.server.faces.whep.settings import WebRtcSettings, parse_ice_server
from vaecast.version import VERSION

MAX_DECODE_SLOTS = 256  # each a decode thread and a live encoder


def _runner(target: str) -> Callable[[argparse.Namespace], int]:
    """The runner at `module:function`, imported when its command runs: `--help`,
    `--version` and usage mistakes import no torch (seconds), encoder or server."""
    module_name, name = target.split(":")

    def run(args: argparse.Namespace) -> int:
        return int(getattr(importlib.import_module(module_name), name)(args))

    return run


def build_parser(description: str | None = None) -> argparse.ArgumentParser:
    """The `vaecast` parser; each command's namespace has `run`, its runner."""
    parser = ReasonOnly(prog="vaecast", description=description, formatter_class=DefaultsShown)
    parser.add_argument("--version", action="version", version=f"vaecast {VERSION}")
    parser.add_argument(
        "--debug", action="store_true", help="show the traceback of an error, not one line"
    )
    parser.add_argument("--log-level", choices=LEVELS, default="info", help="what goes to the log")
    parser.add_argument(
        "--log-format",
        choices=FORMATS,
        default="text",
        help="json: one object per line, with job_id on a job's lines",
    )
    commands = parser.add_subparsers(required=True, metavar="COMMAND")
    command = functools.partial(commands.add_parser, formatter_class=DefaultsShown)

    serve = command("serve", help="run the HTTP server")
    serve.set_defaults(run=_runner("vaecast.cli.serve:run_serve"))
    for add_options in (
        _serve_basics,
        _serve_limits,
        _serve_timeouts,
        _serve_admission_and_store,
        _serve_security,
        _serve_webhooks,
        _serve_webrtc,
        _serve_cluster,
    ):
        add_options(serve)
    add_common_options(serve)
    _add_latents(command)
    _add_decode(command)
    _add_push(command)
    defaults_from_environment(serve)
    return parser


def _serve_basics(serve: argparse.ArgumentParser) -> None:
    """`serve`'s logging, address, models and previews."""
    # Also after the command, where a server's options are looked for (SUPPRESS: a value
    # given before the command is not reset by the command's default).
    serve.add_argument(
        "--log-level",
        choices=LEVELS,
        default=argparse.SUPPRESS,
        help="as before the command (default: info)",
    )
    serve.add_argument(
        "--log-format",
        choices=FORMATS,
        default=argparse.SUPPRESS,
        help="log lines as text or json (one object per line, job_id on a job's lines); as "
        "before the command (default: text)",
    )
    serve.add_argument("--host", default="127.0.0.1", help="the address to listen on")
    serve.add_argument("--port", type=port_number, default=8000, help="0 picks a free port")
    serve.add_argument(
        "--model",
        action="append",
        help="model to serve (repeatable; the first is the default; default "
        f"{DEFAULT_MODEL}): a built-in name, 'diffusers' (the model of the --weights "
        "folder's config.json), or a plugin as package.module:factory",
    )
    serve.add_argument(
        "--preview",
        action="append",
        default=[],
        metavar="MODEL=DECODER",
        help="a model's default preview decoder (repeatable), e.g. wan2.1=taehv: its jobs "
        "play DECODER's fast decode at once, then the model's own (a request's "
        '"preview" overrides it, "none" for none). DECODER is a served --model or linear',
    )
    serve.add_argument(
        "--preview-device",
        default=None,
        type=torch_device,
        help="torch device of the --preview decoders (default: the --device, where the "
        "model yields to its preview chunk by chunk)",
    )


def _serve_limits(serve: argparse.ArgumentParser) -> None:
    """`serve`'s limits: what a request and a push session may be."""
    serve.add_argument(
        "--max-upload-mb",
        type=at_least(int, 1),
        default=DEFAULTS.limits.max_upload_bytes // MIB,
        help="largest request body (413 past it)",
    )
    serve.add_argument(
        "--max-frames",
        type=at_least(int, 1),
        default=DEFAULTS.limits.max_frames,
        help="most frames one video may decode to (413 past it, from the declared shape)",
    )
    serve.add_argument(
        "--max-pixels",
        type=at_least(int, 1),
        default=DEFAULTS.limits.max_pixels_per_frame,
        help="largest width x height of a decoded frame",
    )
    serve.add_argument(
        "--decode-slots",
        type=at_least(int, 1, high=MAX_DECODE_SLOTS),
        default=DEFAULTS.decode_slots,
        help=f"videos decoded at once (each a decode thread and an encoder; at most "
        f"{MAX_DECODE_SLOTS})",
    )
    serve.add_argument(
        "--max-queued",
        type=at_least(int, 0),
        default=DEFAULTS.max_queued_jobs,
        help="jobs that may wait for a decode slot before POST answers 429",
    )
    serve.add_argument(
        "--reader-timeout",
        type=at_least(float, 0, above=True),
        default=DEFAULTS.reader_write_timeout_s,
        metavar="SECONDS",
        help="drop a viewer whose socket accepts nothing for this long",
    )
    serve.add_argument(
        "--push-queue-blocks",
        type=at_least(int, 1),
        default=DEFAULTS.push_queue_blocks,
        help="push sessions: latent blocks that may wait for the decoder before a push waits",
    )


def _serve_timeouts(serve: argparse.ArgumentParser) -> None:
    """`serve`'s timeouts: idle push sessions, slow request heads and bodies."""
    serve.add_argument(
        "--push-idle-timeout",
        type=at_least(float, 0, above=True),
        default=DEFAULTS.push_idle_timeout_s,
        metavar="SECONDS",
        help="a push session that receives nothing this long fails",
    )
    serve.add_argument(
        "--header-timeout",
        type=at_least(float, 0, above=True),
        default=DEFAULTS.header_timeout_s,
        metavar="SECONDS",
        help="close a connection whose request head is not complete this long after it "
        "opened or after its previous response (idle keep-alive connections too)",
    )
    serve.add_argument(
        "--body-timeout",
        type=at_least(float, 0, above=True),
        default=DEFAULTS.body_timeout_s,
        metavar="SECONDS",
        help="answer 408 when no part of a request body arrives for this long",
    )
    serve.add_argument(
        "--min-body-rate",
        type=at_least(int, 0),
        default=DEFAULTS.min_body_rate,
        metavar="BYTES_PER_S",
        help="answer 408 when a request body, past its grace, has averaged fewer bytes/s "
        "than this; 0: no minimum",
    )
    serve.add_argument(
        "--body-rate-grace",
        type=at_least(float, 0),
        default=DEFAULTS.body_rate_grace_s,
        metavar="SECONDS",
        help="how long a request body may arrive at any rate before --min-body-rate applies",
    )
    serve.add_argument(
        "--max-pending",
        type=at_least(int, 1),
        default=DEFAULTS.max_pending,
        metavar="N",
        help="requests whose body is still arriving, and push sessions with no block yet, "
        "held at once; past it POST answers 429",
    )


def _serve_admission_and_store(serve: argparse.ArgumentParser) -> None:
    """`serve`'s admission (queues, places per client) and its store."""
    serve.add_argument(
        "--max-pending-per-client",
        type=at_least(int, 1),
        default=DEFAULTS.max_pending_per_client,
        metavar="N",
        help="of those, the most one client (one address) may hold; past it that client's "
        "POST answers 429 and others' still get in",
    )
    serve.add_argument(
        "--push-first-block-timeout",
        type=at_least(float, 0, above=True),
        default=DEFAULTS.push_first_block_timeout_s,
        metavar="SECONDS",
        help="a push session whose first block does not come this long after its start fails",
    )
    serve.add_argument(
        "--retention",
        type=at_least(float, 0),
        default=DEFAULTS.retention_s,
        metavar="SECONDS",
        help="keep finished videos this long",
    )
    serve.add_argument(
        "--retention-memory-mb",
        type=at_least(int, 0),
        default=DEFAULTS.retention_memory_bytes // MIB,
        help="RAM that finished videos may hold; the oldest are evicted past it",
    )
    serve.add_argument(
        "--spill-threshold-mb",
        type=at_least(int, 0),
        default=DEFAULTS.spill_threshold_bytes // MIB,
        help="a video's bytes past this go to a temporary file instead of RAM",
    )
    serve.add_argument("--spill-dir", default=None, help="where spill files go (default: $TMPDIR)")
    serve.add_argument(
        "--store",
        default=None,
        metavar="DIR",
        help="keep job records and finished videos in DIR, so they survive a restart; "
        "'none': memory only (default: $XDG_DATA_HOME/vaecast or ~/.local/share/vaecast, "
        "one per user: servers started on it share its videos; give each its own DIR)",
    )
    serve.add_argument(
        "--store-max-gb",
        type=at_least(float, 0, above=True),
        default=DEFAULTS.store_max_bytes / 1024**3,
        metavar="GB",
        help="disk the store's videos may take; past it the oldest finished videos go "
        "first, then a video that does not fit streams without being kept (its job object "
        "says so in not_stored)",
    )
    serve.add_argument(
        "--shutdown-grace",
        type=at_least(float, 0),
        default=DEFAULTS.shutdown_grace_s,
        metavar="SECONDS",
        help="on SIGTERM/SIGINT, let running jobs finish this long before cancelling them",
    )


def _serve_security(serve: argparse.ArgumentParser) -> None:
    """`serve`'s security: the API key, Host and Origin checks."""
    # Security (vaecast.server.edge.security; README: Security).
    serve.add_argument(
        "--api-key",
        default=os.environ.get(API_KEY_ENV) or None,
        type=option_type(check_api_key),
        metavar="KEY",
        help="require 'Authorization: Bearer KEY' on /v1 (the page, /healthz and /metrics "
        f"stay open); default ${API_KEY_ENV}, which other users cannot read in `ps`",
    )
    serve.add_argument(
        "--require-api-key",
        action="store_true",
        help="refuse to start beyond loopback (--host 0.0.0.0) without an API key; the "
        "container image (deploy/serve.Dockerfile) sets it",
    )
    serve.add_argument(
        "--allowed-host",
        action="append",
        type=option_type(normalize_host_pattern),
        metavar="NAME",
        help="also answer to this Host (repeatable): a name, '*.domain', an IP address or "
        "network, or '*' for any; others get 421 (default: localhost and loopback addresses)",
    )
    serve.add_argument(
        "--cors-origin",
        action="append",
        type=option_type(normalize_origin),
        metavar="ORIGIN",
        help="let pages of this origin (https://app.example.com) call the API (repeatable); "
        "other origins' POST and DELETE get 403 (default: none, same-origin pages only)",
    )


def _serve_webhooks(serve: argparse.ArgumentParser) -> None:
    """`serve`'s webhooks (vaecast.server.faces.webhooks)."""
    serve.add_argument(
        "--webhook-secret",
        type=option_type(check_webhook_secret),
        metavar="SECRET",
        help="sign each job's webhooks with this Standard Webhooks secret (whsec_ and "
        "base64); without one no webhook is sent and a job's webhook_url is refused; "
        "default $VAECAST_WEBHOOK_SECRET, which other users cannot read in `ps`",
    )
    serve.add_argument(
        "--webhook-url",
        type=option_type(check_url_syntax),
        metavar="URL",
        help="where every job's start and end are POSTed unless it names its own "
        "webhook_url (needs --webhook-secret); default none: only a job's own",
    )
    serve.add_argument(
        "--webhook-allow-private",
        action="store_true",
        help="let webhooks go to loopback, private and link-local addresses (refused "
        "otherwise: a client could reach what only the server can)",
    )


def _serve_webrtc(serve: argparse.ArgumentParser) -> None:
    """`serve`'s WHEP viewers: ICE servers and limits."""
    # WHEP viewers (vaecast.server.faces.whep; README: WebRTC).
    serve.add_argument(
        "--ice-server",
        action="append",
        type=option_type(parse_ice_server),
        metavar="URL",
        help="a STUN or TURN server for WebRTC viewers (repeatable): stun:HOST:PORT, "
        "turn:USER:PASSWORD@HOST:PORT; a TURN relay is yours to run (default: none, host "
        "candidates on the --host address only)",
    )
    serve.add_argument(
        "--max-webrtc-viewers",
        type=at_least(int, 0),
        default=WebRtcSettings().max_viewers,
        metavar="N",
        help="WHEP viewers at once; past it a WHEP POST gets 429",
    )


def _serve_cluster(serve: argparse.ArgumentParser) -> None:
    """`serve --ray`: the Ray cluster's options."""
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
        "joined with `ray start`) or ray://HOST:PORT (default: none, decode in this process)",
    )
    cluster.add_argument("--replicas", type=int, default=1, help="decoder replicas")
    cluster.add_argument(
        "--max-replicas",
        type=int,
        default=None,
        help="autoscale between --replicas and this many replicas (default: none, "
        "--replicas and no autoscaling)",
    )
    cluster.add_argument("--replica-gpus", type=float, default=0.0, help="GPUs per replica")
    cluster.add_argument("--replica-cpus", type=float, default=1.0, help="CPUs per replica")
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
        help="jobs one replica decodes at once: Serve's max_ongoing_requests",
    )


def _add_latents(command: Callable[..., argparse.ArgumentParser]) -> None:
    """`vaecast latents`: make a latent file."""
    latents = command(
        "latents", help="make a latent file: a demo scene or a video, encoded with tiny"
    )
    latents.set_defaults(run=_runner("vaecast.cli.files:run_latents"))
    source = latents.add_mutually_exclusive_group(required=True)
    source.add_argument("--scene", help="a demo scene: " + ", ".join(SCENE_NAMES))
    source.add_argument("--video", type=Path, help="a video file to encode (read with PyAV)")
    latents.add_argument(
        "-o", "--output", type=Path, required=True, help="the .safetensors file to write"
    )
    latents.add_argument("--frames", type=int, default=81, help="1 + 4k (scene only)")
    latents.add_argument("--width", type=int, default=832, help="multiple of 8 (scene only)")
    latents.add_argument("--height", type=int, default=480, help="multiple of 8 (scene only)")
    latents.add_argument("--seed", type=int, default=0, help="scene only")
    latents.add_argument("--fps", default="16", help="stored in the file's metadata")
    latents.add_argument(
        "--no-sound", action="store_true", help="leave out the scene's or the video's sound"
    )
    latents.add_argument(
        "--max-frames",
        type=int,
        default=None,
        help="video only: read at most this many (default: all)",
    )
    latents.add_argument(
        "--device",
        default="cpu",
        type=torch_device,
        help="torch device that tiny's encoder runs on",
    )


def _add_decode(command: Callable[..., argparse.ArgumentParser]) -> None:
    """`vaecast decode`: a latent file to an MP4 file."""
    decode = command("decode", help="decode a latent file to an MP4 file")
    decode.set_defaults(run=_runner("vaecast.cli.files:run_decode"))
    decode.add_argument("latents", type=Path, help=".safetensors (tensor 'latents') or .npy")
    decode.add_argument("-o", "--output", type=Path, required=True, help="the MP4 file to write")
    decode.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help="the decoder: a built-in name, 'diffusers' (the model of the --weights "
        "folder's config.json), or a plugin as package.module:factory",
    )
    add_common_options(decode)


def _add_push(command: Callable[..., argparse.ArgumentParser]) -> None:
    """`vaecast push`: a latent file pushed to a server, block by block."""
    push = command(
        "push", help="push a latent file to a server block by block, as a generator would"
    )
    push.set_defaults(run=_runner("vaecast.cli.files:run_push"))
    push.add_argument("latents", type=Path, help=".safetensors (tensor 'latents', 'audio') or .npy")
    push.add_argument("--url", default="http://127.0.0.1:8000", help="the server's base URL")
    push.add_argument(
        "--latent-fps",
        type=float,
        default=4.0,
        help="latent frames the simulated generator makes per second (0: no wait)",
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
