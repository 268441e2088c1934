"""`ltx-video` and `ltx-2`: the LTX-Video and LTX-2 video VAE decoders, streamed
through their own temporal tiles.

The models are diffusers' `AutoencoderKLLTXVideo` (`LTXPipeline`) and
`AutoencoderKLLTX2Video` (`LTX2Pipeline`) (Apache-2.0; architectures by Lightricks):
128 latent channels, 32x in space and 8x in time for the released models (read from
the VAE's config). Both decode a whole clip at once by default; their
`_temporal_tiled_decode` (`use_framewise_decoding`) decodes tiles of 3 latents every
1, each on its own (its last frame dropped after tile 0), blends each with the tile
before over 8 frames by `blend_t`, and keeps 8 frames per tile (9 for the first).
`CausalTileStream` (`vaecast/models/causal_tiles.py`) runs that scheme tile by tile and
publishes each tile's frames as soon as it is decoded: latent T = 13 gives chunks of
9 then eleven of 8 frames (97 in all), and a stream decodes tile i once latents up to
i + 3 have arrived. So these decoders turn the VAE's `use_framewise_decoding` on:
`vae.decode` is then the decode they stream, and the chunks concatenate to it bit for
bit (tested, one thread on CPU); each tile goes through the VAE's own per-tile path
(`tiled_decode` where its `use_tiling` applies to the tile, else `decoder`). The tile
sizes are read from the VAE when the decoder is built.

The temporal tiling is an approximation of the whole-clip decode the pipelines use by
default, which is not streamable (the decoder is not causal: every frame depends on
the whole clip): each tile sees 3 latents of context instead of the clip. Measured
against the untiled `vae.decode` on the tiny random test VAEs (`tests/models/test_ltx.py`,
4 to 13 latent frames), the tiled decode is at 16 to 19 dB PSNR over the [-1, 1] range
(LTX-Video 17 to 19, LTX-2 16 to 17); random weights spread each frame over the clip
far more than trained ones, and the released models' figure is not measured here.

Latents are taken as each pipeline returns them with `output_type="latent"`:
- `ltx-video`: packed tokens (B, F*H*W, C), still normalized; the upload converts them
  to BCTHW with `PackedTokens` (the pipeline's `_unpack_latents`, geometry from the
  request's num_frames, height and width), and the decoder denormalizes them exactly as
  `pipeline_ltx.py` does (`_denormalize_latents` with the VAE's `latents_mean`,
  `latents_std` and `scaling_factor`, in float32, then cast to the VAE's dtype);
- `ltx-2`: BCTHW, already unpacked and denormalized by `pipeline_ltx2.py`, so only cast
  to the VAE's dtype (the audio latents it returns beside them are for
  `AutoencoderKLLTX2Audio`, which vaecast does not decode).
Frames come out in [-1, 1], unclamped, as `vae.decode` gives them.

A VAE with `timestep_conditioning` (LTX-Video's later releases) is decoded at
`decode_timestep` (default 0.0, the pipelines' default) with no noise added: at 0 the
pipelines add none either, so this is their decode; at any other timestep they mix in
`decode_noise_scale` of random noise from their generator, which vaecast cannot
reproduce, so such a decode is not bit-equal to the pipeline's. A VAE whose decoder
injects noise (`decoder_inject_noise`) draws it from the device's
default generator in diffusers; vaecast seeds that generator with a fixed seed for
each tile (restoring it after), so a decode is deterministic and a stream equals a
whole decode, but the noise is not the pipeline's. Those tile decodes hold one
process-wide lock, since the generator is shared.

Otherwise a tile decode keeps no state on the module (no cache, no hooks of ours), so
decodes may share one VAE: each holds only its own pending latents and last tile's tail.

Each decoder is `DiffusersDecoder` with its family's spec (`LTX_VIDEO`, `LTX_2`):
`from_weights` loads a local diffusers folder; `LTXVideoDecoder(vae)` and
`LTX2VideoDecoder(vae)` wrap a VAE loaded some other way. diffusers is imported only
when a model is loaded, so `import vaecast` never needs it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch

from vaecast.models.causal_tiles import (
    SCHEME_ATTRIBUTES,
    CausalTiles,
    TileChunking,
    TileDecoder,
    missing_scheme_lines,
    per_tile_decoder,
)
from vaecast.models.diffusers_family import DiffusersDecoder, DiffusersFamily
from vaecast.models.layouts import PackedTokens
from vaecast.models.streaming import Prepare

# What vaecast drives of both models beyond diffusers' public API, on the versions
# whose `_temporal_tiled_decode` is the scheme we reproduce (checked in 0.42.1); each
# family's signatures are its own.
LTX_ATTRIBUTES = (*SCHEME_ATTRIBUTES, "latents_mean", "latents_std")
LTX_CONFIG_KEYS = (
    "latent_channels",
    "scaling_factor",
    "timestep_conditioning",
    "decoder_inject_noise",
)
# The lines of `_temporal_tiled_decode` that fix the scheme: which frame a later tile
# drops, and that it is blended with the previous tile as diffusers stores it.
SCHEME_LINES = (
    "decoded = decoded[:, :, :-1, :, :]",
    "tile = self.blend_t(row[i - 1], tile, blend_num_frames)",
)


# The seed of the device's default generator (which diffusers' noise injection draws
# from) while a tile decodes.
NOISE_SEED = 0
_NOISE_LOCK = threading.Lock()
# (vae, latents, temb) -> frames: a family's spatially tiled decode, or its decoder's.
_Call = Callable[[Any, torch.Tensor, torch.Tensor | None], torch.Tensor]


def ltx_video_decode_step(vae: Any, device: torch.device) -> Prepare:
    """pipeline_ltx.py's `_denormalize_latents` on its float32 latents, step for step,
    then its cast to the VAE's dtype."""

    def prepare(latents: torch.Tensor) -> torch.Tensor:
        latents = latents.to(device, torch.float32)
        mean = vae.latents_mean.view(1, -1, 1, 1, 1).to(latents.device, latents.dtype)
        std = vae.latents_std.view(1, -1, 1, 1, 1).to(latents.device, latents.dtype)
        latents = latents * std / vae.config.scaling_factor + mean
        return latents.to(vae.dtype)

    return prepare


def ltx2_decode_step(vae: Any, device: torch.device) -> Prepare:
    """pipeline_ltx2.py denormalized them already; its decode casts them only."""
    return lambda latents: latents.to(device).to(vae.dtype)


def _tile_chunking(model: str, tiled: _Call, untiled: _Call) -> Callable[..., TileChunking]:
    """The chunking of LTX family `model`, whose per-tile paths are `tiled` and `untiled`."""

    def chunking(
        vae: Any, device: torch.device, prepare: Prepare, decode_timestep: float = 0.0
    ) -> TileChunking:
        """A chunk per temporal tile, decoded at `decode_timestep` where the VAE is
        timestep-conditioned; turns `use_framewise_decoding` on, so that `vae.decode`
        is the decode it streams."""
        vae.use_framewise_decoding = True
        # The pipelines' `timestep` argument to `vae.decode`: None unless conditioned.
        temb = None
        if vae.config.timestep_conditioning:
            temb = torch.tensor([float(decode_timestep)], device=device, dtype=vae.dtype)
        decode_tile = per_tile_decoder(
            vae, lambda z: tiled(vae, z, temb), lambda z: untiled(vae, z, temb)
        )
        noise = vae.config.decoder_inject_noise
        if any(noise) if isinstance(noise, list | tuple) else bool(noise):
            decode_tile = _with_seeded_noise(decode_tile, device)
        return TileChunking(
            CausalTiles.of(vae, drop="last", model=model),
            latent_channels=int(vae.config.latent_channels),
            spatial_scale=int(vae.spatial_compression_ratio),
            prepare=prepare,
            decode_tile=decode_tile,
            blend=vae.blend_t,
        )

    return chunking


def _with_seeded_noise(decode_tile: TileDecoder, device: torch.device) -> TileDecoder:
    def seeded(latents: torch.Tensor) -> torch.Tensor:
        with _NOISE_LOCK, _seeded(device):
            return decode_tile(latents)

    return seeded


LTX_VIDEO = DiffusersFamily(
    "ltx-video",
    "AutoencoderKLLTXVideo",
    "diffusers>=0.42,<0.43",
    attributes=LTX_ATTRIBUTES,
    config_keys=LTX_CONFIG_KEYS,
    signatures={
        "tiled_decode": ("z", "temb", "return_dict"),
        "blend_t": ("a", "b", "blend_extent"),
        "decoder.forward": ("hidden_states", "temb"),
    },
    weights_of="LTX-Video",
    more_checks=lambda vae: missing_scheme_lines(vae, SCHEME_LINES),
    decode_step=ltx_video_decode_step,
    chunking=_tile_chunking(
        "ltx-video",
        lambda vae, z, temb: vae.tiled_decode(z, temb, return_dict=True).sample,
        lambda vae, z, temb: vae.decoder(z, temb),
    ),
    # Packed tokens, unpacked with the VAE's own compression ratios.
    layout=lambda vae: PackedTokens(
        spatial_scale=int(vae.spatial_compression_ratio),
        temporal_scale=int(vae.temporal_compression_ratio),
    ),
)
LTX_2 = DiffusersFamily(
    "ltx-2",
    "AutoencoderKLLTX2Video",
    "diffusers>=0.42,<0.43",
    attributes=LTX_ATTRIBUTES,
    config_keys=LTX_CONFIG_KEYS,
    signatures={
        "tiled_decode": ("z", "temb", "causal", "return_dict"),
        "blend_t": ("a", "b", "blend_extent"),
        "decoder.forward": ("hidden_states", "temb", "causal"),
    },
    weights_of="LTX-2",
    more_checks=lambda vae: missing_scheme_lines(vae, SCHEME_LINES),
    decode_step=ltx2_decode_step,
    # causal=None, as `vae.decode(latents, timestep)` passes it: the decoder's own.
    chunking=_tile_chunking(
        "ltx-2",
        lambda vae, z, temb: vae.tiled_decode(z, temb, causal=None, return_dict=True).sample,
        lambda vae, z, temb: vae.decoder(z, temb, causal=None),
    ),
)


class LTXVideoDecoder(DiffusersDecoder):
    """LTX-Video's VAE decoder under the chunk contract: a chunk per temporal tile.
    Its pipeline's latents are packed tokens (`latent_layout`)."""

    family = LTX_VIDEO


class LTX2VideoDecoder(DiffusersDecoder):
    """LTX-2's video VAE decoder under the chunk contract: a chunk per temporal tile.
    Its pipeline returns the video latents unpacked and denormalized (BCTHW)."""

    family = LTX_2


@contextlib.contextmanager
def _seeded(device: torch.device) -> Iterator[None]:
    """The device's default generator seeded with `NOISE_SEED`, restored after."""
    if device.type == "cpu":
        generator = torch.default_generator
    else:
        module = torch.get_device_module(device.type)
        index = device.index if device.index is not None else module.current_device()
        generator = module.default_generators[index]
    state = generator.get_state()
    generator.manual_seed(NOISE_SEED)
    try:
        yield
    finally:
        generator.set_state(state)
