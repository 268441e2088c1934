"""What a latent file reads to, and the checks every format applies to its latents.

Each format's reader (`safetensors_format`, `npy_format`) parses its own header,
then hands the declared dtype and shape to `check_declared` before touching any
tensor data, and the tensor to `finish_latents` once it is built. The helpers that
write numbers and client-sent values into messages live here too, so that every
message quotes them the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from vaecast.errors import InvalidRequestError, PayloadTooLargeError
from vaecast.models.layouts import BCTHW, BoundLayout, Params

LATENTS_KEY = "latents"
SAFE_HINT = "save it with safetensors: safetensors.torch.save_file({'latents': z}, 'z.safetensors')"
# Neither torch nor numpy has a dimension past a signed 64-bit index.
MAX_DIM = 2**63 - 1
_MAX_ECHO_CHARS = 40

ShapeCheck = Callable[[tuple[int, ...]], None]
# The file's metadata -> the layout its latents are read in, bound to the request's
# parameters (those a layout needs may come from either).
LayoutChoice = Callable[[Params], BoundLayout]


def choose_layout(choice: LayoutChoice | None, metadata: Params) -> BoundLayout:
    return BCTHW if choice is None else choice(metadata)


# An upload as read: a bytearray from the server (tensors may be views of it), bytes elsewhere.
Buffer = bytes | bytearray
# The NaN/Inf scan goes this many values at a time: its boolean temporary stays small
# (4 MiB) instead of a quarter of the latents' float32 size.
_FINITE_SLICE_VALUES = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class TensorRole:
    """What an upload's tensor is: latents for a decoder, or frames decoded already."""

    key: str  # its name in a safetensors file, and in messages
    takes_uint8: bool  # frames may be 8-bit RGB; latents are floats
    dtypes_hint: str  # what to send instead of a refused dtype


LATENTS = TensorRole(LATENTS_KEY, False, "latents must be floating point")
FRAMES = TensorRole(
    "frames", True, "frames must be uint8 RGB (T, H, W, 3) or floats (1, 3, T, H, W)"
)


@dataclass(frozen=True, slots=True)
class LatentFile:
    latents: torch.Tensor  # float32, BCTHW, finite (frames: or uint8 as sent); B == 1
    # unless the reader was given a larger max_batch
    metadata: dict[str, str] = field(default_factory=dict)
    audio: torch.Tensor | None = None  # as uploaded; checked by `check_audio`
    dtype: torch.dtype = torch.float32  # of the latents as uploaded, before conversion
    # Audio latents for the model's sound decoder (`vaecast.models.sound`), as uploaded.
    audio_latents: torch.Tensor | None = None


def declared_bytes(shape: Sequence[int], itemsize: int, limit: int) -> int | None:
    """The byte count of `shape` in Python ints, or None once it is past `limit`.

    Stopping there bounds the cost of thousands of huge sizes.
    """
    if 0 in shape:
        return 0
    total = itemsize
    for size in shape:
        total *= size
        if total > limit:
            return None
    return total


def check_declared(
    shape: tuple[int, ...],
    dtype_name: str,
    floating: bool,
    layout: BoundLayout = BCTHW,
    role: TensorRole = LATENTS,
    max_batch: int = 1,
) -> tuple[int, ...]:
    """The declared tensor's shape as the BCTHW that `layout` makes of it, or the 422
    (413 for a batch past `max_batch`) that says what is wrong with it."""
    if not (floating or (role.takes_uint8 and dtype_name == "uint8")):
        raise InvalidRequestError(f"{role.dtypes_hint}, got {dtype_name}")
    shape = layout.bcthw_shape(shape)
    name = role.key
    if max_batch == 1 and shape[0] != 1:
        raise InvalidRequestError(f"{name} must hold one video (batch 1), got batch {shape[0]}")
    if shape[0] < 1:
        raise InvalidRequestError(f"{name} hold no video: batch 0")
    if shape[0] > max_batch:
        raise PayloadTooLargeError(
            f"a batch of {shape[0]} videos is more than this server takes at once ({max_batch})"
        )
    if shape[2] == 0:
        raise InvalidRequestError(f"{name} have zero frames")
    if 0 in shape:
        raise InvalidRequestError(f"{name} are empty: shape {shape}")
    return shape


def finish_latents(latents: torch.Tensor, role: TensorRole = LATENTS) -> torch.Tensor:
    """Declared-shape-checked latents as float32 BCTHW, refused if any value is not
    finite; 8-bit frames stay as they are (a view of the upload, a quarter the size)."""
    if latents.ndim == 4:
        latents = latents.unsqueeze(0)
    if latents.dtype == torch.uint8:
        assert role.takes_uint8
        return latents
    latents = latents.to(torch.float32).contiguous()
    frames = latents.shape[2]
    per_frame = max(1, latents[:, :, :1].numel())
    step = max(1, _FINITE_SLICE_VALUES // per_frame)
    # Any NaN or infinity makes the sum non-finite, so a finite sum settles it in one
    # pass with no temporary (11-48 ms -> under 6 ms for 81 frames at 832x480); a
    # non-finite sum may also be an overflow of finite values, so it is checked in full.
    if torch.isfinite(latents.sum()):
        return latents
    for start in range(0, frames, step):
        if not torch.isfinite(latents[:, :, start : start + step]).all():
            raise InvalidRequestError(f"{role.key} contain NaN or infinite values")
    return latents


def bytes_text(declared: int | None, limit: int) -> str:
    return f"{declared} bytes" if declared is not None else f"more than {limit} bytes"


def echo(value: object) -> str:
    """A client-sent value, cut short enough to quote in a message."""
    text = str(value)
    return text if len(text) <= _MAX_ECHO_CHARS else f"{text[:_MAX_ECHO_CHARS]}..."
