"""Mochi's pipeline from tiny random components.

The components are those of diffusers' own Mochi pipeline tests
(tests/pipelines/mochi/test_mochi.py). 25 frames make 5 latent frames, which the
pipeline decodes as one clip (its default) and vaecast's mochi decoder streams a latent
frame at a time (1, 6, 6, 6, 6 frames), the same frames to rounding.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from diffusers import (
    AutoencoderKLMochi,
    FlowMatchEulerDiscreteScheduler,
    MochiPipeline,
    MochiTransformer3DModel,
)

from tests.helpers.tiny_pipelines import TinyPipelineCase

LATENT_CHANNELS = 12
TEXT_EMBED_DIM = 32
TEXT_TOKENS = 16
NUM_FRAMES = 25
AUTOCAST_WARNING = "In CPU autocast, but the target dtype is not supported"

VAE_CONFIG: dict[str, Any] = {
    "latent_channels": LATENT_CHANNELS,
    "out_channels": 3,
    "encoder_block_out_channels": (32, 32, 32, 32),
    "decoder_block_out_channels": (32, 32, 32, 32),
    "layers_per_block": (1, 1, 1, 1, 1),
}


def tiny_vae(seed: int = 0) -> AutoencoderKLMochi:
    torch.manual_seed(seed)
    return AutoencoderKLMochi(**VAE_CONFIG).eval()


def _quiet_forward(transformer: MochiTransformer3DModel) -> None:
    """Its `forward`, without the warning torch gives each call on CPU.

    diffusers' Mochi transformer opens a float32 autocast region on every call, and CPU
    autocast takes only bf16 and fp16, so torch warns (and disables it: nothing changes);
    under pytest's warnings-as-errors that warning would fail every test running it.
    """
    forward = transformer.forward

    def quiet(*args: Any, **kwargs: Any) -> Any:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=AUTOCAST_WARNING, category=UserWarning)
            return forward(*args, **kwargs)

    transformer.forward = quiet  # type: ignore[method-assign]


def build() -> MochiPipeline:
    torch.manual_seed(0)
    transformer = MochiTransformer3DModel(
        patch_size=2,
        num_attention_heads=2,
        attention_head_dim=8,
        num_layers=2,
        pooled_projection_dim=16,
        in_channels=LATENT_CHANNELS,
        out_channels=None,
        qk_norm="rms_norm",
        text_embed_dim=TEXT_EMBED_DIM,
        time_embed_dim=4,
        activation_fn="swiglu",
        max_sequence_length=TEXT_TOKENS,
    )
    transformer.pos_frequencies.data = transformer.pos_frequencies.new_full(
        transformer.pos_frequencies.shape, 0
    )
    _quiet_forward(transformer)
    vae = tiny_vae()
    pipeline = MochiPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(),
        vae=vae,
        text_encoder=None,
        tokenizer=None,
        transformer=transformer.eval(),
    )
    pipeline.set_progress_bar_config(disable=True)
    return pipeline


def call_kwargs() -> dict[str, Any]:
    prompt_embeds = torch.randn(
        1, TEXT_TOKENS, TEXT_EMBED_DIM, generator=torch.Generator().manual_seed(1)
    )
    mask = torch.ones(1, TEXT_TOKENS, dtype=torch.long)
    return {
        "prompt_embeds": prompt_embeds,
        "prompt_attention_mask": mask,
        "negative_prompt_embeds": torch.zeros_like(prompt_embeds),
        "negative_prompt_attention_mask": mask.clone(),
        "num_frames": NUM_FRAMES,
        "height": 16,
        "width": 16,
        "num_inference_steps": 2,
    }


CASES: list[TinyPipelineCase] = [
    TinyPipelineCase(model="mochi", build=build, call_kwargs=call_kwargs())
]
