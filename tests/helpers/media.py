"""Media generated on the fly for codec tests, and real parameter sets from libx264."""

from __future__ import annotations

import io

import av
import numpy as np

from vaecast.codecs.colour import Yuv420Frames, from_rgb

# libx264's SPS/PPS for 64x48: ultrafast (Constrained Baseline) and veryfast (High).
X264_BASELINE_SPS = bytes.fromhex("6742c00ada11e9a830302a000003000200000300411e244d40")
X264_BASELINE_PPS = bytes.fromhex("68ce0fc8")
X264_HIGH_SPS = bytes.fromhex("6764000aacb423d350606054000003000400000300823c489a80")
# The baseline pair as an avcC payload, as an `avc1` sample entry carries it.
X264_BASELINE_AVCC = (
    bytes.fromhex("0142c00affe10019") + X264_BASELINE_SPS + b"\x01\x00\x04" + X264_BASELINE_PPS
)


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


def gradient_yuv(count: int, width: int = 64, height: int = 48) -> Yuv420Frames:
    """`gradient_frames` as the encoder takes them (swscale's BT.601 4:2:0)."""
    return from_rgb(gradient_frames(count, width, height))


def x264_options(h264: bytes) -> str:
    """The options x264 says it encoded with: the text of the SEI it writes into the
    first frame, found in an encoded sample or a whole MP4 (`rc=cqp ... qp=21 ...`)."""
    text = h264.decode("latin-1")
    return text[text.index("options: ") :].split("\0", 1)[0]


def decode_yuv420(data: bytes) -> list[np.ndarray]:
    """Every frame of an MP4 as its decoded I420 planes, (H * 3 // 2, W) uint8: what a
    lossless encode must give back exactly, with no colour conversion in between."""
    with av.open(io.BytesIO(data)) as container:
        return [frame.to_ndarray(format="yuv420p") for frame in container.decode(video=0)]
