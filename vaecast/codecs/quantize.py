"""Decoder output (float BCTHW on any device) to 8-bit frames on the host: RGB or YUV 4:2:0.

Everything is done on the tensor's own device, so a GPU decode ships one uint8
buffer to the host (YUV 4:2:0: 1.5 bytes a pixel, 1/8 of the float32 RGB; already
in the layout the encoder reads) through exactly one device-to-host copy per chunk.
On CUDA that copy goes into pinned host memory on a side stream and the encode
thread waits for it (`copy_to_host`), so the decode thread queues the next chunk's
kernels while the copy runs; elsewhere it is a plain `.cpu()`.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable

import numpy as np
import torch

from vaecast.codecs import colour
from vaecast.codecs.colour import Yuv420Frames

_MAX_8BIT = 255.0


def _check(frames: torch.Tensor, value_range: tuple[float, float]) -> tuple[float, float]:
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
    return low, high


def quantize_to_host(frames: torch.Tensor, value_range: tuple[float, float]) -> np.ndarray:
    """BCTHW (B == 1, C == 3 RGB) floats in `value_range` -> (T, H, W, 3) uint8 on the host.

    Values map linearly so `value_range` ends become 0 and 255, round half up, and
    anything outside the range clamps to it.
    """
    low, high = _check(frames, value_range)
    with torch.no_grad():
        # float32 at least: fp16/bf16 cannot hold 255 * x exactly enough to round right.
        x = frames[0].to(torch.promote_types(frames.dtype, torch.float32))
        # Written straight into THWC: the first operation reads the CTHW input strided,
        # every later one runs in place on one buffer. On a CPU each pass over the
        # frame costs about as much as its arithmetic, and the permute-then-copy this
        # replaces was one more pass (benchmarks/results: ~2x faster, same bytes).
        thwc = x.permute(1, 2, 3, 0)
        scaled = torch.empty(thwc.shape, dtype=x.dtype, device=x.device)
        if low:
            torch.sub(thwc, low, out=scaled).mul_(_MAX_8BIT / (high - low))
        else:
            torch.mul(thwc, _MAX_8BIT / high, out=scaled)
        # floor(x + 0.5) rounds half up, the same on every device (torch.round is
        # half-to-even, which would map the midpoint 127.5 to 128 but 126.5 to 126).
        # After the clamp to [0, 255] every value is >= 0, so the cast's truncation
        # toward zero is that floor.
        pixels = scaled.add_(0.5).clamp_(0.0, _MAX_8BIT).to(torch.uint8)
        return pixels.cpu().numpy()


def quantize_yuv420_to_host(frames: torch.Tensor, value_range: tuple[float, float]) -> Yuv420Frames:
    """BCTHW (B == 1, C == 3 RGB) floats in `value_range` -> 8-bit YUV 4:2:0 on the host.

    The RGB -> YUV conversion and the 4:2:0 subsampling run on the tensor's own
    device (`yuv420_on_device`), so a GPU decode ships 1.5 bytes per pixel (half of
    RGB) through one device-to-host copy (`copy_to_host`), and the encoder skips
    swscale. From a CUDA tensor that copy is still in flight when this returns: the
    frames' `planes` waits for it, on whichever thread reads them first (the encode
    thread), so the decode thread goes on to the next chunk meanwhile.
    """
    planes = yuv420_on_device(frames, value_range)
    _, h3, w = planes.shape
    host, ready = copy_to_host(planes)
    return Yuv420Frames(host, h3 * 2 // 3, w, ready)


def yuv420_on_device(
    frames: torch.Tensor, value_range: tuple[float, float], out: torch.Tensor | None = None
) -> torch.Tensor:
    """BCTHW RGB floats in `value_range` -> (T, H * 3 // 2, W) uint8 I420 planes, on
    the tensor's own device (written into `out`, a contiguous uint8 tensor of that
    shape, where given).

    BT.601, limited range (`colour.BT601_LIMITED`). RGB clamps to `value_range` first,
    as in `quantize_to_host`; each plane rounds half up. Each chroma sample is the mean
    of its 2x2 luma block, which is what swscale does for rgb24 -> yuv420p (mean
    difference from it ~0.2 levels on the demo scenes; luma within 1).
    """
    low, high = _check(frames, value_range)
    _, _, t, h, w = frames.shape
    if h % 2 or w % 2:
        raise ValueError(f"4:2:0 needs an even width and height, got {w}x{h}")
    with torch.no_grad():
        x = frames[0].to(torch.promote_types(frames.dtype, torch.float32)).clamp(low, high)
        # Normalization to [0, 1] folds into the matrix: row . ((x - low) * s) + offset
        # == row . x * s + (offset - s * low * sum(row)); + 0.5 makes the cast round.
        scale = 1.0 / (high - low)
        if out is None:
            out = torch.empty(t, h * 3 // 2, w, dtype=torch.uint8, device=x.device)
        elif out.shape != (t, h * 3 // 2, w) or out.dtype != torch.uint8 or not out.is_contiguous():
            raise ValueError(f"out must be contiguous uint8 of shape {(t, h * 3 // 2, w)}")
        out = out.view(t, h * w * 3 // 2)
        luma = out[:, : h * w].view(t, h, w)
        luma.copy_(_weighted_sum(x, colour.BT601_LIMITED[0], scale, low, colour.OFFSETS[0]))
        rows = x[:, :, 0::2] + x[:, :, 1::2]
        block_mean = (rows[..., 0::2] + rows[..., 1::2]).mul_(0.25)
        chroma = out[:, h * w :].view(t, 2, h // 2, w // 2)
        for plane in (1, 2):
            row, offset = colour.BT601_LIMITED[plane], colour.OFFSETS[plane]
            chroma[:, plane - 1].copy_(_weighted_sum(block_mean, row, scale, low, offset))
        return out.view(t, h * 3 // 2, w)


def copy_to_host(tensor: torch.Tensor) -> tuple[np.ndarray, Callable[[], None] | None]:
    """The one device-to-host copy of a chunk: (host array, the wait for it, or None).

    From a CUDA tensor: into pinned (page-locked) host memory, on a side stream of
    the calling thread that first waits for the work queued so far on the current
    stream (the kernels that made `tensor`). The copy is enqueued and this returns at
    once; the wait returned is `Event.synchronize` (which releases the GIL) of an event
    recorded after the copy. Pinned blocks come from torch's caching host allocator,
    so after the first chunks no call allocates page-locked memory; the device
    buffer is kept from reuse until the side stream is done with it (`record_stream`).

    From any other tensor (CPU, or a device without streams): today's synchronous
    `.cpu()`, which costs nothing for a CPU tensor, and no wait.
    """
    if tensor.device.type != "cuda":
        return tensor.cpu().numpy(), None
    device = tensor.device
    side = _side_stream(device)
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        host.copy_(tensor, non_blocking=True)
        copied = torch.cuda.Event()
        copied.record(side)
    tensor.record_stream(side)
    # The array's base holds `host`: the pinned block stays allocated while any view
    # of these frames lives, and returns to the allocator's cache after.
    return host.numpy(), copied.synchronize


class _SideStreams(threading.local):
    """One side stream per (decode thread, device): copies of two decodes never queue
    behind each other."""

    def __init__(self) -> None:
        self.streams: dict[torch.device, torch.cuda.Stream] = {}


_SIDE = _SideStreams()


def _side_stream(device: torch.device) -> torch.cuda.Stream:
    stream = _SIDE.streams.get(device)
    if stream is None:
        stream = _SIDE.streams[device] = torch.cuda.Stream(device)
    return stream


def _weighted_sum(
    rgb: torch.Tensor, row: tuple[float, float, float], scale: float, low: float, offset: float
) -> torch.Tensor:
    """row . ((rgb - low) * scale) + offset + 0.5, over the channel dimension (dim 0)."""
    constant = offset + 0.5 - scale * low * sum(row)
    total = torch.mul(rgb[0], row[0] * scale)
    total.add_(rgb[1], alpha=row[1] * scale).add_(rgb[2], alpha=row[2] * scale)
    # Limited range never reaches 0 or 255 from in-range RGB; the clamp guards the
    # cast against float error at the ends.
    return total.add_(constant).clamp_(0.0, _MAX_8BIT)
