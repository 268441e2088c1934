"""`LTXPipeline` and `LTX2Pipeline`s of tiny random components (after diffusers' own test
configurations), without their text encoders: called with `prompt_embeds` and
`prompt_attention_mask`.

Both VAEs have the released models' temporal geometry (8x in time) at 8x in space, and
are left as diffusers builds them (`use_framewise_decoding` off): the pipeline decodes the
whole clip at once, which is what `ltx-video` and `ltx-2` stream. 25 frames are 4 latent
frames: chunks of 17 and 8 frames.

The LTX-Video VAE is timestep-conditioned (as LTX-Video's later releases), decoded at
the pipeline's default `decode_timestep` of 0, where the pipeline adds no noise; its
latents' mean, std and scaling factor are not the identity, so that the pipeline's
denormalization is exercised. LTX-2's pipeline returns its video latents unpacked and
denormalized (BCTHW), and needs its audio VAE, vocoder and text connectors as well.
"""

from __future__ import annotations

from typing import Any

import torch
from diffusers import (
    AutoencoderKLLTX2Audio,
    AutoencoderKLLTX2Video,
    AutoencoderKLLTXVideo,
    FlowMatchEulerDiscreteScheduler,
    LTX2Pipeline,
    LTX2VideoTransformer3DModel,
    LTXPipeline,
    LTXVideoTransformer3DModel,
)

from tests.helpers.tiny_pipelines import TinyPipelineCase

LTX_CHANNELS = 8
LTX2_CHANNELS = 4
TEXT_DIM = 32
TEXT_TOKENS = 8
# LTX-2's connectors take every text-encoder layer's hidden states, stacked.
LTX2_CAPTION_DIM = 32
LTX2_TEXT_LAYERS = 3
GEOMETRY = {"height": 32, "width": 32, "num_frames": 25}


def ltx_vae(**overrides: Any) -> AutoencoderKLLTXVideo:
    """`overrides` go to the constructor."""
    config: dict[str, Any] = dict(
        latent_channels=LTX_CHANNELS,
        block_out_channels=(8, 8, 8, 8),
        decoder_block_out_channels=(8, 8, 8, 8),
        layers_per_block=(1, 1, 1, 1, 1),
        decoder_layers_per_block=(1, 1, 1, 1, 1),
        spatio_temporal_scaling=(True, True, True, False),
        decoder_spatio_temporal_scaling=(True, True, True, False),
        timestep_conditioning=True,
        patch_size=1,
        patch_size_t=1,
        scaling_factor=0.8,
        encoder_causal=True,
        decoder_causal=False,
    )
    torch.manual_seed(0)
    vae = AutoencoderKLLTXVideo(**(config | overrides))
    with torch.no_grad():
        vae.latents_mean.copy_(torch.linspace(-0.2, 0.3, LTX_CHANNELS))
        vae.latents_std.copy_(torch.linspace(0.6, 1.4, LTX_CHANNELS))
    return vae


def ltx_video() -> LTXPipeline:
    torch.manual_seed(0)
    transformer = LTXVideoTransformer3DModel(
        in_channels=LTX_CHANNELS,
        out_channels=LTX_CHANNELS,
        patch_size=1,
        patch_size_t=1,
        num_attention_heads=4,
        attention_head_dim=8,
        cross_attention_dim=32,
        num_layers=1,
        caption_channels=TEXT_DIM,
    )
    vae = ltx_vae()
    return LTXPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(),
        vae=vae,
        text_encoder=None,
        tokenizer=None,
        transformer=transformer,
    )


def ltx2_vae() -> AutoencoderKLLTX2Video:
    torch.manual_seed(0)
    return AutoencoderKLLTX2Video(
        in_channels=3,
        out_channels=3,
        latent_channels=LTX2_CHANNELS,
        block_out_channels=(8, 8, 8),
        decoder_block_out_channels=(8, 8, 8),
        layers_per_block=(1, 1, 1, 1),
        decoder_layers_per_block=(1, 1, 1, 1),
        spatio_temporal_scaling=(True, True, True),
        decoder_spatio_temporal_scaling=(True, True, True),
        decoder_inject_noise=(False, False, False, False),
        downsample_type=("spatiotemporal", "spatiotemporal", "spatiotemporal"),
        upsample_residual=(False, False, False),
        upsample_factor=(1, 1, 1),
        timestep_conditioning=False,
        patch_size=1,
        patch_size_t=1,
        encoder_causal=True,
        decoder_causal=False,
    )


def ltx2() -> LTX2Pipeline:
    from diffusers.pipelines.ltx2 import LTX2TextConnectors
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder

    torch.manual_seed(0)
    transformer = LTX2VideoTransformer3DModel(
        in_channels=LTX2_CHANNELS,
        out_channels=LTX2_CHANNELS,
        patch_size=1,
        patch_size_t=1,
        num_attention_heads=2,
        attention_head_dim=8,
        cross_attention_dim=16,
        audio_in_channels=4,
        audio_out_channels=4,
        audio_num_attention_heads=2,
        audio_attention_head_dim=4,
        audio_cross_attention_dim=8,
        num_layers=2,
        qk_norm="rms_norm_across_heads",
        caption_channels=LTX2_CAPTION_DIM,
        rope_double_precision=False,
        rope_type="split",
    )
    torch.manual_seed(0)
    connectors = LTX2TextConnectors(
        caption_channels=LTX2_CAPTION_DIM,
        text_proj_in_factor=LTX2_TEXT_LAYERS,
        video_connector_num_attention_heads=4,
        video_connector_attention_head_dim=8,
        video_connector_num_layers=1,
        video_connector_num_learnable_registers=None,
        audio_connector_num_attention_heads=4,
        audio_connector_attention_head_dim=8,
        audio_connector_num_layers=1,
        audio_connector_num_learnable_registers=None,
        connector_rope_base_seq_len=32,
        rope_theta=10000.0,
        rope_double_precision=False,
        causal_temporal_positioning=False,
        rope_type="split",
    )
    vae = ltx2_vae()
    torch.manual_seed(0)
    audio_vae = AutoencoderKLLTX2Audio(
        base_channels=4,
        output_channels=2,
        ch_mult=(1,),
        num_res_blocks=1,
        attn_resolutions=None,
        in_channels=2,
        resolution=32,
        latent_channels=2,
        norm_type="pixel",
        causality_axis="height",
        dropout=0.0,
        mid_block_add_attention=False,
        sample_rate=16000,
        mel_hop_length=160,
        is_causal=True,
        mel_bins=8,
    )
    torch.manual_seed(0)
    vocoder = LTX2Vocoder(
        in_channels=audio_vae.config.output_channels * audio_vae.config.mel_bins,
        hidden_channels=32,
        out_channels=2,
        # 10 x 4 x 4 = the mel hop (160): a waveform at the audio VAE's 16 kHz, as the
        # released vocoder's 240x makes 24 kHz from its 100 mel frames a second.
        upsample_kernel_sizes=[20, 8, 8],
        upsample_factors=[10, 4, 4],
        resnet_kernel_sizes=[3],
        resnet_dilations=[[1, 3, 5]],
        leaky_relu_negative_slope=0.1,
        output_sampling_rate=16000,
    )
    return LTX2Pipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(),
        vae=vae,
        audio_vae=audio_vae,
        text_encoder=None,
        tokenizer=None,
        connectors=connectors,
        transformer=transformer,
        vocoder=vocoder,
    )


def _ltx_call() -> dict[str, Any]:
    return {
        "prompt_embeds": torch.randn(
            1, TEXT_TOKENS, TEXT_DIM, generator=torch.Generator().manual_seed(1)
        ),
        "prompt_attention_mask": torch.ones(1, TEXT_TOKENS, dtype=torch.int64),
        "guidance_scale": 1.0,
        "num_inference_steps": 2,
        **GEOMETRY,
    }


def _ltx2_call() -> dict[str, Any]:
    features = LTX2_CAPTION_DIM * LTX2_TEXT_LAYERS
    return {
        "prompt_embeds": torch.randn(
            1, TEXT_TOKENS, features, generator=torch.Generator().manual_seed(1)
        ),
        "prompt_attention_mask": torch.ones(1, TEXT_TOKENS, dtype=torch.int64),
        "guidance_scale": 1.0,
        "stg_scale": 0.0,
        "modality_scale": 1.0,
        "guidance_rescale": 0.0,
        "audio_guidance_scale": 1.0,
        "audio_stg_scale": 0.0,
        "audio_modality_scale": 1.0,
        "audio_guidance_rescale": 0.0,
        "spatio_temporal_guidance_blocks": None,
        "use_cross_timestep": False,
        "frame_rate": 25.0,
        "num_inference_steps": 2,
        **GEOMETRY,
    }


CASES = [
    TinyPipelineCase(
        "ltx-video",
        ltx_video,
        _ltx_call(),
        params={key: str(value) for key, value in GEOMETRY.items()},
    ),
    TinyPipelineCase("ltx-2", ltx2, _ltx2_call()),
]
