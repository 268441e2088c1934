"""Reading a NumPy `.npy` latent file without numpy's loader, and so without pickle.

Any floating dtype in either byte order, C or Fortran order. The header is a Python
literal, parsed here by a small parser of the subset numpy writes, with bounded
cost; the dtype must be a plain number (objects need pickle, structured arrays are
not read), and the declared shape is checked before any data is touched.
"""

from __future__ import annotations

import re
import struct

import numpy as np
import torch

from vaecast.errors import UnsupportedMediaError
from vaecast.latent_files.latents import (
    LATENTS,
    MAX_DIM,
    SAFE_HINT,
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

NPY_MAGIC = b"\x93NUMPY"
_CORRUPT = "the .npy file is corrupt: "
_UNSAFE = "the .npy file cannot be read safely: "
# numpy's own default limit for np.load (`max_header_size`).
_MAX_HEADER_BYTES = 10_000
_MAX_NESTING = 8

_FLOAT = re.compile(r"[<>|=]?(?:f(?:2|4|8|12|16)|[efdg])", re.ASCII)
_NUMBER = re.compile(r"[<>|=]?(?:[iu][1248]|c(?:8|16)|b1|\?)", re.ASCII)
_OBJECT = re.compile(r"[<>|=]?O[48]?", re.ASCII)
_TOKEN = re.compile(
    r"""\s*(?:(?P<str>'[^'\\\n]*'|"[^"\\\n]*")|(?P<int>[0-9]+)L?"""
    r"""|(?P<name>True|False|None)\b|(?P<punct>[{}()\[\]:,]))""",
    re.ASCII,
)
_NAMES = {"True": True, "False": False, "None": None}


def load_npy(
    data: Buffer,
    check_shape: ShapeCheck | None,
    layout: LayoutChoice | None = None,
    role: TensorRole = LATENTS,
    max_batch: int = 1,
) -> LatentFile:
    descr, fortran_order, shape, offset = _read_header(data)
    dtype = _plain_dtype(descr)
    present = len(data) - offset
    declared = declared_bytes(shape, dtype.itemsize, present)
    if declared != present:
        raise UnsupportedMediaError(
            f"{_CORRUPT}its header declares shape {shape_text(shape)} of {dtype.str}, "
            f"{bytes_text(declared, present)} of data, but the file holds {present}"
        )
    floating = dtype.kind == "f"
    bound = choose_layout(layout, {})  # a .npy file has no metadata
    bcthw = check_declared(shape, dtype.name, floating, bound, role, max_batch)
    if check_shape is not None:
        check_shape((1, *bcthw[1:]))  # one video's
    count = present // dtype.itemsize
    array = np.frombuffer(data, dtype=dtype, count=count, offset=offset)
    array = array.reshape(shape, order="F" if fortran_order else "C")
    # Native byte order, C order, aligned and writable (torch shares it): a view of a
    # bytearray upload that already is, else one copy.
    native = np.require(array, dtype=dtype.newbyteorder("="), requirements=["C", "A", "W"])
    if native.dtype.itemsize > 8:  # long double: torch has none; what overflows is caught later
        with np.errstate(over="ignore", invalid="ignore"):
            native = native.astype(np.float64)
    tensor = torch.from_numpy(native)
    return LatentFile(finish_latents(bound.to_bcthw(tensor), role), dtype=tensor.dtype)


def _read_header(data: bytes) -> tuple[object, bool, tuple[int, ...], int]:
    """(descr, fortran_order, shape, data offset) of a .npy file, read with bounded cost."""
    if len(data) < 10:
        raise UnsupportedMediaError(f"{_CORRUPT}its header is truncated")
    major, minor = data[6], data[7]
    if (major, minor) == (1, 0):
        (header_size,) = struct.unpack_from("<H", data, 8)
        start = 10
    elif (major, minor) in ((2, 0), (3, 0)):
        if len(data) < 12:
            raise UnsupportedMediaError(f"{_CORRUPT}its header is truncated")
        (header_size,) = struct.unpack_from("<I", data, 8)
        start = 12
    else:
        raise UnsupportedMediaError(
            f"{_CORRUPT}format version {major}.{minor} is not one of 1.0, 2.0, 3.0"
        )
    if header_size > _MAX_HEADER_BYTES:
        raise UnsupportedMediaError(
            f"{_CORRUPT}its header is {header_size} bytes, over the {_MAX_HEADER_BYTES} "
            "that numpy reads"
        )
    if start + header_size > len(data):
        raise UnsupportedMediaError(f"{_CORRUPT}its header is truncated")
    raw = data[start : start + header_size]
    try:
        text = raw.decode("utf-8" if major == 3 else "latin-1")
        header = _HeaderParser(text).parse()
    except ValueError as error:
        raise UnsupportedMediaError(f"{_CORRUPT}its header cannot be parsed: {error}") from None
    if not isinstance(header, dict) or set(header) != {"descr", "fortran_order", "shape"}:
        raise UnsupportedMediaError(
            f"{_CORRUPT}its header is not a dict of descr, fortran_order and shape"
        )
    shape = header["shape"]
    fortran_order = header["fortran_order"]
    if not (
        isinstance(shape, tuple)
        and all(type(d) is int and 0 <= d <= MAX_DIM for d in shape)
        and isinstance(fortran_order, bool)
    ):
        raise UnsupportedMediaError(
            f"{_CORRUPT}its header needs a shape of sizes and a fortran_order of True or False"
        )
    return header["descr"], fortran_order, shape, start + header_size


class _HeaderParser:
    """The Python-literal subset .npy headers are written in: dicts, tuples, lists,
    strings without escapes, non-negative ints, True/False/None.

    Our own, rather than `ast.literal_eval`: the Python parser runs out of stack (a
    MemoryError) on a few kilobytes of `not not not ...`, and the header is hostile.
    """

    def __init__(self, text: str) -> None:
        self.tokens: list[tuple[str, object]] = []
        position = 0
        while position < len(text):
            match = _TOKEN.match(text, position)
            if match is None:
                if text[position:].strip():
                    raise ValueError(f"unexpected {echo(text[position : position + 10])!r}")
                break
            kind = match.lastgroup
            assert kind is not None
            token = match.group(kind)
            if kind == "str":
                self.tokens.append(("value", token[1:-1]))
            elif kind == "int":
                if len(token) > 19:
                    raise ValueError(f"integer {echo(token)} is too large")
                self.tokens.append(("value", int(token)))
            elif kind == "name":
                self.tokens.append(("value", _NAMES[token]))
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
        if depth > _MAX_NESTING:
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


def _plain_dtype(descr: object) -> np.dtype:
    """The dtype of a .npy file's `descr`: plain numbers only, never objects or records."""
    if isinstance(descr, list):
        raise UnsupportedMediaError(f"{_UNSAFE}structured arrays are not read; {SAFE_HINT}")
    if not isinstance(descr, str):
        raise UnsupportedMediaError(f"{_CORRUPT}its descr is not a dtype")
    if _OBJECT.fullmatch(descr):
        raise UnsupportedMediaError(
            f"{_UNSAFE}it holds Python objects, which need pickle; {SAFE_HINT}"
        )
    if _FLOAT.fullmatch(descr) or _NUMBER.fullmatch(descr):
        try:
            return np.dtype(descr)
        except TypeError:  # a float size this platform lacks, such as f16 without long double
            pass
    raise UnsupportedMediaError(f"{_UNSAFE}dtype {echo(descr)!r} is not read; {SAFE_HINT}")
