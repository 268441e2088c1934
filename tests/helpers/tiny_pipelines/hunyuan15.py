"""HunyuanVideo 1.5's `HunyuanVideo15Pipeline` and `HunyuanVideo15ImageToVideoPipeline` of
tiny random components (the transformer, scheduler and guider of diffusers' own test
configuration; a VAE with the real temporal geometry, 4x in time), without text encoders:
called with `prompt_embeds` and `prompt_embeds_2` and their masks."""

from __future__ import annotations

from typing import Any

import numpy as np
import PIL.Image
import torch
from diffusers import (
    AutoencoderKLHunyuanVideo15,
    FlowMatchEulerDiscreteScheduler,
    HunyuanVideo15ImageToVideoPipeline,
    HunyuanVideo15Pipeline,
    HunyuanVideo15Transformer3DModel,
)
from diffusers.guiders import ClassifierFreeGuidance
from transformers import SiglipImageProcessor, SiglipVisionConfig, SiglipVisionModel

from tests.helpers.tiny_pipelines import TinyPipelineCase

LATENT_CHANNELS = 4
TEXT_DIM = 16
TEXT_2_DIM = 32
IMAGE_DIM = 12
# 4x in space and in time (two temporal upsamplers, as the real VAE's 16x/4x has), with
# every channel count different from its neighbours' so that the decoder's repeats and
# rearrangements are exercised. The untiled default, as the pipelines use it.
VAE_CONFIG: dict[str, Any] = {
    "in_channels": 3,
    "out_channels": 3,
    "latent_channels": LATENT_CHANNELS,
    "block_out_channels": (8, 16, 16),
    "layers_per_block": 1,
    "spatial_compression_ratio": 4,
    "temporal_compression_ratio": 4,
    # Not 1, so that the pipelines' scaling is exercised.
    "scaling_factor": 0.7,
}


def tiny_vae() -> AutoencoderKLHunyuanVideo15:
    torch.manual_seed(0)
    return AutoencoderKLHunyuanVideo15(**VAE_CONFIG).eval()


def _transformer(task_type: str) -> HunyuanVideo15Transformer3DModel:
    torch.manual_seed(0)
    return HunyuanVideo15Transformer3DModel(
        in_channels=2 * LATENT_CHANNELS + 1,  # latents, the condition's latents, its mask
        out_channels=LATENT_CHANNELS,
        num_attention_heads=2,
        attention_head_dim=8,
        num_layers=1,
        num_refiner_layers=1,
        mlp_ratio=2.0,
        patch_size=1,
        patch_size_t=1,
        text_embed_dim=TEXT_DIM,
        text_embed_2_dim=TEXT_2_DIM,
        image_embed_dim=IMAGE_DIM,
        rope_axes_dim=(2, 2, 4),
        target_size=16,
        task_type=task_type,
    ).eval()


def _components(task_type: str) -> dict[str, Any]:
    return {
        "transformer": _transformer(task_type),
        "vae": tiny_vae(),
        "scheduler": FlowMatchEulerDiscreteScheduler(shift=7.0),
        "text_encoder": None,
        "tokenizer": None,
        "text_encoder_2": None,
        "tokenizer_2": None,
        "guider": ClassifierFreeGuidance(guidance_scale=1.0),
    }


def text_to_video() -> HunyuanVideo15Pipeline:
    return HunyuanVideo15Pipeline(**_components("t2v"))


def image_to_video() -> HunyuanVideo15ImageToVideoPipeline:
    components = _components("i2v")
    torch.manual_seed(0)
    image_encoder = SiglipVisionModel(
        SiglipVisionConfig(
            hidden_size=IMAGE_DIM,
            intermediate_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            image_size=16,
            patch_size=8,
        )
    ).eval()
    feature_extractor = SiglipImageProcessor(size={"height": 16, "width": 16})
    return HunyuanVideo15ImageToVideoPipeline(
        **components, image_encoder=image_encoder, feature_extractor=feature_extractor
    )


def _embeds() -> dict[str, Any]:
    generator = torch.Generator().manual_seed(1)
    return {
        "prompt_embeds": torch.randn(1, 8, TEXT_DIM, generator=generator),
        "prompt_embeds_mask": torch.ones(1, 8, dtype=torch.int64),
        "prompt_embeds_2": torch.randn(1, 6, TEXT_2_DIM, generator=generator),
        "prompt_embeds_mask_2": torch.ones(1, 6, dtype=torch.int64),
        "num_inference_steps": 2,
    }


def _image() -> PIL.Image.Image:
    pixels = np.random.default_rng(2).integers(0, 256, size=(16, 16, 3), dtype=np.uint8)
    return PIL.Image.fromarray(pixels)


# 13 frames: 4 latent frames, 4 chunks (1, 4, 4, 4 frames). One case per model name (a
# server test serves each case's VAE under its model's name).
CASES = [
    TinyPipelineCase(
        "hunyuan-video-1.5",
        text_to_video,
        {**_embeds(), "height": 16, "width": 24, "num_frames": 13},
    ),
]
# The image-to-video pipeline decodes its latents the same way (the same VAE, the same
# decode step); its frame size comes from the image (and the transformer's target
# size): 16x16.
IMAGE_TO_VIDEO_CASES = [
    TinyPipelineCase(
        "hunyuan-video-1.5",
        image_to_video,
        {**_embeds(), "image": _image(), "num_frames": 13},
    ),
]
