"""`python -m benchmarks.exact_cone`: how much of a non-causal decoder's work an exact
first chunk needs, whatever the schedule.

LTX-Video's and LTX-2's decoders are not causal: a frame depends on latents after it.
An exact stream can publish frames [0, F) only once every activation those frames
depend on is computed, so no schedule (windows with a margin, as `ltx-video` streams,
or a layer-by-layer wavefront) gets them with less work than that dependency cone. This
measures the cone on each model's published architecture (seeded random weights):

- for each Conv3d of the decoder, the frames of its output that frames [0, F) of the
  video depend on, found by autograd: a backward pass from the sum of those frames gives
  a frame outside the cone a gradient of exactly zero, and one inside it (with random
  weights) one that is not;
- the share is those frames' multiply-adds over all of the convs' multiply-adds (the
  convs are nearly all of a decode's work). A conv's multiply-adds per frame scale with
  its output's area, the same factor for every conv, so the share does not depend on the
  frame size and the decoder runs on latents of 2x2 pixels (LTX-2's convs pad by
  reflection, which needs two).

Clip lengths: the 33 frames `benchmarks.models` decodes, and each pipeline's default
`num_frames` (LTXPipeline 161, LTX2Pipeline 121). First chunks: the first frame alone
(the least a stream can publish first) and the 17 frames of `ltx-video`'s first chunk.

    python -m benchmarks.exact_cone [--out DIR]

Writes `exact_cone.json` and `exact_cone.md` to --out.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from benchmarks import report
from benchmarks.arms import now_utc
from benchmarks.models import SPECS, ModelSpec, _commit, _diffusers_class

DEFAULT_OUT = Path(__file__).resolve().parent / "results"
# (model, the pipeline's default num_frames)
MODELS = (("ltx-video", 161), ("ltx-2", 121))
BENCHMARKED_FRAMES = 33
FIRST_CHUNKS = (1, 17)


def decode_call(vae: Any) -> Any:
    """`latents -> frames` as vaecast's LTX decoders call the VAE's decoder (untiled)."""
    temb = torch.zeros(1) if vae.config.timestep_conditioning else None
    if type(vae.decoder).__name__ == "LTX2VideoDecoder3d":
        return lambda z: vae.decoder(z, temb, causal=None)
    return lambda z: vae.decoder(z, temb)


def cone_share(vae: Any, latent_frames: int, first_frames: int) -> float:
    """The share of the decoder's conv multiply-adds that frames [0, first_frames) of a
    clip of `latent_frames` latents depend on."""
    outputs: list[tuple[torch.nn.Conv3d, torch.Tensor]] = []

    def keep(module: torch.nn.Module, _: Any, output: torch.Tensor) -> None:
        output.retain_grad()
        outputs.append((module, output))  # type: ignore[arg-type]

    hooks = [
        module.register_forward_hook(keep)
        for module in vae.decoder.modules()
        if isinstance(module, torch.nn.Conv3d)
    ]
    try:
        generator = torch.Generator().manual_seed(0)
        channels = int(vae.config.latent_channels)
        latents = torch.randn(1, channels, latent_frames, 2, 2, generator=generator)
        video = decode_call(vae)(latents.to(vae.dtype))
        if first_frames > video.shape[2]:
            raise ValueError(f"{first_frames} frames asked of a clip of {video.shape[2]}")
        video[:, :, :first_frames].sum().backward()
    finally:
        for hook in hooks:
            hook.remove()
    needed = total = 0
    for conv, output in outputs:
        per_frame = conv.weight.numel() * output.shape[3] * output.shape[4]
        assert output.grad is not None, "every conv output reaches the video"
        frames = int((output.grad.abs().amax(dim=(0, 1, 3, 4)) > 0).sum())
        needed += frames * per_frame
        total += output.shape[2] * per_frame
    vae.zero_grad(set_to_none=True)
    return needed / total


def measure(spec: ModelSpec, default_frames: int) -> dict[str, Any]:
    torch.manual_seed(0)
    vae = _diffusers_class(spec)(**spec.config).float()
    rows = []
    for frames in (BENCHMARKED_FRAMES, default_frames):
        latent_frames = (frames - 1) // spec.temporal_scale + 1
        for first in FIRST_CHUNKS:
            share = cone_share(vae, latent_frames, first)
            rows.append({"frames": frames, "first_frames": first, "share": share})
            print(f"{spec.name}: {frames} frames, first {first}: {share:.1%}", flush=True)
    return {"vae_class": spec.vae_class, "rows": rows}


def markdown(result: dict[str, Any]) -> str:
    meta = result["meta"]
    lines = [
        f"# The exact first chunk's share of a non-causal decode ({meta['finished_utc']})",
        "",
        f"Commit {meta['commit']}; torch {meta['torch']}. Each model's published decoder "
        "(seeded random weights); the share of its conv multiply-adds that the first "
        "frames of the video depend on (autograd's dependency cone), which no exact "
        "schedule computes with less.",
        "",
        "| model | clip (frames) | first frame alone | first chunk (17 frames) |",
        "|---|---:|---:|---:|",
    ]
    for name, entry in result["models"].items():
        by_clip: dict[int, dict[int, float]] = {}
        for row in entry["rows"]:
            by_clip.setdefault(row["frames"], {})[row["first_frames"]] = row["share"]
        for frames, shares in by_clip.items():
            cells = " | ".join(f"{shares[first]:.0%}" for first in FIRST_CHUNKS)
            lines.append(f"| {name} | {frames} | {cells} |")
    return "\n".join([*lines, ""])


def run(models: Sequence[tuple[str, int]], out: Path) -> dict[str, Any]:
    result: dict[str, Any] = {
        "meta": {"commit": _commit(), "torch": torch.__version__, "started_utc": now_utc()},
        "models": {name: measure(SPECS[name], frames) for name, frames in models},
    }
    result["meta"]["finished_utc"] = now_utc()
    report.write_json(result, out / "exact_cone.json")
    (out / "exact_cone.md").write_text(markdown(result))
    return result


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.exact_cone", description=__doc__.splitlines()[0]
    )
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    return run(MODELS, p.parse_args(argv).out)


if __name__ == "__main__":
    main()
