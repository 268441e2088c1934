"""The soundtrack a safetensors latent file may carry beside its latents.

A tensor `audio`, float in [-1, 1], `(channels, samples)` or `(samples,)` for mono,
and its rate in the metadata (or a request parameter) `audio_sample_rate`. The
safetensors reader only converts it; `check_audio` checks it once the rate is known,
since the rate may come from the request rather than the file.
"""

from __future__ import annotations

import re

import numpy as np
import torch

from vaecast.errors import InvalidRequestError
from vaecast.latent_files.latents import echo

AUDIO_KEY = "audio"
AUDIO_RATE_KEY = "audio_sample_rate"
MAX_AUDIO_CHANNELS = 2
MAX_RATE_DIGITS = 6


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
        not re.fullmatch(rf"[0-9]{{1,{MAX_RATE_DIGITS}}}", sample_rate)
        or not MIN_SAMPLE_RATE_HZ <= int(sample_rate) <= MAX_SAMPLE_RATE_HZ
    ):
        raise InvalidRequestError(
            f"{AUDIO_RATE_KEY} must be an integer from {MIN_SAMPLE_RATE_HZ} to "
            f"{MAX_SAMPLE_RATE_HZ} Hz, got {echo(sample_rate)!r}"
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
