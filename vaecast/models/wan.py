"""`wan2.1`: the Wan 2.1 video VAE decoder, a chunk per latent frame.

The model is diffusers' `AutoencoderKLWan` (Apache-2.0; architecture by the Wan team,
Alibaba). Its decoder is causal: `vae.decode` feeds latent frames one at a time
through `decoder(x[:, :, i:i+1], feat_cache=..., feat_idx=[0], first_chunk=(i == 0))`,
which carries the temporal convs' state in `feat_cache`, after `post_quant_conv`, and
clamps to [-1, 1]. Latent frame 0 gives 1 frame, each later one 4. We drive that same
loop from outside and publish each frame's output as a chunk, so the chunks
concatenate to `vae.decode` (tested; bit for bit where the CPU allows, see below).

The loop runs on a cache list of our own (`[None] * _cached_conv_counts["decoder"]`),
so it keeps no state on the module, and a stream keeps it between latent blocks.
`post_quant_conv` (a 1x1x1 conv, cheap at latent size) runs on one latent frame at a
time, in a whole decode as in a stream: `vae.decode` runs it once over all frames,
and over T frames at once the conv may pick another kernel than over one, which would
make a stream's output depend on how its blocks were split. So a stream equals a whole
decode bit for bit, however it was split; against `vae.decode` the chunks are equal
bit for bit where the CPU picks the same kernel for one frame as for all (one thread
on the Intel CPUs first measured), and within float rounding elsewhere (2.4e-7 on an
AMD EPYC, even on one thread). Latents come in pipeline space and are denormalized
exactly as the Wan pipelines write it (`latents / (1.0 / std) + mean`, for bit parity).

One decode per VAE instance at a time: concurrent decodes are *serialized* on a lock
held for the whole decode (including the callbacks; for a stream, from its first
block to its end, waits for the next block included). Our own cache list would make
overlapping decodes correct, but each holds a full set of activations and cache on
the device; serializing behaves like one decode slot for this model rather than
failing a job. A decode waiting for the lock starts once the running one ends or
is cancelled at its next chunk (or, for a stream, when its iterator raises).

`WanDecoder.from_weights` loads a local diffusers folder or a single checkpoint;
`WanDecoder(vae)` wraps an `AutoencoderKLWan` loaded some other way. diffusers is
imported only when a model is loaded, so `import vaecast` never needs it.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from vaecast.models.base import (
    DecodePlan,
    StreamPlan,
    causal_plan,
    causal_stream_plan,
)
from vaecast.models.diffusers_family import DiffusersFamily, vae_lock
from vaecast.models.streaming import CausalStream, StreamingDecoder
from vaecast.models.weights_io import (
    WeightsError,
    diffusers_class,
    load_strict,
    read_state_dict,
)

# What vaecast drives of the model beyond diffusers' public API, on the versions whose
# `AutoencoderKLWan._decode` loop is the one we drive (0.35.0 and 0.42.1 are identical
# there).
FAMILY = DiffusersFamily(
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
)
# A key only the original (non-diffusers) Wan checkpoint layout has.
ORIGINAL_LAYOUT_KEY = "decoder.middle.0.residual.0.gamma"


def check_internals(vae: Any) -> None:
    """Raise `WeightsError` if `vae` lacks the diffusers internals this decoder drives."""
    FAMILY.check(vae, _missing_cache_counts)


def _missing_cache_counts(vae: Any) -> list[str]:
    counts = getattr(vae, "_cached_conv_counts", None)
    return (
        ['_cached_conv_counts["decoder"]'] if counts is not None and "decoder" not in counts else []
    )


def load_vae(weights: str | Path, config: Mapping[str, Any] | None = None) -> Any:
    """`AutoencoderKLWan` from a local diffusers folder (the model's or its `vae/`) or one file.

    A single file (safetensors, or a weights-only `.pth` such as Wan's own
    `Wan2.1_VAE.pth`) may use diffusers' or the original Wan key layout; it is built
    with `config` (default: Wan 2.1's, which is the class's defaults). Never the hub.
    """
    path = Path(weights)
    if path.is_dir():
        return FAMILY.load(path)
    autoencoder_class = diffusers_class(FAMILY.model, FAMILY.class_name, FAMILY.requirement)
    state = read_state_dict(path)
    if ORIGINAL_LAYOUT_KEY in state:
        from diffusers.loaders.single_file_utils import convert_wan_vae_to_diffusers

        state = convert_wan_vae_to_diffusers(state)
    vae = autoencoder_class(**dict(config or {}))
    load_strict(vae, state, str(path))
    return vae


class WanDecoder(StreamingDecoder):
    """Wan 2.1's VAE decoder under the chunk contract: 1 frame for latent 0, then 4 per latent."""

    name = "wan2.1"
    value_range = (-1.0, 1.0)

    def __init__(self, vae: Any, device: str | torch.device = "cpu") -> None:
        check_internals(vae)
        self.device = torch.device(device)
        self.vae = vae.to(self.device).eval().requires_grad_(False)
        config = vae.config
        self.latent_channels = int(config.z_dim)
        self._patch_size = config.patch_size
        # Geometry from the architecture: 2x in space per upsampling stage (times the
        # output patch), 2x in time per temporal one.
        stages = len(config.dim_mult) - 1
        self.spatial_scale = 2**stages * (config.patch_size or 1)
        self.temporal_scale = 2 ** sum(bool(flag) for flag in config.temperal_downsample)
        self._lock = vae_lock(vae)

    @classmethod
    def from_weights(
        cls,
        weights: str | Path | None,
        device: str | torch.device = "cpu",
        config: Mapping[str, Any] | None = None,
    ) -> WanDecoder:
        """Load the VAE with `load_vae` (`config` is for a single-file checkpoint)."""
        if weights is None:
            raise WeightsError(
                "the wan2.1 decoder needs --weights: a local diffusers folder of a Wan 2.1 "
                "model (or its vae/ subfolder), or a single VAE checkpoint file"
            )
        return cls(load_vae(weights, config), device)

    def plan(self, latent_shape: Sequence[int]) -> DecodePlan:
        return causal_plan(
            latent_shape, self.latent_channels, self.spatial_scale, self.temporal_scale
        )

    def plan_stream(self, first_block_shape: Sequence[int]) -> StreamPlan:
        return causal_stream_plan(
            first_block_shape, self.latent_channels, self.spatial_scale, self.temporal_scale
        )

    def open_stream(self, first_block_shape: tuple[int, ...]) -> _WanStream:
        return _WanStream(self)

    def _denormalize(self, latents: torch.Tensor) -> torch.Tensor:
        # Exactly pipeline_wan.py's expression and order (the reciprocal is taken
        # after the cast), for bit parity with a pipeline's decode.
        vae = self.vae
        latents = latents.to(self.device, dtype=vae.dtype)
        shape = (1, vae.config.z_dim, 1, 1, 1)
        mean = torch.tensor(vae.config.latents_mean).view(shape).to(latents.device, latents.dtype)
        std = 1.0 / torch.tensor(vae.config.latents_std).view(shape).to(
            latents.device, latents.dtype
        )
        return latents / std + mean

    def step(self, latent: torch.Tensor, cache: list[Any], first: bool) -> torch.Tensor:
        """One latent frame (1, C, 1, h, w), pipeline space, through the decoder."""
        vae = self.vae
        # One frame at a time, in every decode: over T frames at once this 1x1x1 conv
        # may pick another kernel (it does for 1x1 latents, and for larger ones with
        # more than one thread), so a stream's blocks would change its rounding.
        x = vae.post_quant_conv(self._denormalize(latent))
        out = vae.decoder(x, feat_cache=cache, feat_idx=[0], first_chunk=first)
        if self._patch_size is not None:
            from diffusers.models.autoencoders.autoencoder_kl_wan import unpatchify

            out = unpatchify(out, patch_size=self._patch_size)
        return torch.clamp(out, min=-1.0, max=1.0)


class _WanStream(CausalStream):
    """Its state: the decoder's causal-conv cache; it holds the VAE's lock throughout."""

    def __init__(self, decoder: WanDecoder) -> None:
        super().__init__(decoder.device, decoder.vae.dtype)
        self._decoder = decoder
        self._cache: list[Any] = [None] * decoder.vae._cached_conv_counts["decoder"]
        self._lock: threading.Lock | None = decoder._lock
        self._lock.acquire()

    def step(self, latent: torch.Tensor, index: int) -> torch.Tensor:
        return self._decoder.step(latent, self._cache, first=index == 0)

    def close(self) -> None:
        super().close()
        self._cache = []
        if self._lock is not None:
            self._lock, lock = None, self._lock
            lock.release()


class Wan22Decoder(WanDecoder):
    """`wan2.2`: the Wan 2.2 TI2V-5B VAE (48 latent channels, 16x in space: a 2x2 output
    patch). The same causal loop as Wan 2.1's, which reads both geometries from the
    config; a name of its own so that a server says which VAE it serves."""

    name = "wan2.2"

    @classmethod
    def from_weights(
        cls,
        weights: str | Path | None,
        device: str | torch.device = "cpu",
        config: Mapping[str, Any] | None = None,
    ) -> WanDecoder:
        if weights is None:
            raise WeightsError(
                "the wan2.2 decoder needs --weights: a local diffusers folder of a Wan 2.2 "
                "TI2V-5B model (or its vae/ subfolder)"
            )
        return cls(load_vae(weights, config), device)
