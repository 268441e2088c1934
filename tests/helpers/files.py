"""Latent files built byte by byte: exact safetensors header lengths, .npy headers, pickles."""

from __future__ import annotations

import io
import json
import struct

import numpy as np
import torch


def padded_safetensors(
    header_length: int,
    tensors: dict[str, torch.Tensor],
    metadata: dict[str, str] | None = None,
) -> bytes:
    """A safetensors file whose header is exactly `header_length` bytes.

    Built by hand (8-byte little-endian length, JSON, spaces, data) because
    safetensors' writer pads to a multiple of 8. Metadata `pad` takes the room when
    there is enough for it, trailing spaces the rest, so both kinds of padding occur.
    """
    entries: dict[str, object] = {}
    data = b""
    for name, tensor in tensors.items():
        raw = tensor.contiguous().view(torch.uint8).numpy().tobytes()
        dtype = {torch.float32: "F32", torch.float16: "F16"}[tensor.dtype]
        entries[name] = {
            "dtype": dtype,
            "shape": list(tensor.shape),
            "data_offsets": [len(data), len(data) + len(raw)],
        }
        data += raw
    plain = json.dumps(
        {**({"__metadata__": metadata} if metadata else {}), **entries}, separators=(",", ":")
    )
    with_pad = json.dumps(
        {"__metadata__": {**(metadata or {}), "pad": ""}, **entries}, separators=(",", ":")
    )
    if len(with_pad) < header_length:
        header = with_pad.replace('"pad":""', f'"pad":"{"p" * (header_length - len(with_pad))}"')
    else:
        header = plain + " " * (header_length - len(plain))
    assert len(header) == header_length, (len(header), header_length)
    return struct.pack("<Q", header_length) + header.encode() + data


def npy_bytes(array: np.ndarray, allow_pickle: bool = False) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=allow_pickle)
    return buffer.getvalue()


def npy_with_header(header: str, data: bytes, version: int = 1) -> bytes:
    encoded = header.encode("latin-1")
    length = struct.pack("<H" if version == 1 else "<I", len(encoded))
    return b"\x93NUMPY" + bytes([version, 0]) + length + encoded + data


def torch_save_bytes(obj: object, zip_format: bool = True) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer, _use_new_zipfile_serialization=zip_format)
    return buffer.getvalue()
