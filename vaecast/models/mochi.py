"""`mochi`: the Mochi 1 video VAE decoder, a chunk per latent frame, exact.

The model is diffusers' `AutoencoderKLMochi` (Apache-2.0; architecture by Genmo), as
`MochiPipeline` decodes with it. Each latent frame decodes to 6 frames (temporal
expansions 1 x 2 x 3), and `_decode` then drops the first 5 frames of the video
(`drop_last_temporal_frames`, on by default, despite its name): T latents give
6 T - 5 frames, latent 0 standing for one. 8x in space.

`_decode` has two paths. By default, and so in the pipeline, it decodes the whole clip
in one call. With `use_framewise_decoding` it decodes batches of
`num_latent_frames_batch_size` (2) latent frames, each as a clip of its own: Mochi's
convs pad in time with `pad_mode="replicate"`, which hands back no cache, so that path
is not the whole clip's (24 to 26 dB PSNR against it on random tiny weights).

This decoder streams the default path (`causal=True`, the default where the model's
structure allows it): the decoder is causal in time throughout, so
`vaecast.models.mochi_stream` runs it a latent frame at a time, carrying each causal
conv's last input frames, and each latent frame's 6 frames are final as soon as it has
arrived (1 for the first, after the 5 dropped). The chunks are `vae.decode`'s whole-clip
frames to float rounding (1e-6, tested at 1e-5), with the VAE's spatial tiling too
(`vae.enable_tiling()`: each tile carries its own caches and the tiles of each frame are
blended as `tiled_decode` blends them). A decoder whose structure is not the one that
pass repeats (`mochi_stream.check_decoder`) is streamed frame-wise instead, saying so in
one log line: `causal=False` turns `use_framewise_decoding` on for the VAE (so that
`vae.decode` decodes as it streams), drives that loop from outside
(`vaecast/models/frame_batches.py`) and publishes each batch: 7 frames for the first,
12 for each next, bit for bit the frame-wise `vae.decode`.

Latents are what `MochiPipeline` returns with `output_type="latent"` (BCTHW, the
transformer's space), denormalized exactly as its decode step writes it:
`latents * latents_std / scaling_factor + latents_mean` (or `latents / scaling_factor`
where the config has no mean and std).

Decodes may overlap on one VAE: the caches are values the decoder returns (and empty),
each decode keeps its own, and the loop writes no state on the module.

`MochiDecoder.from_weights` loads a local diffusers folder (the VAE's or a model's, with
`vae/`); `MochiDecoder(vae)` wraps an `AutoencoderKLMochi` loaded some other way.
diffusers is imported only when a model is loaded, so `import vaecast` never needs it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from vaecast.models import mochi_stream
from vaecast.models.base import DecodePlan, StreamPlan, check_latent_shape
from vaecast.models.diffusers_family import DiffusersFamily
from vaecast.models.frame_batches import BatchStream, CachedBatches, FrameBatches, SpatialTiles
from vaecast.models.streaming import StreamingDecoder
from vaecast.models.weights_io import WeightsError

# What vaecast drives of the model beyond diffusers' public API, on the versions whose
# `AutoencoderKLMochi._decode` and `tiled_decode` loops and pipeline decode step are
# the ones we drive (0.35.0 and 0.42.1 are identical there).
FAMILY = DiffusersFamily(
    "mochi",
    "AutoencoderKLMochi",
    "diffusers>=0.35,<0.43",
    attributes=(
        "decoder",
        "use_framewise_decoding",
        "num_latent_frames_batch_size",
        "drop_last_temporal_frames",
        "temporal_compression_ratio",
        "spatial_compression_ratio",
        "use_tiling",
        "tile_sample_min_height",
        "tile_sample_min_width",
        "tile_sample_stride_height",
        "tile_sample_stride_width",
        "blend_v",
        "blend_h",
    ),
    config_keys=("latent_channels", "latents_mean", "latents_std", "scaling_factor"),
    signatures={"decoder.forward": ("hidden_states", "conv_cache")},
    weights_of="Mochi",
)

log = logging.getLogger(__name__)


def check_internals(vae: Any) -> None:
    """Raise `WeightsError` if `vae` lacks the diffusers internals this decoder drives."""
    FAMILY.check(vae)


def load_vae(weights: str | Path | None) -> Any:
    """`AutoencoderKLMochi` from a local diffusers folder (the model's or its `vae/`)."""
    return FAMILY.load(weights)


class MochiDecoder(StreamingDecoder):
    """Mochi's VAE decoder under the chunk contract: a chunk per latent frame, the
    whole-clip decode's (causal), or a chunk per frame-wise batch (see the module
    docstring).

    `causal=None` streams causally where `mochi_stream.check_decoder` accepts the
    decoder, frame-wise otherwise; `False` streams frame-wise and turns
    `use_framewise_decoding` on for the VAE, so that `vae.decode` decodes as it streams.
    The batch size and `drop_last_temporal_frames` are read from the VAE when the
    decoder is built.
    """

    name = "mochi"
    value_range = (-1.0, 1.0)

    def __init__(
        self, vae: Any, device: str | torch.device = "cpu", causal: bool | None = None
    ) -> None:
        check_internals(vae)
        self.device = torch.device(device)
        # Its parameters keep `requires_grad` as loaded (diffusers leaves it on): with it
        # off, matmul folds Mochi's linear layers differently (~4e-7 in fp32 on CPU), and
        # the pipeline decodes with it on.
        self.vae = vae.to(self.device).eval()
        problems = mochi_stream.check_decoder(vae.decoder) if causal is not False else []
        if causal and problems:
            raise WeightsError(f"mochi cannot stream this decoder causally: {'; '.join(problems)}")
        self.causal = causal is not False and not problems
        if problems:
            log.warning(
                "mochi: streaming frame-wise, not exactly the whole-clip decode (%s)",
                "; ".join(problems),
            )
        if not self.causal:
            vae.use_framewise_decoding = True
        self.latent_channels = int(vae.config.latent_channels)
        self.spatial_scale = int(vae.spatial_compression_ratio)
        self.frames_per_latent = int(vae.temporal_compression_ratio)
        # `_decode` drops these leading frames once the decode has at least
        # `temporal_compression_ratio` frames, which every decode has.
        self.dropped_frames = self.frames_per_latent - 1 if vae.drop_last_temporal_frames else 0
        batch = 1 if self.causal else int(vae.num_latent_frames_batch_size)
        self.batches = FrameBatches(batch, remainder_first=False)
        self._mean, self._std = self._normalization()

    @classmethod
    def from_weights(
        cls, weights: str | Path | None, device: str | torch.device = "cpu"
    ) -> MochiDecoder:
        """Load the VAE from a local diffusers folder with `load_vae`."""
        return cls(load_vae(weights), device)

    def batch_frames(self, index: int, latent_frames: int) -> int:
        """The frames batch `index` of `latent_frames` latent frames decodes to."""
        frames = latent_frames * self.frames_per_latent
        return frames - self.dropped_frames if index == 0 else frames

    def plan(self, latent_shape: Sequence[int]) -> DecodePlan:
        _, _, t, h, w = check_latent_shape(latent_shape, self.latent_channels)
        height, width = self._output_size(h, w)
        chunk_frames = tuple(self.batch_frames(i, n) for i, n in enumerate(self.batches.sizes(t)))
        return DecodePlan(height=height, width=width, chunk_frames=chunk_frames)

    def plan_stream(self, first_block_shape: Sequence[int]) -> StreamPlan:
        _, _, _, h, w = check_latent_shape(first_block_shape, self.latent_channels)
        height, width = self._output_size(h, w)
        size = self.batches.size
        return StreamPlan(
            height=height,
            width=width,
            first_chunk_frames=self.batch_frames(0, size),
            chunk_frames=self.batch_frames(1, size),
            frames_per_latent=self.frames_per_latent,
            group_opening_frames=self.frames_per_latent - self.dropped_frames,
            latents_per_group=None,
        )

    def open_stream(self, first_block_shape: tuple[int, ...]) -> BatchStream:
        _, _, _, h, w = first_block_shape
        batches = CachedBatches(
            self._decode_tile, self._tiles(h, w), self.vae.blend_v, self.vae.blend_h
        )
        # The batches start at frame 0 whatever the length: a stream's are the whole's.
        return BatchStream(
            self.batches,
            lambda latents, index: batches(self._denormalize(latents), index),
            self.device,
            self.vae.dtype,
            close=batches.close,
        )

    def _normalization(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        config = self.vae.config
        if config.latents_mean is None or config.latents_std is None:
            return None, None
        # pipeline_mochi.py's tensors: built in float32, then cast to the latents' dtype.
        shape = (1, self.latent_channels, 1, 1, 1)
        dtype = self.vae.dtype
        mean = torch.tensor(config.latents_mean).view(shape).to(self.device, dtype)
        std = torch.tensor(config.latents_std).view(shape).to(self.device, dtype)
        return mean, std

    def _denormalize(self, latents: torch.Tensor) -> torch.Tensor:
        # pipeline_mochi.py's decode step, the same expression and order for bit parity.
        scaling_factor = self.vae.config.scaling_factor
        if self._mean is None or self._std is None:
            return latents / scaling_factor
        return latents * self._std / scaling_factor + self._mean

    def _decode_tile(
        self, latents: torch.Tensor, cache: Any, index: int
    ) -> tuple[torch.Tensor, Any]:
        if self.causal:
            cache = cache or mochi_stream.DecoderState()
            frames = mochi_stream.decode_step(self.vae.decoder, latents, cache)
        else:
            frames, cache = self.vae.decoder(latents, conv_cache=cache)
        if index == 0 and self.dropped_frames:
            frames = frames[:, :, self.dropped_frames :]
        return frames, cache

    def _tiles(self, height: int, width: int) -> SpatialTiles | None:
        """`tiled_decode`'s grid where `_decode` would take it for latents of this size."""
        vae = self.vae
        scale = self.spatial_scale
        # _decode's and tiled_decode's arithmetic, operation for operation.
        tile_latent_min_height = vae.tile_sample_min_height // scale
        tile_latent_min_width = vae.tile_sample_min_width // scale
        if not (
            vae.use_tiling and (width > tile_latent_min_width or height > tile_latent_min_height)
        ):
            return None
        return SpatialTiles(
            tile=(tile_latent_min_height, tile_latent_min_width),
            stride=(vae.tile_sample_stride_height // scale, vae.tile_sample_stride_width // scale),
            blend=(
                vae.tile_sample_min_height - vae.tile_sample_stride_height,
                vae.tile_sample_min_width - vae.tile_sample_stride_width,
            ),
            keep=(vae.tile_sample_stride_height, vae.tile_sample_stride_width),
            crop=(height * scale, width * scale),
        )

    def _output_size(self, height: int, width: int) -> tuple[int, int]:
        tiles = self._tiles(height, width)
        if tiles is None:
            return height * self.spatial_scale, width * self.spatial_scale
        return tiles.output_size(height, width, self.spatial_scale)
