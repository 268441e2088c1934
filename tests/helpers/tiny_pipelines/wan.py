"""Wan 2.1 and Wan 2.2 TI2V-5B `WanPipeline`s of tiny random components (diffusers' own
test configurations), without a text encoder."""

from __future__ import annotations

from typing import Any

import torch
from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanPipeline, WanTransformer3DModel

from tests.helpers.tiny_pipelines import TinyPipelineCase

TEXT_DIM = 32


def _transformer(channels: int) -> WanTransformer3DModel:
    torch.manual_seed(0)
    return WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=2,
        attention_head_dim=12,
        in_channels=channels,
        out_channels=channels,
        text_dim=TEXT_DIM,
        freq_dim=256,
        ffn_dim=32,
        num_layers=2,
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
        rope_max_seq_len=32,
    )


def _pipeline(vae: AutoencoderKLWan, expand_timesteps: bool) -> WanPipeline:
    scheduler = UniPCMultistepScheduler(
        prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0
    )
    return WanPipeline(
        tokenizer=None,
        text_encoder=None,
        transformer=_transformer(vae.config.z_dim),
        vae=vae,
        scheduler=scheduler,
        expand_timesteps=expand_timesteps,
    )


def wan21() -> WanPipeline:
    torch.manual_seed(0)
    vae = AutoencoderKLWan(
        base_dim=3,
        z_dim=16,
        dim_mult=[1, 1, 1, 1],
        num_res_blocks=1,
        temperal_downsample=[False, True, True],
        # Not the identity, so that the pipeline's denormalisation is exercised.
        latents_mean=[0.1 * (i % 5) for i in range(16)],
        latents_std=[0.5 + 0.1 * (i % 7) for i in range(16)],
    )
    return _pipeline(vae, expand_timesteps=False)


def wan22() -> WanPipeline:
    torch.manual_seed(0)
    vae = AutoencoderKLWan(
        base_dim=3,
        z_dim=48,
        in_channels=12,
        out_channels=12,
        is_residual=True,
        patch_size=2,
        dim_mult=[1, 1, 1, 1],
        num_res_blocks=1,
        scale_factor_spatial=16,
        scale_factor_temporal=4,
        temperal_downsample=[False, True, True],
        latents_mean=[0.05 * (i % 5) for i in range(48)],
        latents_std=[0.6 + 0.1 * (i % 4) for i in range(48)],
    )
    return _pipeline(vae, expand_timesteps=True)


def _call(height: int, width: int, frames: int) -> dict[str, Any]:
    embeds = torch.randn(1, 8, TEXT_DIM, generator=torch.Generator().manual_seed(1))
    return {
        "prompt_embeds": embeds,
        "guidance_scale": 1.0,
        "num_inference_steps": 2,
        "height": height,
        "width": width,
        "num_frames": frames,
    }


CASES = [
    TinyPipelineCase("wan2.1", wan21, _call(16, 16, 13)),
    TinyPipelineCase("wan2.2", wan22, _call(32, 32, 13)),
]
