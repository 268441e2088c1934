"""Where `tiny` loses on each held-out real clip: in time, or in space.

    python tools/where_the_loss_is.py [--weights PATH]

For each clip of `tools/real_clips.py`, its held-out span (the 81 frames that
`benchmarks/tiny_quality.py` measures, scaled to cover 832x480), through the encoder
and the decoder in-process (no x264), PSNR in dB of:

- `vae`: the span as it is;
- `frozen`: the span with each latent's 4 frames replaced by the last of them (frame
  0 alone, as always), so nothing moves within a latent: if the 4x temporal
  compression were what loses, this would score much higher;
- `by position`: `vae` for the 1st, 2nd, 3rd and 4th frame of each latent;
- `frame to frame`: each frame against the one before (how much the footage moves);
- `8x blur`: each frame against its 8x8 block means, bilinearly upsampled (how much
  of the picture is detail finer than a latent's 8x8 patch).

Needs the `fit` extra (the clips). Prints one line per clip; writes nothing.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import real_clips  # tools/ is not a package

from vaecast.models.tiny import TEMPORAL_SCALE, TinyDecoder, TinyEncoder

HEIGHT, WIDTH = 480, 832


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    return 10 * math.log10(1.0 / max(torch.mean((a - b) ** 2).item(), 1e-12))


def frozen_within_latents(video: torch.Tensor) -> torch.Tensor:
    """Each latent's frames (1-4, 5-8, ...) replaced by the last of them."""
    frozen = video.clone()
    for start in range(1, video.shape[2], TEMPORAL_SCALE):
        frozen[:, :, start : start + TEMPORAL_SCALE] = video[:, :, start + TEMPORAL_SCALE - 1][
            :, :, None
        ]
    return frozen


def block_blur_psnr(video: torch.Tensor) -> float:
    frames = video[0].transpose(0, 1)  # (T, 3, H, W)
    blurred = F.interpolate(F.avg_pool2d(frames, 8), scale_factor=8, mode="bilinear")
    return psnr(blurred, frames)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--weights", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(2)
    encoder, decoder = TinyEncoder(weights=args.weights), TinyDecoder(weights=args.weights)
    for clip in real_clips.CLIPS:
        frames = real_clips.heldout_span(clip.name)[: real_clips.HELDOUT_FRAMES]
        video = real_clips.to_video(real_clips.scale_cover(frames, HEIGHT, WIDTH))
        frozen = frozen_within_latents(video)
        with torch.inference_mode():
            decoded = decoder.decode(encoder.encode(video))
            decoded_frozen = decoder.decode(encoder.encode(frozen))
        count = video.shape[2]
        by_position = [
            statistics.fmean(
                psnr(decoded[:, :, t], video[:, :, t]) for t in range(1 + k, count, TEMPORAL_SCALE)
            )
            for k in range(TEMPORAL_SCALE)
        ]
        moving = statistics.fmean(psnr(video[:, :, t], video[:, :, t - 1]) for t in range(1, count))
        print(
            f"{clip.name:13s} vae {psnr(decoded, video):6.2f}  "
            f"frozen {psnr(decoded_frozen, frozen):6.2f}  "
            f"by position {' '.join(f'{p:5.2f}' for p in by_position)}  "
            f"frame to frame {moving:6.2f}  8x blur {block_blur_psnr(video):6.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
