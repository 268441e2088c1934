"""One diffusers video VAE family as data (`DiffusersFamily`), and the one decoder that
any family's spec drives (`DiffusersDecoder`).

Each diffusers family vaecast streams (wan2.1 and wan2.2, hunyuan-video,
hunyuan-video-1.5, ltx-video and ltx-2, mochi, cogvideox, minimax-h3) is driven through
internals that are not diffusers' public API, on the diffusers versions they were
checked in. A family's spec says everything that differs between families:
- the model class, those versions, and the internals (attributes, config keys, method
  signatures, and the family's own structural checks) the decode reads; they are
  checked at load, so an upgrade that renames one fails loudly instead of decoding
  wrongly;
- how its weights load (a local diffusers folder, never the hub);
- its pipeline's decode step (`decode_step`: pipeline-space latents to what the VAE
  takes, the denormalization written as the pipeline writes it);
- the layout its pipeline returns latents in (`layout`, where that is not BCTHW);
- its chunking (`chunking`): one of the four schemes, each in its own module, built
  from the VAE: `CausalChunking` (a causal decode with carried caches, latent frame by
  latent frame: Wan, HunyuanVideo 1.5), `BatchChunking` (the VAE's own frame batches
  through its conv cache: Mochi, CogVideoX), `TileChunking` (the VAE's causal temporal
  tiles: HunyuanVideo, LTX), `WindowChunking` (bidirectional windows: MiniMax-H3).

`DiffusersDecoder` composes them: it checks the VAE, puts it on its device, builds the
decode step and the chunking, and answers the chunk contract through the chunking.
A family's named decoder (`WanDecoder`, ...) is `DiffusersDecoder` with its spec.
"""

from __future__ import annotations

import importlib.util
import inspect
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol, Self

import torch

from vaecast.errors import WeightsError
from vaecast.models.base import DecodePlan, StreamPlan
from vaecast.models.layouts import LatentLayout
from vaecast.models.sound import SoundDecoder
from vaecast.models.streaming import LatentStream, Prepare, StreamingDecoder
from vaecast.models.weights_io import diffusers_class, load_diffusers_folder

# One lock per VAE module, shared by every decoder wrapping it (`vae_lock`).
_LOCKS: weakref.WeakKeyDictionary[Any, threading.Lock] = weakref.WeakKeyDictionary()
_LOCKS_GUARD = threading.Lock()


class Chunking(Protocol):
    """How one family's decode of one VAE is cut into chunks: the contract's plans,
    and the state of each decode."""

    latent_channels: int

    def plan(self, latent_shape: Sequence[int]) -> DecodePlan: ...

    def plan_stream(self, first_block_shape: Sequence[int]) -> StreamPlan: ...

    def open_stream(
        self, first_block_shape: tuple[int, ...], latent_frames: int | None
    ) -> LatentStream: ...


@dataclass(frozen=True)
class DiffusersFamily:
    """One family: its model class, the diffusers internals its decode relies on, its
    pipeline's decode step, its latent layout and its chunking."""

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
    # The family's own structural checks: what of it a VAE lacks, as the error names it.
    more_checks: Callable[[Any], list[str]] | None = None
    # (vae, device) -> the pipeline's decode step for that VAE.
    decode_step: Callable[[Any, torch.device], Prepare] | None = None
    # (vae, device, decode step, **the decoder's options) -> its chunking for that VAE.
    chunking: Callable[..., Chunking] | None = None
    # (vae) -> the layout its pipeline returns latents in; None: BCTHW.
    layout: Callable[[Any], LatentLayout] | None = None
    value_range: tuple[float, float] = (-1.0, 1.0)
    # Whether the parameters keep `requires_grad` as loaded, as the pipeline decodes
    # them (it can change which kernel a layer takes; inference mode records nothing).
    keeps_grad: bool = False
    # (weights, **load options) -> the VAE, where more than a diffusers folder loads;
    # `load_options` are the decoder options it takes.
    loader: Callable[..., Any] | None = None
    load_options: tuple[str, ...] = ()
    # (weights, device) -> the sound decoder the same weights hold (LTX-2's audio VAE
    # and vocoder, beside its VAE in the pipeline's folder), or None.
    sound: Callable[[str | Path, torch.device], SoundDecoder | None] | None = None

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

    def check(self, vae: Any) -> None:
        """Raise `WeightsError` naming all that `vae` lacks of what the decoder drives
        (`missing`, with the family's own checks)."""
        absent = self.missing(vae, self.more_checks)
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


class DiffusersDecoder(StreamingDecoder):
    """A diffusers family's decoder: its spec (`family`), composed.

    Built from a VAE loaded any way (`Decoder(vae, device, **options)`) or from a local
    diffusers folder (`Decoder.from_weights(weights, device, **options)`); the options
    are the family's chunking's (and its loader's).
    """

    family: ClassVar[DiffusersFamily]
    # Decodes the audio latents the pipeline makes beside the video's, where it has them.
    sound: SoundDecoder | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        family = cls.__dict__.get("family")
        if family is not None:
            cls.name = family.model
            cls.value_range = family.value_range

    def __init__(
        self,
        vae: Any,
        device: str | torch.device = "cpu",
        sound: SoundDecoder | None = None,
        **options: Any,
    ) -> None:
        family = self.family
        self.sound = sound
        assert family.decode_step is not None and family.chunking is not None
        family.check(vae)
        self.device = torch.device(device)
        self.vae = vae.to(self.device).eval()
        if not family.keeps_grad:
            self.vae.requires_grad_(False)
        prepare = family.decode_step(self.vae, self.device)
        self.chunking = family.chunking(self.vae, self.device, prepare, **options)
        self.latent_channels = self.chunking.latent_channels
        if family.layout is not None:
            self.latent_layout = family.layout(self.vae)

    @classmethod
    def check_internals(cls, vae: Any) -> None:
        """Raise `WeightsError` if `vae` lacks the diffusers internals this decoder drives."""
        cls.family.check(vae)

    @classmethod
    def load_vae(cls, weights: str | Path | None, **load_options: Any) -> Any:
        """The VAE from a local diffusers folder (the model's or its `vae/`), or what
        else the family's loader reads."""
        family = cls.family
        if family.loader is not None:
            return family.loader(weights, **load_options)
        return family.load(weights)

    @classmethod
    def from_weights(
        cls, weights: str | Path | None, device: str | torch.device = "cpu", **options: Any
    ) -> Self:
        """Load the VAE with `load_vae` and build the decoder on it, with the sound
        decoder the same folder holds (where the family has one)."""
        family = cls.family
        load_options = {key: options.pop(key) for key in family.load_options if key in options}
        vae = cls.load_vae(weights, **load_options)
        sound = None
        if family.sound is not None and weights is not None:
            sound = family.sound(weights, torch.device(device))
        return cls(vae, device, sound, **options)

    def plan(self, latent_shape: Sequence[int]) -> DecodePlan:
        return self.chunking.plan(latent_shape)

    def plan_stream(self, first_block_shape: Sequence[int]) -> StreamPlan:
        return self.chunking.plan_stream(first_block_shape)

    def open_stream(
        self, first_block_shape: tuple[int, ...], latent_frames: int | None = None
    ) -> LatentStream:
        return self.chunking.open_stream(first_block_shape, latent_frames)


def vae_lock(vae: Any) -> threading.Lock:
    """The lock of a VAE module whose decode keeps state on it (a feature cache, say):
    one per module, shared by every decoder that wraps it."""
    with _LOCKS_GUARD:
        lock = _LOCKS.get(vae)
        if lock is None:
            lock = _LOCKS[vae] = threading.Lock()
        return lock
