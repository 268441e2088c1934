"""Reading latent tensors from uploaded bytes, safely.

Accepted: safetensors (tensor `latents`, optionally a soundtrack `audio`, and
`__metadata__` such as `fps` and `audio_sample_rate`) and NumPy `.npy` (read with
`allow_pickle=False`; latents only). Pickles, including `torch.save`
files, are refused on sight: loading one can run arbitrary code. The format is
sniffed from the bytes, not trusted from a Content-Type, because `curl
--data-binary` labels everything `application/x-www-form-urlencoded`.

The result is a finite float32 BCTHW tensor with batch 1; every way an upload can
fail that is raises a typed error whose message tells the user what to send.
"""

from __future__ import annotations

import io
import json
import struct
from dataclasses import dataclass, field

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors

from vaecast.errors import InvalidRequestError, UnsupportedMediaError

LATENTS_KEY = "latents"
AUDIO_KEY = "audio"
AUDIO_RATE_KEY = "audio_sample_rate"
MAX_AUDIO_CHANNELS = 2
_NPY_MAGIC = b"\x93NUMPY"
_ZIP_MAGIC = b"PK\x03\x04"  # torch.save's default format is a zip of pickles
_PICKLE_PROTO = 0x80  # pickle protocol 2+ starts with PROTO
_SAFE_HINT = (
    "save it with safetensors: safetensors.torch.save_file({'latents': z}, 'z.safetensors')"
)


@dataclass(frozen=True, slots=True)
class LatentFile:
    latents: torch.Tensor  # float32, BCTHW, B == 1, finite
    metadata: dict[str, str] = field(default_factory=dict)
    audio: torch.Tensor | None = None  # as uploaded; checked by `check_audio`


def load_latents(data: bytes) -> LatentFile:
    """Parse and check an uploaded latent file; see the module docstring."""
    if not data:
        raise InvalidRequestError(f"the upload is empty; {_SAFE_HINT}")
    if data.startswith(_ZIP_MAGIC) or data[0] == _PICKLE_PROTO:
        raise UnsupportedMediaError(
            f"pickle and torch.save files are refused (loading them can run code); {_SAFE_HINT}"
        )
    if data.startswith(_NPY_MAGIC):
        return LatentFile(_check_latents(_tensor_from_npy(data)))
    if _looks_like_safetensors(data):
        tensors, metadata = _read_safetensors(data)
        if LATENTS_KEY not in tensors:
            found = ", ".join(sorted(tensors)) or "none"
            raise InvalidRequestError(
                f"the safetensors file has no tensor named {LATENTS_KEY!r} (found: {found})"
            )
        return LatentFile(_check_latents(tensors[LATENTS_KEY]), metadata, tensors.get(AUDIO_KEY))
    raise UnsupportedMediaError(f"the upload is not a safetensors or .npy file; {_SAFE_HINT}")


def _looks_like_safetensors(data: bytes) -> bool:
    if len(data) < 10:
        return False
    (header_size,) = struct.unpack_from("<Q", data)
    return 2 <= header_size <= len(data) - 8 and data[8:9] == b"{"


def _read_safetensors(data: bytes) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    try:
        tensors = load_safetensors(data)
        (header_size,) = struct.unpack_from("<Q", data)
        header = json.loads(data[8 : 8 + header_size])
    except (SafetensorError, ValueError, TypeError) as error:
        raise UnsupportedMediaError(f"the safetensors file is corrupt: {error}") from None
    metadata = header.get("__metadata__") or {}
    return tensors, {str(k): str(v) for k, v in metadata.items()}


def _tensor_from_npy(data: bytes) -> torch.Tensor:
    try:
        array = np.load(io.BytesIO(data), allow_pickle=False)
    except ValueError as error:
        # Object arrays need pickle; NumPy says so in the message.
        raise UnsupportedMediaError(f"the .npy file cannot be read safely: {error}") from None
    except (OSError, EOFError) as error:
        raise UnsupportedMediaError(f"the .npy file is corrupt: {error}") from None
    if not np.issubdtype(array.dtype, np.floating):
        raise InvalidRequestError(f"latents must be floating point, got {array.dtype}")
    return torch.from_numpy(np.ascontiguousarray(array))


def _check_latents(latents: torch.Tensor) -> torch.Tensor:
    if not latents.is_floating_point():
        raise InvalidRequestError(
            f"latents must be floating point, got {str(latents.dtype).removeprefix('torch.')}"
        )
    if latents.ndim == 4:
        latents = latents.unsqueeze(0)
    elif latents.ndim != 5:
        raise InvalidRequestError(
            f"latents must be CTHW or BCTHW, got {latents.ndim} dimensions {tuple(latents.shape)}"
        )
    if latents.shape[0] != 1:
        raise InvalidRequestError(
            f"latents must hold one video (batch 1), got batch {latents.shape[0]}"
        )
    if latents.shape[2] == 0:
        raise InvalidRequestError("latents have zero frames")
    if latents.numel() == 0:
        raise InvalidRequestError(f"latents are empty: shape {tuple(latents.shape)}")
    latents = latents.to(torch.float32)
    if not torch.isfinite(latents).all():
        raise InvalidRequestError("latents contain NaN or infinite values")
    return latents.contiguous()


def check_audio(audio: torch.Tensor, sample_rate: str | None) -> tuple[np.ndarray, int]:
    """A soundtrack as (channels, samples) float32 in [-1, 1] and its rate, or a 422.

    Mono may come as one dimension. Values past [-1, 1] are clipped, as any audio
    output would clip them.
    """
    from vaecast.codecs.aac import MAX_SAMPLE_RATE_HZ, MIN_SAMPLE_RATE_HZ

    if sample_rate is None or sample_rate == "":
        raise InvalidRequestError(
            f"audio needs its sample rate: metadata or parameter {AUDIO_RATE_KEY!r}"
        )
    if (
        not sample_rate.isdigit()
        or not MIN_SAMPLE_RATE_HZ <= int(sample_rate) <= MAX_SAMPLE_RATE_HZ
    ):
        raise InvalidRequestError(
            f"{AUDIO_RATE_KEY} must be an integer from {MIN_SAMPLE_RATE_HZ} to "
            f"{MAX_SAMPLE_RATE_HZ} Hz, got {sample_rate!r}"
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
