"""Latent files built byte by byte: valid ones of every shape the formats allow, and
the small well-formed ones the other categories send."""

from __future__ import annotations

import io
import json
import random
import struct
from dataclasses import dataclass

import numpy as np

from chaos import faults

LATENT_CHANNELS = 16
TEMPORAL_SCALE = 4
# The shortest header a file with a `latents` tensor can have:
# {"latents":{"dtype":"F16","shape":[16,1,1,1],"data_offsets":[0,32]}}
MIN_LATENTS_HEADER_BYTES = 68
SAFETENSORS_DTYPES = {"F16": "<f2", "F32": "<f4", "F64": "<f8", "BF16": None}
NPY_FLOAT_CHARS = ("f2", "f4", "f8")
NPY_BYTE_ORDERS = ("<", ">")
NPY_VERSIONS = ((1, 0), (2, 0), (3, 0))


@dataclass(frozen=True, slots=True)
class LatentFile:
    data: bytes
    frames: int  # what the linear decoder makes of it
    label: str


def video_frames(latent_frames: int) -> int:
    return 1 + TEMPORAL_SCALE * (latent_frames - 1)


def _values(rng: random.Random, shape: tuple[int, ...]) -> np.ndarray:
    generator = np.random.default_rng(rng.getrandbits(32))
    return generator.uniform(-1.0, 1.0, size=shape).astype(np.float32)


def _tensor_bytes(values: np.ndarray, dtype: str) -> bytes:
    numpy_dtype = SAFETENSORS_DTYPES[dtype]
    if numpy_dtype is None:  # bfloat16: the upper half of a float32
        return (values.astype("<f4").view("<u4") >> 16).astype("<u2").tobytes()
    return values.astype(numpy_dtype).tobytes()


def safetensors_file(
    tensors: dict[str, tuple[str, tuple[int, ...], bytes]],
    metadata: dict[str, object] | None = None,
    header_bytes: int | None = None,
) -> bytes:
    """A safetensors file: u64 LE header length, JSON header padded with spaces, data.

    `tensors`: name -> (dtype, shape, raw bytes). Without `header_bytes` the header is
    padded to a multiple of 8, as the safetensors library writes it.
    """
    header: dict[str, object] = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    offset, data = 0, []
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {
            "dtype": dtype,
            "shape": list(shape),
            "data_offsets": [offset, offset + len(raw)],
        }
        offset += len(raw)
        data.append(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    size = header_bytes if header_bytes is not None else -(-len(text) // 8) * 8
    if len(text) > size:
        raise ValueError(f"the header needs {len(text)} bytes, more than {size}")
    return struct.pack("<Q", size) + text.ljust(size, b" ") + b"".join(data)


def latents_file(
    shape: tuple[int, ...],
    rng: random.Random,
    dtype: str = "F32",
    metadata: dict[str, object] | None = None,
    header_bytes: int | None = None,
    values: np.ndarray | None = None,
) -> bytes:
    raw = _tensor_bytes(_values(rng, shape) if values is None else values, dtype)
    return safetensors_file({"latents": (dtype, shape, raw)}, metadata, header_bytes)


def valid_safetensors(header_bytes: int, rng: random.Random) -> LatentFile:
    """A valid latent file whose header is exactly `header_bytes` long (>= 68)."""
    for _ in range(20):
        frames, height, width = rng.randint(1, 3), rng.randint(1, 4), rng.randint(1, 4)
        shape: tuple[int, ...] = (LATENT_CHANNELS, frames, height, width)
        if rng.random() < 0.5:
            shape = (1, *shape)
        dtype = rng.choice(sorted(SAFETENSORS_DTYPES))
        metadata = {"fps": rng.choice(["16", "24", "30000/1001"])} if rng.random() < 0.5 else None
        try:
            data = latents_file(shape, rng, dtype, metadata, header_bytes)
        except ValueError:
            continue
        return LatentFile(data, video_frames(frames), f"safetensors header {header_bytes} B")
    data = latents_file((LATENT_CHANNELS, 1, 1, 1), rng, "F16", None, header_bytes)
    return LatentFile(data, 1, f"safetensors header {header_bytes} B")


def valid_npy(
    char: str, byte_order: str, fortran: bool, version: tuple[int, int], rng: random.Random
) -> LatentFile:
    frames, height, width = rng.randint(1, 3), rng.randint(1, 4), rng.randint(1, 4)
    shape: tuple[int, ...] = (LATENT_CHANNELS, frames, height, width)
    if rng.random() < 0.5:
        shape = (1, *shape)
    array = _values(rng, shape).astype(np.dtype(byte_order + char))
    if fortran:
        array = np.asfortranarray(array)
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, array, version=version, allow_pickle=False)
    order = "Fortran" if fortran else "C"
    label = f".npy {byte_order}{char} {order} order v{version[0]}.{version[1]}"
    return LatentFile(buffer.getvalue(), video_frames(frames), label)


def npy_combinations() -> list[tuple[str, str, bool]]:
    return [
        (char, order, fortran)
        for char in NPY_FLOAT_CHARS
        for order in NPY_BYTE_ORDERS
        for fortran in (False, True)
    ]


# Files the other categories send.


def small_latents(frames: int = 2, height: int = 2, width: int = 2, seed: int = 0) -> bytes:
    return latents_file((LATENT_CHANNELS, frames, height, width), random.Random(seed))


def latents_with_audio(seed: int = 0) -> bytes:
    rng = random.Random(seed)
    latents = _tensor_bytes(_values(rng, (LATENT_CHANNELS, 2, 2, 2)), "F32")
    audio = _tensor_bytes(_values(rng, (2, 8000)) * 0.5, "F32")
    return safetensors_file(
        {
            "latents": ("F32", (LATENT_CHANNELS, 2, 2, 2), latents),
            "audio": ("F32", (2, 8000), audio),
        }
    )


def slow_job_latents(seed: int = 0) -> bytes:
    """For the `slow` model: 12 chunks of 64x64, about half a second of decoding."""
    return small_latents(frames=12, height=8, width=8, seed=seed)


def decoder_fault_latents(seed: int) -> bytes:
    return small_latents(frames=faults.FAULT_CHUNKS, seed=seed)


def encoder_fault_latents(chunk: int, seed: int) -> bytes:
    height = faults.ENCODER_FAULT_HEIGHT_PX // 8
    width = faults.encoder_fault_width_px(chunk) // 8
    return small_latents(frames=faults.FAULT_CHUNKS, height=height, width=width, seed=seed)


def disk_full_latents(seed: int) -> bytes:
    """Noise at the pixel limit, 65 frames: an MP4 well past `DISK_FULL_FILE_BYTES`."""
    rng = random.Random(seed)
    values = _values(rng, (LATENT_CHANNELS, 17, 16, 16)) * 1.5
    return latents_file((LATENT_CHANNELS, 17, 16, 16), rng, values=values)
