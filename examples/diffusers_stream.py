"""Run a diffusers video pipeline and watch its decode stream from a vaecast server.

    # a real pipeline on a GPU; the server decodes with the pipeline's own VAE
    vaecast serve --model wan2.1 --weights wan2.1=Wan2.1-T2V-1.3B-Diffusers/vae &
    python examples/diffusers_stream.py --weights Wan2.1-T2V-1.3B-Diffusers \\
        --prompt "a cat surfing" --num-frames 81 --height 480 --width 832

    # no download: tiny random components, on the CPU
    python examples/tiny_random.py /tmp/tiny-wan    # prints the serve command
    python examples/diffusers_stream.py --tiny-random --videos 2

The pipeline runs with `output_type="latent"` and its latents go to the server in one
upload (`vaecast.integrations.diffusers.stream`), which answers with a job per video at
once: open the printed URLs while the server decodes. `--decode-here` decodes on this
machine instead, with vaecast's decoder for the VAE, and pushes the frames
(`stream_decoded`): the server then only encodes. `--videos N` makes N videos of one
prompt (`num_videos_per_prompt`), N jobs.
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
from size_flags import add_size_flags, chosen, given

from vaecast.integrations.diffusers import stream, stream_decoded

# Wan 2.1's published size.
SIZES = {"num_frames": 81, "height": 480, "width": 832, "num_inference_steps": 30}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--tiny-random", action="store_true", help="tiny random Wan 2.1")
    source.add_argument("--weights", metavar="DIR", help="a diffusers pipeline folder")
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="the vaecast server")
    parser.add_argument("--prompt", default="a red fox running through snow, cinematic")
    add_size_flags(parser, SIZES)
    parser.add_argument("--videos", type=int, default=1, help="num_videos_per_prompt")
    parser.add_argument("--decode-here", action="store_true", help="decode here, push frames")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    call: dict[str, Any]
    if args.tiny_random:
        import tiny_random

        pipe, call = tiny_random.wan(), tiny_random.wan_call(**given(args, SIZES))
    else:
        from diffusers import DiffusionPipeline

        pipe = DiffusionPipeline.from_pretrained(args.weights, torch_dtype=torch.bfloat16)
        pipe.to(args.device)
        call = {"prompt": args.prompt, **chosen(args, SIZES)}
    device = "cpu" if args.tiny_random else args.device
    call["generator"] = torch.Generator(device).manual_seed(args.seed)
    call["num_videos_per_prompt"] = args.videos

    if args.decode_here:
        jobs = stream_decoded(pipe, args.url, on_job=lambda job: watch(args.url, job), **call)
    else:
        jobs = stream(pipe, args.url, **call)
        for job in jobs if isinstance(jobs, list) else [jobs]:
            watch(args.url, job)
    for job in jobs if isinstance(jobs, list) else [jobs]:
        print(f"job {job['id']} {job['status']}")


def watch(url: str, job: dict[str, Any]) -> None:
    print(f"watch: {url.rstrip('/')}{job['urls']['content']}", flush=True)


if __name__ == "__main__":
    main()
