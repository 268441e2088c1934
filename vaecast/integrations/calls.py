"""What a diffusers pipeline is and what one call of it asks: the vaecast model for its
VAE, the call's arguments with the signature's defaults filled in, and the checks that
refuse a pipeline before it runs rather than fail deep inside it."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from vaecast.client import Fps
from vaecast.errors import VaecastError
from vaecast.models.registry import DIFFUSERS_CLASSES, WAN22_LATENT_CHANNELS

# The pipeline source that the replicated parts (the diffusion-forcing schedule,
# FramePack's decode step) follow.
DIFFUSERS_REQUIREMENT = "diffusers>=0.42,<0.43"
# The frame rates the released models make, for a pipeline call that names none.
DEFAULT_FPS: dict[str, Fps] = {
    "wan2.1": 16,
    "wan2.2": 24,
    "hunyuan-video": 24,
    "hunyuan-video-1.5": 24,
    "ltx-video": 25,
    "ltx-2": 24,
    "cogvideox": 8,
    "mochi": 30,
}
COGVIDEOX_15_FPS = 16  # CogVideoX 1.5 (temporal patches of 2) makes 16 fps
GEOMETRY_ARGUMENTS = ("num_frames", "height", "width")
VAECAST_ARGUMENTS = ("output_type", "return_dict")

Job = dict[str, Any]


class PipelineError(VaecastError):
    """This pipeline, or this call of it, cannot be streamed as asked."""

    status = 422
    type = "unsupported_pipeline"


def model_for(pipe: Any) -> str:
    """The vaecast model that decodes `pipe`'s VAE (by its class, as `--model
    diffusers` picks one for a saved folder)."""
    vae = getattr(pipe, "vae", None)
    for cls in type(vae).__mro__:
        model = DIFFUSERS_CLASSES.get(cls.__name__)
        if model is None:
            continue
        if cls.__name__ == "AutoencoderKLWan" and vae.config.z_dim == WAN22_LATENT_CHANNELS:
            return "wan2.2"
        return model
    supported = ", ".join(sorted(DIFFUSERS_CLASSES))
    raise PipelineError(
        f"{type(pipe).__name__}'s VAE is {type(vae).__name__}, which vaecast does not "
        f"decode; supported VAE classes: {supported}"
    )


def class_names(pipe: Any) -> set[str]:
    return {cls.__name__ for cls in type(pipe).__mro__}


def require_pipeline(pipe: Any, class_name: str, use: str) -> None:
    if class_name not in class_names(pipe):
        raise PipelineError(f"{use} streams a {class_name}, not a {type(pipe).__name__}")


def _signature(pipe: Any) -> inspect.Signature:
    """The pipeline's call signature; a `PipelineError` for what is not a diffusers
    pipeline, or one that cannot return latents."""
    try:
        signature = inspect.signature(pipe.__call__) if callable(pipe) else None
    except (TypeError, ValueError):
        signature = None
    if signature is None or "output_type" not in signature.parameters:
        raise PipelineError(
            f"not a diffusers pipeline that returns latents: {type(pipe).__name__} has no "
            f"__call__ that takes output_type"
        )
    return signature


@dataclass(frozen=True)
class PipelineCall:
    """A pipeline call's arguments, the defaults of its signature filled in."""

    pipe: Any
    arguments: Mapping[str, Any]

    @classmethod
    def of(cls, pipe: Any, kwargs: Mapping[str, Any]) -> PipelineCall:
        signature = _signature(pipe)
        for name in VAECAST_ARGUMENTS:
            if name in kwargs:
                raise PipelineError(
                    f"{name} is vaecast's to set: the pipeline runs with output_type='latent' "
                    f"and its latents are decoded by the server"
                )
        try:
            bound = signature.bind_partial(**kwargs)
        except TypeError as error:
            raise PipelineError(f"{type(pipe).__name__}: {error}") from None
        bound.apply_defaults()
        return cls(pipe, dict(bound.arguments))

    def geometry(self, model: str) -> dict[str, str]:
        """The call's num_frames, height and width, as request parameters."""
        values = {name: self.arguments.get(name) for name in GEOMETRY_ARGUMENTS}
        if values["num_frames"] is None and model == "cogvideox":
            # As CogVideoX's pipelines fill it in: `num_frames or sample_frames`.
            values["num_frames"] = self.pipe.transformer.config.sample_frames
        return {name: str(int(value)) for name, value in values.items() if value is not None}

    def fps(self, model: str) -> Fps:
        """The call's own frame rate if the pipeline takes one, else the model's."""
        for name in ("frame_rate", "fps"):
            if self.arguments.get(name) is not None:
                return self.arguments[name]
        if model == "cogvideox" and self.pipe.transformer.config.patch_size_t is not None:
            return COGVIDEOX_15_FPS
        return DEFAULT_FPS.get(model, 16)


def with_fps(pipe: Any, pipe_kwargs: dict[str, Any], fps: Fps | None) -> dict[str, Any]:
    """The call's arguments, with `fps` passed on to a pipeline that is conditioned on it
    (SkyReels-V2's `fps`)."""
    if fps is not None and "fps" in _signature(pipe).parameters:
        return {**pipe_kwargs, "fps": fps}
    return dict(pipe_kwargs)


def run_latent(pipe: Any, kwargs: Mapping[str, Any]) -> Any:
    """The pipeline's `frames` with output_type='latent' (its latents, as returned)."""
    return pipe(**kwargs, output_type="latent", return_dict=True).frames


def latent_tensor(pipe: Any, latents: Any) -> torch.Tensor:
    if not isinstance(latents, torch.Tensor):
        raise PipelineError(
            f"{type(pipe).__name__} returned {type(latents).__name__} latents, not a tensor"
        )
    return latents


def check_internals(
    pipe: Any, attributes: tuple[str, ...], call_parameters: tuple[str, ...]
) -> list[str]:
    """What of `attributes` and `call_parameters` the pipeline lacks, and whether its
    step callback is shown the latents."""
    # On the class too: a property (`num_timesteps`) reads state set only by a call.
    missing = [
        name for name in attributes if not (hasattr(type(pipe), name) or hasattr(pipe, name))
    ]
    parameters = _signature(pipe).parameters
    missing += [f"__call__({name}=...)" for name in call_parameters if name not in parameters]
    if "latents" not in getattr(pipe, "_callback_tensor_inputs", ()):
        missing.append("_callback_tensor_inputs['latents']")
    return missing


def internals_error(pipe: Any, missing: list[str]) -> PipelineError:
    import diffusers

    return PipelineError(
        f"diffusers {diffusers.__version__}'s {type(pipe).__name__} no longer has "
        f"{', '.join(missing)}, which vaecast's integration relies on; install "
        f"{DIFFUSERS_REQUIREMENT}"
    )
