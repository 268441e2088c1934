"""Reading user-supplied weight files, and loading them into a module with errors a user can act on.

Two formats are read: safetensors, and PyTorch checkpoints (`.pth`, `.pt`, `.bin`,
`.ckpt`) through `torch.load(weights_only=True)` only. A checkpoint that needs
arbitrary pickled code to load is refused, never unpickled: a weights file is data,
and `torch.load` without `weights_only` runs whatever the file says.

The format is told by the file's structure (`vaecast.safetensors_header`, the rule
latent uploads are sniffed by), not its name, so a safetensors file renamed to `.pth`
(or the reverse) still loads. The diffusers-based decoders load from a local
diffusers folder through `load_diffusers_folder`, never from the hub.
"""

from __future__ import annotations

import importlib
import pickle
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

from vaecast.errors import UnsupportedMediaError, WeightsError
from vaecast.safetensors_header import read_file_header

# Keys listed in one error message; the rest are counted.
MAX_KEYS_LISTED = 8
# Wrappers that training scripts put around a state dict in a checkpoint.
WRAPPER_KEYS = ("state_dict", "model", "module")
ZIP_MAGIC = b"PK\x03\x04"
# A diffusers model folder keeps its VAE here; a VAE folder has config.json itself.
VAE_SUBFOLDER = "vae"


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file or a weights-only PyTorch checkpoint, on the CPU."""
    path = Path(path)
    if not path.is_file():
        raise WeightsError(f"weights file {str(path)!r} does not exist (or is not a file)")
    try:
        is_safetensors = read_file_header(path) is not None
    except UnsupportedMediaError as error:  # a header too costly to parse
        raise WeightsError(f"{path}: {error.message}") from None
    if is_safetensors:
        try:
            return load_file(str(path))
        except Exception as error:  # safetensors raises its own error types
            raise WeightsError(f"{path}: not a readable safetensors file: {error}") from None
    with path.open("rb") as file:
        is_zip = file.read(len(ZIP_MAGIC)) == ZIP_MAGIC
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        # torch's weights-only unpickler refuses any global outside its allow-list and
        # says which; any other unpickling error means the bytes are not a checkpoint.
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        refusal = next((line for line in lines if "global" in line.lower()), None)
        if refusal is not None:
            raise WeightsError(
                f"{path}: refused: this checkpoint is not weights-only loadable (it needs "
                f"pickled code to load, which vaecast never runs; {refusal.rstrip('.')}). "
                f"Re-save its state dict with safetensors.torch.save_file"
            ) from None
        detail = lines[-2] if len(lines) >= 2 else str(error)
        raise WeightsError(
            f"{path}: not a safetensors file or a readable PyTorch checkpoint ({detail})"
        ) from None
    # torch.load reads a file that looks like safetensors with safetensors, whose
    # errors are their own type.
    except (RuntimeError, EOFError, OSError, ValueError, SafetensorError) as error:
        kind = "zip checkpoint" if is_zip else "file"
        raise WeightsError(
            f"{path}: not a safetensors file or a readable PyTorch {kind}: {error}"
        ) from None
    return _tensors_of(loaded, path)


def _tensors_of(loaded: object, path: Path) -> dict[str, torch.Tensor]:
    if isinstance(loaded, Mapping):
        for key in WRAPPER_KEYS:
            inner = loaded.get(key)
            if isinstance(inner, Mapping) and inner:
                loaded = inner
                break
    if not isinstance(loaded, Mapping):
        raise WeightsError(
            f"{path}: a checkpoint must hold a state dict (names to tensors), "
            f"got {type(loaded).__name__}"
        )
    state: dict[str, torch.Tensor] = {}
    for key, value in loaded.items():
        if not isinstance(key, str) or not isinstance(value, torch.Tensor):
            raise WeightsError(
                f"{path}: entry {key!r} is a {type(value).__name__}, not a tensor; "
                f"a weights file holds tensors only"
            )
        state[key] = value
    return state


def _listed(keys: Iterable[str]) -> str:
    keys = sorted(keys)
    shown = ", ".join(keys[:MAX_KEYS_LISTED])
    more = len(keys) - MAX_KEYS_LISTED
    return f"{shown} (and {more} more)" if more > 0 else shown


def load_strict(
    module: nn.Module,
    state: Mapping[str, torch.Tensor],
    source: str,
    ignore_prefixes: tuple[str, ...] = (),
) -> None:
    """Load `state` into `module`: every key present, none extra, every shape equal.

    Keys under `ignore_prefixes` are parts of a published file the module does not
    need (a decoder ignoring its encoder). Floating tensors are cast to the module's
    dtype (files ship fp16). Raises `WeightsError` naming each offending key.
    """
    expected = module.state_dict()
    given = {k: v for k, v in state.items() if not k.startswith(ignore_prefixes)}
    missing = expected.keys() - given.keys()
    unexpected = given.keys() - expected.keys()
    mismatched = [
        f"{key}: file {tuple(given[key].shape)}, model {tuple(expected[key].shape)}"
        for key in sorted(expected.keys() & given.keys())
        if given[key].shape != expected[key].shape
    ]
    problems = []
    if missing:
        problems.append(f"missing keys: {_listed(missing)}")
    if unexpected:
        problems.append(f"unexpected keys: {_listed(unexpected)}")
    if mismatched:
        problems.append(f"shape mismatches: {_listed(mismatched)}")
    if problems:
        raise WeightsError(f"{source} does not fit this model: " + "; ".join(problems))
    cast = {
        key: value.to(expected[key].dtype) if value.is_floating_point() else value
        for key, value in given.items()
    }
    module.load_state_dict(cast, strict=True)


def diffusers_class(model: str, class_name: str, requirement: str) -> Any:
    """A diffusers model class, imported on first use: only the decoders built on
    diffusers need it installed, never `import vaecast`."""
    try:
        diffusers = importlib.import_module("diffusers")
    except ImportError:
        raise WeightsError(
            f"the {model} decoder needs {requirement}: pip install 'vaecast[real]'"
        ) from None
    found = getattr(diffusers, class_name, None)
    if found is None:
        raise WeightsError(
            f"diffusers {diffusers.__version__} has no {class_name}; the {model} decoder "
            f"needs {requirement}"
        )
    return found


def load_diffusers_folder(autoencoder_class: Any, path: Path) -> Any:
    """`autoencoder_class` from a local diffusers folder: a model's (with `vae/` inside)
    or the VAE's own, in float32. Never the hub."""
    subfolder = VAE_SUBFOLDER if (path / VAE_SUBFOLDER / "config.json").is_file() else None
    if subfolder is None and not (path / "config.json").is_file():
        raise WeightsError(f"{path} has neither config.json nor {VAE_SUBFOLDER}/config.json")
    return autoencoder_class.from_pretrained(
        path, subfolder=subfolder, local_files_only=True, torch_dtype=torch.float32
    )
