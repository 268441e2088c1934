"""CogVideoX's pipeline from tiny random components: CogVideoX 1.0 and 1.5.

The components are those of diffusers' own CogVideoX pipeline tests
(tests/pipelines/cogvideo/test_cogvideox.py), but 2 heads of 16 (the same inner dim,
32) so that CogVideoX 1.5's rotary embeddings split evenly. 25 frames make 7 latent
frames, which the VAE decodes in 3 batches (9, 8, 8 frames). CogVideoX 1.5's
transformer (`patch_size_t` 2) pads them to 8, and the pipeline returns all 8 with
`output_type="latent"`: vaecast needs the call's `num_frames` to drop the padding.
The VAE decodes with its saved config's defaults (no tiling), as vaecast's does.
"""

from __future__ import annotations

from typing import Any

import torch
from diffusers import (
    AutoencoderKLCogVideoX,
    CogVideoXDDIMScheduler,
    CogVideoXPipeline,
    CogVideoXTransformer3DModel,
)

from tests.helpers.tiny_pipelines import TinyPipelineCase

LATENT_CHANNELS = 4
TEXT_EMBED_DIM = 32
TEXT_TOKENS = 16
NUM_FRAMES = 25

VAE_CONFIG: dict[str, Any] = {
    "in_channels": 3,
    "out_channels": 3,
    "block_out_channels": (8, 8, 8, 8),
    "latent_channels": LATENT_CHANNELS,
    "layers_per_block": 1,
    "norm_num_groups": 2,
    "temporal_compression_ratio": 4,
}


def tiny_vae(seed: int = 0) -> AutoencoderKLCogVideoX:
    torch.manual_seed(seed)
    return AutoencoderKLCogVideoX(**VAE_CONFIG).eval()


def build(patch_size_t: int | None = None) -> CogVideoXPipeline:
    """`patch_size_t=2` for CogVideoX 1.5 (which also takes rotary embeddings)."""
    torch.manual_seed(0)
    transformer = CogVideoXTransformer3DModel(
        num_attention_heads=2,
        attention_head_dim=16,
        in_channels=LATENT_CHANNELS,
        out_channels=LATENT_CHANNELS,
        time_embed_dim=2,
        text_embed_dim=TEXT_EMBED_DIM,
        num_layers=1,
        sample_width=2,
        sample_height=2,
        sample_frames=9,
        patch_size=2,
        patch_size_t=patch_size_t,
        temporal_compression_ratio=4,
        max_text_seq_length=TEXT_TOKENS,
        use_rotary_positional_embeddings=patch_size_t is not None,
    )
    pipeline = CogVideoXPipeline(
        tokenizer=None,
        text_encoder=None,
        vae=tiny_vae(),
        transformer=transformer.eval(),
        scheduler=CogVideoXDDIMScheduler(),
    )
    pipeline.set_progress_bar_config(disable=True)
    return pipeline


def call_kwargs() -> dict[str, Any]:
    prompt_embeds = torch.randn(
        1, TEXT_TOKENS, TEXT_EMBED_DIM, generator=torch.Generator().manual_seed(1)
    )
    return {
        "prompt_embeds": prompt_embeds,
        "negative_prompt_embeds": torch.zeros_like(prompt_embeds),
        "num_frames": NUM_FRAMES,
        "height": 16,
        "width": 16,
        "num_inference_steps": 2,
    }


# CogVideoX 1.0: the latents as returned, nothing to drop.
COGVIDEOX_1_0 = TinyPipelineCase(model="cogvideox", build=build, call_kwargs=call_kwargs())
# CogVideoX 1.5: the returned latents lead with a padding frame, which `num_frames` drops.
COGVIDEOX_1_5 = TinyPipelineCase(
    model="cogvideox",
    build=lambda: build(patch_size_t=2),
    call_kwargs=call_kwargs(),
    params={"num_frames": str(NUM_FRAMES)},
)
# One case per model name (cases are keyed by it); 1.5's covers 1.0's decode and the layout.
CASES: list[TinyPipelineCase] = [COGVIDEOX_1_5]
