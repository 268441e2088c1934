"""quantize_to_host: exact 8-bit values, layout, and one device-to-host copy."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vaecast.codecs.quantize import quantize_to_host


def constant(value: float, frames: int = 1, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.full((1, 3, frames, 2, 4), value, dtype=dtype)


@pytest.mark.parametrize(
    ("value_range", "value", "expected"),
    [
        ((0.0, 1.0), 0.0, 0),
        ((0.0, 1.0), 1.0, 255),
        ((0.0, 1.0), 0.5, 128),  # 127.5 rounds half up
        ((-1.0, 1.0), -1.0, 0),
        ((-1.0, 1.0), 1.0, 255),
        ((-1.0, 1.0), 0.0, 128),
        ((0.0, 255.0), 126.5, 127),  # half up, where half-to-even would give 126
        ((0.0, 255.0), 126.49, 126),
        ((0.0, 255.0), 0.6, 1),
        ((0.0, 1.0), -0.5, 0),  # clamped
        ((0.0, 1.0), 7.0, 255),
        ((-1.0, 1.0), -3.0, 0),
    ],
)
def test_exact_values(value_range: tuple[float, float], value: float, expected: int) -> None:
    out = quantize_to_host(constant(value), value_range)
    assert out.dtype == np.uint8
    assert np.all(out == expected)


def test_half_precision_input_reaches_both_ends() -> None:
    for dtype in (torch.float16, torch.bfloat16):
        assert np.all(quantize_to_host(constant(1.0, dtype=dtype), (0.0, 1.0)) == 255)
        assert np.all(quantize_to_host(constant(-1.0, dtype=dtype), (-1.0, 1.0)) == 0)


def test_layout_is_thwc_and_contiguous() -> None:
    t, h, w = 2, 3, 5
    frames = torch.zeros(1, 3, t, h, w)
    # Encode channel, frame, row and column into each value to pin the permutation.
    for c in range(3):
        for ti in range(t):
            for y in range(h):
                for x in range(w):
                    frames[0, c, ti, y, x] = c * 60 + ti * 20 + y * 5 + x
    out = quantize_to_host(frames, (0.0, 255.0))
    assert isinstance(out, np.ndarray)
    assert out.shape == (t, h, w, 3)
    assert out.flags.c_contiguous
    assert out[1, 2, 4].tolist() == [20 + 10 + 4, 60 + 34, 120 + 34]
    expected = frames[0].permute(1, 2, 3, 0).numpy().astype(np.uint8)
    np.testing.assert_array_equal(out, expected)


def test_exactly_one_device_to_host_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    original = torch.Tensor.cpu

    def counting_cpu(self: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        calls.append(tuple(self.shape))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "cpu", counting_cpu)
    out = quantize_to_host(constant(0.25, frames=3), (0.0, 1.0))
    # The one copy is of the finished uint8 THWC tensor, not of the floats.
    assert calls == [(3, 2, 4, 3)]
    assert out.shape == (3, 2, 4, 3)


def test_input_is_not_modified() -> None:
    frames = constant(2.0)
    quantize_to_host(frames, (0.0, 1.0))
    assert torch.all(frames == 2.0)


@pytest.mark.parametrize(
    ("frames", "message"),
    [
        (torch.zeros(3, 2, 4, 4), "BCTHW"),
        (torch.zeros(2, 3, 1, 4, 4), "batch size 1"),
        (torch.zeros(1, 4, 1, 4, 4), "3 \\(RGB\\) channels"),
        (torch.zeros(1, 3, 1, 4, 4, dtype=torch.uint8), "floating-point"),
        (np.zeros((1, 3, 1, 4, 4), np.float32), "torch.Tensor"),
    ],
)
def test_bad_input_raises(frames: torch.Tensor, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        quantize_to_host(frames, (0.0, 1.0))


@pytest.mark.parametrize("value_range", [(1.0, 1.0), (1.0, 0.0), (0.0, float("inf"))])
def test_bad_value_range_raises(value_range: tuple[float, float]) -> None:
    with pytest.raises(ValueError, match="value_range"):
        quantize_to_host(constant(0.0), value_range)


@settings(max_examples=50, deadline=None)
@given(
    values=st.lists(st.floats(-2.0, 2.0, width=32), min_size=24, max_size=24),
    signed=st.booleans(),
)
def test_nearest_level_property(values: list[float], signed: bool) -> None:
    low, high = (-1.0, 1.0) if signed else (0.0, 1.0)
    frames = torch.tensor(values, dtype=torch.float32).reshape(1, 3, 1, 2, 4)
    out = quantize_to_host(frames, (low, high)).astype(np.float64)
    ideal = np.clip(
        (frames[0].permute(1, 2, 3, 0).double().numpy() - low) * 255 / (high - low), 0, 255
    )
    assert np.all(np.abs(out - ideal) <= 0.5 + 1e-4)
