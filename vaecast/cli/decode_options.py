"""The options of the commands that decode (`serve`, `decode`), and how they are read.

Both take the same decoder and encoder options (`add_common_options`: device,
weights, fps, x264 settings) and resolve `--model`/`--weights` the same way before
loading a decoder. Here, apart from the parser (`vaecast.cli.parser`) and the
commands (`vaecast.cli.serve`, `vaecast.cli.files`), because both sides use them.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import TYPE_CHECKING

from vaecast.codecs.encoder_settings import MAX_QP, EncoderSettings
from vaecast.errors import InvalidRequestError, UnknownModelError, VaecastError
from vaecast.server.config import ServerConfig

if TYPE_CHECKING:
    from vaecast.models.base import ChunkedDecoder

# The model registry imports torch: it is imported by the functions that load or name
# models, never by the parser (so `--help` and `--version` start at once).

DEFAULT_MODEL = "tiny"
DEFAULTS = ServerConfig()


def add_common_options(parser: argparse.ArgumentParser) -> None:
    encoder = EncoderSettings()
    parser.add_argument(
        "--device",
        default="cpu",
        type=torch_device,
        help="torch device of the decoder: cpu, cuda, cuda:N, mps",
    )
    parser.add_argument(
        "--weights",
        action="append",
        default=[],
        metavar="[MODEL=]PATH",
        help="weights of a model that needs them (taehv: taew2_1.safetensors; the diffusers "
        "models: a local diffusers folder); PATH alone is for the first --model",
    )
    parser.add_argument(
        "--fps", default=None, help=f"frames per second (default: {DEFAULTS.default_fps})"
    )
    parser.add_argument(
        "--preset",
        default=encoder.preset,
        choices=X264_PRESETS,
        metavar="PRESET",
        help=f"x264 preset: {', '.join(X264_PRESETS)}; any but ultrafast is High profile, "
        "which WebRTC viewers get as VP8",
    )
    # One rate control or the other: both given is refused, not one silently ignored.
    rate_control = parser.add_mutually_exclusive_group()
    rate_control.add_argument(
        "--qp",
        type=quantizer,
        default=encoder.qp,
        help=f"x264 constant quantizer, 0-{MAX_QP}",
    )
    rate_control.add_argument(
        "--crf",
        type=quantizer,
        default=None,
        help="x264 constant rate factor instead of --qp (default: none, --qp applies)",
    )
    parser.add_argument(
        "--keyframe-interval",
        type=positive_seconds,
        default=encoder.keyframe_interval_s,
        metavar="SECONDS",
        help="a keyframe at least this often",
    )


# libx264's presets (x264.h, x264_preset_names): any other name fails every encoder open.
X264_PRESETS = (
    "ultrafast",
    "superfast",
    "veryfast",
    "faster",
    "fast",
    "medium",
    "slow",
    "slower",
    "veryslow",
    "placebo",
)


def torch_device(text: str) -> str:
    """--device: a torch device this machine has, as an argparse type."""
    import torch

    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise argparse.ArgumentTypeError(f"not a torch device: {text[:40]!r}") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            build = "a CPU build" if torch.version.cuda is None else f"CUDA {torch.version.cuda}"
            raise argparse.ArgumentTypeError(
                f"{text!r}: CUDA is not available here (torch {torch.__version__}, {build})"
            )
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise argparse.ArgumentTypeError(
                f"{text!r}: this machine has {torch.cuda.device_count()} CUDA device(s)"
            )
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise argparse.ArgumentTypeError(f"{text!r}: MPS is not available here")
    elif device.type not in ("cpu", "cuda", "mps"):
        raise argparse.ArgumentTypeError(f"{text!r}: vaecast decodes on cpu, cuda or mps")
    return text


def encoder_settings(args: argparse.Namespace) -> EncoderSettings:
    return EncoderSettings(
        preset=args.preset, crf=args.crf, qp=args.qp, keyframe_interval_s=args.keyframe_interval
    )


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text[:40]!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def quantizer(text: str) -> int:
    """--qp and --crf: an integer on x264's 8-bit scale."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text[:40]!r}") from None
    if not 0 <= value <= MAX_QP:
        raise argparse.ArgumentTypeError(f"must be in 0..{MAX_QP}, got {value}")
    return value


def weights_by_model(specs: list[str], models: list[str]) -> dict[str, str]:
    """The path each `--weights [MODEL=]PATH` gives a model in `models`.

    MODEL is a known model's name; anything else before a `=` is part of a path, which
    is for the first model. Raises for weights of a model not in `models` and for a
    model that takes no weights file.
    """
    from vaecast.models.registry import available_decoders, takes_weights

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


def resolve_diffusers(
    models: list[str], weights: dict[str, str]
) -> tuple[list[str], dict[str, str]]:
    """`--model diffusers` named as the model its `--weights` folder holds (its
    config.json's class), so that requests and the page name the real model."""
    from vaecast.models.registry import DIFFUSERS_MODEL, diffusers_model

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


def load_decoder(name: str, device: str, weights: str | None) -> ChunkedDecoder:
    """Model `name`'s decoder; a model that fails to load is one line naming the option
    (an unknown model's says so itself)."""
    from vaecast.models.registry import get_decoder

    try:
        return get_decoder(name, device=device, weights=weights)
    except UnknownModelError:
        raise
    except VaecastError as error:
        raise InvalidRequestError(f"--model {name}: {error.message}") from None
