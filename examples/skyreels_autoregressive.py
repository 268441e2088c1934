"""Watch SkyReels-V2 diffusion forcing while it generates: each causal block of latent
frames is pushed to a vaecast server the moment its last denoising step is done.

    # a real model on a GPU (a window's first block takes a whole denoising schedule:
    # give the server a long --push-idle-timeout)
    vaecast serve --push-idle-timeout 600 \\
        --model wan2.1 --weights wan2.1=SkyReels-V2-DF-1.3B-540P-Diffusers/vae &
    python examples/skyreels_autoregressive.py \\
        --weights SkyReels-V2-DF-1.3B-540P-Diffusers --prompt "a koi pond at dawn"

    # no download: tiny random components, on the CPU
    python examples/tiny_random.py /tmp/tiny-wan    # prints the serve command
    python examples/skyreels_autoregressive.py --tiny-random

`vaecast.integrations.diffusers.stream_autoregressive` follows the pipeline's own
schedule (`ar_step`, `causal_block_size`): a block is final `ar_step` rows before the
next, and a long video (`--num-frames` past `--base-num-frames`) goes in windows that
start from the last `--overlap-history` frames of the one before, which were pushed
already. The watch URL is printed with the first block, while the pipeline is still
denoising the later ones.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch
from size_flags import add_size_flags, chosen, given

from vaecast.integrations.diffusers import stream_autoregressive

# SkyReels-V2 DF 540P's long-video settings.
SIZES = {
    "num_frames": 257,
    "base_num_frames": 97,
    "overlap_history": 17,
    "ar_step": 5,
    "causal_block_size": 5,
    "height": 544,
    "width": 960,
    "num_inference_steps": 30,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--tiny-random", action="store_true", help="tiny random SkyReels-V2")
    source.add_argument("--weights", metavar="DIR", help="a SkyReels-V2 DF diffusers folder")
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="the vaecast server")
    parser.add_argument("--prompt", default="a sailboat crossing a stormy sea, cinematic")
    add_size_flags(parser, SIZES)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    call: dict[str, Any]
    if args.tiny_random:
        import tiny_random

        pipe = tiny_random.skyreels_df()
        call = tiny_random.skyreels_call(**given(args, SIZES))
        device = "cpu"
    else:
        from diffusers import SkyReelsV2DiffusionForcingPipeline

        pipe = SkyReelsV2DiffusionForcingPipeline.from_pretrained(
            args.weights, torch_dtype=torch.bfloat16
        )
        pipe.to(args.device)
        device = args.device
        call = {
            "prompt": args.prompt,
            **chosen(args, SIZES),
            "addnoise_condition": 20,
        }
    call["generator"] = torch.Generator(device).manual_seed(args.seed)

    started = time.perf_counter()

    def on_job(job: dict[str, Any]) -> None:
        elapsed = time.perf_counter() - started
        content = args.url.rstrip("/") + job["urls"]["content"]
        print(f"first block pushed at {elapsed:.1f} s; watch: {content}", flush=True)

    jobs = stream_autoregressive(pipe, args.url, on_job=on_job, **call)
    print(f"pipeline done at {time.perf_counter() - started:.1f} s")
    for job in jobs if isinstance(jobs, list) else [jobs]:
        print(f"job {job['id']} {job['status']}")


if __name__ == "__main__":
    main()
