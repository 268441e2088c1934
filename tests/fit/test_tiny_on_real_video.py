"""The shipped `tiny` weights on real footage they were not fitted on: held-out frames of
the real clips (the fit trains only on frames 85 and later), at each clip's own size."""

from __future__ import annotations

import math

import pytest
import real_clips
import torch

from vaecast.models.tiny import TinyDecoder, encode_video

# (clip, floor in dB) on the first 9 held-out frames at the clip's own geometry. The
# shipped weights give 3.3-3.4 dB more than each floor (36.4, 30.4); untrained ~10 dB.
FLOORS = {"bikes": 33.0, "bigbuckbunny": 27.0}


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    return 10 * math.log10(1.0 / torch.mean((a - b) ** 2).item())


@pytest.mark.slow
@pytest.mark.usefixtures("need_clips")
@pytest.mark.parametrize(("name", "floor"), FLOORS.items())
def test_shipped_weights_reconstruct_held_out_real_frames(name: str, floor: float) -> None:
    frames = real_clips.heldout_span(name)[:9]
    h, w = frames.shape[1] // 8 * 8, frames.shape[2] // 8 * 8
    video = real_clips.to_video(frames[:, :h, :w])
    decoded = TinyDecoder().decode(encode_video(video))
    assert decoded.shape == video.shape
    assert psnr(decoded, video) > floor
