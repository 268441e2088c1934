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

`from_weights` loads a local diffusers folder; `LTXVideoDecoder(vae)` and
`LTX2VideoDecoder(vae)` wrap a VAE loaded some other way. diffusers is imported only
when a model is loaded, so `import vaecast` never needs it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar, Self

import torch

from vaecast.models.causal_tiles import CausalTileDecoder, CausalTiles, missing_scheme_lines
from vaecast.models.diffusers_family import DiffusersFamily
from vaecast.models.layouts import PackedTokens

# What vaecast drives of both models beyond diffusers' public API, on the versions
# whose `_temporal_tiled_decode` is the scheme we reproduce (checked in 0.42.1); each
# decoder's signatures are its own (`_ltx_family`).
LTX_ATTRIBUTES = (
    "_temporal_tiled_decode",
    "tiled_decode",
    "blend_t",
    "decoder",
    "latents_mean",
    "latents_std",
    "use_tiling",
    "use_framewise_decoding",
    "tile_sample_min_height",
    "tile_sample_min_width",
    "tile_sample_min_num_frames",
    "tile_sample_stride_num_frames",
    "spatial_compression_ratio",
    "temporal_compression_ratio",
)
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


def _ltx_family(
    model: str, class_name: str, signatures: dict[str, tuple[str, ...]], weights_of: str
) -> DiffusersFamily:
    return DiffusersFamily(
        model,
        class_name,
        "diffusers>=0.42,<0.43",
        attributes=LTX_ATTRIBUTES,
        config_keys=LTX_CONFIG_KEYS,
        signatures=signatures,
        weights_of=weights_of,
    )


class _LTXFamilyDecoder(CausalTileDecoder):
    """What LTX-Video's and LTX-2's decoders share: all but the latents' normalization
    and the decoder's arguments."""

    name: str
    value_range = (-1.0, 1.0)
    spec: ClassVar[DiffusersFamily]
    class_name: ClassVar[str]

    def __init__(
        self, vae: Any, device: str | torch.device = "cpu", decode_timestep: float = 0.0
    ) -> None:
        self.check_internals(vae)
        self.device = torch.device(device)
        self.vae = vae.to(self.device).eval().requires_grad_(False)
        vae.use_framewise_decoding = True
        self.tiles = CausalTiles.of(vae, drop="last", model=self.name)
        self.latent_channels = int(vae.config.latent_channels)
        self.spatial_scale = int(vae.spatial_compression_ratio)
        self.decode_timestep = float(decode_timestep)
        # The pipelines' `timestep` argument to `vae.decode`: None unless conditioned.
        self._temb: torch.Tensor | None = None
        if vae.config.timestep_conditioning:
            self._temb = torch.tensor([self.decode_timestep], device=self.device, dtype=vae.dtype)
        noise = vae.config.decoder_inject_noise
        self._injects_noise = any(noise) if isinstance(noise, list | tuple) else bool(noise)

    @classmethod
    def check_internals(cls, vae: Any) -> None:
        """Raise `WeightsError` if `vae` lacks the diffusers internals this decoder drives."""
        cls.spec.check(vae, lambda vae: missing_scheme_lines(vae, SCHEME_LINES))

    @classmethod
    def load_vae(cls, weights: str | Path | None) -> Any:
        """The VAE from a local diffusers folder (the model's or its `vae/`)."""
        return cls.spec.load(weights)

    @classmethod
    def from_weights(
        cls,
        weights: str | Path | None,
        device: str | torch.device = "cpu",
        decode_timestep: float = 0.0,
    ) -> Self:
        """Load the VAE from a local diffusers folder with `load_vae`."""
        return cls(cls.load_vae(weights), device, decode_timestep)

    def decode_tile(self, latents: torch.Tensor) -> torch.Tensor:
        if not self._injects_noise:
            return self._decode_tile(latents)
        with _NOISE_LOCK, _seeded(self.device):
            return self._decode_tile(latents)

    def _decode_tile(self, latents: torch.Tensor) -> torch.Tensor:
        # The per-tile branch of `_temporal_tiled_decode` (and `_decode`'s below the
        # tile length).
        vae = self.vae
        min_height = vae.tile_sample_min_height // vae.spatial_compression_ratio
        min_width = vae.tile_sample_min_width // vae.spatial_compression_ratio
        if vae.use_tiling and (latents.shape[-1] > min_width or latents.shape[-2] > min_height):
            return self._tiled_decode(latents)
        return self._decoder(latents)

    def _tiled_decode(self, latents: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _decoder(self, latents: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def blend(self, a: torch.Tensor, b: torch.Tensor, blend_extent: int) -> torch.Tensor:
        return self.vae.blend_t(a, b, blend_extent)


class LTXVideoDecoder(_LTXFamilyDecoder):
    """LTX-Video's VAE decoder under the chunk contract: a chunk per temporal tile.

    Its pipeline's latents are packed tokens: `latent_layout` unpacks them with the
    VAE's own compression ratios.
    """

    name = "ltx-video"
    spec = _ltx_family(
        name,
        "AutoencoderKLLTXVideo",
        {
            "tiled_decode": ("z", "temb", "return_dict"),
            "blend_t": ("a", "b", "blend_extent"),
            "decoder.forward": ("hidden_states", "temb"),
        },
        "LTX-Video",
    )
    class_name = spec.class_name

    def __init__(
        self, vae: Any, device: str | torch.device = "cpu", decode_timestep: float = 0.0
    ) -> None:
        super().__init__(vae, device, decode_timestep)
        self.latent_layout = PackedTokens(
            spatial_scale=self.spatial_scale, temporal_scale=self.tiles.temporal_scale
        )

    def prepare(self, latents: torch.Tensor) -> torch.Tensor:
        # pipeline_ltx.py's `_denormalize_latents` on its float32 latents, step for
        # step, then its cast to the VAE's dtype.
        vae = self.vae
        latents = latents.to(self.device, torch.float32)
        mean = vae.latents_mean.view(1, -1, 1, 1, 1).to(latents.device, latents.dtype)
        std = vae.latents_std.view(1, -1, 1, 1, 1).to(latents.device, latents.dtype)
        latents = latents * std / vae.config.scaling_factor + mean
        return latents.to(vae.dtype)

    def _tiled_decode(self, latents: torch.Tensor) -> torch.Tensor:
        return self.vae.tiled_decode(latents, self._temb, return_dict=True).sample

    def _decoder(self, latents: torch.Tensor) -> torch.Tensor:
        return self.vae.decoder(latents, self._temb)


class LTX2VideoDecoder(_LTXFamilyDecoder):
    """LTX-2's video VAE decoder under the chunk contract: a chunk per temporal tile.

    Its pipeline returns the video latents unpacked and denormalized (BCTHW).
    """

    name = "ltx-2"
    spec = _ltx_family(
        name,
        "AutoencoderKLLTX2Video",
        {
            "tiled_decode": ("z", "temb", "causal", "return_dict"),
            "blend_t": ("a", "b", "blend_extent"),
            "decoder.forward": ("hidden_states", "temb", "causal"),
        },
        "LTX-2",
    )
    class_name = spec.class_name

    def prepare(self, latents: torch.Tensor) -> torch.Tensor:
        # pipeline_ltx2.py denormalized them already; its decode casts them only.
        return latents.to(self.device).to(self.vae.dtype)

    def _tiled_decode(self, latents: torch.Tensor) -> torch.Tensor:
        # causal=None, as `vae.decode(latents, timestep)` passes it: the decoder's own.
        return self.vae.tiled_decode(latents, self._temb, causal=None, return_dict=True).sample

    def _decoder(self, latents: torch.Tensor) -> torch.Tensor:
        return self.vae.decoder(latents, self._temb, causal=None)


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
