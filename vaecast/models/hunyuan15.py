"""`hunyuan-video-1.5`: HunyuanVideo 1.5's video VAE decoder, streamed causally in blocks.

The model is diffusers' `AutoencoderKLHunyuanVideo15` (Apache-2.0; architecture by the
Hunyuan team, Tencent). Both of its pipelines (`HunyuanVideo15Pipeline`,
`HunyuanVideo15ImageToVideoPipeline`) decode with
`vae.decode(latents.to(vae.dtype) / vae.config.scaling_factor)`, and `vae.decode` is one
whole-clip `decoder(z)` (spatially tiled by `tiled_decode` only when the VAE's tiling
is enabled and the latents are larger than a tile). Its decoder is causal in time
(causal 3-D convs, channel-only RMS norms, a mid-block attention masked to earlier
frames, temporal upsamplers that treat the first frame apart), so
`vaecast/models/hunyuan15_stream.py` runs it a few latent frames at a time, carrying
each causal conv's last input frames and the attention's earlier keys and values
between steps: latent frame 0 alone (1 frame, published at once), then blocks of
`block_latents` (4 by default: 16 frames a chunk), each published as soon as it is
decoded (the real model: 4x in time, 16x in space, 32 latent channels; all read from
the VAE). A step over several frames costs less per frame than one per frame (the
figures are in `benchmarks/results/design_notes.md`); `block_latents=1` gives a chunk per
latent frame. The work is one decode's: each
step's attention scores only the keys its queries may see, where `decoder(z)` builds
a full (T*h*w)^2 mask. (On a CPU, PyTorch runs a conv over few frames of a *small*
tensor with its slow reference kernel rather than oneDNN, so a tiny model streams 2-3x
slower than `vae.decode`; at the real model's widths it picks oneDNN either way.)

Not bit-identical to `vae.decode`, but within its rounding: over a latent frame at a
time the kernels may round differently than over the whole clip (a conv's algorithm,
an attention's reduction, are chosen by shape): measured max abs difference up to 6e-6
in fp32 (outputs up to ~4; often 0), tested with `torch.allclose(atol=1e-5)`. Every
decode runs the same steps, so a stream's chunks are bit-identical to `decode` however
its blocks were split.

Spatial tiling, when the wrapped VAE has it enabled (`vae.enable_tiling()`, as the
pipelines' examples do; the state is read when the decoder is built), runs the same way
per tile: each tile of `tiled_decode`'s grid has its own carried state, and each step's
tiles are blended with the VAE's own `blend_v`/`blend_h` and cropped as
`tiled_decode` does (those act on each frame alone). A VAE loaded from a folder starts
untiled, as the pipelines' default (`from_weights(..., spatial_tiling=True)` tiles it).

Latents come in pipeline space (what the pipeline returns with `output_type="latent"`,
BCTHW) and are scaled exactly as the pipelines write it, for bit parity. Frames are
`vae.decode`'s, unclamped: nominally in [-1, 1], which the pipeline's video processor
then maps to [0, 1] with a clamp, as the quantizer here clamps to `value_range`.

One decode per VAE instance at a time: concurrent decodes are *serialized* on a lock
held for the whole decode (including the callbacks; for a stream, from its first block
to its end, waits for the next block included). The carried state is the decode's own
(nothing is kept on the module), so overlapping decodes would be correct, but each
holds a full set of activations and the attention's keys on the device; serializing
behaves like one decode slot for this model rather than failing a job.

The decoder is `DiffusersDecoder` with this family's spec (`FAMILY`):
`HunyuanVideo15Decoder.from_weights` loads a local diffusers folder;
`HunyuanVideo15Decoder(vae)` wraps an `AutoencoderKLHunyuanVideo15` loaded some other
way. diffusers is imported only when a model is loaded, so `import vaecast` never needs
it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from vaecast.models import hunyuan15_stream
from vaecast.models.diffusers_family import DiffusersDecoder, DiffusersFamily, vae_lock
from vaecast.models.hunyuan15_stream import DecoderState, check_decoder
from vaecast.models.streaming import CausalChunking, CausalStream, Prepare
from vaecast.models.weights_io import WeightsError

# Latent frames per step and chunk after latent 0's: the causal pass spends less per
# frame on blocks (measured: benchmarks/results/design_notes.md).
BLOCK_LATENTS = 4


def load_vae(weights: str | Path | None, spatial_tiling: bool = False) -> Any:
    """`AutoencoderKLHunyuanVideo15` from a local diffusers folder (the model's or its
    `vae/`); `spatial_tiling` decodes as a pipeline does after `vae.enable_tiling()`
    (diffusers' default tiles)."""
    vae = FAMILY.load(weights)
    if spatial_tiling:
        vae.enable_tiling()
    return vae


def decode_step(vae: Any, device: torch.device) -> Prepare:
    """Exactly the pipelines' expression, the cast to the VAE's dtype first, for bit
    parity with a pipeline's decode."""
    scaling_factor = vae.config.scaling_factor
    return lambda latents: latents.to(device, vae.dtype) / scaling_factor


def chunking(
    vae: Any, device: torch.device, prepare: Prepare, block_latents: int = BLOCK_LATENTS
) -> CausalChunking:
    """Latent 0's frame alone, then a chunk per `block_latents` latent frames (4 frames
    each), each block one step of the causal pass; tiled where the VAE's tiling (as it
    is now) applies to the latents."""
    if block_latents < 1:
        raise ValueError(f"block_latents must be at least 1, got {block_latents}")
    # Geometry from the architecture: 2x in space per upsampler, 2x in time per
    # temporal one; refuse a config that says otherwise.
    upsamplers = [
        upsampler
        for block in vae.decoder.up_blocks
        if block.upsamplers is not None
        for upsampler in block.upsamplers
    ]
    spatial_scale = 2 ** len(upsamplers)
    temporal_scale = 2 ** sum(bool(u.add_temporal_upsample) for u in upsamplers)
    ratios = (int(vae.spatial_compression_ratio), int(vae.temporal_compression_ratio))
    if ratios != (spatial_scale, temporal_scale):
        raise WeightsError(
            f"unsupported HunyuanVideo 1.5 geometry: its decoder upsamples "
            f"{spatial_scale}x in space and {temporal_scale}x in time, its "
            f"config says {ratios[0]}x and {ratios[1]}x"
        )
    tiling = SpatialTiling.of(vae)
    lock = vae_lock(vae)

    def applies(height: int, width: int) -> SpatialTiling | None:
        return tiling if tiling is not None and tiling.applies(height, width) else None

    def frame_size(height: int, width: int) -> tuple[int, int] | None:
        tiles = applies(height, width)
        return None if tiles is None else tiles.output_size(height, width, spatial_scale)

    return CausalChunking(
        latent_channels=int(vae.config.latent_channels),
        spatial_scale=spatial_scale,
        temporal_scale=temporal_scale,
        open=lambda shape: _HunyuanVideo15Stream(
            vae, prepare, applies(shape[3], shape[4]), lock, device, block_latents
        ),
        frame_size=frame_size,
        block_latents=block_latents,
    )


@dataclass(frozen=True, slots=True)
class SpatialTiling:
    """`tiled_decode`'s grid, as the VAE's tiling settings were when the decoder was built."""

    latent_height: int  # tile_latent_min_height
    latent_width: int
    sample_height: int  # tile_sample_min_height
    sample_width: int
    overlap_factor: float

    @classmethod
    def of(cls, vae: Any) -> SpatialTiling | None:
        if not vae.use_tiling:
            return None
        return cls(
            int(vae.tile_latent_min_height),
            int(vae.tile_latent_min_width),
            int(vae.tile_sample_min_height),
            int(vae.tile_sample_min_width),
            float(vae.tile_overlap_factor),
        )

    def applies(self, height: int, width: int) -> bool:
        """Whether `_decode` tiles latents of this size (it does past one tile)."""
        return width > self.latent_width or height > self.latent_height

    # The arithmetic below is `tiled_decode`'s, expression for expression.
    @property
    def latent_strides(self) -> tuple[int, int]:
        return (
            int(self.latent_height * (1 - self.overlap_factor)),
            int(self.latent_width * (1 - self.overlap_factor)),
        )

    @property
    def blend_extents(self) -> tuple[int, int]:
        return (
            int(self.sample_height * self.overlap_factor),
            int(self.sample_width * self.overlap_factor),
        )

    @property
    def row_limits(self) -> tuple[int, int]:
        blend_height, blend_width = self.blend_extents
        return self.sample_height - blend_height, self.sample_width - blend_width

    def output_size(self, height: int, width: int, scale: int) -> tuple[int, int]:
        """The frame size `tiled_decode` gives latents of this size."""
        stride_h, stride_w = self.latent_strides
        limit_h, limit_w = self.row_limits
        rows = sum(
            min(min(self.latent_height, height - i) * scale, limit_h)
            for i in range(0, height, stride_h)
        )
        columns = sum(
            min(min(self.latent_width, width - j) * scale, limit_w)
            for j in range(0, width, stride_w)
        )
        return rows, columns


def tiled_step(
    vae: Any, z: torch.Tensor, tiling: SpatialTiling, states: dict[tuple[int, int], DecoderState]
) -> torch.Tensor:
    """One step of `tiled_decode`: each tile's frames, blended and cropped."""
    _, _, _, height, width = z.shape
    stride_h, stride_w = tiling.latent_strides
    blend_height, blend_width = tiling.blend_extents
    row_limit_height, row_limit_width = tiling.row_limits
    rows = []
    for i in range(0, height, stride_h):
        row = []
        for j in range(0, width, stride_w):
            tile = z[:, :, :, i : i + tiling.latent_height, j : j + tiling.latent_width]
            state = states.setdefault((i, j), DecoderState())
            row.append(hunyuan15_stream.decode_step(vae.decoder, tile, state))
        rows.append(row)
    result_rows = []
    for i, row in enumerate(rows):
        result_row = []
        for j, tile in enumerate(row):
            if i > 0:
                tile = vae.blend_v(rows[i - 1][j], tile, blend_height)
            if j > 0:
                tile = vae.blend_h(row[j - 1], tile, blend_width)
            result_row.append(tile[:, :, :, :row_limit_height, :row_limit_width])
        result_rows.append(torch.cat(result_row, dim=-1))
    return torch.cat(result_rows, dim=-2)


class _HunyuanVideo15Stream(CausalStream):
    """Its state: each tile's carried conv frames and attention keys (one tile when
    untiled); it holds the VAE's lock throughout."""

    def __init__(
        self,
        vae: Any,
        prepare: Prepare,
        tiling: SpatialTiling | None,
        lock: threading.Lock,
        device: torch.device,
        block_latents: int,
    ) -> None:
        super().__init__(device, vae.dtype, block_latents=block_latents)
        self._vae = vae
        self._prepare = prepare
        self._tiling = tiling
        self._state = DecoderState()
        self._tiles: dict[tuple[int, int], DecoderState] = {}
        self._lock: threading.Lock | None = lock
        lock.acquire()

    def step(self, latent: torch.Tensor, index: int) -> torch.Tensor:
        z = self._prepare(latent)
        if self._tiling is None:
            return hunyuan15_stream.decode_step(self._vae.decoder, z, self._state)
        return tiled_step(self._vae, z, self._tiling, self._tiles)

    def close(self) -> None:
        super().close()
        self._state.clear()
        for state in self._tiles.values():
            state.clear()
        self._tiles = {}
        if self._lock is not None:
            self._lock, lock = None, self._lock
            lock.release()


# What vaecast drives of the model beyond diffusers' public API. The class arrived in
# diffusers 0.36; the stream pass repeats its 0.42.1 forwards, and `check_internals`
# checks the structure they rely on.
FAMILY = DiffusersFamily(
    "hunyuan-video-1.5",
    "AutoencoderKLHunyuanVideo15",
    "diffusers>=0.36,<0.43",
    attributes=(
        "decoder",
        "use_tiling",
        "tile_latent_min_height",
        "tile_latent_min_width",
        "tile_sample_min_height",
        "tile_sample_min_width",
        "tile_overlap_factor",
        "blend_v",
        "blend_h",
        "tiled_decode",
        "enable_tiling",
        "spatial_compression_ratio",
        "temporal_compression_ratio",
    ),
    config_keys=("latent_channels", "scaling_factor"),
    weights_of="a HunyuanVideo 1.5 model",
    more_checks=lambda vae: check_decoder(vae.decoder) if hasattr(vae, "decoder") else [],
    decode_step=decode_step,
    chunking=chunking,
    loader=load_vae,
    load_options=("spatial_tiling",),
)


class HunyuanVideo15Decoder(DiffusersDecoder):
    """HunyuanVideo 1.5's VAE decoder under the chunk contract: 1 frame for latent 0, then
    4 per latent."""

    family = FAMILY
