"""Reading a safetensors latent file: tensor `latents`, optionally `audio` (a waveform) or
`audio_latents` (for the model to decode), and metadata.

The header is parsed by `vaecast.safetensors_header` (bounded cost) and the
`latents` entry checked against the bytes it spans and against the caller's shape
check before the whole header is validated and before any tensor data is touched.
Every float dtype safetensors has and torch knows is taken, F8 included; other
tensors in the file may be of any dtype safetensors knows.

The whole-header check is ours, not `safetensors.deserialize`: that returns a copy
of every tensor, and the upload is then held twice. It applies the same rules as
safetensors' own validation (every entry's dtype, shape and data_offsets; the
entries in order, without overlap or hole, covering exactly the data section) on
the parsed header, with Python ints, so no size can overflow. The latents are then
a zero-copy `torch.frombuffer` view of the upload when the buffer is writable and
the offset aligned for the dtype (and the host little-endian); otherwise the one
tensor is copied. A view holds a reference to the buffer: it stays valid after the
request that read it is gone, and nothing else writes to an upload's buffer.
"""

from __future__ import annotations

import sys

import torch

from vaecast.errors import InvalidRequestError, UnsupportedMediaError
from vaecast.latent_files.audio import AUDIO_KEY
from vaecast.latent_files.latents import (
    LATENTS,
    LATENTS_KEY,
    MAX_DIM,
    Buffer,
    LatentFile,
    LayoutChoice,
    ShapeCheck,
    TensorRole,
    bytes_text,
    check_declared,
    choose_layout,
    declared_bytes,
    echo,
    finish_latents,
)
from vaecast.models.layouts import shape_text
from vaecast.models.sound import AUDIO_LATENTS_KEY
from vaecast.safetensors_header import CORRUPT, SafetensorsHeader

_MAX_NAMES_LISTED = 10
_METADATA_KEY = "__metadata__"

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
# Every dtype safetensors 0.8 knows, with its size in bits (F4 and F6 pack below a byte).
_BITS: dict[str, int] = {
    "BOOL": 8,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "F8_E4M3FNUZ": 8,
    "F8_E5M2FNUZ": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "C64": 64,
    "F64": 64,
    "I64": 64,
    "U64": 64,
}
_FLOATS_HINT = "send F32, F16, BF16, F64, F8_E4M3 or F8_E5M2"
_LITTLE_ENDIAN = sys.byteorder == "little"


def load_safetensors(
    data: Buffer,
    header: SafetensorsHeader,
    check_shape: ShapeCheck | None,
    layout: LayoutChoice | None = None,
    role: TensorRole = LATENTS,
    max_batch: int = 1,
) -> LatentFile:
    """The latents (or frames: `role`), metadata and soundtrack of a safetensors file
    whose header is parsed; the tensor read in the layout `layout` picks from the
    metadata (BCTHW without it)."""
    entries = header.entries
    entry = entries.get(role.key)
    if entry is None:
        names = sorted(k for k in entries if k != _METADATA_KEY)
        found = ", ".join(echo(k) for k in names[:_MAX_NAMES_LISTED]) or "none"
        if len(names) > _MAX_NAMES_LISTED:
            found += f", ... {len(names)} in all"
        raise InvalidRequestError(
            f"the safetensors file has no tensor named {role.key!r} (found: {found})"
        )
    data_bytes = len(data) - header.data_start
    dtype_name, shape = _latents_entry(entry, data_bytes, role.key)
    torch_dtype = _DTYPES.get(dtype_name)
    if torch_dtype is None:
        raise InvalidRequestError(
            f"{role.key} dtype {echo(dtype_name)!r} is not supported; {_FLOATS_HINT}"
        )
    metadata_entry = entries.get(_METADATA_KEY)
    bound = choose_layout(layout, {} if metadata_entry is None else _metadata(metadata_entry))
    bcthw = check_declared(
        shape, _torch_name(torch_dtype), torch_dtype.is_floating_point, bound, role, max_batch
    )
    if check_shape is not None:
        check_shape((1, *bcthw[1:]))  # one video's
    metadata = _validate(entries, data_bytes)
    begin, _ = entry["data_offsets"]  # type: ignore[index]
    tensor = _tensor(data, header.data_start + begin, shape, torch_dtype)
    latents = finish_latents(bound.to_bcthw(tensor), role)
    audio = _float_tensor(data, header, AUDIO_KEY)
    audio_latents = _float_tensor(data, header, AUDIO_LATENTS_KEY)
    if audio is not None and audio_latents is not None:
        raise InvalidRequestError(
            f"send {AUDIO_KEY!r} (a waveform) or {AUDIO_LATENTS_KEY!r} (the model decodes "
            "them), not both"
        )
    return LatentFile(latents, metadata, audio, dtype=torch_dtype, audio_latents=audio_latents)


def _float_tensor(data: Buffer, header: SafetensorsHeader, key: str) -> torch.Tensor | None:
    """The tensor `key` beside the latents (a soundtrack, or audio latents), a copy: it is
    small, and a view would pin the upload for nothing."""
    entry = header.entries.get(key)
    if entry is None:
        return None
    assert isinstance(entry, dict)  # _validate checked every entry
    dtype = _DTYPES.get(entry["dtype"])
    if dtype is None:  # a known one that is not a float is refused by its own check
        raise InvalidRequestError(
            f"{key} dtype {entry['dtype']!r} is not supported; send F32, F16, BF16 or F64"
        )
    begin, _ = entry["data_offsets"]
    return _tensor(data, header.data_start + begin, tuple(entry["shape"]), dtype).clone()


def _latents_entry(
    entry: object, data_bytes: int, key: str = LATENTS_KEY
) -> tuple[str, tuple[int, ...]]:
    """The dtype and shape of the `key` entry, checked against the bytes it spans."""
    if not isinstance(entry, dict):
        raise UnsupportedMediaError(f"{CORRUPT}the header entry for {key!r} is not an object")
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
            f"{CORRUPT}the header entry for {key!r} needs a dtype, "
            "a shape of sizes and two data_offsets"
        )
    begin, end = offsets
    if not 0 <= begin <= end <= data_bytes:
        raise UnsupportedMediaError(
            f"{CORRUPT}{key!r} spans bytes {echo(begin)} to {echo(end)} of a "
            f"data section of {data_bytes} bytes (is the file truncated?)"
        )
    torch_dtype = _DTYPES.get(dtype_name)
    if torch_dtype is not None:
        spanned = end - begin
        declared = declared_bytes(shape, torch_dtype.itemsize, spanned)
        if declared != spanned:
            raise UnsupportedMediaError(
                f"{CORRUPT}{key!r} of shape {shape_text(shape)} and dtype "
                f"{dtype_name} needs {bytes_text(declared, spanned)} but spans {spanned}"
            )
    return dtype_name, tuple(shape)


def _validate(entries: dict[str, object], data_bytes: int) -> dict[str, str]:
    """The metadata, once every entry of the header is checked as safetensors checks it.

    Each tensor entry: an object with a dtype safetensors knows, a shape of sizes and
    two data_offsets whose span is exactly the shape's size (whole bytes for the
    sub-byte dtypes). Together, sorted by offset: starting at 0, each where the last
    ended (no overlap, no hole), the last ending where the data section ends.
    """
    spans: list[tuple[int, int, str]] = []
    metadata: dict[str, str] = {}
    for name, entry in entries.items():
        if name == _METADATA_KEY:
            metadata = _metadata(entry)
            continue
        shown = echo(name)
        if not isinstance(entry, dict):
            raise UnsupportedMediaError(f"{CORRUPT}the header entry for {shown!r} is not an object")
        dtype_name, shape = entry.get("dtype"), entry.get("shape")
        offsets = entry.get("data_offsets")
        bits = _BITS.get(dtype_name) if isinstance(dtype_name, str) else None
        if bits is None:
            raise UnsupportedMediaError(
                f"{CORRUPT}tensor {shown!r} has dtype {echo(dtype_name)!r}, "
                "which safetensors does not have"
            )
        if not (
            isinstance(shape, list)
            and all(type(d) is int and 0 <= d <= MAX_DIM for d in shape)
            and isinstance(offsets, list)
            and len(offsets) == 2
            and all(type(o) is int and o >= 0 for o in offsets)
            and offsets[0] <= offsets[1]
        ):
            raise UnsupportedMediaError(
                f"{CORRUPT}the header entry for {shown!r} needs a shape of sizes and two "
                "increasing data_offsets"
            )
        begin, end = offsets
        spanned = end - begin
        # Bits, bounded: a shape of huge sizes stops as soon as it is past the span.
        declared_bits = declared_bytes(shape, bits, spanned * 8)
        if declared_bits != spanned * 8:
            raise UnsupportedMediaError(
                f"{CORRUPT}tensor {shown!r} of shape {shape_text(shape)} and dtype "
                f"{dtype_name} does not fill the {spanned} bytes it spans"
            )
        spans.append((begin, end, name))
    spans.sort()
    covered = 0
    for begin, end, name in spans:
        if begin != covered:
            what = "overlaps the tensor before it" if begin < covered else "leaves a hole before it"
            raise UnsupportedMediaError(
                f"{CORRUPT}tensor {echo(name)!r} at bytes {begin} to {end} {what}"
            )
        covered = end
    if covered != data_bytes:
        raise UnsupportedMediaError(
            f"{CORRUPT}its tensors cover {covered} bytes of a data section of {data_bytes}"
        )
    return metadata


def _metadata(value: object) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise UnsupportedMediaError(f"{CORRUPT}its __metadata__ is not an object of strings")
    return dict(value)


def _tensor(data: Buffer, offset: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """The tensor at `offset` of `data`: a view where that is safe, else a copy of it alone."""
    count = declared_bytes(shape, 1, MAX_DIM) or 0
    if count == 0:  # torch.frombuffer refuses an empty span
        return torch.empty(shape, dtype=dtype)
    view = memoryview(data)
    nbytes = count * dtype.itemsize
    if view.readonly or not _LITTLE_ENDIAN or not _aligned(view, offset, dtype.itemsize):
        # torch warns on (and must never write to) a read-only buffer; a big-endian host
        # needs the bytes swapped; a misaligned view is undefined behaviour for kernels.
        copied = bytearray(view[offset : offset + nbytes])
        tensor = torch.frombuffer(copied, dtype=dtype, count=count)
        if not _LITTLE_ENDIAN:
            tensor = _byteswapped(tensor)
    else:
        tensor = torch.frombuffer(data, dtype=dtype, count=count, offset=offset)
    return tensor.reshape(shape)


def _aligned(view: memoryview, offset: int, itemsize: int) -> bool:
    # The address of the buffer, read from a 1-byte view of it (no copy).
    address = torch.frombuffer(view, dtype=torch.uint8, count=1).data_ptr()
    return (address + offset) % itemsize == 0


def _byteswapped(tensor: torch.Tensor) -> torch.Tensor:  # pragma: no cover (big-endian hosts)
    size = tensor.dtype.itemsize
    if size == 1:
        return tensor
    raw = tensor.view(torch.uint8).numpy().reshape(-1, size)[:, ::-1].copy()
    return torch.from_numpy(raw.reshape(-1)).view(tensor.dtype)


def _torch_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
