"""Decoder output (float BCTHW on any device) to 8-bit RGB frames on the host.

Everything is done on the tensor's own device, so a GPU decode ships one uint8
THWC buffer to the host (a quarter of the float32 bytes, already in the layout
the encoder reads) through exactly one device-to-host copy per chunk.
"""

from __future__ import annotations

import math

import numpy as np
import torch

_MAX_8BIT = 255.0


def quantize_to_host(frames: torch.Tensor, value_range: tuple[float, float]) -> np.ndarray:
    """BCTHW (B == 1, C == 3 RGB) floats in `value_range` -> (T, H, W, 3) uint8 on the host.

    Values map linearly so `value_range` ends become 0 and 255, round half up, and
    anything outside the range clamps to it.
    """
    if not isinstance(frames, torch.Tensor):
        raise ValueError(f"frames must be a torch.Tensor, got {type(frames).__name__}")
    if frames.ndim != 5:
        raise ValueError(f"frames must be BCTHW (5-D), got shape {tuple(frames.shape)}")
    batch, channels = frames.shape[:2]
    if batch != 1:
        raise ValueError(f"frames must have batch size 1, got {batch}")
    if channels != 3:
        raise ValueError(f"frames must have 3 (RGB) channels, got {channels}")
    if not frames.is_floating_point():
        raise ValueError(f"frames must be a floating-point tensor, got {frames.dtype}")
    low, high = (float(v) for v in value_range)
    if not (math.isfinite(low) and math.isfinite(high) and high > low):
        raise ValueError(f"value_range must be finite with high > low, got {value_range}")

    with torch.no_grad():
        # float32 at least: fp16/bf16 cannot hold 255 * x exactly enough to round right.
        x = frames[0].to(torch.promote_types(frames.dtype, torch.float32))
        scaled = (x - low) * (_MAX_8BIT / (high - low))
        # floor(x + 0.5) rounds half up, the same on every device (torch.round is
        # half-to-even, which would map the midpoint 127.5 to 128 but 126.5 to 126).
        pixels = torch.floor(scaled + 0.5).clamp_(0.0, _MAX_8BIT).to(torch.uint8)
        # CTHW -> THWC on the device, so the single copy lands in the encoder's layout.
        thwc = pixels.permute(1, 2, 3, 0).contiguous()
        return thwc.cpu().numpy()
