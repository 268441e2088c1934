"""What vaecast needs of one diffusers video VAE, as data: a family's spec.

Each diffusers family vaecast streams (wan2.1, hunyuan-video, hunyuan-video-1.5,
ltx-video and ltx-2, mochi, cogvideox, minimax-h3) is driven through internals that
are not diffusers' public API, on the diffusers versions they were checked in. A
`DiffusersFamily` names the model class, those versions, and the internals (the
attributes, config keys and method signatures the decoder reads), and does what every
family does the same way: check that a VAE still has them (`check`, at load, so an
upgrade that renames one fails loudly instead of decoding wrongly) and load the VAE
from a local diffusers folder (`load`, never the hub). What the family's decode step
does (its latent layout, its chunking, its windows or tiles) is its own module's.
"""

from __future__ import annotations

import importlib.util
import inspect
import threading
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vaecast.errors import WeightsError
from vaecast.models.weights_io import diffusers_class, load_diffusers_folder

# One lock per VAE module, shared by every decoder wrapping it (`vae_lock`).
_LOCKS: weakref.WeakKeyDictionary[Any, threading.Lock] = weakref.WeakKeyDictionary()
_LOCKS_GUARD = threading.Lock()


@dataclass(frozen=True)
class DiffusersFamily:
    """One family's model class and the diffusers internals its decoder relies on."""

    model: str  # vaecast's name for it ("hunyuan-video")
    class_name: str  # diffusers' ("AutoencoderKLHunyuanVideo")
    requirement: str  # the diffusers versions checked ("diffusers>=0.42,<0.43")
    attributes: tuple[str, ...] = ()
    config_keys: tuple[str, ...] = ()
    # (Dotted) methods of the VAE and the parameters each must take, in order.
    signatures: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # Packages the load needs beyond diffusers, and why, for the error that says so.
    needs: Mapping[str, str] = field(default_factory=dict)
    # What a folder of its weights is of, as an error asking for one says it.
    weights_of: str = "the model"

    def missing(self, vae: Any, more: Callable[[Any], list[str]] | None = None) -> list[str]:
        """What of the internals `vae` lacks, as the error names them: its attributes,
        then each method whose owner it has but whose parameters differ (or that is
        gone), then what `more(vae)` finds (a family's own checks, which must cope
        with what is missing), then its config keys."""
        absent = [name for name in self.attributes if not hasattr(vae, name)]
        for name, parameters in self.signatures.items():
            *path, method_name = name.split(".")
            owner: Any = vae
            for part in path:
                owner = getattr(owner, part, None)
            if owner is None or name in absent:
                continue
            method = getattr(owner, method_name, None)
            if method is None or list(inspect.signature(method).parameters) != list(parameters):
                absent.append(f"{name}({', '.join(parameters)})")
        if more is not None:
            absent += more(vae)
        absent += [f"config.{key}" for key in self.config_keys if key not in vae.config]
        return absent

    def check(self, vae: Any, more: Callable[[Any], list[str]] | None = None) -> None:
        """Raise `WeightsError` naming all that `vae` lacks of what the decoder drives
        (`missing`)."""
        absent = self.missing(vae, more)
        if absent:
            import diffusers

            raise WeightsError(
                f"diffusers {diffusers.__version__}'s {self.class_name} no longer has "
                f"{', '.join(absent)}, which vaecast's {self.model} decoder relies on; "
                f"install {self.requirement}"
            )

    def load(self, weights: str | Path | None) -> Any:
        """The VAE from a local diffusers folder (the model's, or its `vae/`); None (no
        `--weights`) is refused, naming what the folder should hold."""
        if weights is None:
            raise WeightsError(
                f"the {self.model} decoder needs --weights: a local diffusers folder of "
                f"{self.weights_of} (or its vae/ subfolder)"
            )
        autoencoder_class = diffusers_class(self.model, self.class_name, self.requirement)
        for package, why in self.needs.items():
            if importlib.util.find_spec(package) is None:
                raise WeightsError(
                    f"the {self.model} decoder needs {package} ({why}): pip install 'vaecast[real]'"
                )
        path = Path(weights)
        if not path.is_dir():
            raise WeightsError(
                f"{self.model} weights must be a local diffusers folder (with config.json, "
                f"or a vae/ subfolder holding one); {str(path)!r} is not a folder"
            )
        return load_diffusers_folder(autoencoder_class, path)


def vae_lock(vae: Any) -> threading.Lock:
    """The lock of a VAE module whose decode keeps state on it (a feature cache, say):
    one per module, shared by every decoder that wraps it."""
    with _LOCKS_GUARD:
        lock = _LOCKS.get(vae)
        if lock is None:
            lock = _LOCKS[vae] = threading.Lock()
        return lock
