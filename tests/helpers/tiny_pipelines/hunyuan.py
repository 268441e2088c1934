"""A `HunyuanVideoPipeline` of tiny random components (diffusers' own test configuration),
without its text encoders: called with `prompt_embeds`, `pooled_prompt_embeds` and
`prompt_attention_mask`.

The VAE keeps diffusers' defaults, `use_framewise_decoding` on and 16-frame temporal
tiles every 12 frames, which a VAE folder saved from it has too (they are not in its
config): its decode is the temporal tiling that `hunyuan-video` streams. 29 frames are
8 latent frames, 3 tiles: chunks of 13, 12 and 4 frames.
"""

from __future__ import annotations

from typing import Any

import torch
from diffusers import (
    AutoencoderKLHunyuanVideo,
    FlowMatchEulerDiscreteScheduler,
    HunyuanVideoPipeline,
    HunyuanVideoTransformer3DModel,
)

from tests.helpers.tiny_pipelines import TinyPipelineCase

TEXT_DIM = 16
POOLED_DIM = 8
TEXT_TOKENS = 8


def hunyuan_video() -> HunyuanVideoPipeline:
    torch.manual_seed(0)
    transformer = HunyuanVideoTransformer3DModel(
        in_channels=4,
        out_channels=4,
        num_attention_heads=2,
        attention_head_dim=10,
        num_layers=1,
        num_single_layers=1,
        num_refiner_layers=1,
        patch_size=1,
        patch_size_t=1,
        guidance_embeds=True,
        text_embed_dim=TEXT_DIM,
        pooled_projection_dim=POOLED_DIM,
        rope_axes_dim=(2, 4, 4),
    )
    torch.manual_seed(0)
    vae = AutoencoderKLHunyuanVideo(
        in_channels=3,
        out_channels=3,
        latent_channels=4,
        block_out_channels=(8, 8, 8, 8),
        layers_per_block=1,
        norm_num_groups=4,
        scaling_factor=0.476986,
        spatial_compression_ratio=8,
        temporal_compression_ratio=4,
        mid_block_add_attention=True,
    )
    return HunyuanVideoPipeline(
        text_encoder=None,
        tokenizer=None,
        transformer=transformer,
        vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
        text_encoder_2=None,
        tokenizer_2=None,
    )


def _call() -> dict[str, Any]:
    generator = torch.Generator().manual_seed(1)
    return {
        "prompt_embeds": torch.randn(1, TEXT_TOKENS, TEXT_DIM, generator=generator),
        "pooled_prompt_embeds": torch.randn(1, POOLED_DIM, generator=generator),
        "prompt_attention_mask": torch.ones(1, TEXT_TOKENS, dtype=torch.int64),
        "guidance_scale": 4.5,
        "num_inference_steps": 2,
        "height": 16,
        "width": 16,
        "num_frames": 29,
    }


CASES = [TinyPipelineCase("hunyuan-video", hunyuan_video, _call())]
