"""Frames a producer decoded itself, read from an upload: tensor `frames`.

Two shapes, told apart by rank: `(T, H, W, 3)` (what a video library or an
`np.uint8` array of RGB frames has) and `(1, 3, T, H, W)` or `(3, T, H, W)` (what a
VAE decode gives). Either may be uint8 RGB (0-255) or floats in the session's
`value_range`. uint8 stays uint8 until the decode thread converts it: a quarter of
the bytes of float32 waiting in the session's queue. Everything else is the latent
reader's (`vaecast.latent_files`): bounded headers, declared shapes checked before any
data is touched, NaN refused, pickles refused on sight.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vaecast.errors import InvalidRequestError
from vaecast.latent_files import LatentFile, ShapeCheck, load_latents
from vaecast.latent_files.latents import FRAMES, Buffer
from vaecast.models.layouts import Params, shape_text

FRAMES_KEY = FRAMES.key
RGB_CHANNELS = 3


@dataclass(frozen=True, slots=True)
class _FramesLayout:
    """(T, H, W, C) frames last-channel, or CTHW / BCTHW channel-first, as BCTHW."""

    name: str = "frames"

    def bind(self, params: Params) -> _FramesLayout:
        return self

    def bcthw_shape(self, declared: tuple[int, ...]) -> tuple[int, ...]:
        if len(declared) == 4 and declared[-1] == RGB_CHANNELS:
            t, h, w, c = declared
            return (1, c, t, h, w)
        if len(declared) == 5 or (len(declared) == 4 and declared[0] == RGB_CHANNELS):
            return declared if len(declared) == 5 else (1, *declared)
        raise InvalidRequestError(
            f"frames must be (T, H, W, 3) or (1, 3, T, H, W), got {shape_text(declared)}"
        )

    def to_bcthw(self, tensor: torch.Tensor) -> torch.Tensor:
        if tensor.ndim == 4 and tensor.shape[-1] == RGB_CHANNELS:
            return tensor.permute(3, 0, 1, 2).unsqueeze(0)
        return tensor if tensor.ndim == 5 else tensor.unsqueeze(0)


FRAMES_LAYOUT = _FramesLayout()


def load_frames(
    data: Buffer, check_shape: ShapeCheck | None = None, max_batch: int = 1
) -> LatentFile:
    """The frames of an upload as BCTHW (uint8 as sent, or float32), its metadata and
    audio; `check_shape` sees one video's BCTHW shape before any data is read. A batch
    of videos is (B, 3, T, H, W)."""
    return load_latents(
        data, check_shape, layout=lambda metadata: FRAMES_LAYOUT, role=FRAMES, max_batch=max_batch
    )
