"""Reading a safetensors latent file: tensor `latents`, optionally `audio`, and metadata.

The header is parsed by `vaecast.safetensors_header` (bounded cost) and the
`latents` entry checked against the bytes it spans and against the caller's shape
check before safetensors' own validation of the whole file and before any tensor
data is converted. Every float dtype safetensors has and torch knows is taken,
F8 included; other tensors in the file may be of any dtype.
"""

from __future__ import annotations

import torch
from safetensors import SafetensorError, deserialize

from vaecast.errors import InvalidRequestError, UnsupportedMediaError
from vaecast.latent_files.audio import AUDIO_KEY
from vaecast.latent_files.latents import (
    LATENTS_KEY,
    MAX_DIM,
    LatentFile,
    ShapeCheck,
    bytes_text,
    check_declared,
    declared_bytes,
    echo,
    finish_latents,
    shape_text,
)
from vaecast.safetensors_header import CORRUPT, SafetensorsHeader

_MAX_NAMES_LISTED = 10

_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "F8_E4M3FNUZ": torch.float8_e4m3fnuz,
    "F8_E5M2FNUZ": torch.float8_e5m2fnuz,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U64": torch.uint64,
    "U32": torch.uint32,
    "U16": torch.uint16,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "C64": torch.complex64,
}
_FLOATS_HINT = "send F32, F16, BF16, F64, F8_E4M3 or F8_E5M2"


def load_safetensors(
    data: bytes, header: SafetensorsHeader, check_shape: ShapeCheck | None
) -> LatentFile:
    """The latents, metadata and soundtrack of a safetensors file whose header is parsed."""
    entries = header.entries
    entry = entries.get(LATENTS_KEY)
    if entry is None:
        names = sorted(k for k in entries if k != "__metadata__")
        found = ", ".join(echo(k) for k in names[:_MAX_NAMES_LISTED]) or "none"
        if len(names) > _MAX_NAMES_LISTED:
            found += f", ... {len(names)} in all"
        raise InvalidRequestError(
            f"the safetensors file has no tensor named {LATENTS_KEY!r} (found: {found})"
        )
    dtype_name, shape = _latents_entry(entry, len(data) - header.data_start)
    torch_dtype = _DTYPES.get(dtype_name)
    if torch_dtype is None:
        raise InvalidRequestError(
            f"latents dtype {echo(dtype_name)!r} is not supported; {_FLOATS_HINT}"
        )
    bcthw = check_declared(shape, _torch_name(torch_dtype), torch_dtype.is_floating_point)
    if check_shape is not None:
        check_shape(bcthw)
    try:
        # safetensors' own validation of the whole file: offsets, coverage, metadata.
        views = dict(deserialize(data))
    except SafetensorError as error:
        raise UnsupportedMediaError(f"{CORRUPT}{error}") from None
    view = views.get(LATENTS_KEY)
    if view is None or view["dtype"] != dtype_name or tuple(view["shape"]) != shape:
        raise UnsupportedMediaError(f"{CORRUPT}{LATENTS_KEY!r} differs from its header entry")
    latents = finish_latents(_tensor_from_view(view, torch_dtype))
    audio = None
    if AUDIO_KEY in views:
        audio_view = views[AUDIO_KEY]
        audio_dtype = _DTYPES.get(audio_view["dtype"])
        if audio_dtype is None:
            raise InvalidRequestError(
                f"audio dtype {audio_view['dtype']!r} is not supported; send F32, F16, BF16 or F64"
            )
        audio = _tensor_from_view(audio_view, audio_dtype)
    metadata = entries.get("__metadata__") or {}
    if not isinstance(metadata, dict):  # deserialize refuses it first; never trust that
        raise UnsupportedMediaError(f"{CORRUPT}its __metadata__ is not an object")
    return LatentFile(
        latents, {str(k): str(v) for k, v in metadata.items()}, audio, dtype=torch_dtype
    )


def _latents_entry(entry: object, data_bytes: int) -> tuple[str, tuple[int, ...]]:
    """The dtype and shape of the `latents` entry, checked against the bytes it spans."""
    if not isinstance(entry, dict):
        raise UnsupportedMediaError(
            f"{CORRUPT}the header entry for {LATENTS_KEY!r} is not an object"
        )
    dtype_name = entry.get("dtype")
    shape = entry.get("shape")
    offsets = entry.get("data_offsets")
    if not (
        isinstance(dtype_name, str)
        and isinstance(shape, list)
        and all(type(d) is int and 0 <= d <= MAX_DIM for d in shape)
        and isinstance(offsets, list)
        and len(offsets) == 2
        and all(type(o) is int for o in offsets)
    ):
        raise UnsupportedMediaError(
            f"{CORRUPT}the header entry for {LATENTS_KEY!r} needs a dtype, "
            "a shape of sizes and two data_offsets"
        )
    begin, end = offsets
    if not 0 <= begin <= end <= data_bytes:
        raise UnsupportedMediaError(
            f"{CORRUPT}{LATENTS_KEY!r} spans bytes {echo(begin)} to {echo(end)} of a "
            f"data section of {data_bytes} bytes (is the file truncated?)"
        )
    torch_dtype = _DTYPES.get(dtype_name)
    if torch_dtype is not None:
        spanned = end - begin
        declared = declared_bytes(shape, torch_dtype.itemsize, spanned)
        if declared != spanned:
            raise UnsupportedMediaError(
                f"{CORRUPT}{LATENTS_KEY!r} of shape {shape_text(shape)} and dtype "
                f"{dtype_name} needs {bytes_text(declared, spanned)} but spans {spanned}"
            )
    return dtype_name, tuple(shape)


def _tensor_from_view(view: dict[str, object], dtype: torch.dtype) -> torch.Tensor:
    shape = list(view["shape"])  # type: ignore[call-overload]
    raw = view["data"]
    assert isinstance(raw, bytearray)
    if not raw:  # torch.frombuffer refuses an empty buffer
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(raw, dtype=dtype).reshape(shape)


def _torch_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
