"""RGB -> YUV 4:2:0 on the tensor's device or through swscale, and the encoder taking the planes."""

from __future__ import annotations

import io
from fractions import Fraction

import av
import numpy as np
import pytest
import torch

from tests.helpers.media import gradient_frames
from vaecast.codecs.colour import Yuv420Frames, from_rgb
from vaecast.codecs.h264 import H264Encoder
from vaecast.codecs.quantize import quantize_to_host, quantize_yuv420_to_host
from vaecast.codecs.stream import VideoStreamEncoder

WIDTH, HEIGHT = 64, 48
# The same floor as test_stream's RGB path: a wrong matrix or range lands near 20 dB.
PSNR_FLOOR_DB = 32.0


def solid(rgb: tuple[float, float, float], frames: int = 1) -> torch.Tensor:
    return torch.tensor(rgb, dtype=torch.float32).reshape(1, 3, 1, 1, 1).expand(1, 3, frames, 4, 6)


def as_float(rgb: np.ndarray) -> torch.Tensor:
    """(T, H, W, 3) uint8 -> BCTHW float in [0, 1]."""
    return torch.from_numpy(rgb).permute(3, 0, 1, 2).unsqueeze(0).float() / 255.0


def psnr_db(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float(10 * np.log10(255**2 / mse))


# BT.601 limited range, the textbook 8-bit values.
TEXTBOOK_COLOURS = [
    ((0.0, 0.0, 0.0), (16, 128, 128)),
    ((1.0, 1.0, 1.0), (235, 128, 128)),
    ((1.0, 0.0, 0.0), (81, 90, 240)),
    ((0.0, 1.0, 0.0), (145, 54, 34)),
    ((0.0, 0.0, 1.0), (41, 240, 110)),
]


@pytest.mark.parametrize(
    ("rgb", "yuv"),
    [*TEXTBOOK_COLOURS, ((2.0, -1.0, -3.0), (81, 90, 240))],  # the last clamped to red
)
def test_textbook_colours(rgb: tuple[float, float, float], yuv: tuple[int, int, int]) -> None:
    for value_range, values in (((0.0, 1.0), rgb), ((-1.0, 1.0), tuple(2 * v - 1 for v in rgb))):
        out = quantize_yuv420_to_host(solid(values, frames=2), value_range)
        assert out.planes.shape == (2, 6, 6)
        for plane, expected in enumerate(yuv):
            assert np.all(out.plane(1, plane) == expected), (value_range, plane)


@pytest.mark.parametrize(("rgb", "yuv"), TEXTBOOK_COLOURS)
def test_from_rgb_textbook_colours(
    rgb: tuple[float, float, float], yuv: tuple[int, int, int]
) -> None:
    pixels = np.broadcast_to(np.array(rgb) * 255, (2, 4, 6, 3)).astype(np.uint8)
    out = from_rgb(pixels)
    assert (out.planes.shape, out.height, out.width) == ((2, 6, 6), 4, 6)
    for plane, expected in enumerate(yuv):
        assert np.all(out.plane(1, plane) == expected), plane


@pytest.mark.parametrize(
    "frames",
    [
        np.zeros((2, 4, 6, 3), np.float32),
        np.zeros((4, 6, 3), np.uint8),
        np.zeros((2, 4, 6, 4), np.uint8),
        np.zeros((2, 3, 6, 3), np.uint8),
        np.zeros((2, 4, 5, 3), np.uint8),
    ],
)
def test_from_rgb_refuses_what_is_not_even_uint8_rgb(frames: np.ndarray) -> None:
    with pytest.raises(ValueError, match=r"uint8 array of shape \(T, H, W, 3\) with even H and W"):
        from_rgb(frames)


def test_planes_against_a_float64_reference() -> None:
    generator = torch.Generator().manual_seed(0)
    frames = torch.rand(1, 3, 3, 6, 10, generator=generator)
    out = quantize_yuv420_to_host(frames, (0.0, 1.0))
    assert out.planes.flags.c_contiguous and out.planes.dtype == np.uint8
    x = frames[0].double().numpy()
    r, g, b = x
    luma = 16 + 219 * (0.299 * r + 0.587 * g + 0.114 * b)
    blocks = x.reshape(3, 3, 3, 2, 5, 2).mean(axis=(3, 5))
    block_luma = 0.299 * blocks[0] + 0.587 * blocks[1] + 0.114 * blocks[2]
    cb = 128 + 224 * (blocks[2] - block_luma) / 1.772
    cr = 128 + 224 * (blocks[0] - block_luma) / 1.402
    for plane, ideal in enumerate((luma, cb, cr)):
        got = np.stack([out.plane(t, plane) for t in range(3)]).astype(np.float64)
        assert np.all(np.abs(got - ideal) <= 0.5 + 1e-4), plane


def test_close_to_swscale() -> None:
    rgb = gradient_frames(3, WIDTH, HEIGHT)
    ours = quantize_yuv420_to_host(as_float(rgb), (0.0, 1.0))
    theirs = from_rgb(rgb)
    for index in range(len(rgb)):
        difference = np.abs(ours.planes[index].astype(np.int16) - theirs.planes[index])
        assert difference[:HEIGHT].max() <= 1
        assert difference[HEIGHT:].mean() < 0.5


def test_one_device_to_host_copy_of_the_planes(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    original = torch.Tensor.cpu

    def counting_cpu(self: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        calls.append((tuple(self.shape), self.dtype))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "cpu", counting_cpu)
    quantize_yuv420_to_host(solid((0.2, 0.4, 0.6), frames=3), (0.0, 1.0))
    assert calls == [((3, 6, 6), torch.uint8)]


def test_input_is_not_modified() -> None:
    frames = torch.full((1, 3, 1, 2, 2), 2.0)
    quantize_yuv420_to_host(frames, (0.0, 1.0))
    assert torch.all(frames == 2.0)


def test_odd_size_and_bad_input_raise() -> None:
    with pytest.raises(ValueError, match="even width and height"):
        quantize_yuv420_to_host(torch.zeros(1, 3, 1, 3, 4), (0.0, 1.0))
    with pytest.raises(ValueError, match="3 \\(RGB\\) channels"):
        quantize_yuv420_to_host(torch.zeros(1, 4, 1, 2, 2), (0.0, 1.0))
    with pytest.raises(ValueError, match=r"shape \(T, 6, 4\)"):
        Yuv420Frames(np.zeros((1, 4, 4), np.uint8), height=4, width=4)


def test_stream_of_yuv_chunks_decodes_to_the_source() -> None:
    source = gradient_frames(9, WIDTH, HEIGHT)
    stream = VideoStreamEncoder(WIDTH, HEIGHT, Fraction(16))
    data = stream.init_segment
    for start, count in ((0, 1), (1, 4), (5, 4)):
        chunk = quantize_yuv420_to_host(as_float(source[start : start + count]), (0.0, 1.0))
        assert chunk.shape == (count, HEIGHT, WIDTH, 3)
        data += stream.encode_chunk(chunk)
    stream.close()
    with av.open(io.BytesIO(data)) as container:
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    assert len(frames) == len(source)
    for index, frame in enumerate(frames):
        assert psnr_db(frame, source[index]) > PSNR_FLOOR_DB, index


def test_swscale_and_torch_chunks_mix_in_one_stream() -> None:
    source = gradient_frames(8, WIDTH, HEIGHT)
    encoder = H264Encoder(WIDTH, HEIGHT, Fraction(16))
    samples = encoder.encode(from_rgb(source[:4]))
    samples += encoder.encode(quantize_yuv420_to_host(as_float(source[4:]), (0.0, 1.0)))
    encoder.close()
    assert len(samples) == 8 and encoder.frames_encoded == 8


def test_yuv_frames_of_another_size_are_refused() -> None:
    encoder = H264Encoder(WIDTH, HEIGHT, Fraction(16))
    other = quantize_yuv420_to_host(torch.zeros(1, 3, 1, HEIGHT, WIDTH + 2), (0.0, 1.0))
    with pytest.raises(ValueError, match="must be 64x48, got 66x48"):
        encoder.encode(other)
    assert encoder.frames_encoded == 0
    encoder.close()


def test_rgb_path_unchanged_by_the_yuv_path() -> None:
    rgb = gradient_frames(2, WIDTH, HEIGHT)
    np.testing.assert_array_equal(quantize_to_host(as_float(rgb), (0.0, 1.0)), rgb)
