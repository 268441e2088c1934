"""Tiny random components for the examples' `--tiny-random`: real diffusers pipeline
classes, small enough for a CPU, built from seeds (nothing is downloaded) and called
with random prompt embeddings (no text encoder).

- `wan()`: a Wan 2.1 `WanPipeline` (diffusers' own test configuration);
- `skyreels_df()`: a `SkyReelsV2DiffusionForcingPipeline` over the same Wan VAE;
- `framepack()`: a `HunyuanVideoFramepackPipeline` with a random SigLIP image encoder.

Their videos are noise: they show the streaming, not a model. The server must decode
with the same tiny VAE: `python examples/tiny_random.py DIR` saves it to DIR and prints
the `vaecast serve` command that serves it (FramePack and a self-decoding producer push
frames, which need no VAE on the server).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
import PIL.Image
import torch
from diffusers import (
    AutoencoderKLHunyuanVideo,
    AutoencoderKLWan,
    FlowMatchEulerDiscreteScheduler,
    HunyuanVideoFramepackPipeline,
    HunyuanVideoFramepackTransformer3DModel,
    SkyReelsV2DiffusionForcingPipeline,
    SkyReelsV2Transformer3DModel,
    UniPCMultistepScheduler,
    WanPipeline,
    WanTransformer3DModel,
)
from transformers import SiglipImageProcessorPil, SiglipVisionConfig, SiglipVisionModel

WAN_TEXT_DIM = 32
FRAMEPACK_TEXT_DIM = 16
FRAMEPACK_POOLED_DIM = 8
FRAMEPACK_IMAGE_DIM = 32
WAN_TRANSFORMER: dict[str, Any] = {
    "patch_size": (1, 2, 2),
    "num_attention_heads": 2,
    "attention_head_dim": 12,
    "in_channels": 16,
    "out_channels": 16,
    "text_dim": WAN_TEXT_DIM,
    "freq_dim": 256,
    "ffn_dim": 32,
    "num_layers": 2,
    "cross_attn_norm": True,
    "qk_norm": "rms_norm_across_heads",
    "rope_max_seq_len": 32,
}


def wan_vae() -> AutoencoderKLWan:
    torch.manual_seed(0)
    return AutoencoderKLWan(
        base_dim=3,
        z_dim=16,
        dim_mult=[1, 1, 1, 1],
        num_res_blocks=1,
        temperal_downsample=[False, True, True],
        latents_mean=[0.1 * (i % 5) for i in range(16)],
        latents_std=[0.5 + 0.1 * (i % 7) for i in range(16)],
    )


def _flow_scheduler(shift: float) -> UniPCMultistepScheduler:
    return UniPCMultistepScheduler(
        prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=shift
    )


def wan() -> WanPipeline:
    vae = wan_vae()
    torch.manual_seed(0)
    transformer = WanTransformer3DModel(**WAN_TRANSFORMER)
    pipe = WanPipeline(
        tokenizer=None,
        text_encoder=None,
        transformer=transformer,
        vae=vae,
        scheduler=_flow_scheduler(3.0),
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def wan_call(**changes: Any) -> dict[str, Any]:
    """13 frames at 16x16 in 2 steps, or what `changes` says."""
    embeds = torch.randn(1, 8, WAN_TEXT_DIM, generator=torch.Generator().manual_seed(1))
    return {
        "prompt_embeds": embeds,
        "guidance_scale": 1.0,
        "num_inference_steps": 2,
        "height": 16,
        "width": 16,
        "num_frames": 13,
        **changes,
    }


def skyreels_df() -> SkyReelsV2DiffusionForcingPipeline:
    vae = wan_vae()
    torch.manual_seed(0)
    transformer = SkyReelsV2Transformer3DModel(**WAN_TRANSFORMER)
    pipe = SkyReelsV2DiffusionForcingPipeline(
        tokenizer=None,
        text_encoder=None,
        transformer=transformer,
        vae=vae,
        scheduler=_flow_scheduler(8.0),
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def skyreels_call(**changes: Any) -> dict[str, Any]:
    """Two windows of 5 latent frames overlapping by 3 (25 frames), in causal blocks of
    1 latent frame, each 2 denoising rows behind the one before."""
    embeds = torch.randn(1, 8, WAN_TEXT_DIM, generator=torch.Generator().manual_seed(1))
    return {
        "prompt": None,
        "prompt_embeds": embeds,
        "guidance_scale": 1.0,
        "num_inference_steps": 3,
        "height": 16,
        "width": 16,
        "num_frames": 25,
        "base_num_frames": 17,
        "overlap_history": 9,
        "ar_step": 2,
        "causal_block_size": 1,
        "fps": 16,
        **changes,
    }


def framepack() -> HunyuanVideoFramepackPipeline:
    torch.manual_seed(0)
    transformer = HunyuanVideoFramepackTransformer3DModel(
        in_channels=4,
        out_channels=4,
        num_attention_heads=2,
        attention_head_dim=10,
        num_layers=1,
        num_single_layers=1,
        num_refiner_layers=1,
        patch_size=2,
        patch_size_t=1,
        guidance_embeds=True,
        text_embed_dim=FRAMEPACK_TEXT_DIM,
        pooled_projection_dim=FRAMEPACK_POOLED_DIM,
        rope_axes_dim=(2, 4, 4),
        image_condition_type=None,
        has_image_proj=True,
        image_proj_dim=FRAMEPACK_IMAGE_DIM,
        has_clean_x_embedder=True,
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
    torch.manual_seed(0)
    image_encoder = SiglipVisionModel(
        SiglipVisionConfig(
            hidden_size=FRAMEPACK_IMAGE_DIM,
            intermediate_size=37,
            num_hidden_layers=2,
            num_attention_heads=4,
            image_size=30,
            patch_size=15,
        )
    ).eval()
    pipe = HunyuanVideoFramepackPipeline(
        text_encoder=None,
        tokenizer=None,
        transformer=transformer,
        vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
        text_encoder_2=None,
        tokenizer_2=None,
        image_encoder=image_encoder,
        feature_extractor=SiglipImageProcessorPil(size={"height": 30, "width": 30}),
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def framepack_call(**changes: Any) -> dict[str, Any]:
    """3 sections of 3 latent frames from a random 32x32 image: 37 frames."""
    generator = torch.Generator().manual_seed(1)
    pixels = np.random.default_rng(0).integers(0, 256, size=(32, 32, 3), dtype=np.uint8)
    return {
        "image": PIL.Image.fromarray(pixels),
        "prompt_embeds": torch.randn(1, 8, FRAMEPACK_TEXT_DIM, generator=generator),
        "pooled_prompt_embeds": torch.randn(1, FRAMEPACK_POOLED_DIM, generator=generator),
        "prompt_attention_mask": torch.ones(1, 8, dtype=torch.int64),
        "guidance_scale": 4.5,
        "num_inference_steps": 2,
        "height": 32,
        "width": 32,
        "num_frames": 27,
        "latent_window_size": 3,
        "sampling_type": "vanilla",
        **changes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="where to save the tiny Wan VAE")
    folder = parser.parse_args().folder
    wan_vae().save_pretrained(folder)
    print(f"vaecast serve --crf 0 --model wan2.1 --weights wan2.1={folder}")


if __name__ == "__main__":
    main()
