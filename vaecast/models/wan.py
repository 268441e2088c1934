"""`wan2.1`: the Wan 2.1 video VAE decoder, a chunk per latent frame (or per block of them).

The model is diffusers' `AutoencoderKLWan` (Apache-2.0; architecture by the Wan team,
Alibaba). Its decoder is causal: `vae.decode` feeds latent frames one at a time
through `decoder(x[:, :, i:i+1], feat_cache=..., feat_idx=[0], first_chunk=(i == 0))`,
which carries the temporal convs' state in `feat_cache`, after `post_quant_conv`, and
clamps to [-1, 1]. Latent frame 0 gives 1 frame, each later one 4. We drive that same
loop from outside, on latent 0 alone and then on blocks of latent frames (the decoder
takes several at once through the same cache, as the encoder's loop does), and
publish each call's output as a chunk, so the chunks concatenate to `vae.decode`
within float rounding (tested).

The loop runs on a cache list of our own (`[None] * _cached_conv_counts["decoder"]`),
so it keeps no state on the module, and a stream keeps it between latent blocks. A
stream cuts its blocks at the same latent frames however the latents arrive, so a
stream equals a whole decode bit for bit, however it was split. Latents come in
pipeline space and are denormalized exactly as the Wan pipelines write it
(`latents / (1.0 / std) + mean`). On a CPU, one default per architecture trades bit
parity with `vae.decode` for speed, each chosen by measurement: Wan 2.1's convs run
in a channels-last copy (`channels_last_modules`), which oneDNN runs faster than the
layout the VAE loads with, and Wan 2.2's decoder takes blocks of 4 latent frames a
call (`block_latents`). With both off (elsewhere, or by option), the chunks equal
`vae.decode` bit for bit where the CPU picks the same `post_quant_conv` kernel for one
frame as for all (one thread on the Intel CPUs first measured), and within 2.4e-7
elsewhere (an AMD EPYC).

One decode per VAE instance at a time: concurrent decodes are *serialized* on a lock
held for the whole decode (including the callbacks; for a stream, from its first
block to its end, waits for the next block included). Our own cache list would make
overlapping decodes correct, but each holds a full set of activations and cache on
the device; serializing behaves like one decode slot for this model rather than
failing a job. A decode waiting for the lock starts once the running one ends or
is cancelled at its next chunk (or, for a stream, when its iterator raises).

The decoders are `DiffusersDecoder` with this family's spec (`WAN21`, and `WAN22` for
Wan 2.2's TI2V-5B VAE, which the same loop decodes: 48 latent channels, 16x in space
through a 2x2 output patch). `WanDecoder.from_weights` loads a local diffusers folder
or a single checkpoint;
`WanDecoder(vae)` wraps an `AutoencoderKLWan` loaded some other way. diffusers is
imported only when a model is loaded, so `import vaecast` never needs it.
"""

from __future__ import annotations

import copy
import dataclasses
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from vaecast.models.diffusers_family import DiffusersDecoder, DiffusersFamily, vae_lock
from vaecast.models.streaming import CausalChunking, CausalStream, Prepare
from vaecast.models.weights_io import (
    WeightsError,
    diffusers_class,
    load_strict,
    read_state_dict,
)

# A key only the original (non-diffusers) Wan checkpoint layout has.
ORIGINAL_LAYOUT_KEY = "decoder.middle.0.residual.0.gamma"
# Latent frames per decoder call (and chunk) after latent 0's, for Wan 2.2 on a CPU.
BLOCK_LATENTS = 4
# (a block of latent frames, pipeline space; the decoder's cache; whether it is the
# first) -> its frames.
_Step = Callable[[torch.Tensor, list[Any], bool], torch.Tensor]


def _missing_cache_counts(vae: Any) -> list[str]:
    counts = getattr(vae, "_cached_conv_counts", None)
    return (
        ['_cached_conv_counts["decoder"]'] if counts is not None and "decoder" not in counts else []
    )


def load_vae(
    weights: str | Path | None, config: Mapping[str, Any] | None = None, model: str = "wan2.1"
) -> Any:
    """`AutoencoderKLWan` from a local diffusers folder (the model's or its `vae/`) or one file.

    A single file (safetensors, or a weights-only `.pth` such as Wan's own
    `Wan2.1_VAE.pth`) may use diffusers' or the original Wan key layout; it is built
    with `config` (default: Wan 2.1's, which is the class's defaults). Never the hub.
    """
    family = WAN22 if model == WAN22.model else WAN21
    if weights is None:
        raise WeightsError(
            f"the {family.model} decoder needs --weights: a local diffusers folder of "
            f"{family.weights_of} (or its vae/ subfolder), or a single VAE checkpoint file"
        )
    path = Path(weights)
    if path.is_dir():
        return family.load(path)
    autoencoder_class = diffusers_class(family.model, family.class_name, family.requirement)
    state = read_state_dict(path)
    if ORIGINAL_LAYOUT_KEY in state:
        from diffusers.loaders.single_file_utils import convert_wan_vae_to_diffusers

        state = convert_wan_vae_to_diffusers(state)
    vae = autoencoder_class(**dict(config or {}))
    load_strict(vae, state, str(path))
    return vae


def decode_step(vae: Any, device: torch.device) -> Prepare:
    """Exactly pipeline_wan.py's expression and order (the reciprocal is taken after
    the cast), for bit parity with a pipeline's decode."""
    shape = (1, vae.config.z_dim, 1, 1, 1)
    dtype = vae.dtype
    mean = torch.tensor(vae.config.latents_mean).view(shape).to(device, dtype)
    std = 1.0 / torch.tensor(vae.config.latents_std).view(shape).to(device, dtype)
    return lambda latents: latents.to(device, dtype=dtype) / std + mean


def channels_last_modules(vae: Any) -> tuple[torch.nn.Module, torch.nn.Module]:
    """A private copy of `post_quant_conv` and the decoder with their 3-D convs'
    weights channels-last (`torch.channels_last_3d`).

    On a CPU, oneDNN's channels-last 3-D convolutions decode Wan 2.1's published
    architecture faster than the contiguous layout `from_pretrained` gives, within
    float rounding of it. A copy, so that the VAE a caller passed in decodes as
    before: it costs the decoder's weights once more (about 0.3 GB for Wan 2.1 in
    float32).
    """
    modules = copy.deepcopy(torch.nn.ModuleList([vae.post_quant_conv, vae.decoder]))
    for parameter in modules.parameters():
        if parameter.dim() == 5:
            parameter.data = parameter.data.contiguous(memory_format=torch.channels_last_3d)
    return modules[0], modules[1]


def chunking(
    vae: Any,
    device: torch.device,
    prepare: Prepare,
    channels_last: bool | None = None,
    block_latents: int | None = None,
) -> CausalChunking:
    """Latent 0's frame alone, then a chunk per `block_latents` latent frames (4 frames
    each, or the config's), each block one call of the decoder through the carried cache.

    The defaults are 1 latent frame a call, through the VAE's own modules: the
    pipeline's own calls, at its peak memory. On a CPU they are chosen per architecture
    by measurement (`benchmarks/results/design_notes.md`): Wan 2.1's (no output patch)
    decodes faster through `channels_last_modules` and no faster in blocks; Wan 2.2's
    (a 2x2 output patch) faster in blocks of `BLOCK_LATENTS` and slower channels-last.
    """
    config = vae.config
    patch_size = config.patch_size
    on_cpu = device.type == "cpu"
    if block_latents is None:
        block_latents = BLOCK_LATENTS if on_cpu and patch_size is not None else 1
    if channels_last is None:
        channels_last = on_cpu and patch_size is None
    if block_latents < 1:
        raise ValueError(f"block_latents must be at least 1, got {block_latents}")
    if channels_last:
        post_quant_conv, decoder = channels_last_modules(vae)
        layout = torch.channels_last_3d
    else:
        post_quant_conv, decoder = vae.post_quant_conv, vae.decoder
        layout = torch.contiguous_format

    def step(latents: torch.Tensor, cache: list[Any], first: bool) -> torch.Tensor:
        # The stream cuts the same blocks whatever blocks the latents came in, so a
        # whole decode and any split of a stream make the same calls, bit for bit.
        x = post_quant_conv(prepare(latents).contiguous(memory_format=layout))
        out = decoder(x, feat_cache=cache, feat_idx=[0], first_chunk=first)
        if patch_size is not None:
            from diffusers.models.autoencoders.autoencoder_kl_wan import unpatchify

            out = unpatchify(out, patch_size=patch_size)
        return torch.clamp(out, min=-1.0, max=1.0).contiguous()

    lock = vae_lock(vae)
    # Geometry from the architecture: 2x in space per upsampling stage (times the
    # output patch), 2x in time per temporal one.
    return CausalChunking(
        latent_channels=int(config.z_dim),
        spatial_scale=2 ** (len(config.dim_mult) - 1) * (patch_size or 1),
        temporal_scale=2 ** sum(bool(flag) for flag in config.temperal_downsample),
        open=lambda shape: _WanStream(vae, step, lock, device, block_latents),
        block_latents=block_latents,
    )


class _WanStream(CausalStream):
    """Its state: the decoder's causal-conv cache; it holds the VAE's lock throughout."""

    def __init__(
        self,
        vae: Any,
        step: _Step,
        lock: threading.Lock,
        device: torch.device,
        block_latents: int,
    ) -> None:
        super().__init__(device, vae.dtype, block_latents=block_latents)
        self._step: _Step | None = step
        self._cache: list[Any] = [None] * vae._cached_conv_counts["decoder"]
        self._lock: threading.Lock | None = lock
        lock.acquire()

    def step(self, latent: torch.Tensor, index: int) -> torch.Tensor:
        assert self._step is not None, "a closed stream decodes nothing"
        return self._step(latent, self._cache, index == 0)

    def close(self) -> None:
        super().close()
        self._cache = []
        self._step = None
        if self._lock is not None:
            self._lock, lock = None, self._lock
            lock.release()


# What vaecast drives of the model beyond diffusers' public API, on the versions whose
# `AutoencoderKLWan._decode` loop is the one we drive (0.35.0 and 0.42.1 are identical
# there).
WAN21 = DiffusersFamily(
    "wan2.1",
    "AutoencoderKLWan",
    "diffusers>=0.35,<0.43",
    attributes=("_cached_conv_counts", "post_quant_conv", "decoder", "clear_cache"),
    config_keys=(
        "latents_mean",
        "latents_std",
        "z_dim",
        "patch_size",
        "dim_mult",
        "temperal_downsample",
    ),
    signatures={"decoder.forward": ("x", "feat_cache", "feat_idx", "first_chunk")},
    weights_of="a Wan 2.1 model",
    more_checks=_missing_cache_counts,
    decode_step=decode_step,
    chunking=chunking,
    loader=load_vae,
    # A single-file checkpoint's model config (default: Wan 2.1's).
    load_options=("config",),
)
WAN22 = dataclasses.replace(
    WAN21,
    model="wan2.2",
    weights_of="a Wan 2.2 TI2V-5B model",
    loader=lambda weights, config=None: load_vae(weights, config, model="wan2.2"),
)


class WanDecoder(DiffusersDecoder):
    """Wan 2.1's VAE decoder under the chunk contract: 1 frame for latent 0, then 4 per latent."""

    family = WAN21


class Wan22Decoder(DiffusersDecoder):
    """`wan2.2`: the Wan 2.2 TI2V-5B VAE (48 latent channels, 16x in space: a 2x2 output
    patch), through Wan 2.1's loop, which reads both geometries from the config; a name
    of its own so that a server says which VAE it serves."""

    family = WAN22
