"""The temporal tiler: its chunks are exactly the full tiled decode, committed as early as possible.

The full decode here is an independent transcription of diffusers'
`AutoencoderKLMiniMaxH3._decode` loop (decode every window, split each into body and
tail, blend, concatenate, cut the padding's frames), generalised over the geometry.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vaecast.models.bidirectional_windows import WindowTiler

MINIMAX = WindowTiler(window=7, overlap=2, frames_per_latent=4, lead_frames=3)


def diffusers_blend(a: torch.Tensor, b: torch.Tensor, blend_extent: int) -> torch.Tensor:
    blend_extent = min(a.shape[2], b.shape[2], blend_extent)
    positions = torch.arange(blend_extent, dtype=b.dtype)
    weight_a = (1 - positions / blend_extent).view(1, 1, -1, 1, 1)
    weight_b = (positions / blend_extent).view(1, 1, -1, 1, 1)
    blended = a[:, :, -blend_extent:] * weight_a + b[:, :, :blend_extent] * weight_b
    return torch.cat([blended, b[:, :, blend_extent:]], dim=2)


def reference_decode(tiler: WindowTiler, latents: torch.Tensor, decode_window) -> torch.Tensor:
    stride, overlap = tiler.window - tiler.overlap, tiler.overlap
    f, lead = tiler.frames_per_latent, tiler.lead_frames
    t = latents.shape[2]
    windows = max(1, math.ceil((t - overlap) / stride))
    pad = windows * stride + overlap - t
    z = torch.cat([latents, latents[:, :, -1:].repeat(1, 1, pad, 1, 1)], dim=2)
    frame_overlap = max(overlap * f - lead, 0)
    decoded, tail = [], None
    for i in range(windows):
        clip = decode_window(z[:, :, i * stride : i * stride + stride + overlap])
        for j in range(2 if overlap else 1):
            piece = clip[:, :, j * stride * f : (j + 1) * stride * f][:, :, lead:]
            if j == 0:
                if tail is not None:
                    piece = diffusers_blend(tail, piece, frame_overlap)
                decoded.append(piece)
            else:
                tail = piece
    if tail is not None:
        decoded.append(tail)
    dec = torch.cat(decoded, dim=2)
    pad_frames = sum(f - lead if (t + k) % stride == 0 else f for k in range(pad))
    return dec[:, :, : dec.shape[2] - pad_frames]


def fake_window(frames_per_latent: int):
    """A non-causal stand-in decoder: every frame depends on the whole window and its place."""

    def decode(window: torch.Tensor) -> torch.Tensor:
        frames = window.repeat_interleave(frames_per_latent, dim=2)
        ramp = torch.arange(frames.shape[2], dtype=frames.dtype).view(1, 1, -1, 1, 1)
        return frames + window.mean(dim=2, keepdim=True) * 0.5 + ramp * 0.01

    return decode


def run(tiler: WindowTiler, latents: torch.Tensor):
    """Chunks as (frames, index, windows decoded when emitted), and the window count."""
    decode = fake_window(tiler.frames_per_latent)
    calls = [0]

    def counted(window: torch.Tensor) -> torch.Tensor:
        assert window.shape[2] == tiler.window
        calls[0] += 1
        return decode(window)

    chunks: list[tuple[torch.Tensor, int, int]] = []
    tiler.run(latents, counted, lambda frames, index: chunks.append((frames, index, calls[0])))
    return chunks, calls[0]


def check(tiler: WindowTiler, latent_frames: int) -> None:
    latents = torch.randn(1, 2, latent_frames, 1, 2, generator=torch.Generator().manual_seed(3))
    plan = tiler.plan(latent_frames)
    chunks, windows = run(tiler, latents)
    expected = reference_decode(tiler, latents, fake_window(tiler.frames_per_latent))
    assert windows == plan.windows
    assert [index for _, index, _ in chunks] == list(range(len(plan.chunk_frames)))
    assert [frames.shape[2] for frames, _, _ in chunks] == list(plan.chunk_frames)
    assert all(frames.shape[2] > 0 for frames, _, _ in chunks)
    # Each chunk leaves as soon as the window that finalises it is decoded.
    assert [decoded for _, _, decoded in chunks] == [w + 1 for w in plan.chunk_windows]
    # Every frame exactly once, in order: the chunks are the full decode, bit for bit.
    assert torch.equal(torch.cat([frames for frames, _, _ in chunks], dim=2), expected)
    wanted = sum(tiler.latent_frame_count(k) for k in range(latent_frames))
    assert plan.frames == expected.shape[2] == wanted


@settings(max_examples=150, deadline=None)
@given(
    frames_per_latent=st.integers(1, 5),
    lead=st.integers(0, 4),
    stride=st.integers(1, 6),
    overlap=st.integers(0, 6),
    latent_frames=st.integers(1, 30),
)
def test_chunks_are_the_full_tiled_decode(
    frames_per_latent: int, lead: int, stride: int, overlap: int, latent_frames: int
) -> None:
    lead = lead % frames_per_latent
    overlap = min(overlap, stride)
    tiler = WindowTiler(stride + overlap, overlap, frames_per_latent, lead)
    check(tiler, latent_frames)


@pytest.mark.parametrize(
    ("latent_frames", "chunk_frames"),
    [
        # MiniMax-H3's own pinned chunk sizes.
        (33, (17,) * 6 + (9,)),  # the padding's frames remove the tail and shorten the body
        (34, (17,) * 6 + (13,)),
        (35, (17,) * 7),  # ... remove exactly the tail
        (36, (17,) * 7 + (1,)),  # ... shorten the tail to one frame
        (37, (17,) * 7 + (5,)),  # no padding at all
        (3, (9,)),  # shorter than one window: one padded window, part of one body
        (7, (17, 5)),  # exactly one window
        (8, (17, 9)),  # a final partial window
        (31, (17,) * 6 + (1,)),  # the last window's overlap runs past the latents
    ],
)
def test_minimax_geometry(latent_frames: int, chunk_frames: tuple[int, ...]) -> None:
    assert MINIMAX.plan(latent_frames).chunk_frames == chunk_frames
    check(MINIMAX, latent_frames)


def test_latents_no_longer_than_the_overlap_still_get_one_window() -> None:
    for latent_frames in (1, 2):
        plan = MINIMAX.plan(latent_frames)
        assert (plan.windows, plan.padding) == (1, 7 - latent_frames)
        check(MINIMAX, latent_frames)


def test_without_overlap_windows_just_follow_each_other() -> None:
    tiler = WindowTiler(window=3, overlap=0, frames_per_latent=2)
    assert tiler.plan(7).chunk_frames == (6, 6, 2)
    check(tiler, 7)


def test_a_wrong_window_output_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="7 latents decoded to 7 frames, expected 28"):
        MINIMAX.run(torch.zeros(1, 1, 3, 1, 1), lambda w: w, lambda frames, index: None)


@pytest.mark.parametrize(
    ("window", "overlap", "frames_per_latent", "lead", "message"),
    [
        (7, 4, 4, 3, "overlap must be in"),
        (4, -1, 4, 0, "overlap must be in"),
        (7, 2, 0, 0, "frames_per_latent must be at least 1"),
        (7, 2, 4, 4, "lead_frames must be in"),
    ],
)
def test_bad_geometry_is_refused(
    window: int, overlap: int, frames_per_latent: int, lead: int, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        WindowTiler(window, overlap, frames_per_latent, lead)
