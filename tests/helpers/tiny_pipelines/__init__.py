"""Real diffusers video pipelines built from tiny random components, one case per model.

Each family's module (`wan`, `hunyuan`, `ltx`, `cogvideox`, `mochi`) lists its
`CASES`: the pipeline class itself with components small enough for a CPU test, built
the way diffusers' own pipeline tests build them, and called with `prompt_embeds` so
that no text encoder is needed. `run_case` runs a case twice from one seed, once with
`output_type="latent"` (what a user hands vaecast) and once with `output_type="np"`
(the frames vaecast must reproduce).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

SEED = 0


@dataclass(frozen=True)
class TinyPipelineCase:
    """One model's pipeline, as a test builds and calls it."""

    model: str  # the `vaecast serve --model` name that decodes its latents
    build: Callable[[], Any]  # a seeded pipeline of tiny random components
    call_kwargs: dict[str, Any]  # everything but output_type and generator
    # Request parameters vaecast needs beyond the tensor (packed latents' geometry).
    params: dict[str, str] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return self.model


@dataclass(frozen=True)
class CaseRun:
    pipeline: Any
    latents: torch.Tensor  # exactly what output_type="latent" returned
    frames: np.ndarray  # (T, H, W, 3) float in [0, 1], what output_type="np" returned
    # A pipeline that makes sound too (LTX-2): its audio latents, then its waveform
    # (channels, samples) as output_type="np" returned it; None for the others.
    audio_latents: torch.Tensor | None = None
    audio: np.ndarray | None = None


def run_case(case: TinyPipelineCase) -> CaseRun:
    """The case's pipeline, run for its latents and for its frames from one seed."""
    pipeline = case.build()
    pipeline.set_progress_bar_config(disable=True)
    outputs = []
    for output_type in ("latent", "np"):
        generator = torch.Generator().manual_seed(SEED)
        with torch.no_grad():
            outputs.append(
                pipeline(**case.call_kwargs, output_type=output_type, generator=generator)
            )
    latent, decoded = outputs
    audio = getattr(decoded, "audio", None)
    return CaseRun(
        pipeline,
        latent.frames,
        np.asarray(decoded.frames[0], dtype=np.float32),
        getattr(latent, "audio", None),
        None if audio is None else audio[0].float().numpy(),
    )
