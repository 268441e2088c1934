"""How a pipeline hands over its latents, and how they become the BCTHW a decoder takes.

Each diffusers video pipeline returns latents (`output_type="latent"`) in a layout of
its own: Wan, HunyuanVideo and Mochi as BCTHW, CogVideoX as BTCHW, LTX-Video as packed
tokens `(B, F*H*W, C)` whose frame count and size the tensor cannot carry. A decoder
names its pipeline's layout (`latent_layout`), and the upload path converts what the
user sends, unchanged from the pipeline, to the decoder's BCTHW before any check of
size or plan.

A layout works in two steps, both pure:
- `bind(params)` takes the request's text parameters (query, form fields, safetensors
  metadata), parses what the layout needs from them (the pipeline's own argument
  names, `num_frames`, `height`, `width`) and returns a `BoundLayout`;
- `BoundLayout.bcthw_shape(declared)` maps a declared shape to the BCTHW shape it
  will become, before any tensor data is read (the upload's limits are checked on
  it), and `to_bcthw(tensor)` converts the tensor itself, as a view where it can.

Every refusal is an `InvalidRequestError` that says which layout the model takes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import torch

from vaecast.errors import InvalidRequestError
from vaecast.params import parse_int

# Pixel sizes and frame counts a pipeline argument may name: far past any video a
# server would take, small enough that products stay cheap Python ints.
MAX_GEOMETRY_VALUE = 1 << 20
Params = Mapping[str, str]


def shape_text(shape: tuple[int, ...] | list[int]) -> str:
    """A client-declared shape, short enough to quote whatever its rank."""
    if len(shape) <= 8:
        return str(tuple(shape))
    return f"({', '.join(map(str, shape[:8]))}, ... {len(shape)} dimensions)"


class BoundLayout(Protocol):
    """A layout with the request's parameters applied."""

    def bcthw_shape(self, declared: tuple[int, ...]) -> tuple[int, ...]:
        """The BCTHW shape that a tensor of `declared` shape converts to (a 4-D
        CTHW-style shape gains its batch of 1); raises `InvalidRequestError`."""
        ...

    def to_bcthw(self, tensor: torch.Tensor) -> torch.Tensor:
        """The tensor as BCTHW; its shape was accepted by `bcthw_shape`."""
        ...


class LatentLayout(Protocol):
    """The layout a pipeline returns its latents in."""

    name: str  # as quoted in messages: "BCTHW", "BTCHW", "packed tokens (B, F*H*W, C)"

    def bind(self, params: Params) -> BoundLayout: ...


@dataclass(frozen=True, slots=True)
class _Permuted:
    """BCTHW up to an order of the four dimensions after the batch."""

    name: str
    order: tuple[int, int, int, int]  # where C, T, H, W stand after B, 1-based

    def bind(self, params: Params) -> BoundLayout:
        return self

    def bcthw_shape(self, declared: tuple[int, ...]) -> tuple[int, ...]:
        if len(declared) == 4:
            declared = (1, *declared)
        elif len(declared) != 5:
            raise InvalidRequestError(
                f"latents must be {self.name[1:]} or {self.name}, got {len(declared)} "
                f"dimensions {shape_text(declared)}"
            )
        return (declared[0], *(declared[axis] for axis in self.order))

    def to_bcthw(self, tensor: torch.Tensor) -> torch.Tensor:
        if tensor.ndim == 4:
            tensor = tensor.unsqueeze(0)
        return tensor.permute(0, *self.order)


BCTHW = _Permuted("BCTHW", (1, 2, 3, 4))
# CogVideoX's transformer works on frames: its pipeline returns (B, T, C, H, W).
BTCHW = _Permuted("BTCHW", (2, 1, 3, 4))


@dataclass(frozen=True, slots=True)
class PackedTokens:
    """LTX-Video's packed latents: `(B, F*H*W, C*pt*p*p)` tokens of patches.

    The latent grid is the pipeline's: `F = (num_frames - 1) // temporal_scale + 1`,
    `H = height // spatial_scale`, `W = width // spatial_scale`, then patches of
    `patch_size_t` x `patch_size` x `patch_size` (LTX's transformer: 1 x 1 x 1). The
    unpacking is the inverse of the pipeline's `_pack_latents`: at LTX's 1 x 1 x 1
    patches, its `_unpack_latents`, the same reshape and permute.
    """

    spatial_scale: int
    temporal_scale: int
    patch_size: int = 1
    patch_size_t: int = 1

    @property
    def name(self) -> str:
        return "packed tokens (B, F*H*W, C), with num_frames, height and width"

    def bind(self, params: Params) -> BoundLayout:
        missing = [key for key in ("num_frames", "height", "width") if not params.get(key)]
        if missing:
            raise InvalidRequestError(
                f"this model's latents are packed tokens (B, F*H*W, C), which do not carry "
                f"the video's size: give {', '.join(missing)} as the pipeline call had them "
                f"(a query parameter, a form field or safetensors metadata)"
            )
        frames = parse_int(params["num_frames"], "num_frames", 1, MAX_GEOMETRY_VALUE)
        height = parse_int(params["height"], "height", 1, MAX_GEOMETRY_VALUE)
        width = parse_int(params["width"], "width", 1, MAX_GEOMETRY_VALUE)
        latent_frames = (frames - 1) // self.temporal_scale + 1
        latent_height, latent_width = height // self.spatial_scale, width // self.spatial_scale
        if latent_height < self.patch_size or latent_width < self.patch_size:
            raise InvalidRequestError(
                f"height and width must be at least {self.spatial_scale * self.patch_size}, "
                f"got {width}x{height}"
            )
        return _BoundPackedTokens(self, latent_frames, latent_height, latent_width)


@dataclass(frozen=True, slots=True)
class _BoundPackedTokens:
    layout: PackedTokens
    frames: int  # the latent grid, before patching
    height: int
    width: int

    def _grid(self) -> tuple[int, int, int]:
        p, pt = self.layout.patch_size, self.layout.patch_size_t
        return self.frames // pt, self.height // p, self.width // p

    def bcthw_shape(self, declared: tuple[int, ...]) -> tuple[int, ...]:
        if len(declared) == 2:
            declared = (1, *declared)
        if len(declared) != 3:
            raise InvalidRequestError(
                f"this model's latents are packed tokens (B, F*H*W, C), got {len(declared)} "
                f"dimensions {shape_text(declared)}"
            )
        batch, tokens, features = declared
        frames, height, width = self._grid()
        if tokens != frames * height * width:
            raise InvalidRequestError(
                f"latents of {tokens} tokens do not fit num_frames, height and width: their "
                f"latent grid is {frames}x{height}x{width} = {frames * height * width} tokens"
            )
        p, pt = self.layout.patch_size, self.layout.patch_size_t
        if features % (pt * p * p):
            raise InvalidRequestError(
                f"latents of {features} features per token do not split into patches of "
                f"{pt}x{p}x{p}"
            )
        channels = features // (pt * p * p)
        return (batch, channels, frames * pt, height * p, width * p)

    def to_bcthw(self, tensor: torch.Tensor) -> torch.Tensor:
        if tensor.ndim == 2:
            tensor = tensor.unsqueeze(0)
        frames, height, width = self._grid()
        p, pt = self.layout.patch_size, self.layout.patch_size_t
        batch = tensor.shape[0]
        # pipeline_ltx.py's `_unpack_latents`, step for step.
        tensor = tensor.reshape(batch, frames, height, width, -1, pt, p, p)
        return tensor.permute(0, 4, 1, 5, 2, 6, 3, 7).flatten(6, 7).flatten(4, 5).flatten(2, 3)


def layout_of(decoder: object) -> LatentLayout:
    """The layout a decoder's pipeline returns latents in (BCTHW unless it says)."""
    return getattr(decoder, "latent_layout", None) or BCTHW
