"""Which decoder a model name builds: the built-in table, plugins, and diffusers folders.

A model name is one of:
- a built-in name (`BUILTIN_DECODERS`), imported on first use, so that naming a
  model never imports every architecture (nor diffusers);
- `diffusers`: the decoder for a local diffusers VAE folder, picked from its
  `config.json` (`_class_name`, and for Wan its latent channels);
- a plugin, `package.module:factory`, or a name an installed package registers in the
  `vaecast.decoders` entry-point group (`vaecast.models.plugins` says what a factory
  may return);
- a name registered at run time with `register_decoder` (tests, embedding code).
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Mapping
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import torch

from vaecast.errors import UnknownModelError, WeightsError
from vaecast.models.base import ChunkedDecoder

# Built-in model names and the class that decodes each, as "module:Class".
BUILTIN_DECODERS: dict[str, str] = {
    "tiny": "vaecast.models.tiny:TinyDecoder",
    "linear": "vaecast.models.linear:LinearDecoder",
    "taehv": "vaecast.models.taehv:TAEHVDecoder",
    "wan2.1": "vaecast.models.wan:WanDecoder",
    "wan2.2": "vaecast.models.wan:Wan22Decoder",
    "minimax-h3": "vaecast.models.minimax:MiniMaxH3Decoder",
    "hunyuan-video": "vaecast.models.hunyuan:HunyuanVideoDecoder",
    "hunyuan-video-1.5": "vaecast.models.hunyuan15:HunyuanVideo15Decoder",
    "ltx-video": "vaecast.models.ltx:LTXVideoDecoder",
    "ltx-2": "vaecast.models.ltx:LTX2VideoDecoder",
    "cogvideox": "vaecast.models.cogvideox:CogVideoXDecoder",
    "mochi": "vaecast.models.mochi:MochiDecoder",
}
# The model that `--model diffusers` picks for a VAE folder, by its config's `_class_name`.
DIFFUSERS_MODEL = "diffusers"
DIFFUSERS_CLASSES: dict[str, str] = {
    "AutoencoderKLWan": "wan2.1",  # or wan2.2, by its latent channels: `_diffusers_model`
    "AutoencoderKLMiniMaxH3": "minimax-h3",
    "AutoencoderKLHunyuanVideo": "hunyuan-video",
    "AutoencoderKLHunyuanVideo15": "hunyuan-video-1.5",
    "AutoencoderKLLTXVideo": "ltx-video",
    "AutoencoderKLLTX2Video": "ltx-2",
    "AutoencoderKLCogVideoX": "cogvideox",
    "AutoencoderKLMochi": "mochi",
}
# Wan 2.2's TI2V-5B VAE: 48 latent channels (Wan 2.1's has 16).
WAN22_LATENT_CHANNELS = 48
PLUGIN_GROUP = "vaecast.decoders"
PLUGIN_SEPARATOR = ":"

_REGISTERED: dict[str, type[ChunkedDecoder] | Callable[..., Any]] = {}


def register_decoder(name: str, factory: type[ChunkedDecoder] | Callable[..., Any]) -> None:
    """Make `get_decoder(name, ...)` build through `factory` (a decoder class, or a
    plugin factory)."""
    _REGISTERED[name] = factory


def available_decoders() -> list[str]:
    """Every model name a server may be started with (plugins by entry point too)."""
    names = set(BUILTIN_DECODERS) | set(_REGISTERED) | {DIFFUSERS_MODEL}
    names |= {point.name for point in entry_points(group=PLUGIN_GROUP)}
    return sorted(names)


def decoder_class(name: str) -> type[ChunkedDecoder] | Callable[..., Any]:
    """What builds model `name`; `UnknownModelError` names the known ones."""
    if name in _REGISTERED:
        return _REGISTERED[name]
    target = BUILTIN_DECODERS.get(name)
    if target is None:
        if PLUGIN_SEPARATOR in name:
            target = name
        else:
            points = entry_points(group=PLUGIN_GROUP, name=name)
            if not points:
                known = ", ".join(available_decoders())
                raise UnknownModelError(
                    f"unknown model {name!r}; this server knows: {known}, or a plugin "
                    f"as package.module:factory"
                ) from None
            target = next(iter(points)).value
    return _import_target(target, name)


def takes_weights(name: str) -> bool:
    """Whether model `name` reads a weights file (its class has `from_weights`, or it is
    a plugin, whose factory gets the path it is given)."""
    if name == DIFFUSERS_MODEL:
        return True
    found = decoder_class(name)
    return callable(getattr(found, "from_weights", None)) or not isinstance(found, type)


def get_decoder(
    name: str,
    device: str | torch.device = "cpu",
    weights: str | Path | None = None,
    **options: Any,
) -> ChunkedDecoder:
    """Build model `name`'s decoder.

    A built-in class with `from_weights` is built through
    `from_weights(weights, device=..., **options)` (one that needs a file raises
    `WeightsError` for None), any other class as `cls(device=..., **options)`, and a
    plugin factory as `factory(device=..., weights=..., **options)`, its result made a
    `ChunkedDecoder` by `vaecast.models.plugins.adapt`.
    """
    if name == DIFFUSERS_MODEL:
        if weights is None:
            raise WeightsError(
                "--model diffusers needs --weights: a local diffusers folder of a video "
                "VAE (or of a pipeline, with a vae/ subfolder)"
            )
        name = diffusers_model(Path(weights))
    found = decoder_class(name)
    if not isinstance(found, type):
        from vaecast.models.plugins import build_plugin

        return build_plugin(name, found, device=device, weights=weights, **options)
    load: Callable[..., ChunkedDecoder] | None = getattr(found, "from_weights", None)
    if load is not None:
        return load(weights, device=device, **options)
    if weights is not None:
        raise WeightsError(f"model {name!r} takes no weights file")
    return found(device=device, **options)  # type: ignore[call-arg]


def diffusers_model(folder: Path) -> str:
    """The built-in model that decodes the VAE in a local diffusers folder."""
    config = _read_vae_config(folder)
    class_name = config.get("_class_name")
    model = DIFFUSERS_CLASSES.get(class_name) if isinstance(class_name, str) else None
    if model is None:
        supported = ", ".join(sorted(DIFFUSERS_CLASSES))
        raise WeightsError(
            f"{folder}: its config.json names {class_name!r}, not a video VAE vaecast "
            f"decodes; supported classes: {supported}"
        )
    if class_name == "AutoencoderKLWan" and config.get("z_dim") == WAN22_LATENT_CHANNELS:
        model = "wan2.2"
    return model


def _read_vae_config(folder: Path) -> Mapping[str, Any]:
    for candidate in (folder / "vae" / "config.json", folder / "config.json"):
        if candidate.is_file():
            try:
                config = json.loads(candidate.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, ValueError) as error:
                raise WeightsError(f"{candidate}: not a readable JSON config: {error}") from None
            if not isinstance(config, dict):
                raise WeightsError(f"{candidate}: a config.json holds a JSON object")
            return config
    raise WeightsError(f"{folder} has neither config.json nor vae/config.json")


def _import_target(target: str, name: str) -> Any:
    module_name, _, attribute = target.partition(PLUGIN_SEPARATOR)
    if not module_name or not attribute:
        raise UnknownModelError(
            f"model {name!r}: a plugin is named package.module:factory, got {target!r}"
        )
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # a plugin's module may fail any way while it imports
        raise UnknownModelError(
            f"model {name!r}: cannot import {module_name!r}: {error!r}"
        ) from None
    found: Any = module
    for part in attribute.split("."):
        found = getattr(found, part, None)
        if found is None:
            raise UnknownModelError(f"model {name!r}: {module_name!r} has no {attribute!r}")
    if not callable(found):
        raise UnknownModelError(f"model {name!r}: {target!r} is not callable")
    return found
