"""Media generated on the fly for codec tests."""

from __future__ import annotations

import numpy as np


def gradient_frames(count: int, width: int = 64, height: int = 48) -> np.ndarray:
    """(count, height, width, 3) uint8 RGB: smooth gradients drifting over time.

    Smooth content with no scene cuts keeps H.264 error small and x264 from
    inserting keyframes of its own, so tests can pin both.
    """
    t = np.arange(count)[:, None, None]
    y, x = np.mgrid[0:height, 0:width]
    red = 128 + 90 * np.sin(2 * np.pi * (x / width + 0.05 * t))
    green = 128 + 90 * np.cos(2 * np.pi * (y / height + 0.03 * t))
    blue = np.broadcast_to(64 + 60 * (x + y) / (width + height), red.shape)
    return np.stack([red, green, blue], axis=-1).round().astype(np.uint8)
