"""The sound a video model makes beside its video: audio latents to the soundtrack.

Some pipelines generate audio latents with the video latents (LTX-2's `LTX2Pipeline`
returns both with `output_type="latent"`). A decoder that can decode them has a `sound`
(`SoundDecoder`): the job's MP4 then carries the soundtrack its pipeline would make,
encoded as AAC and placed from the video's first frame, as the pipeline's own output
puts it. A decoder without one (`sound_of` is None) refuses audio latents.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import torch

from vaecast.errors import InvalidRequestError

# The name of the tensor an upload carries them in, beside `latents`.
AUDIO_LATENTS_KEY = "audio_latents"
# The longest sound decoded for one upload: it bounds the work audio latents can ask for.
MAX_SOUND_SECONDS = 600


class SoundDecoder(Protocol):
    """Audio latents, as the pipeline returns them, to its waveform."""

    def check_shape(self, shape: Sequence[int]) -> None:
        """Raise `InvalidRequestError` for audio latents this decoder cannot take (a
        bounded check, before anything is decoded)."""
        ...

    def decode(self, audio_latents: torch.Tensor) -> tuple[np.ndarray, int]:
        """The waveform, (channels, samples) float32 in [-1, 1], and its sample rate."""
        ...


def sound_of(decoder: object) -> SoundDecoder | None:
    """The decoder's sound decoder, if it has one."""
    return getattr(decoder, "sound", None)


def decode_sound(
    sound: SoundDecoder | None, model: str, audio_latents: torch.Tensor
) -> tuple[np.ndarray, int]:
    """`sound`'s waveform of `audio_latents` (model `model`'s), or a 422 saying why not."""
    if sound is None:
        raise InvalidRequestError(
            f"model {model!r} decodes no {AUDIO_LATENTS_KEY} here: it has no sound decoder "
            "(serve LTX-2 from its pipeline's folder, with audio_vae/ and vocoder/, for its "
            "sound), or send the waveform as 'audio'"
        )
    return sound.decode(audio_latents)
