"""The GPU path's host side: YUV 4:2:0 made on the device, one copy, a wait on the encode side.

On this CPU-only machine the CUDA tests skip; what runs here is the device math on
CPU tensors against swscale and the float64 reference, the fallback (no stream, no
pinned memory, CUDA never initialized), and frames whose copy is still in flight
reaching the real encoder, which must wait for them.
"""

from __future__ import annotations

import io
import threading
from fractions import Fraction

import av
import numpy as np
import pytest
import torch

from tests.helpers.media import gradient_frames
from vaecast.codecs.colour import Yuv420Frames, from_rgb
from vaecast.codecs.h264 import H264Encoder
from vaecast.codecs.quantize import copy_to_host, quantize_yuv420_to_host, yuv420_on_device
from vaecast.codecs.stream import VideoStreamEncoder

WIDTH, HEIGHT = 64, 48
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def as_float(rgb: np.ndarray) -> torch.Tensor:
    """(T, H, W, 3) uint8 -> BCTHW float in [-1, 1] (Wan's range)."""
    return torch.from_numpy(rgb).permute(3, 0, 1, 2).unsqueeze(0).float() / 127.5 - 1.0


def test_device_planes_against_swscale_within_one_level() -> None:
    """The device math (run here on CPU tensors) against `colour.from_rgb` (swscale):
    luma within 1 level everywhere, chroma within 1 level and 0.5 on average."""
    rgb = gradient_frames(4, WIDTH, HEIGHT)
    ours = yuv420_on_device(as_float(rgb), (-1.0, 1.0)).numpy()
    theirs = from_rgb(rgb).planes
    difference = np.abs(ours.astype(np.int16) - theirs)
    assert difference[:, :HEIGHT].max() <= 1
    assert difference[:, HEIGHT:].max() <= 1
    assert difference[:, HEIGHT:].mean() < 0.5


def test_host_frames_are_the_device_planes_byte_for_byte() -> None:
    frames = torch.rand(1, 3, 3, HEIGHT, WIDTH, generator=torch.Generator().manual_seed(1))
    on_device = yuv420_on_device(frames, (0.0, 1.0))
    host = quantize_yuv420_to_host(frames, (0.0, 1.0))
    assert on_device.shape == (3, HEIGHT * 3 // 2, WIDTH) and on_device.dtype == torch.uint8
    np.testing.assert_array_equal(host.planes, on_device.numpy())
    assert (host.height, host.width) == (HEIGHT, WIDTH)


def test_cpu_fallback_is_a_plain_copy_with_nothing_to_wait_for() -> None:
    planes = torch.arange(2 * 6 * 4, dtype=torch.int64).to(torch.uint8).view(2, 6, 4)
    host, ready = copy_to_host(planes)
    assert ready is None
    np.testing.assert_array_equal(host, planes.numpy())
    frames = quantize_yuv420_to_host(torch.zeros(1, 3, 2, 4, 4), (0.0, 1.0))
    assert not frames.pending
    assert frames.planes.shape == (2, 6, 4)


def test_cpu_fallback_never_touches_cuda() -> None:
    """No side stream, no pinned allocation: on a machine without CUDA (or a CPU
    decode on one with it) the path is the synchronous copy it always was."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        pytest.skip("CUDA was initialized by an earlier test in this process")
    quantize_yuv420_to_host(torch.rand(1, 3, 2, 8, 8), (0.0, 1.0))
    assert not torch.cuda.is_initialized()


class LandingLater:
    """A copy in flight, played on the CPU: `planes` are zeros until `ready` writes them.

    What a reader sees before the wait is garbage; after it, the frames."""

    def __init__(self, frames: Yuv420Frames) -> None:
        self.source = frames.planes
        self.target = np.zeros_like(self.source)
        self.waits = 0
        self.frames = Yuv420Frames(self.target, frames.height, frames.width, self.ready)

    def ready(self) -> None:
        self.waits += 1
        self.target[...] = self.source


def test_shape_and_length_do_not_wait_for_the_copy() -> None:
    landing = LandingLater(from_rgb(gradient_frames(3, WIDTH, HEIGHT)))
    assert len(landing.frames) == 3
    assert landing.frames.shape == (3, HEIGHT, WIDTH, 3)
    assert landing.frames.pending and landing.waits == 0
    assert "copy pending" in repr(landing.frames)


def test_planes_wait_once_and_slices_wait_too() -> None:
    source = from_rgb(gradient_frames(3, WIDTH, HEIGHT))
    landing = LandingLater(source)
    head = landing.frames[:1]
    np.testing.assert_array_equal(head.planes, source.planes[:1])
    np.testing.assert_array_equal(landing.frames.planes, source.planes)
    landing.frames.plane(2, 1)
    assert not landing.frames.pending
    # The slice waited (once), the whole frames waited once more, then never again.
    assert landing.waits == 2


def test_frames_are_immutable() -> None:
    frames = from_rgb(gradient_frames(1, WIDTH, HEIGHT))
    with pytest.raises(AttributeError, match="immutable"):
        frames.height = 2  # type: ignore[misc]


def test_the_encoder_waits_for_a_copy_in_flight() -> None:
    """Frames whose bytes land only when waited for, through the real encoder and
    decoder: the stream is the one the landed frames make, not that of the zeros
    that were there before the wait."""
    rgb = gradient_frames(6, WIDTH, HEIGHT)
    source = from_rgb(rgb)
    landing = LandingLater(source)
    streams = []
    for frames in (landing.frames, source):
        stream = VideoStreamEncoder(WIDTH, HEIGHT, Fraction(16))
        streams.append(stream.init_segment + stream.encode_chunk(frames))
        stream.close()
    assert landing.waits >= 1
    assert streams[0] == streams[1]
    with av.open(io.BytesIO(streams[0]), format="mp4") as container:
        decoded = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    assert len(decoded) == 6
    error = np.abs(np.stack(decoded).astype(np.int16) - rgb).mean()
    assert error < 8.0, error  # the zeros would be ~100 levels off


def test_a_copy_landing_on_another_thread_holds_the_encoder_until_it_lands() -> None:
    source = from_rgb(gradient_frames(2, WIDTH, HEIGHT))
    target = np.zeros_like(source.planes)
    landed = threading.Event()

    def copy_later() -> None:
        target[...] = source.planes
        landed.set()

    timer = threading.Timer(0.2, copy_later)

    def wait() -> None:
        assert landed.wait(5.0), "the copy never landed"

    encoder = H264Encoder(WIDTH, HEIGHT, Fraction(16))
    timer.start()
    try:
        samples = encoder.encode(Yuv420Frames(target, HEIGHT, WIDTH, wait))
    finally:
        timer.join()
        encoder.close()
    assert landed.is_set() and len(samples) == 2


@CUDA
def test_cuda_copy_is_pinned_pending_and_byte_identical() -> None:
    frames = torch.rand(1, 3, 5, 480, 832, generator=torch.Generator().manual_seed(2))
    expected = quantize_yuv420_to_host(frames, (0.0, 1.0)).planes
    on_gpu = quantize_yuv420_to_host(frames.cuda(), (0.0, 1.0))
    assert on_gpu.pending
    np.testing.assert_array_equal(on_gpu.planes, expected)
    assert not on_gpu.pending


@CUDA
def test_cuda_copy_runs_on_a_side_stream_into_pinned_memory() -> None:
    planes = torch.randint(0, 256, (4, 720, 832), dtype=torch.uint8, device="cuda")
    host, ready = copy_to_host(planes)
    assert ready is not None
    ready()
    np.testing.assert_array_equal(host, planes.cpu().numpy())
    base = host.base
    while base is not None and not isinstance(base, torch.Tensor):
        base = getattr(base, "base", None)
    assert isinstance(base, torch.Tensor) and base.is_pinned()


@CUDA
def test_cuda_copy_waits_for_the_kernels_that_made_the_tensor() -> None:
    """The side stream waits for the current stream: a tensor still being written
    by queued kernels is copied after them, not before."""
    torch.cuda.synchronize()
    big = torch.zeros(4096, 4096, device="cuda")
    for _ in range(20):  # keep the current stream busy
        big = big @ torch.eye(4096, device="cuda") + 1.0
    planes = big[:6, :8].to(torch.uint8).view(1, 6, 8)
    host, ready = copy_to_host(planes)
    assert ready is not None
    ready()
    assert np.all(host == 20)
