"""Reading latent tensors from uploaded bytes, safely.

Accepted: safetensors (tensor `latents`, optionally a soundtrack `audio`, and
`__metadata__` such as `fps` and `audio_sample_rate`) and NumPy `.npy` of any
floating dtype in either byte order, C or Fortran order (latents only). Pickles,
including `torch.save` files, are refused on sight: loading one can run arbitrary
code. The format is sniffed from the bytes, not trusted from a Content-Type, because
`curl --data-binary` labels everything `application/x-www-form-urlencoded`.

Sniffing goes by structure, most specific first: safetensors (an 8-byte little-endian
header length that fits in the data, then a JSON object starting at byte 8; a header
length of 640 starts with the same two bytes as a protocol-2 pickle, so this comes
before the pickle test), then the `.npy` magic, then pickles (PROTO, 0x80, followed by
protocol 2..5) and zip archives (torch.save), which are refused.

Both headers are read here, with bounded cost, and the declared dtype and shape of
`latents` are checked before any tensor data is touched: a file whose latents are too
big for the caller is refused (by `check_shape`) before it is converted to float32 or
scanned for NaN. The result is a finite float32 BCTHW tensor with batch 1.

Errors, each with a message that tells the user what to send:
- 415 `UnsupportedMediaError`: not safetensors or `.npy`; a pickle or torch.save file;
  a corrupt file (truncated header, data that does not match the declared shape and
  dtype, a header past the size and complexity bounds); a `.npy` dtype that is not a
  plain number (objects need pickle; structured arrays are not read).
- 422 `InvalidRequestError`: an empty upload; no `latents` tensor; latents that are not
  floating point (or of a safetensors float type torch lacks, such as F4), not CTHW or
  BCTHW, of batch > 1, empty, or NaN/infinite; a sample rate that is not a few digits.
- whatever `check_shape` raises, unchanged.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from safetensors import SafetensorError, deserialize

from vaecast.errors import InvalidRequestError, UnsupportedMediaError

LATENTS_KEY = "latents"
AUDIO_KEY = "audio"
AUDIO_RATE_KEY = "audio_sample_rate"
MAX_AUDIO_CHANNELS = 2
ShapeCheck = Callable[[tuple[int, ...]], None]

_NPY_MAGIC = b"\x93NUMPY"
_ZIP_MAGIC = b"PK\x03\x04"  # torch.save's default format is a zip of pickles
_PICKLE_PROTO = 0x80  # pickle protocols 2 to 5 start with PROTO and the protocol number
_PICKLE_PROTOCOLS = range(2, 6)
_SAFE_HINT = (
    "save it with safetensors: safetensors.torch.save_file({'latents': z}, 'z.safetensors')"
)
_PICKLE_REFUSED = (
    f"pickle and torch.save files are refused (loading them can run code); {_SAFE_HINT}"
)
_ST_CORRUPT = "the safetensors file is corrupt: "
_NPY_CORRUPT = "the .npy file is corrupt: "
_NPY_UNSAFE = "the .npy file cannot be read safely: "

# safetensors' own limit; a longer header is not safetensors.
_MAX_ST_HEADER_BYTES = 100_000_000
# Python's JSON tree costs up to ~70 bytes per value (`[[],[],...]` is 3 bytes a value):
# bounding the values bounds the memory a hostile header can make us spend.
_MAX_ST_HEADER_VALUES = 1_000_000
_ST_STRINGS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
# numpy's own default limit for np.load (`max_header_size`).
_MAX_NPY_HEADER_BYTES = 10_000
_MAX_NPY_NESTING = 8
# Neither torch nor numpy has a dimension past a signed 64-bit index.
_MAX_DIM = 2**63 - 1
_MAX_RATE_DIGITS = 6
_MAX_ECHO_CHARS = 40
_MAX_NAMES_LISTED = 10

_ST_DTYPES: dict[str, torch.dtype] = {
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
_ST_FLOATS_HINT = "send F32, F16, BF16, F64, F8_E4M3 or F8_E5M2"

_NPY_FLOAT = re.compile(r"[<>|=]?(?:f(?:2|4|8|12|16)|[efdg])", re.ASCII)
_NPY_NUMBER = re.compile(r"[<>|=]?(?:[iu][1248]|c(?:8|16)|b1|\?)", re.ASCII)
_NPY_OBJECT = re.compile(r"[<>|=]?O[48]?", re.ASCII)
_NPY_TOKEN = re.compile(
    r"""\s*(?:(?P<str>'[^'\\\n]*'|"[^"\\\n]*")|(?P<int>[0-9]+)L?"""
    r"""|(?P<name>True|False|None)\b|(?P<punct>[{}()\[\]:,]))""",
    re.ASCII,
)
_NPY_NAMES = {"True": True, "False": False, "None": None}


@dataclass(frozen=True, slots=True)
class LatentFile:
    latents: torch.Tensor  # float32, BCTHW, B == 1, finite
    metadata: dict[str, str] = field(default_factory=dict)
    audio: torch.Tensor | None = None  # as uploaded; checked by `check_audio`


def load_latents(data: bytes, check_shape: ShapeCheck | None = None) -> LatentFile:
    """Parse and check an uploaded latent file; see the module docstring.

    `check_shape` gets the declared latents shape as BCTHW after the dtype, rank and
    batch checks and before any latents data is converted or scanned; what it raises
    propagates unchanged (the server refuses videos over its frame and pixel limits).
    """
    if not data:
        raise InvalidRequestError(f"the upload is empty; {_SAFE_HINT}")
    header = _safetensors_header(data)
    if header is not None:
        return _load_safetensors(data, header, check_shape)
    if data.startswith(_NPY_MAGIC):
        return LatentFile(_load_npy(data, check_shape))
    if data.startswith(_ZIP_MAGIC) or (
        data[0] == _PICKLE_PROTO and len(data) > 1 and data[1] in _PICKLE_PROTOCOLS
    ):
        raise UnsupportedMediaError(_PICKLE_REFUSED)
    raise UnsupportedMediaError(f"the upload is not a safetensors or .npy file; {_SAFE_HINT}")


def _safetensors_header(data: bytes) -> dict[str, object] | None:
    """The header of a safetensors file, or None when `data` is not one by structure."""
    if len(data) < 10:
        return None
    (header_size,) = struct.unpack_from("<Q", data)
    if not 2 <= header_size <= min(_MAX_ST_HEADER_BYTES, len(data) - 8) or data[8] != ord("{"):
        return None
    raw = data[8 : 8 + header_size]
    if _json_values_bound(raw) > _MAX_ST_HEADER_VALUES:
        raise UnsupportedMediaError(
            f"{_ST_CORRUPT}its header holds more than {_MAX_ST_HEADER_VALUES} JSON values"
        )
    try:
        header = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):  # RecursionError: nesting deeper than the stack
        return None
    return header if isinstance(header, dict) else None


def _json_values_bound(raw: bytes) -> int:
    """At least the number of JSON values in `raw`: one per comma or container opener."""

    def count(text: bytes) -> int:
        return text.count(b",") + text.count(b"[") + text.count(b"{") + 1

    rough = count(raw)
    if rough <= _MAX_ST_HEADER_VALUES:
        return rough
    # Metadata strings (embedded workflows) may hold many commas; they cost no values.
    return count(_ST_STRINGS.sub(b'""', raw))


def _load_safetensors(
    data: bytes, header: dict[str, object], check_shape: ShapeCheck | None
) -> LatentFile:
    entry = header.get(LATENTS_KEY)
    if entry is None:
        names = sorted(k for k in header if k != "__metadata__")
        found = ", ".join(_echo(k) for k in names[:_MAX_NAMES_LISTED]) or "none"
        if len(names) > _MAX_NAMES_LISTED:
            found += f", ... {len(names)} in all"
        raise InvalidRequestError(
            f"the safetensors file has no tensor named {LATENTS_KEY!r} (found: {found})"
        )
    dtype_name, shape = _safetensors_entry(entry, len(data) - 8 - _header_size(data))
    torch_dtype = _ST_DTYPES.get(dtype_name)
    if torch_dtype is None:
        raise InvalidRequestError(
            f"latents dtype {_echo(dtype_name)!r} is not supported; {_ST_FLOATS_HINT}"
        )
    bcthw = _check_declared(shape, _torch_name(torch_dtype), torch_dtype.is_floating_point)
    if check_shape is not None:
        check_shape(bcthw)
    try:
        # safetensors' own validation of the whole file: offsets, coverage, metadata.
        views = dict(deserialize(data))
    except SafetensorError as error:
        raise UnsupportedMediaError(f"{_ST_CORRUPT}{error}") from None
    view = views.get(LATENTS_KEY)
    if view is None or view["dtype"] != dtype_name or tuple(view["shape"]) != shape:
        raise UnsupportedMediaError(f"{_ST_CORRUPT}{LATENTS_KEY!r} differs from its header entry")
    latents = _finish_latents(_tensor_from_view(view, torch_dtype))
    audio = None
    if AUDIO_KEY in views:
        audio_view = views[AUDIO_KEY]
        audio_dtype = _ST_DTYPES.get(audio_view["dtype"])
        if audio_dtype is None:
            raise InvalidRequestError(
                f"audio dtype {audio_view['dtype']!r} is not supported; send F32, F16, BF16 or F64"
            )
        audio = _tensor_from_view(audio_view, audio_dtype)
    metadata = header.get("__metadata__") or {}
    if not isinstance(metadata, dict):  # deserialize refuses it first; never trust that
        raise UnsupportedMediaError(f"{_ST_CORRUPT}its __metadata__ is not an object")
    return LatentFile(latents, {str(k): str(v) for k, v in metadata.items()}, audio)


def _header_size(data: bytes) -> int:
    (header_size,) = struct.unpack_from("<Q", data)
    return int(header_size)


def _safetensors_entry(entry: object, data_bytes: int) -> tuple[str, tuple[int, ...]]:
    """The dtype and shape of the `latents` entry, checked against the bytes it spans."""
    if not isinstance(entry, dict):
        raise UnsupportedMediaError(
            f"{_ST_CORRUPT}the header entry for {LATENTS_KEY!r} is not an object"
        )
    dtype_name = entry.get("dtype")
    shape = entry.get("shape")
    offsets = entry.get("data_offsets")
    if not (
        isinstance(dtype_name, str)
        and isinstance(shape, list)
        and all(type(d) is int and 0 <= d <= _MAX_DIM for d in shape)
        and isinstance(offsets, list)
        and len(offsets) == 2
        and all(type(o) is int for o in offsets)
    ):
        raise UnsupportedMediaError(
            f"{_ST_CORRUPT}the header entry for {LATENTS_KEY!r} needs a dtype, "
            "a shape of sizes and two data_offsets"
        )
    begin, end = offsets
    if not 0 <= begin <= end <= data_bytes:
        raise UnsupportedMediaError(
            f"{_ST_CORRUPT}{LATENTS_KEY!r} spans bytes {_echo(begin)} to {_echo(end)} of a "
            f"data section of {data_bytes} bytes (is the file truncated?)"
        )
    torch_dtype = _ST_DTYPES.get(dtype_name)
    if torch_dtype is not None:
        spanned = end - begin
        declared = _declared_bytes(shape, torch_dtype.itemsize, spanned)
        if declared != spanned:
            raise UnsupportedMediaError(
                f"{_ST_CORRUPT}{LATENTS_KEY!r} of shape {_shape_text(shape)} and dtype "
                f"{dtype_name} needs {_bytes_text(declared, spanned)} but spans {spanned}"
            )
    return dtype_name, tuple(shape)


def _tensor_from_view(view: dict[str, object], dtype: torch.dtype) -> torch.Tensor:
    shape = list(view["shape"])  # type: ignore[call-overload]
    raw = view["data"]
    assert isinstance(raw, bytearray)
    if not raw:  # torch.frombuffer refuses an empty buffer
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(raw, dtype=dtype).reshape(shape)


def _load_npy(data: bytes, check_shape: ShapeCheck | None) -> torch.Tensor:
    descr, fortran_order, shape, offset = _npy_header(data)
    dtype = _npy_dtype(descr)
    present = len(data) - offset
    declared = _declared_bytes(shape, dtype.itemsize, present)
    if declared != present:
        raise UnsupportedMediaError(
            f"{_NPY_CORRUPT}its header declares shape {_shape_text(shape)} of {dtype.str}, "
            f"{_bytes_text(declared, present)} of data, but the file holds {present}"
        )
    floating = dtype.kind == "f"
    bcthw = _check_declared(shape, dtype.name, floating)
    if check_shape is not None:
        check_shape(bcthw)
    count = present // dtype.itemsize
    array = np.frombuffer(data, dtype=dtype, count=count, offset=offset)
    array = array.reshape(shape, order="F" if fortran_order else "C")
    # One copy: native byte order, C order, writable (torch shares it).
    native = np.array(array, dtype=dtype.newbyteorder("="), order="C")
    if native.dtype.itemsize > 8:  # long double: torch has none; what overflows is caught later
        with np.errstate(over="ignore", invalid="ignore"):
            native = native.astype(np.float64)
    return _finish_latents(torch.from_numpy(native))


def _npy_header(data: bytes) -> tuple[object, bool, tuple[int, ...], int]:
    """(descr, fortran_order, shape, data offset) of a .npy file, read with bounded cost."""
    if len(data) < 10:
        raise UnsupportedMediaError(f"{_NPY_CORRUPT}its header is truncated")
    major, minor = data[6], data[7]
    if (major, minor) == (1, 0):
        (header_size,) = struct.unpack_from("<H", data, 8)
        start = 10
    elif (major, minor) in ((2, 0), (3, 0)):
        if len(data) < 12:
            raise UnsupportedMediaError(f"{_NPY_CORRUPT}its header is truncated")
        (header_size,) = struct.unpack_from("<I", data, 8)
        start = 12
    else:
        raise UnsupportedMediaError(
            f"{_NPY_CORRUPT}format version {major}.{minor} is not one of 1.0, 2.0, 3.0"
        )
    if header_size > _MAX_NPY_HEADER_BYTES:
        raise UnsupportedMediaError(
            f"{_NPY_CORRUPT}its header is {header_size} bytes, over the {_MAX_NPY_HEADER_BYTES} "
            "that numpy reads"
        )
    if start + header_size > len(data):
        raise UnsupportedMediaError(f"{_NPY_CORRUPT}its header is truncated")
    raw = data[start : start + header_size]
    try:
        text = raw.decode("utf-8" if major == 3 else "latin-1")
        header = _NpyHeaderParser(text).parse()
    except ValueError as error:
        raise UnsupportedMediaError(f"{_NPY_CORRUPT}its header cannot be parsed: {error}") from None
    if not isinstance(header, dict) or set(header) != {"descr", "fortran_order", "shape"}:
        raise UnsupportedMediaError(
            f"{_NPY_CORRUPT}its header is not a dict of descr, fortran_order and shape"
        )
    shape = header["shape"]
    fortran_order = header["fortran_order"]
    if not (
        isinstance(shape, tuple)
        and all(type(d) is int and 0 <= d <= _MAX_DIM for d in shape)
        and isinstance(fortran_order, bool)
    ):
        raise UnsupportedMediaError(
            f"{_NPY_CORRUPT}its header needs a shape of sizes and a fortran_order of True or False"
        )
    return header["descr"], fortran_order, shape, start + header_size


class _NpyHeaderParser:
    """The Python-literal subset .npy headers are written in: dicts, tuples, lists,
    strings without escapes, non-negative ints, True/False/None.

    Our own, rather than `ast.literal_eval`: the Python parser runs out of stack (a
    MemoryError) on a few kilobytes of `not not not ...`, and the header is hostile.
    """

    def __init__(self, text: str) -> None:
        self.tokens: list[tuple[str, object]] = []
        position = 0
        while position < len(text):
            match = _NPY_TOKEN.match(text, position)
            if match is None:
                if text[position:].strip():
                    raise ValueError(f"unexpected {_echo(text[position : position + 10])!r}")
                break
            kind = match.lastgroup
            assert kind is not None
            token = match.group(kind)
            if kind == "str":
                self.tokens.append(("value", token[1:-1]))
            elif kind == "int":
                if len(token) > 19:
                    raise ValueError(f"integer {_echo(token)} is too large")
                self.tokens.append(("value", int(token)))
            elif kind == "name":
                self.tokens.append(("value", _NPY_NAMES[token]))
            else:
                self.tokens.append(("punct", token))
            position = match.end()
        self.index = 0

    def parse(self) -> object:
        value = self._value(0)
        if self.index != len(self.tokens):
            raise ValueError("more after the header's value")
        return value

    def _next(self) -> tuple[str, object]:
        if self.index == len(self.tokens):
            raise ValueError("the header ends early")
        token = self.tokens[self.index]
        self.index += 1
        return token

    def _peek(self, punct: str) -> bool:
        return self.index < len(self.tokens) and self.tokens[self.index] == ("punct", punct)

    def _value(self, depth: int) -> object:
        if depth > _MAX_NPY_NESTING:
            raise ValueError("nested too deeply")
        kind, token = self._next()
        if kind == "value":
            return token
        if token == "{":
            pairs = self._items("}", depth, pairs=True)
            return dict(pairs)  # type: ignore[arg-type]
        if token == "[":
            return self._items("]", depth)
        if token == "(":
            return self._items(")", depth, parenthesis=True)
        raise ValueError(f"unexpected {token!r}")

    def _items(
        self, close: str, depth: int, pairs: bool = False, parenthesis: bool = False
    ) -> object:
        items: list[object] = []
        trailing_comma = False
        while not self._peek(close):
            if items and not trailing_comma:
                raise ValueError(f"expected ',' or {close!r}")
            item = self._value(depth + 1)
            if pairs:
                if not self._peek(":"):
                    raise ValueError("expected ':'")
                self.index += 1
                if not isinstance(item, str):
                    raise ValueError("a key is not a string")
                item = (item, self._value(depth + 1))
            items.append(item)
            trailing_comma = self._peek(",")
            if trailing_comma:
                self.index += 1
        self.index += 1
        if parenthesis:
            # `(16)` is 16, `(16,)` a tuple, as in Python.
            return items[0] if len(items) == 1 and not trailing_comma else tuple(items)
        return items


def _npy_dtype(descr: object) -> np.dtype:
    """The dtype of a .npy file's `descr`: plain numbers only, never objects or records."""
    if isinstance(descr, list):
        raise UnsupportedMediaError(f"{_NPY_UNSAFE}structured arrays are not read; {_SAFE_HINT}")
    if not isinstance(descr, str):
        raise UnsupportedMediaError(f"{_NPY_CORRUPT}its descr is not a dtype")
    if _NPY_OBJECT.fullmatch(descr):
        raise UnsupportedMediaError(
            f"{_NPY_UNSAFE}it holds Python objects, which need pickle; {_SAFE_HINT}"
        )
    if _NPY_FLOAT.fullmatch(descr) or _NPY_NUMBER.fullmatch(descr):
        try:
            return np.dtype(descr)
        except TypeError:  # a float size this platform lacks, such as f16 without long double
            pass
    raise UnsupportedMediaError(f"{_NPY_UNSAFE}dtype {_echo(descr)!r} is not read; {_SAFE_HINT}")


def _declared_bytes(shape: Sequence[int], itemsize: int, limit: int) -> int | None:
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


def _check_declared(shape: tuple[int, ...], dtype_name: str, floating: bool) -> tuple[int, ...]:
    """The declared latents shape as BCTHW, or the 422 that says what is wrong with it."""
    if not floating:
        raise InvalidRequestError(f"latents must be floating point, got {dtype_name}")
    if len(shape) == 4:
        shape = (1, *shape)
    elif len(shape) != 5:
        raise InvalidRequestError(
            f"latents must be CTHW or BCTHW, got {len(shape)} dimensions {_shape_text(shape)}"
        )
    if shape[0] != 1:
        raise InvalidRequestError(f"latents must hold one video (batch 1), got batch {shape[0]}")
    if shape[2] == 0:
        raise InvalidRequestError("latents have zero frames")
    if 0 in shape:
        raise InvalidRequestError(f"latents are empty: shape {shape}")
    return shape


def _finish_latents(latents: torch.Tensor) -> torch.Tensor:
    """Declared-shape-checked latents as float32 BCTHW, refused if any value is not finite."""
    if latents.ndim == 4:
        latents = latents.unsqueeze(0)
    latents = latents.to(torch.float32)
    if not torch.isfinite(latents).all():
        raise InvalidRequestError("latents contain NaN or infinite values")
    return latents.contiguous()


def _torch_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _shape_text(shape: Sequence[int]) -> str:
    if len(shape) <= 8:
        return str(tuple(shape))
    return f"({', '.join(map(str, shape[:8]))}, ... {len(shape)} dimensions)"


def _bytes_text(declared: int | None, limit: int) -> str:
    return f"{declared} bytes" if declared is not None else f"more than {limit} bytes"


def _echo(value: object) -> str:
    """A client-sent value, cut short enough to quote in a message."""
    text = str(value)
    return text if len(text) <= _MAX_ECHO_CHARS else f"{text[:_MAX_ECHO_CHARS]}..."


def check_audio(audio: torch.Tensor, sample_rate: str | None) -> tuple[np.ndarray, int]:
    """A soundtrack as (channels, samples) float32 in [-1, 1] and its rate, or a 422.

    Mono may come as one dimension. Values past [-1, 1] are clipped, as any audio
    output would clip them. The rate must be ASCII digits, a handful at most.
    """
    from vaecast.codecs.aac import MAX_SAMPLE_RATE_HZ, MIN_SAMPLE_RATE_HZ

    if sample_rate is None or sample_rate == "":
        raise InvalidRequestError(
            f"audio needs its sample rate: metadata or parameter {AUDIO_RATE_KEY!r}"
        )
    # str.isdigit() accepts '²', which int() refuses; a long string costs int() time.
    if (
        not re.fullmatch(rf"[0-9]{{1,{_MAX_RATE_DIGITS}}}", sample_rate)
        or not MIN_SAMPLE_RATE_HZ <= int(sample_rate) <= MAX_SAMPLE_RATE_HZ
    ):
        raise InvalidRequestError(
            f"{AUDIO_RATE_KEY} must be an integer from {MIN_SAMPLE_RATE_HZ} to "
            f"{MAX_SAMPLE_RATE_HZ} Hz, got {_echo(sample_rate)!r}"
        )
    if not audio.is_floating_point():
        raise InvalidRequestError(
            f"audio must be floating point, got {str(audio.dtype).removeprefix('torch.')}"
        )
    if audio.ndim == 1:
        audio = audio.unsqueeze(0)
    if audio.ndim != 2:
        raise InvalidRequestError(
            f"audio must be (channels, samples) or (samples,), got shape {tuple(audio.shape)}"
        )
    if not 1 <= audio.shape[0] <= MAX_AUDIO_CHANNELS:
        raise InvalidRequestError(
            f"audio must be mono or stereo, got {audio.shape[0]} channels "
            "(is it (samples, channels)? send (channels, samples))"
        )
    if audio.shape[1] == 0:
        raise InvalidRequestError("audio has no samples")
    audio = audio.to(torch.float32)
    if not torch.isfinite(audio).all():
        raise InvalidRequestError("audio contains NaN or infinite values")
    return audio.clamp(-1.0, 1.0).contiguous().numpy(), int(sample_rate)
