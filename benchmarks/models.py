"""`python -m benchmarks.models`: each diffusers video VAE vaecast serves, streamed over HTTP
against the decoder alone and against the pipeline's own decode and export, on the same latents.

    python -m benchmarks.models [--models wan2.1,wan2.2,...] [--repeats 3] [--out DIR]

Per model, with the model's real architecture (the diffusers class's default config, which
is the published model's; Wan 2.2 TI2V-5B's and LTX-2's published VAE configs where the
defaults are another model's) and seeded random weights, saved with `save_pretrained` to a
cache folder and loaded from it by `get_decoder(name, weights=FOLDER)`, as a server loads
it; latents are seeded N(0, 1) in the pipeline's own layout, of 33 frames (37 for Mochi,
whose latents stand for 6 frames; 34 for MiniMax-H3) at 256x256 for every model
(`ModelSpec.latent_shape`, in the results), and LTX-Video, LTX-2 and MiniMax-H3 at their
pipelines' default lengths as well (rows `ltx-video-161`, `ltx-2-121`, `minimax-h3-124`):
where per-call overhead no longer hides what a decode costs, and an exact first chunk needs
a smaller share of it. On a 2-core CPU one decode there takes from a quarter of a minute
(LTX-Video) to several minutes (HunyuanVideo 1.5), so each model's arms decode the whole
clip three times in all, and a run of every model takes hours.

- geometry: latent channels, spatial and temporal compression, and the frames per chunk
  of the benchmarked latents, from the decoder's plan (checked against the chunks);
- exactness: the decoder's chunks, concatenated, against `vae.decode` as the pipeline's
  decode step calls it: the pipeline arm's first decode, so no decode runs only to be
  compared (max abs difference; PSNR, over frames clamped to `value_range`, where not
  bit-identical); where the decoder changes the VAE's decode switches (none of the
  built-in decoders does by default: the column then says "same path") also against
  the decode step on the decoder's path;
- the chunk plan's cost: the chunks decoded whole in this process (their first run,
  outside the pairs) over the pipeline arm's decode step;
- TTFF ratio: `vaecast serve`'s time to the first fragment over HTTP (a real subprocess
  on 127.0.0.1 --port 0: request sent to the first moof + mdat received; the client then
  cancels the job with DELETE, which returns once its decode has stopped) over the same
  decoder's time to its first chunk in this process (`decode_chunks` stopped there);
- total ratio: `vaecast serve`'s time to the last byte of the whole MP4 over what a user
  runs today on the same latents: the pipeline's decode step, written as its source
  writes it (denormalisation or unpacking, then `vae.decode` on the VAE as loaded), then
  `video_processor.postprocess_video(video, output_type="np")`, then
  `diffusers.utils.export_to_video(frames, path, fps=16)`.

Arms run strictly one after another (this process never decodes while the server does)
and are paired as `benchmarks.paired` pairs them: each repeat runs vaecast back to back
with each of the two in-process arms, the order rotated from repeat to repeat
(`paired.schedule`); each ratio is computed within its pair, and the report gives the
median of the per-repeat ratios with their IQR, and the raw seconds. Before the repeats,
unmeasured: one stream from the server to its first fragment (its frame count is checked
on each whole stream), and the chunks' decode, which warms up the in-process arms. Torch's
threads are left at their default in both processes, as `vaecast serve` leaves them.

The weights are safetensors files, which diffusers maps (mmap) rather than reads: the
server and this process then share one copy in the page cache, and every model is
measured in back-to-back pairs. The pages are read in before anything is timed in this
process (`read_in`), as the server's warm-up reads them in there, so no arm pays for
reading the weights from disk. Where this process does not map its weights (the results
say `weights_shared`), a VAE that would not fit twice in this machine's memory is
measured with one copy at a time: vaecast's arms first, with this process holding no
weights, then the in-process arms, so each ratio is within its repeat but its pair not
back to back (the results say `one_copy`). A model that does not fit once is
skipped with the reason written in the results, as is a model whose decoder module is
missing or fails. Writes `models.json` and `models.md` to --out after each
model; `--keep-others` keeps the rows there of the models not measured now.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import gc
import hashlib
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import torch

from benchmarks import load, paired, report
from benchmarks.__main__ import _load, _machine
from benchmarks.arms import now_utc
from benchmarks.client import (
    REPO,
    announced_process,
    client_session,
    count_frames,
    latents_body,
    receive,
    vaecast_serve_url,
)
from vaecast.codecs.fmp4_reader import TopLevelBoxSplitter
from vaecast.codecs.h264 import EncoderSettings

DEFAULT_OUT = Path(__file__).resolve().parent / "results"
FPS = 16
SEED = 0
DEFAULT_REPEATS = 3
FIRST_CHUNK = "first_chunk"
PIPELINE = "pipeline"
PEERS = (FIRST_CHUNK, PIPELINE)
# The server's copy and ours, each the size of the weights, plus activations and the rest
# of the machine: a model needs this many times its weights' bytes of available memory.
MEMORY_FACTOR = 2.5
# One copy at a time (`measure_model`'s `one_copy`): the weights, activations, the rest.
ONE_COPY_FACTOR = 1.6
# What a streamed decode must beat, as shares of the pipeline's decode + export time.
FIRST_FRAGMENT_TARGET = 0.5
LAST_BYTE_TARGET = 1.0

DecodeStep = Callable[[Any, torch.Tensor, "ModelSpec"], torch.Tensor]


# ---------------------------------------------------------------------------
# The models


@dataclass(frozen=True)
class ModelSpec:
    """One model as benchmarked: its VAE, its latents, and its pipeline's decode step."""

    name: str  # the `vaecast serve --model` name
    vae_class: str  # the diffusers class
    pipeline: str  # where the decode step below is written, as quoted in the results
    decode_step: DecodeStep  # (vae, latents as the pipeline returns them, spec) -> video
    latent_shape: tuple[int, int, int, int]  # C, T, h, w (BCTHW, batch 1)
    # On top of the class's defaults: what makes them the published model's, and fixed
    # latent statistics (any values, not the identity, so the denormalisation counts).
    config: Mapping[str, Any] = field(default_factory=dict)
    # Buffers set after construction (LTX keeps its latent statistics in buffers).
    buffers: Mapping[str, Sequence[float]] = field(default_factory=dict)
    spatial_scale: int = 8
    temporal_scale: int = 4
    # The pipeline's VideoProcessor: whether it maps [-1, 1] to [0, 1].
    do_normalize: bool = True
    # BCTHW latents -> the layout the pipeline returns with output_type="latent".
    pack: Callable[[torch.Tensor], torch.Tensor] = lambda latents: latents
    # Request parameters the layout needs (the pipeline call's num_frames, height, width).
    needs_geometry: bool = False
    # Its row's name where a model is measured at more than one length (else `name`).
    label: str = ""

    @property
    def key(self) -> str:
        """The row's name, and `--models`'."""
        return self.label or self.name

    @property
    def frames(self) -> int:
        """The pipeline call's num_frames for these latents."""
        return (self.latent_shape[1] - 1) * self.temporal_scale + 1

    def params(self) -> dict[str, str]:
        if not self.needs_geometry:
            return {}
        _, _, h, w = self.latent_shape
        return {
            "num_frames": str(self.frames),
            "height": str(h * self.spatial_scale),
            "width": str(w * self.spatial_scale),
        }

    def latents(self) -> torch.Tensor:
        """Seeded BCTHW latents in pipeline space."""
        generator = torch.Generator().manual_seed(SEED)
        return torch.randn(1, *self.latent_shape, generator=generator)


def _stats(channels: int, period: int, low: float, step: float) -> list[float]:
    return [round(low + step * (i % period), 4) for i in range(channels)]


def _wan_step(vae: Any, latents: torch.Tensor, spec: ModelSpec) -> torch.Tensor:
    # pipeline_wan.py (WanPipeline.__call__), its order and expressions.
    latents = latents.to(dtype=vae.dtype)
    latents_mean = (
        torch.tensor(vae.config.latents_mean)
        .view(1, vae.config.z_dim, 1, 1, 1)
        .to(latents.device, latents.dtype)
    )
    latents_std = 1.0 / torch.tensor(vae.config.latents_std).view(1, vae.config.z_dim, 1, 1, 1).to(
        latents.device, latents.dtype
    )
    latents = latents / latents_std + latents_mean
    return vae.decode(latents, return_dict=False)[0]


# MiniMaxH3ModularPipeline.pixel_mean / pixel_std (ImageNet's).
_IMAGENET_MEAN = (0.485, 0.456, 0.406)
_IMAGENET_STD = (0.229, 0.224, 0.225)


def _minimax_step(vae: Any, latents: torch.Tensor, spec: ModelSpec) -> torch.Tensor:
    # modular_pipelines/minimax_h3/decoders.py (MiniMaxH3VideoDecodeStep.__call__).
    device = latents.device
    latents_mean = torch.tensor(vae.config.latents_mean, device=device).view(1, -1, 1, 1, 1)
    latents_std = torch.tensor(vae.config.latents_std, device=device).view(1, -1, 1, 1, 1)
    latents = latents * latents_std + latents_mean
    video = vae.decode(latents, return_dict=False)[0]
    pixel_mean = torch.tensor(_IMAGENET_MEAN, device=device).view(1, -1, 1, 1, 1)
    pixel_std = torch.tensor(_IMAGENET_STD, device=device).view(1, -1, 1, 1, 1)
    return (video.float() * pixel_std + pixel_mean).clamp(0, 1)


def _hunyuan_step(vae: Any, latents: torch.Tensor, spec: ModelSpec) -> torch.Tensor:
    # pipeline_hunyuan_video.py and pipeline_hunyuan_video1_5.py, the same two lines.
    latents = latents.to(vae.dtype) / vae.config.scaling_factor
    return vae.decode(latents, return_dict=False)[0]


def _ltx_timestep(vae: Any, latents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The pipelines' decode-time conditioning at their defaults (decode_timestep 0.0,
    decode_noise_scale = decode_timestep)."""
    if not vae.config.timestep_conditioning:
        return latents, None
    generator = torch.Generator(latents.device).manual_seed(SEED)
    noise = torch.randn(latents.shape, generator=generator, dtype=latents.dtype)
    timestep = torch.tensor([0.0], device=latents.device, dtype=latents.dtype)
    scale = torch.tensor([0.0], device=latents.device, dtype=latents.dtype)[
        :, None, None, None, None
    ]
    return (1 - scale) * latents + scale * noise, timestep


def _ltx_step(vae: Any, latents: torch.Tensor, spec: ModelSpec) -> torch.Tensor:
    # pipeline_ltx.py (LTXPipeline.__call__): unpack, denormalize, decode.
    from diffusers import LTXPipeline

    _, t, h, w = spec.latent_shape
    latents = LTXPipeline._unpack_latents(latents, t, h, w, 1, 1)
    latents = LTXPipeline._denormalize_latents(
        latents, vae.latents_mean, vae.latents_std, vae.config.scaling_factor
    )
    latents = latents.to(torch.float32)  # prompt_embeds' dtype
    latents, timestep = _ltx_timestep(vae, latents)
    latents = latents.to(vae.dtype)
    return vae.decode(latents, timestep, return_dict=False)[0]


def _ltx2_step(vae: Any, latents: torch.Tensor, spec: ModelSpec) -> torch.Tensor:
    # pipeline_ltx2.py returns its latents unpacked and already denormalized with
    # output_type="latent"; what its decode branch does after that: cast and decode.
    latents, timestep = _ltx_timestep(vae, latents.to(torch.float32))
    latents = latents.to(vae.dtype)
    return vae.decode(latents, timestep, return_dict=False)[0]


def _cogvideox_step(vae: Any, latents: torch.Tensor, spec: ModelSpec) -> torch.Tensor:
    # pipeline_cogvideox.py: `latents[:, additional_frames:]` (0 for CogVideoX 1.0), then
    # CogVideoXPipeline.decode_latents.
    latents = latents.permute(0, 2, 1, 3, 4)
    latents = 1 / vae.config.scaling_factor * latents
    return vae.decode(latents).sample


def _mochi_step(vae: Any, latents: torch.Tensor, spec: ModelSpec) -> torch.Tensor:
    # pipeline_mochi.py (MochiPipeline.__call__), its order and expressions.
    has_latents_mean = hasattr(vae.config, "latents_mean") and vae.config.latents_mean is not None
    has_latents_std = hasattr(vae.config, "latents_std") and vae.config.latents_std is not None
    if has_latents_mean and has_latents_std:
        latents_mean = (
            torch.tensor(vae.config.latents_mean)
            .view(1, 12, 1, 1, 1)
            .to(latents.device, latents.dtype)
        )
        latents_std = (
            torch.tensor(vae.config.latents_std)
            .view(1, 12, 1, 1, 1)
            .to(latents.device, latents.dtype)
        )
        latents = latents * latents_std / vae.config.scaling_factor + latents_mean
    else:
        latents = latents / vae.config.scaling_factor
    return vae.decode(latents, return_dict=False)[0]


def _pack_ltx(latents: torch.Tensor) -> torch.Tensor:
    from diffusers import LTXPipeline

    return LTXPipeline._pack_latents(latents, 1, 1)


def _btchw(latents: torch.Tensor) -> torch.Tensor:
    return latents.permute(0, 2, 1, 3, 4).contiguous()


# Wan 2.2 TI2V-5B's published VAE (Wan-AI/Wan2.2-TI2V-5B-Diffusers, vae/config.json).
WAN22_CONFIG: dict[str, Any] = {
    "base_dim": 160,
    "decoder_base_dim": 256,
    "z_dim": 48,
    "dim_mult": [1, 2, 4, 4],
    "num_res_blocks": 2,
    "attn_scales": [],
    "temperal_downsample": [False, True, True],
    "dropout": 0.0,
    "is_residual": True,
    "in_channels": 12,
    "out_channels": 12,
    "patch_size": 2,
    "scale_factor_spatial": 16,
    "scale_factor_temporal": 4,
}
# LTX-2's published video VAE: the class defaults but these (diffusers'
# scripts/convert_ltx2_to_diffusers.py, version "2.0").
LTX2_CONFIG: dict[str, Any] = {
    "decoder_causal": False,
    "spatial_compression_ratio": 32,
    "temporal_compression_ratio": 8,
}

# Both LTX VAEs keep their latent statistics in buffers.
LTX_STATS = {
    "latents_mean": _stats(128, 5, -0.2, 0.1),
    "latents_std": _stats(128, 4, 0.6, 0.1),
}
LTX_VIDEO = ModelSpec(
    "ltx-video",
    "AutoencoderKLLTXVideo",
    "diffusers/pipelines/ltx/pipeline_ltx.py",
    _ltx_step,
    (128, 5, 8, 8),
    buffers=LTX_STATS,
    spatial_scale=32,
    temporal_scale=8,
    pack=_pack_ltx,
    needs_geometry=True,
)
LTX_2 = ModelSpec(
    "ltx-2",
    "AutoencoderKLLTX2Video",
    "diffusers/pipelines/ltx2/pipeline_ltx2.py",
    _ltx2_step,
    (128, 5, 8, 8),
    config=LTX2_CONFIG,
    buffers=LTX_STATS,
    spatial_scale=32,
    temporal_scale=8,
)

MINIMAX_H3 = ModelSpec(
    "minimax-h3",
    "AutoencoderKLMiniMaxH3",
    "diffusers/modular_pipelines/minimax_h3/decoders.py",
    _minimax_step,
    (24, 10, 16, 16),
    config={
        "latents_mean": _stats(24, 5, -0.2, 0.1),
        "latents_std": _stats(24, 4, 0.6, 0.1),
    },
    spatial_scale=16,
    do_normalize=False,
)

SPECS: dict[str, ModelSpec] = {
    spec.key: spec
    for spec in (
        ModelSpec(
            "wan2.1",
            "AutoencoderKLWan",
            "diffusers/pipelines/wan/pipeline_wan.py",
            _wan_step,
            (16, 9, 32, 32),
            config={
                "latents_mean": _stats(16, 5, -0.2, 0.1),
                "latents_std": _stats(16, 7, 0.5, 0.1),
            },
        ),
        ModelSpec(
            "wan2.2",
            "AutoencoderKLWan",
            "diffusers/pipelines/wan/pipeline_wan.py",
            _wan_step,
            (48, 9, 16, 16),
            config={
                **WAN22_CONFIG,
                "latents_mean": _stats(48, 5, -0.2, 0.1),
                "latents_std": _stats(48, 4, 0.6, 0.1),
            },
            spatial_scale=16,
        ),
        MINIMAX_H3,
        # And at its pipeline's default length: 124 frames (`num_frames` of the form
        # 17 n + 5, n = 7), 37 latents: seven of its decoder's windows, not two.
        dataclasses.replace(MINIMAX_H3, latent_shape=(24, 37, 16, 16), label="minimax-h3-124"),
        ModelSpec(
            "hunyuan-video",
            "AutoencoderKLHunyuanVideo",
            "diffusers/pipelines/hunyuan_video/pipeline_hunyuan_video.py",
            _hunyuan_step,
            (16, 9, 32, 32),
        ),
        ModelSpec(
            "hunyuan-video-1.5",
            "AutoencoderKLHunyuanVideo15",
            "diffusers/pipelines/hunyuan_video1_5/pipeline_hunyuan_video1_5.py",
            _hunyuan_step,
            (32, 9, 16, 16),
            spatial_scale=16,
        ),
        LTX_VIDEO,
        LTX_2,
        # And at their pipelines' default lengths (LTXPipeline: 161 frames, LTX2Pipeline:
        # 121), where an exact first chunk needs a smaller share of the decode.
        dataclasses.replace(LTX_VIDEO, latent_shape=(128, 21, 8, 8), label="ltx-video-161"),
        dataclasses.replace(LTX_2, latent_shape=(128, 16, 8, 8), label="ltx-2-121"),
        ModelSpec(
            "cogvideox",
            "AutoencoderKLCogVideoX",
            "diffusers/pipelines/cogvideo/pipeline_cogvideox.py",
            _cogvideox_step,
            (16, 9, 32, 32),
            pack=_btchw,
            needs_geometry=False,
        ),
        ModelSpec(
            "mochi",
            "AutoencoderKLMochi",
            "diffusers/pipelines/mochi/pipeline_mochi.py",
            _mochi_step,
            (12, 7, 32, 32),
            config={
                "latents_mean": _stats(12, 5, -0.2, 0.1),
                "latents_std": _stats(12, 4, 0.6, 0.1),
            },
            temporal_scale=6,
        ),
    )
}


# ---------------------------------------------------------------------------
# Weights


def _diffusers_class(spec: ModelSpec) -> Any:
    import diffusers

    return getattr(diffusers, spec.vae_class)


def weights_bytes(spec: ModelSpec) -> int:
    """The VAE's float32 weights, counted on the meta device (nothing allocated)."""
    with torch.device("meta"):
        vae = _diffusers_class(spec)(**spec.config)
    return sum(p.numel() for p in vae.parameters()) * 4


def weights_folder(spec: ModelSpec, cache_dir: Path) -> Path:
    """A diffusers folder of the VAE with seeded random weights (`save_pretrained`),
    built once and kept under `cache_dir`, named by what determines its weights."""
    import diffusers

    key = {
        "class": spec.vae_class,
        "config": spec.config,
        "buffers": spec.buffers,
        "seed": SEED,
        "diffusers": diffusers.__version__,
        "torch": torch.__version__.split("+")[0],
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    folder = cache_dir / f"{spec.name}-{digest}"
    if folder.is_dir():
        return folder
    torch.manual_seed(SEED)
    vae = _diffusers_class(spec)(**spec.config).eval()
    for name, values in spec.buffers.items():
        getattr(vae, name).copy_(torch.tensor(values))
    partial = folder.with_name(folder.name + ".part")
    shutil.rmtree(partial, ignore_errors=True)
    vae.save_pretrained(partial)
    partial.rename(folder)  # a folder that exists is complete
    return folder


def mapped_bytes(folder: Path) -> int:
    """Bytes of the files under `folder` that this process has mapped: a model whose
    weights loaded by mmap maps all of its safetensors files, whose pages in the page
    cache a second process loading the same files shares."""
    root = str(folder.resolve()) + os.sep
    total = 0
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5].startswith(root):
            start, end = (int(address, 16) for address in fields[0].split("-"))
            total += end - start
    return total


def read_in(module: torch.nn.Module) -> None:
    """Every parameter's and buffer's pages read now: mapped weights are read from the
    page cache, or from disk, at their first use, which would otherwise fall into the
    first timed decode."""
    with torch.no_grad():
        for tensor in (*module.parameters(), *module.buffers()):
            tensor.sum()


def available_memory_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


# ---------------------------------------------------------------------------
# The decode paths


@contextlib.contextmanager
def decode_flags(vae: Any, flags: Mapping[str, bool]) -> Iterator[None]:
    """`vae`'s `use_*` switches set to `flags` meanwhile (its decode path), then restored."""
    before = {name: getattr(vae, name) for name in flags}
    for name, value in flags.items():
        setattr(vae, name, value)
    try:
        yield
    finally:
        for name, value in before.items():
            setattr(vae, name, value)


def flags_of(vae: Any) -> dict[str, bool]:
    return {k: v for k, v in sorted(vars(vae).items()) if k.startswith("use_") and type(v) is bool}


def loaded_flags(vae: Any) -> dict[str, bool]:
    """The switches of the same VAE freshly loaded, as a pipeline has it."""
    with torch.device("meta"):
        fresh = type(vae).from_config(vae.config)
    return flags_of(fresh)


def compare(
    streamed: torch.Tensor, reference: torch.Tensor, value_range: Sequence[float]
) -> dict[str, Any]:
    """Max abs difference (as published), and PSNR over frames clamped to `value_range`
    (peak: its width) where they are not bit-identical."""
    if streamed.shape != reference.shape:
        raise RuntimeError(
            f"streamed {tuple(streamed.shape)} != reference {tuple(reference.shape)}"
        )
    a, b = streamed.double(), reference.double()
    low, high = value_range
    mse = float(((a.clamp(low, high) - b.clamp(low, high)) ** 2).mean())
    equal = torch.equal(streamed, reference)
    return {
        "bit_identical": equal,
        "max_abs_diff": float((a - b).abs().max()),
        "psnr_db": None if equal or mse == 0 else 10 * math.log10((high - low) ** 2 / mse),
    }


class _Stop(Exception):
    """Raised from a chunk callback: the decode is stopped there."""


def first_chunk_s(decoder: Any, latents: torch.Tensor) -> float:
    """Seconds from calling `decode_chunks` to its first chunk (the decode stopped there)."""
    started = time.monotonic()
    at: list[float] = []

    def on_chunk(chunk: Any) -> None:
        at.append(time.monotonic())
        raise _Stop

    with contextlib.suppress(_Stop):
        decoder.decode_chunks(latents, on_chunk)
    return at[0] - started


def pipeline_run(
    spec: ModelSpec,
    vae: Any,
    latents: torch.Tensor,
    flags: Mapping[str, bool],
    path: Path,
    keep: list[torch.Tensor] | None = None,
) -> dict[str, Any]:
    """The pipeline's decode step, its postprocessing and `export_to_video`, timed; the
    decoded frames are appended to `keep` where given (the exactness reference)."""
    processor = _processor(spec)
    started = time.monotonic()
    with decode_flags(vae, flags), torch.no_grad():
        video = spec.decode_step(vae, latents, spec)
        decoded = time.monotonic()
        frames = processor.postprocess_video(video, output_type="np")
    processed = time.monotonic()
    _export(frames, path)
    ended = time.monotonic()
    if keep is not None:
        keep.append(video)
    return {
        "total_s": ended - started,
        "decode_s": decoded - started,
        "postprocess_s": processed - decoded,
        "export_s": ended - processed,
        "bytes": path.stat().st_size,
        "frames": int(frames.shape[1]),
    }


def _processor(spec: ModelSpec) -> Any:
    """The pipeline's video processor (HunyuanVideo 1.5's subclass postprocesses alike)."""
    from diffusers.video_processor import VideoProcessor

    return VideoProcessor(vae_scale_factor=spec.spatial_scale, do_normalize=spec.do_normalize)


def _export(frames: Any, path: Path) -> None:
    from diffusers.utils import export_to_video

    export_to_video(frames[0], str(path), fps=FPS)


def check_chunks(chunks: list[Any], plan: Any) -> None:
    """The published chunks keep the plan: sizes, indices, starts, totals."""
    sizes = tuple(int(c.frames.shape[2]) for c in chunks)
    if sizes != plan.chunk_frames:
        raise RuntimeError(f"chunks of {sizes} frames, the plan says {plan.chunk_frames}")
    for index, chunk in enumerate(chunks):
        if (chunk.index, chunk.total, chunk.frame_start) != (
            index,
            plan.chunks,
            plan.chunk_starts[index],
        ):
            raise RuntimeError(f"chunk {index}: {chunk.index}/{chunk.total} at {chunk.frame_start}")


def exactness(
    spec: ModelSpec,
    decoder: Any,
    latents: torch.Tensor,
    packed: torch.Tensor,
    plan: Any,
    work: Path,
) -> tuple[dict[str, Any], torch.Tensor]:
    """The decoder's chunks, decoded once in this process (also the in-process arms'
    unmeasured first run), timed to the first chunk and to the last; and, where the
    decoder changed the VAE's decode switches, the pipeline's decode step on its path.
    The reference on the pipeline's own path is the pipeline arm's first decode
    (`reference`), so no decode runs only to be compared."""
    chunks: list[Any] = []
    first: list[float] = []
    started = time.monotonic()

    def on_chunk(chunk: Any) -> None:
        if not first:
            first.append(time.monotonic() - started)
        chunks.append(dataclasses.replace(chunk, frames=chunk.frames.clone()))

    decoder.decode_chunks(latents, on_chunk)
    decode_s = time.monotonic() - started
    check_chunks(chunks, plan)
    streamed = torch.cat([c.frames for c in chunks], dim=2)
    chunks.clear()
    vae = decoder.vae
    streamed_flags, pipeline_flags = flags_of(vae), loaded_flags(vae)
    result: dict[str, Any] = {
        "decode_s": decode_s,
        "first_chunk_s": first[0],
        "path": _describe(streamed_flags),
        "finite": bool(torch.isfinite(streamed).all()),
    }
    if streamed_flags != pipeline_flags:
        with torch.no_grad():
            video = spec.decode_step(vae, packed, spec)
        result["vs_path"] = compare(streamed, video, decoder.value_range)
        result["loaded_path"] = _describe(pipeline_flags)
    # export_to_video's first call imports imageio and reads the ffmpeg binary: not
    # part of what the pipeline arm measures.
    frames = _processor(spec).postprocess_video(streamed, output_type="np")
    _export(frames, work / "warmup.mp4")
    return result, streamed


def reference(
    result: dict[str, Any],
    streamed: torch.Tensor,
    video: torch.Tensor,
    value_range: Sequence[float],
) -> None:
    """The chunks against the pipeline arm's frames: its path, or the VAE as loaded where
    the decoder's path is another."""
    key = "vs_loaded" if "loaded_path" in result else "vs_path"
    result[key] = compare(streamed, video, value_range)


def _describe(flags: Mapping[str, bool]) -> str:
    on = [name for name, value in flags.items() if value and "encod" not in name]
    return "vae.decode" + (f" with {', '.join(on)}" if on else "")


# ---------------------------------------------------------------------------
# Over HTTP


@contextlib.contextmanager
def vaecast_serve(model: str, weights: Path, log_path: Path) -> Iterator[tuple[str, int]]:
    """`vaecast serve --model MODEL --weights WEIGHTS` on a free port of 127.0.0.1:
    yields (base URL, pid)."""
    command = [
        sys.executable,
        "-m",
        "vaecast",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--model",
        model,
        "--weights",
        str(weights),
    ]
    with announced_process(command, log_path, vaecast_serve_url, what="vaecast serve") as (
        url,
        process,
    ):
        yield url, process.pid


def stream_url(base: str, spec: ModelSpec) -> str:
    query = "&".join(
        f"{k}={v}" for k, v in {"model": spec.name, "fps": FPS, **spec.params()}.items()
    )
    return f"{base}/v1/videos/stream?{query}"


async def whole_stream(session: aiohttp.ClientSession, url: str, body: bytes) -> dict[str, Any]:
    received = await receive(session, "POST", url, body)
    if received.status != 200:
        raise RuntimeError(f"vaecast: HTTP {received.status}: {received.body[:300]!r}")
    record = received.relative()
    record["frames_decoded"] = count_frames(received.body)
    return record


async def first_fragment(
    session: aiohttp.ClientSession, base: str, url: str, body: bytes
) -> dict[str, Any]:
    """Seconds to the first fragment after the init segment; then the job is cancelled
    with DELETE, which answers once its decode has stopped, so that nothing of it runs
    into the next arm."""
    started = time.monotonic()
    splitter = TopLevelBoxSplitter()
    init_seen = False
    ttff: float | None = None
    async with session.post(url, data=body) as response:
        if response.status != 200:
            raise RuntimeError(
                f"vaecast: HTTP {response.status}: {(await response.read())[:300]!r}"
            )
        video_id = response.headers["X-Video-Id"]
        async for data in response.content.iter_any():
            for box in splitter.feed(data):
                init_seen = init_seen or box[4:8] == b"moov"
                if init_seen and box[4:8] == b"mdat":
                    ttff = time.monotonic() - started
                    break
            if ttff is not None:
                break
        if ttff is None:
            raise RuntimeError("the stream ended before its first fragment")
        async with session.delete(f"{base}/v1/videos/{video_id}") as deleted:
            answer = await deleted.read()
            if deleted.status != 200:
                raise RuntimeError(f"DELETE of the job: HTTP {deleted.status}: {answer[:300]!r}")
    return {"ttff_s": ttff, "cancelled_after_s": time.monotonic() - started}


# ---------------------------------------------------------------------------
# One model


def geometry(spec: ModelSpec, decoder: Any, latents: torch.Tensor, plan: Any) -> dict[str, Any]:
    _, c, t, h, w = latents.shape
    stream_plan = decoder.plan_stream(latents.shape)
    return {
        "vae_class": spec.vae_class,
        "latent_channels": int(decoder.latent_channels),
        "spatial_compression": plan.width // w,
        "temporal_compression": int(stream_plan.frames_per_latent),
        "latent_shape": [c, t, h, w],
        "frames": plan.frames,
        "width": plan.width,
        "height": plan.height,
        "chunk_frames": list(plan.chunk_frames),
        "value_range": list(decoder.value_range),
    }


@dataclass(frozen=True)
class Server:
    """A running `vaecast serve`: its base URL and pid."""

    base: str
    pid: int


async def run_pairs(
    spec: ModelSpec,
    latents: torch.Tensor,
    packed: torch.Tensor,
    body: bytes,
    server: Server | None,
    repeats: int,
    planned_frames: int,
    work: Path,
    keep: list[torch.Tensor],
    *,
    decoder: Any,
) -> tuple[dict[str, Any] | None, list[dict[str, Any]], list[dict[str, Any]]]:
    """The server's warm-up (a stream to its first fragment: at the sizes measured a
    whole one would cost another full decode), then `repeats` repeats of
    `paired.schedule`. The pipeline arm's first frames are appended to `keep`.

    Without a server only the in-process arms run, without a decoder only vaecast's:
    the two phases of a model measured with one copy of its weights at a time
    (`measure_model`)."""
    pids = [] if server is None else [server.pid]
    runs: list[dict[str, Any]] = []
    loads: list[dict[str, Any]] = []
    warmup = None
    async with client_session() as session:
        if server is not None:
            url = stream_url(server.base, spec)
            warmup = await first_fragment(session, server.base, url, body)
        for repeat in range(repeats):
            repeat_start = load.sample(pids)
            for position, (arm, pair) in enumerate(paired.schedule(repeat, PEERS)):
                if not (server if arm == paired.VAECAST else decoder):
                    continue  # an arm of the other phase
                before, arm_started = load.sample(pids), time.monotonic()
                record: dict[str, Any] = {
                    "arm": arm,
                    "pair": pair,
                    "repeat": repeat,
                    "position": position,
                }
                if arm == paired.VAECAST and pair == FIRST_CHUNK:
                    assert server is not None
                    record |= await first_fragment(session, server.base, url, body)
                elif arm == paired.VAECAST:
                    record |= await whole_stream(session, url, body)
                    if record["frames_decoded"] != planned_frames:
                        raise RuntimeError(
                            f"the MP4 has {record['frames_decoded']} frames, "
                            f"{planned_frames} planned"
                        )
                elif arm == FIRST_CHUNK:
                    record["first_chunk_s"] = first_chunk_s(decoder, latents)
                else:
                    record |= pipeline_run(
                        spec,
                        decoder.vae,
                        packed,
                        loaded_flags(decoder.vae),
                        work / "pipeline.mp4",
                        keep=None if keep else keep,  # the first decode alone
                    )
                if "frames_decoded" in record or arm == PIPELINE:
                    record["frames_planned"] = planned_frames
                record["others_cores"] = load.between(before, load.sample(pids))["others_cores"]
                runs.append(record)
                # A line per arm: a model's repeats can take an hour between other lines.
                _say(
                    f"{spec.name}: repeat {repeat + 1}/{repeats}, {arm} arm of the {pair} "
                    f"pair, {time.monotonic() - arm_started:.1f} s"
                )
            repeat_load = load.between(repeat_start, load.sample(pids))
            repeat_load["repeat"] = repeat
            repeat_load["loaded"] = repeat_load["others_cores"] > paired.LOADED_CORES
            loads.append(repeat_load)
    return warmup, runs, loads


def repeat_ratios(runs: Sequence[dict[str, Any]]) -> list[dict[str, float]]:
    """Per repeat, each ratio within its pair."""
    by_repeat: dict[int, dict[tuple[str, str], dict[str, Any]]] = {}
    for run in runs:
        by_repeat.setdefault(run["repeat"], {})[(run["arm"], run["pair"])] = run
    ratios = []
    for repeat in sorted(by_repeat):
        arms = by_repeat[repeat]
        ttff = arms[(paired.VAECAST, FIRST_CHUNK)]["ttff_s"]
        whole = arms[(paired.VAECAST, PIPELINE)]
        baseline = arms[(PIPELINE, PIPELINE)]["total_s"]
        ratios.append(
            {
                "ttff_over_first_chunk": ttff / arms[(FIRST_CHUNK, FIRST_CHUNK)]["first_chunk_s"],
                "total_over_pipeline": whole["last_byte_s"] / baseline,
                "ttff_over_pipeline": whole["ttff_s"] / baseline,
            }
        )
    return ratios


def _median(runs: Sequence[dict[str, Any]], arm: str, pair: str, key: str) -> float:
    return statistics.median(r[key] for r in runs if r["arm"] == arm and r["pair"] == pair)


def summarize(runs: Sequence[dict[str, Any]], loads: Sequence[dict[str, Any]]) -> dict[str, Any]:
    ratios = repeat_ratios(runs)
    names = ratios[0].keys()
    return {
        "ratios": {name: paired.Spread.of([r[name] for r in ratios]).as_dict() for name in names},
        "per_repeat": ratios,
        "seconds": {
            "vaecast_ttff_s": _median(runs, paired.VAECAST, FIRST_CHUNK, "ttff_s"),
            "first_chunk_s": _median(runs, FIRST_CHUNK, FIRST_CHUNK, "first_chunk_s"),
            "vaecast_total_s": _median(runs, paired.VAECAST, PIPELINE, "last_byte_s"),
            "vaecast_total_run_ttff_s": _median(runs, paired.VAECAST, PIPELINE, "ttff_s"),
            "pipeline_total_s": _median(runs, PIPELINE, PIPELINE, "total_s"),
            "pipeline_decode_s": _median(runs, PIPELINE, PIPELINE, "decode_s"),
            "pipeline_export_s": _median(runs, PIPELINE, PIPELINE, "export_s"),
        },
        "frames_ok": all(
            r.get("frames_decoded", r.get("frames")) == r["frames_planned"]
            for r in runs
            if "frames_planned" in r
        ),
        "loaded_repeats": sum(1 for repeat in loads if repeat["loaded"]),
    }


def measure_model(
    spec: ModelSpec, repeats: int, work: Path, one_copy: bool = False
) -> dict[str, Any]:
    """Everything about one model; the server runs only while its arms do. With
    `one_copy` (weights that fit this machine's memory once but not twice) and weights
    this process does not map (so not shared with the server's), this process lets go of
    its copy while the server runs, so that vaecast's arms run first, then the
    in-process ones: each ratio is still within its repeat, but its pair is no longer
    back to back."""
    from vaecast.models.layouts import layout_of
    from vaecast.models.registry import get_decoder

    weights_s = time.monotonic()
    folder = weights_folder(spec, work / "models")
    weights_s = time.monotonic() - weights_s
    decoder = get_decoder(spec.name, "cpu", weights=folder)
    weights = weights_bytes(spec)
    shared = mapped_bytes(folder) >= weights
    one_copy = one_copy and not shared
    read_in(decoder.vae)
    latents = spec.latents()
    packed = spec.pack(latents)
    bound = layout_of(decoder).bind(spec.params())
    if not torch.equal(bound.to_bcthw(packed), latents):
        raise RuntimeError(f"{spec.name}: the layout does not give back the latents packed")
    plan = decoder.plan(latents.shape)
    result: dict[str, Any] = {
        "pipeline": spec.pipeline,
        "geometry": geometry(spec, decoder, latents, plan),
        "weights_mb": weights / 1e6,
        "weights_build_or_cache_s": weights_s,
        "one_copy": one_copy,
        "weights_shared": shared,
    }
    scales = (result["geometry"]["spatial_compression"], result["geometry"]["temporal_compression"])
    if scales != (spec.spatial_scale, spec.temporal_scale):
        # The spec's scales size the pipeline's processor and the layout's parameters.
        raise RuntimeError(f"{spec.name}: the decoder's scales are {scales}, the spec's differ")
    _say(
        f"{spec.name}: {result['geometry']['latent_shape']} -> {plan.frames} frames "
        f"{plan.width}x{plan.height}, chunks {list(plan.chunk_frames)}"
    )
    del bound
    body = latents_body(packed, FPS)
    keep: list[torch.Tensor] = []
    measured = (spec, latents, packed, body)
    served: tuple[Any, ...] = ()
    if one_copy:
        del decoder
        gc.collect()
        served = _served(measured, None, folder, repeats, plan.frames, work, keep)
        decoder = get_decoder(spec.name, "cpu", weights=folder)
        read_in(decoder.vae)
    result["exactness"], streamed = exactness(spec, decoder, latents, packed, plan, work)
    if one_copy:
        _, runs, loads = asyncio.run(
            run_pairs(*measured, None, repeats, plan.frames, work, keep, decoder=decoder)
        )
        warmup, runs, loads = served[0], served[1] + runs, _merged(served[2], loads)
    else:
        warmup, runs, loads = _served(measured, decoder, folder, repeats, plan.frames, work, keep)
    reference(result["exactness"], streamed, keep[0], decoder.value_range)
    del streamed, keep
    _say(f"{spec.name}: chunks against {spec.pipeline}'s decode: {result['exactness']['vs_path']}")
    result |= {
        "commit": _commit(),
        "measured_utc": now_utc(),
        "server_warmup": warmup,
        "summary": summarize(runs, loads),
        "runs": runs,
        "load": loads,
    }
    return result


def _served(
    measured: tuple[ModelSpec, torch.Tensor, torch.Tensor, bytes],
    decoder: Any,
    folder: Path,
    repeats: int,
    frames: int,
    work: Path,
    keep: list[torch.Tensor],
) -> Any:
    """`run_pairs` while a `vaecast serve` of the model runs."""
    spec = measured[0]
    with vaecast_serve(spec.name, folder, work / f"serve-{spec.name}.log") as (base, pid):
        return asyncio.run(
            run_pairs(*measured, Server(base, pid), repeats, frames, work, keep, decoder=decoder)
        )


def _merged(first: Sequence[dict[str, Any]], second: Sequence[dict[str, Any]]) -> list[Any]:
    """Each repeat's load over both phases: the busier phase's."""
    return [
        max(a, b, key=lambda phase: phase["others_cores"])
        for a, b in zip(first, second, strict=True)
    ]


# ---------------------------------------------------------------------------
# The run


def run(
    specs: Sequence[ModelSpec],
    repeats: int,
    out: Path,
    work: Path | None = None,
    keep_others: bool = False,
) -> dict[str, Any]:
    """Every model in turn; writes `models.json` and `models.md` to `out` after each one
    (a run cut short keeps the models it measured). With `keep_others`, the models of an
    earlier `models.json` there that this run does not measure keep their rows, each
    with its own commit and time."""
    work = work or out / "tmp"
    work.mkdir(parents=True, exist_ok=True)
    earlier: dict[str, Any] = {}
    if keep_others and (out / "models.json").is_file():
        earlier = json.loads((out / "models.json").read_text())["models"]
    result: dict[str, Any] = {"meta": _meta(repeats), "models": {}}
    for spec in specs:
        _say(f"{spec.key}: {spec.vae_class}")
        entry: dict[str, Any]
        started = time.monotonic()
        try:
            weights, available = weights_bytes(spec), available_memory_bytes()
            if ONE_COPY_FACTOR * weights > available:
                entry = {
                    "skipped": f"its {weights / 2**30:.1f} GiB of float32 weights need "
                    f"~{ONE_COPY_FACTOR * weights / 2**30:.0f} GiB even one copy at a time; "
                    f"{available / 2**30:.0f} GiB available"
                }
            else:
                one_copy = MEMORY_FACTOR * weights > available
                entry = measure_model(spec, repeats, work, one_copy=one_copy)
        except Exception as error:  # one model's failure is its row, not the run's end
            entry = {
                "error": f"{type(error).__name__}: {error}",
                "traceback": traceback.format_exc(),
            }
            _say(f"{spec.key}: {entry['error']}")
        entry["elapsed_s"] = time.monotonic() - started
        if "summary" in entry:
            ratios = entry["summary"]["ratios"]
            _say(
                f"{spec.key}: TTFF / first chunk {ratios['ttff_over_first_chunk']['median']:.2f}, "
                f"total / pipeline {ratios['total_over_pipeline']['median']:.2f} "
                f"({entry['elapsed_s']:.0f} s)"
            )
        result["models"][spec.key] = entry
        gc.collect()
        _write(result, earlier, out)
    _say(f"wrote {out / 'models.json'}, {out / 'models.md'}")
    return result


def _write(result: dict[str, Any], earlier: Mapping[str, Any], out: Path) -> None:
    """The results so far, in `SPECS` order, with the earlier rows kept."""
    result["meta"]["finished_utc"] = now_utc()
    result["meta"]["load_end"] = _load()
    measured = {**earlier, **result["models"]}
    order = [name for name in SPECS if name in measured]
    result["models"] = {name: measured[name] for name in order}
    report.write_json(result, out / "models.json")
    (out / "models.md").write_text(markdown(result))


def _meta(repeats: int) -> dict[str, Any]:
    import diffusers

    settings = EncoderSettings()
    return {
        "started_utc": now_utc(),
        "commit": _commit(),
        "machine": _machine(),
        "load_start": _load(),
        "repeats": repeats,
        "fps": FPS,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "diffusers": diffusers.__version__,
        "python": platform.python_version(),
        "encoder": f"{settings.preset} {' '.join(map(str, settings.rate_control))} zerolatency, "
        f"keyframe every {settings.keyframe_interval_s:g} s (vaecast serve's default)",
        "export_to_video": _export_backend(),
    }


def _commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()

    try:
        commit = git("rev-parse", "--short=12", "HEAD")
        # Results being written are not changes to what measures them.
        dirty = bool(
            git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!benchmarks/results")
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit + (" (with uncommitted changes)" if dirty else "")


def _export_backend() -> str:
    try:
        import imageio
        import imageio_ffmpeg
    except ImportError:
        return "imageio or imageio-ffmpeg missing: diffusers falls back to OpenCV"
    return (
        f"imageio {imageio.__version__}, imageio-ffmpeg {imageio_ffmpeg.__version__} "
        f"(ffmpeg {imageio_ffmpeg.get_ffmpeg_version()}), libx264 quality 5"
    )


# ---------------------------------------------------------------------------
# The report


def _x(spread: Mapping[str, float]) -> str:
    return f"{spread['median']:.2f}x ({spread['q1']:.2f}-{spread['q3']:.2f})"


def _values(values: Iterable[float]) -> str:
    return ", ".join(f"{value:.2f}" for value in values)


def _yes(met: bool) -> str:
    return "yes" if met else "no"


def _diff(comparison: Mapping[str, Any]) -> str:
    if comparison["bit_identical"]:
        return "bit-identical"
    psnr = comparison["psnr_db"]
    return f"{comparison['max_abs_diff']:.1e}" + ("" if psnr is None else f", {psnr:.1f} dB")


def markdown(result: Mapping[str, Any]) -> str:
    meta = result["meta"]
    models = result["models"]
    lines = [
        f"# vaecast per model ({meta['finished_utc']})",
        "",
        f"Commit {meta['commit']}; {meta['machine']}; torch {meta['torch']} "
        f"({meta['torch_threads']} threads, the default, in the server and here), diffusers "
        f"{meta['diffusers']}; load average at start {meta['load_start']}, at end "
        f"{meta['load_end']}. Each model's real architecture with seeded random weights; "
        f"vaecast paired with each in-process arm, {meta['repeats']} repeats in this run "
        f"(a row kept from an earlier run: its count in the last column, its commit and time "
        f"at the end; medians, IQR in brackets). vaecast: `vaecast serve` over HTTP on "
        f"127.0.0.1, x264 {meta['encoder']}; the pipeline: its decode step, "
        f"`postprocess_video` and `export_to_video(fps={meta['fps']})` "
        f"({meta['export_to_video']}).",
        "",
        "## What is decoded",
        "",
        "| model | VAE | weights | latents C x T x h x w | video | channels, spatial x temporal "
        "| frames per chunk | chunks vs `vae.decode` on the decoder's path "
        "| vs the pipeline's default path |",
        "|---|---|---:|---|---|---|---|---|---|",
    ]
    for name, entry in models.items():
        if "geometry" not in entry:
            continue
        g, e = entry["geometry"], entry["exactness"]
        path = f"{_diff(e['vs_path'])} ({e['path']})"
        loaded = (
            f"{_diff(e['vs_loaded'])} ({e['loaded_path']})" if "vs_loaded" in e else "same path"
        )
        lines.append(
            f"| {name} | {g['vae_class']} | {entry['weights_mb']:.0f} MB "
            f"| {' x '.join(map(str, g['latent_shape']))} "
            f"| {g['frames']} x {g['width']}x{g['height']} "
            f"| {g['latent_channels']}, {g['spatial_compression']}x x {g['temporal_compression']}x "
            f"| {', '.join(map(str, g['chunk_frames']))} | {path} | {loaded} |"
        )
    lines += [
        "",
        "Differences: max abs over the frames as published (the decoders' value range, "
        "[-1, 1] but for minimax-h3's [0, 1]), then PSNR over frames clamped to that range "
        "where not bit-identical. Both columns run the pipeline's decode step (the source "
        "below) up to the frames it hands its video processor: first with the VAE's decode "
        "switches as the decoder set them, then, where the decoder changed them, as a "
        "pipeline loads the VAE (its default path, and the baseline's below).",
        "",
        "Decode steps: "
        + "; ".join(
            f"{name}, {entry['pipeline']}" for name, entry in models.items() if "pipeline" in entry
        )
        + ".",
        "",
        "## Time (seconds, medians)",
        "",
        "| model | vaecast TTFF | decoder's first chunk alone | TTFF / first chunk "
        "| vaecast last byte | pipeline decode + export | of which export | total / pipeline "
        "| vaecast TTFF / pipeline | first fragment <= 0.5x, last byte <= 1.0x "
        "| chunk plan: chunked decode / pipeline decode | loaded repeats |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    for name, entry in models.items():
        if "summary" not in entry:
            continue
        s, r = entry["summary"]["seconds"], entry["summary"]["ratios"]
        first_ok = r["ttff_over_pipeline"]["median"] <= FIRST_FRAGMENT_TARGET
        last_ok = r["total_over_pipeline"]["median"] <= LAST_BYTE_TARGET
        plan_cost = entry["exactness"]["decode_s"] / s["pipeline_decode_s"]
        shown = f"{name} (one copy at a time)" if entry.get("one_copy") else name
        lines.append(
            f"| {shown} | {s['vaecast_ttff_s']:.2f} | {s['first_chunk_s']:.2f} "
            f"| {_x(r['ttff_over_first_chunk'])} | {s['vaecast_total_s']:.2f} "
            f"| {s['pipeline_total_s']:.2f} | {s['pipeline_export_s']:.2f} "
            f"| {_x(r['total_over_pipeline'])} | {_x(r['ttff_over_pipeline'])} "
            f"| {_yes(first_ok)}, {_yes(last_ok)} | {plan_cost:.2f}x "
            f"| {entry['summary']['loaded_repeats']}/{len(entry['load'])} |"
        )
    lines += [
        "",
        "TTFF: request sent to the first fragment (moof + mdat after the init segment) "
        "received; the first chunk alone: the same decoder in this process, `decode_chunks` "
        "stopped at its first chunk. Last byte: the whole MP4 received. Pipeline: the "
        'pipeline\'s decode step on the VAE as loaded, `postprocess_video(output_type="np")`, '
        "`export_to_video`; the user sees nothing before it ends. The targets: the first "
        f"fragment by {FIRST_FRAGMENT_TARGET}x the pipeline's time, the last byte by "
        f"{LAST_BYTE_TARGET}x (medians). The chunk plan's cost: the decoder's chunks decoded "
        "whole in this process (its first, unpaired run) over the pipeline arm's decode "
        "step. One copy at a time: weights that do not fit this machine twice, so vaecast's "
        "arms ran first and the in-process ones after (each ratio within its repeat, its "
        "pair not back to back). A repeat is loaded when "
        f"other processes kept more than {paired.LOADED_CORES} core busy on average.",
        "",
    ]
    lines += [
        "Per repeat, in order: each ratio within its pair, and the cores other processes "
        "kept busy during the repeat.",
        "",
        "| model | TTFF / first chunk | total / pipeline | others' cores |",
        "|---|---|---|---|",
    ]
    for name, entry in models.items():
        if "summary" not in entry:
            continue
        per = entry["summary"]["per_repeat"]
        ttff = _values(r["ttff_over_first_chunk"] for r in per)
        total = _values(r["total_over_pipeline"] for r in per)
        cores = _values(repeat["others_cores"] for repeat in entry["load"])
        lines.append(f"| {name} | {ttff} | {total} | {cores} |")
    lines.append("")
    runs = [
        f"- {name}: commit {entry['commit']}, {entry['measured_utc']}, "
        f"{entry['elapsed_s'] / 60:.0f} min"
        if "measured_utc" in entry
        else f"- {name}: an earlier run that did not record when"
        for name, entry in models.items()
        if "summary" in entry
    ]
    if runs:
        lines += ["Each model measured at:", "", *runs, ""]
    others = {name: entry for name, entry in models.items() if "summary" not in entry}
    if others:
        lines += ["## Not measured", ""]
        for name, entry in others.items():
            lines.append(f"- {name}: {entry.get('skipped') or entry.get('error')}")
        lines.append("")
    return "\n".join(lines)


def _say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.models", description=__doc__.splitlines()[0]
    )
    p.add_argument("--models", default=",".join(SPECS), help="comma list (default: all)")
    p.add_argument("--repeats", type=int, default=DEFAULT_REPEATS)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory")
    p.add_argument(
        "--keep-others",
        action="store_true",
        help="keep the rows of models not measured now from the models.json in --out",
    )
    return p


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parser().parse_args(argv)
    names = [name for name in args.models.split(",") if name]
    unknown = [name for name in names if name not in SPECS]
    if unknown:
        parser().error(f"unknown models {unknown}; known: {', '.join(SPECS)}")
    if args.repeats < 1:
        parser().error("--repeats must be >= 1")
    return run(
        [SPECS[name] for name in names], args.repeats, args.out, keep_others=args.keep_others
    )


if __name__ == "__main__":
    main()
