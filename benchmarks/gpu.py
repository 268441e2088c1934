"""What `benchmarks/device.sh` needs on a GPU machine: a probe, and random-weight models.

    python -m benchmarks.gpu probe                      # JSON; exit 3 without CUDA
    python -m benchmarks.gpu weights --model wan2.1 --dir DIR   # prints the path

`probe` says what the machine offers: CUDA and its device, and whether FFmpeg's
`h264_nvenc` *works* here, found by opening an encoder and encoding frames at the
benchmark's size (an encoder that PyAV lists may still fail to open: H100/H200-class
GPUs have no NVENC engine, and a driver or FFmpeg build may lack it). It never
assumes: a failure to open is the answer "no", with FFmpeg's message.

`weights` writes a model with random weights at its real architecture (no download:
these machines reach no network), so the arms measure the real decode cost of
`wan2.1` (diffusers' `AutoencoderKLWan` at its default config, which is Wan 2.1's
VAE, 127 M parameters) and `taehv` (taew2_1's shape), in the layouts their loaders
read: a diffusers folder, a safetensors file. What the frames look like does not
change the decode's time; x264's time depends a little on content (random weights
make smooth, low-detail frames), which the table says.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import numpy as np
import torch

NVENC = "h264_nvenc"
PROBE_FRAMES = 3
SEED = 0
NO_CUDA_EXIT = 3


def nvenc_works(width: int = 832, height: int = 480) -> tuple[bool, str]:
    """(works, why): open `h264_nvenc` through PyAV and encode a few frames."""
    try:
        context = av.CodecContext.create(NVENC, "w")
        context.width, context.height = width, height
        context.pix_fmt = "yuv420p"
        context.time_base = Fraction(1, 16)
        context.framerate = Fraction(16)
        context.open()
        packets = []
        for index in range(PROBE_FRAMES):
            frame = av.VideoFrame.from_ndarray(
                np.full((height * 3 // 2, width), 16 + index, np.uint8), format="yuv420p"
            )
            frame.pts = index
            packets += context.encode(frame)
        packets += context.encode(None)
    except (av.error.FFmpegError, ValueError, OSError) as error:
        return False, f"{type(error).__name__}: {error}"
    if not packets:
        return False, "opened, but gave no packets"
    return True, f"opened and encoded {PROBE_FRAMES} frames at {width}x{height}"


def probe(width: int = 832, height: int = 480) -> dict[str, Any]:
    info: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda": torch.cuda.is_available(),
        "pyav": av.__version__,
    }
    if info["cuda"]:
        props = torch.cuda.get_device_properties(0)
        info["device"] = props.name
        info["capability"] = f"{props.major}.{props.minor}"
        info["memory_gib"] = round(props.total_memory / 2**30, 1)
    works, why = nvenc_works(width, height)
    info["h264_nvenc"] = {"works": works, "why": why}
    info["encoder_used"] = "libx264 (CPU threads)"  # the pipeline's encoder today
    return info


def random_weights(model: str, directory: Path) -> Path:
    """Write `model` with seeded random weights under `directory`; return the path its
    loader takes as `--weights`. Reuses what an earlier call wrote."""
    directory.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(SEED)
    if model == "wan2.1":
        path = directory / "wan2.1-random"
        if not (path / "config.json").is_file():
            from diffusers import AutoencoderKLWan

            AutoencoderKLWan().save_pretrained(path)
        return path
    if model == "taehv":
        from safetensors.torch import save_file

        from vaecast.models.taehv import TAEHVConfig, TAEHVNet

        path = directory / "taew2_1-random.safetensors"
        if not path.is_file():
            state = {k: v.contiguous() for k, v in TAEHVNet(TAEHVConfig()).state_dict().items()}
            save_file(state, str(path))
        return path
    raise ValueError(f"no random weights for model {model!r} (wan2.1 or taehv)")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu")
    commands = parser.add_subparsers(dest="command", required=True)
    probe_command = commands.add_parser("probe", help="CUDA and h264_nvenc, as JSON")
    probe_command.add_argument("--width", type=int, default=832)
    probe_command.add_argument("--height", type=int, default=480)
    weights_command = commands.add_parser("weights", help="write a random-weight model")
    weights_command.add_argument("--model", required=True, choices=("wan2.1", "taehv"))
    weights_command.add_argument("--dir", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.command == "probe":
        info = probe(args.width, args.height)
        print(json.dumps(info, indent=2))
        return 0 if info["cuda"] else NO_CUDA_EXIT
    print(random_weights(args.model, args.dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
