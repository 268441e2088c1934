"""Watch HunyuanVideo FramePack section by section: each section is decoded here, by
the pipeline's own decode step, and its frames pushed to a vaecast server as it is made.

    # a real model on a GPU: DIR is a saved HunyuanVideoFramepackPipeline, e.g.
    #   HunyuanVideoFramepackPipeline.from_pretrained("hunyuanvideo-community/HunyuanVideo",
    #       transformer=<lllyasviel/FramePackI2V_HY>, image_encoder=..., feature_extractor=...
    #       <both from lllyasviel/flux_redux_bfl>).save_pretrained(DIR)
    vaecast serve --push-idle-timeout 600 &
    python examples/framepack_sections.py --weights DIR --image first.png --prompt "..."

    # no download: tiny random components, on the CPU; any server will do
    vaecast serve &
    python examples/framepack_sections.py --tiny-random

`vaecast.integrations.diffusers.stream_sections` needs `sampling_type="vanilla"`, the
sampling that makes sections in the order they play. Each section's frames go out but
the last `(latent_window_size - 1) * 4 + 1`, which the next section cross-fades; the
server only encodes (a frames push session), so it needs no VAE.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch
from size_flags import add_size_flags, chosen, given

from vaecast.integrations.diffusers import stream_sections

SIZES = {"num_frames": 129, "height": 512, "width": 512, "num_inference_steps": 30}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--tiny-random", action="store_true", help="tiny random FramePack")
    source.add_argument("--weights", metavar="DIR", help="a saved FramePack pipeline folder")
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="the vaecast server")
    parser.add_argument("--image", help="the first frame (with --weights)")
    parser.add_argument("--prompt", default="the camera slowly orbits the scene")
    add_size_flags(parser, SIZES)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    call: dict[str, Any]
    if args.tiny_random:
        import tiny_random

        pipe = tiny_random.framepack()
        call = tiny_random.framepack_call(**given(args, SIZES))
        device = "cpu"
    else:
        if args.image is None:
            parser.error("--weights needs --image")
        import PIL.Image
        from diffusers import HunyuanVideoFramepackPipeline

        pipe = HunyuanVideoFramepackPipeline.from_pretrained(
            args.weights, torch_dtype=torch.bfloat16
        )
        pipe.to(args.device)
        device = args.device
        call = {
            "image": PIL.Image.open(args.image).convert("RGB"),
            "prompt": args.prompt,
            **chosen(args, SIZES),
            "guidance_scale": 9.0,
            "sampling_type": "vanilla",
        }
    call["generator"] = torch.Generator(device).manual_seed(args.seed)

    started = time.perf_counter()

    def on_job(job: dict[str, Any]) -> None:
        elapsed = time.perf_counter() - started
        content = args.url.rstrip("/") + job["urls"]["content"]
        print(f"first section pushed at {elapsed:.1f} s; watch: {content}", flush=True)

    jobs = stream_sections(pipe, args.url, on_job=on_job, **call)
    print(f"pipeline done at {time.perf_counter() - started:.1f} s")
    for job in jobs if isinstance(jobs, list) else [jobs]:
        print(f"job {job['id']} {job['status']}")


if __name__ == "__main__":
    main()
