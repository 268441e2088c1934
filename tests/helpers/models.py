"""Small random-weight configurations of the diffusers VAEs, shared by model and server tests."""

from __future__ import annotations

# diffusers' own tiny test config of AutoencoderKLWan.
WAN_TINY_CONFIG = {
    "base_dim": 3,
    "z_dim": 16,
    "dim_mult": [1, 1, 1, 1],
    "num_res_blocks": 1,
    "temperal_downsample": [False, True, True],
}

MINIMAX_LATENT_CHANNELS = 4
MINIMAX_TINY_CONFIG = {
    "latent_channels": MINIMAX_LATENT_CHANNELS,
    "block_out_channels": (8, 8, 8),
    "layers_per_block": 1,
    "spatial_downsample_factors": (2, 2, 1),
    "temporal_downsample_factors": (1, 2, 2),
    "norm_num_groups": 4,
    "decoder_num_layers": 1,
    "decoder_num_attention_heads": 2,
    "decoder_attention_head_dim": 8,
    "decoder_num_register_tokens": 2,
    "decoder_ffn_mult": 2,
    "latents_mean": (0.1, -0.2, 0.3, 0.0),
    "latents_std": (0.5, 1.5, 1.0, 2.0),
}
