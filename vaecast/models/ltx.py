"""`ltx-video` and `ltx-2`: the LTX-Video and LTX-2 video VAE decoders, streamed exactly
as their pipelines decode.

The models are diffusers' `AutoencoderKLLTXVideo` (`LTXPipeline`) and
`AutoencoderKLLTX2Video` (`LTX2Pipeline`) (Apache-2.0; architectures by Lightricks):
128 latent channels, 32x in space and 8x in time for the released models (read from
the VAE's config). What `vae.decode` does is what the stream is, with no attribute of
the VAE changed:
- by default (`from_pretrained` leaves `use_framewise_decoding` off) both decode the
  whole clip at once. Their decoders are not causal, but each layer's frame depends
  only on a few frames of the layer before, so the stream runs the decoder layer by
  layer (`vaecast/models/ltx_wavefront.py`): each frame of each layer computed once, as
  soon as the frames it reads are in, the whole decode's work in the whole decode's
  kernels, the first chunk out once the work it depends on is done (a share of the
  decode that shrinks as the clip grows: `benchmarks/results/exact_cone.md`). Its
  frames are `vae.decode`'s within float rounding. Chunks of 3 latents (17 frames,
  then 24 each). Where that stream is not shown to be the decoder's forward
  (checked at load), where the decoder injects noise, where the VAE's spatial tiles
  apply, or where `window_latents` asks for them, the stream decodes windows of latents
  with a margin of the decoder's reach each side (derived at load,
  `vaecast/models/ltx_reach.py`: 25 latent frames for LTX-Video's released VAE, 23 for
  LTX-2's) and keeps the frames no latent outside the window can change
  (`vaecast/models/margin_windows.py`): a clip no longer than one window is decoded
  whole, bit for bit `vae.decode`, its chunks at once; a longer one in windows that
  commit `window_latents` each (by default twice the margins). A decoder whose reach
  cannot be shown (a module the walk does not know) is decoded whole, with one log
  line.
- with `use_framewise_decoding` on (set by the user before the decoder is built, or
  `temporal_tiling=True`), their `_temporal_tiled_decode` decodes tiles of 3 latents
  every 1, each on its own (its last frame dropped after tile 0), blends each with the
  tile before over 8 frames by `blend_t`, and keeps 8 frames per tile (9 for the first).
  `CausalTileStream` (`vaecast/models/causal_tiles.py`) runs that scheme tile by tile
  and publishes each tile's frames as soon as it is decoded, bit for bit that decode:
  an earlier first fragment, but not the whole-clip decode (16 to 19 dB PSNR from it on
  the tests' random VAEs).
Each window or tile goes through the VAE's own path (`tiled_decode` where its
`use_tiling` applies, else `decoder`).

Latents are taken as each pipeline returns them with `output_type="latent"`:
- `ltx-video`: packed tokens (B, F*H*W, C), still normalized; the upload converts them
  to BCTHW with `PackedTokens` (the pipeline's `_unpack_latents`, geometry from the
  request's num_frames, height and width), and the decoder denormalizes them exactly as
  `pipeline_ltx.py` does (`_denormalize_latents` with the VAE's `latents_mean`,
  `latents_std` and `scaling_factor`, in float32, then cast to the VAE's dtype);
- `ltx-2`: BCTHW, already unpacked and denormalized by `pipeline_ltx2.py`, so only cast
  to the VAE's dtype (the audio latents it returns beside them are decoded by its
  audio VAE and vocoder where the weights are the pipeline's folder:
  `vaecast/models/ltx2_sound.py`).
Frames come out in [-1, 1], unclamped, as `vae.decode` gives them.

A VAE with `timestep_conditioning` (LTX-Video's later releases) is decoded at
`decode_timestep` (default 0.0, the pipelines' default) with no noise added: at 0 the
pipelines add none either, so this is their decode; at any other timestep they mix in
`decode_noise_scale` of random noise from their generator, which vaecast cannot
reproduce, so such a decode is not bit-equal to the pipeline's. A VAE whose decoder
injects noise (`decoder_inject_noise`) draws it from the device's
default generator in diffusers; vaecast seeds that generator with a fixed seed for
each window or tile (restoring it after), so a decode is deterministic and a stream
equals a whole decode, but the noise is not the pipeline's. Those decodes hold one
process-wide lock, since the generator is shared.

Otherwise a decode keeps no state on the module (no cache, no hooks of ours), so
decodes may share one VAE: each holds only its own pending latents (and last tile's tail).

Each decoder is `DiffusersDecoder` with its family's spec (`LTX_VIDEO`, `LTX_2`):
`from_weights` loads a local diffusers folder; `LTXVideoDecoder(vae)` and
`LTX2VideoDecoder(vae)` wrap a VAE loaded some other way. diffusers is imported only
when a model is loaded, so `import vaecast` never needs it.
"""

from __future__ import annotations

import contextlib
import logging
import math
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
    spatially_tiled,
)
from vaecast.models.diffusers_family import DiffusersDecoder, DiffusersFamily
from vaecast.models.layouts import PackedTokens
from vaecast.models.ltx2_sound import LTX2Sound
from vaecast.models.ltx_reach import temporal_reach, temporal_scale
from vaecast.models.ltx_wavefront import check, wavefront_net
from vaecast.models.margin_windows import MarginChunking, MarginWindows, Reach
from vaecast.models.streaming import Prepare
from vaecast.models.wavefront import NetFactory, WavefrontChunking
from vaecast.models.weights_io import WeightsError

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


# Latent frames per chunk of the exact stream: 17 frames, then 24 (a second at 24 fps).
CHUNK_LATENTS = 3
log = logging.getLogger(__name__)
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


def _chunking(model: str, tiled: _Call, untiled: _Call) -> Callable[..., Any]:
    """The chunking of LTX family `model`, whose per-tile paths are `tiled` and `untiled`."""

    def chunking(
        vae: Any,
        device: torch.device,
        prepare: Prepare,
        decode_timestep: float = 0.0,
        temporal_tiling: bool | None = None,
        window_latents: int | None = None,
    ) -> WavefrontChunking | MarginChunking | TileChunking:
        """The VAE's decode, streamed: its whole-clip decode layer by layer (or in
        exact windows where that cannot be shown, or `window_latents` asks for windows
        committing that many latents), or its temporal tiles where `temporal_tiling`
        (default: the VAE's own `use_framewise_decoding`) says so; decoded at
        `decode_timestep` where the VAE is timestep-conditioned."""
        # The pipelines' `timestep` argument to `vae.decode`: None unless conditioned.
        temb = None
        if vae.config.timestep_conditioning:
            temb = torch.tensor([float(decode_timestep)], device=device, dtype=vae.dtype)
        decode = per_tile_decoder(
            vae, lambda z: tiled(vae, z, temb), lambda z: untiled(vae, z, temb)
        )
        noise = vae.config.decoder_inject_noise
        noisy = any(noise) if isinstance(noise, list | tuple) else bool(noise)
        if noisy:
            decode = _with_seeded_noise(decode, device)
        latent_channels = int(vae.config.latent_channels)
        spatial_scale = int(vae.spatial_compression_ratio)
        tiles = vae.use_framewise_decoding if temporal_tiling is None else temporal_tiling
        if tiles:
            return TileChunking(
                CausalTiles.of(vae, drop="last", model=model),
                latent_channels=latent_channels,
                spatial_scale=spatial_scale,
                prepare=prepare,
                decode_tile=decode,
                blend=vae.blend_t,
            )
        windows = _windows(model, vae, window_latents)
        margins = MarginChunking(windows, latent_channels, spatial_scale, prepare, decode)
        if window_latents is not None or windows.reach is None:
            return margins
        if noisy:  # diffusers draws the noise per call: a split decode would differ
            log.info("%s: streaming in exact windows: its decoder injects noise", model)
            return margins
        make_net = _layer_by_layer(model, vae.decoder, temb)
        if make_net is None:
            return margins
        return WavefrontChunking(
            margins, make_net, takes=lambda shape: not spatially_tiled(vae, shape)
        )

    return chunking


def _layer_by_layer(model: str, decoder: Any, temb: torch.Tensor | None) -> NetFactory | None:
    """The decoder's layer-by-layer stream, where it is shown to be its forward."""
    make_net = wavefront_net(decoder, temb)
    try:
        problem = check(decoder, make_net, temb)
    except Exception as error:  # a module not as re-stated (diffusers moved on): windows
        problem = f"its layers could not be streamed ({type(error).__name__}: {error})"
    if problem is not None:
        log.warning("%s: streaming in exact windows, not layer by layer: %s", model, problem)
        return None
    return make_net


def _windows(model: str, vae: Any, window_latents: int | None) -> MarginWindows:
    """Exact windows for the VAE's decoder, from the reach derived from it."""
    scale = int(vae.temporal_compression_ratio)
    if temporal_scale(vae.decoder) != scale:
        raise WeightsError(
            f"unsupported {model} geometry: its decoder upsamples "
            f"{temporal_scale(vae.decoder)}x in time, its config says {scale}x"
        )
    found = temporal_reach(vae.decoder)
    reach: Reach | None = None
    if isinstance(found, Reach):
        reach = found
    else:
        log.warning(
            "%s: decoding each clip whole before streaming it, exactly: its decoder's reach "
            "over time cannot be shown (%s)",
            model,
            "; ".join(found),
        )
    if window_latents is None:
        # Margins of at most half the committed latents.
        margins = 0 if reach is None else reach.before + reach.after
        window_latents = CHUNK_LATENTS * max(1, math.ceil(2 * margins / CHUNK_LATENTS))
    return MarginWindows(scale, CHUNK_LATENTS, window_latents, reach)


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
    chunking=_chunking(
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
    # Its audio VAE and vocoder, where the folder is the pipeline's.
    sound=lambda weights, device: LTX2Sound.from_folder(weights, device),
    # causal=None, as `vae.decode(latents, timestep)` passes it: the decoder's own.
    chunking=_chunking(
        "ltx-2",
        lambda vae, z, temb: vae.tiled_decode(z, temb, causal=None, return_dict=True).sample,
        lambda vae, z, temb: vae.decoder(z, temb, causal=None),
    ),
)


class LTXVideoDecoder(DiffusersDecoder):
    """LTX-Video's VAE decoder under the chunk contract: its decode, in exact windows
    (or temporal tiles). Its pipeline's latents are packed tokens (`latent_layout`)."""

    family = LTX_VIDEO


class LTX2VideoDecoder(DiffusersDecoder):
    """LTX-2's video VAE decoder under the chunk contract: its decode, in exact windows
    (or temporal tiles). Its pipeline returns the video latents unpacked and denormalized
    (BCTHW)."""

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
