"""LTX-2's sound: its audio latents through its audio VAE and vocoder, as its pipeline does.

`LTX2Pipeline` (diffusers, Apache-2.0; architecture by Lightricks) generates audio latents
with the video latents and, with `output_type="latent"`, returns them denormalized and
unpacked: (B, C, L, M), C the audio VAE's latent channels, L latent frames in time, M
latent mel bins. Its decode step is then `audio_vae.decode(latents.to(audio_vae.dtype))`
(`AutoencoderKLLTX2Audio`: a mel spectrogram) and `vocoder(mel)` (`LTX2Vocoder`, or
LTX-2.3's `LTX2VocoderWithBWE`: a waveform, (B, channels, samples) at the vocoder's
`output_sampling_rate`). `LTX2Sound` runs exactly that, whole, when a job's upload is
read: the sound is a small share of the work (a second of LTX-2's sound is 25 latent
frames), and the video's fragments need it from the first one on.

The two models are loaded from the pipeline's folder (`audio_vae/` and `vocoder/`,
beside `vae/`), never the hub; a server given only the video VAE's folder serves no
sound, and an upload with audio latents is then refused with the reason.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vaecast.errors import InvalidRequestError, WeightsError
from vaecast.models.sound import MAX_SOUND_SECONDS
from vaecast.models.weights_io import VAE_SUBFOLDER, diffusers_class

AUDIO_VAE_SUBFOLDER = "audio_vae"
VOCODER_SUBFOLDER = "vocoder"
REQUIREMENT = "diffusers>=0.42,<0.43"


class LTX2Sound:
    """LTX-2's audio decode step: a `SoundDecoder`."""

    def __init__(self, audio_vae: Any, vocoder: Any, device: str | torch.device = "cpu") -> None:
        self.device = torch.device(device)
        self.audio_vae = audio_vae.to(self.device).eval().requires_grad_(False)
        self.vocoder = vocoder.to(self.device).eval().requires_grad_(False)
        config = audio_vae.config
        self.latent_channels = int(config.latent_channels)
        self.latent_mel_bins = int(config.mel_bins) // int(audio_vae.mel_compression_ratio)
        self.sample_rate = int(vocoder.config.output_sampling_rate)
        # The pipeline's `audio_latents_per_second`.
        self.latents_per_second = (
            int(config.sample_rate)
            / int(config.mel_hop_length)
            / int(audio_vae.temporal_compression_ratio)
        )
        # One decode at a time on these modules: an upload's sound is decoded while it
        # is read, and uploads may be read side by side.
        self._lock = threading.Lock()

    @classmethod
    def from_folder(
        cls, weights: str | Path, device: str | torch.device = "cpu"
    ) -> LTX2Sound | None:
        """The sound of the pipeline folder `weights` (or of the pipeline whose `vae/`
        it is), or None where it has no `audio_vae/` and `vocoder/`."""
        path = Path(weights)
        if path.name == VAE_SUBFOLDER:
            path = path.parent
        audio_vae_folder, vocoder_folder = path / AUDIO_VAE_SUBFOLDER, path / VOCODER_SUBFOLDER
        if not (audio_vae_folder / "config.json").is_file():
            return None
        if not (vocoder_folder / "config.json").is_file():
            return None
        audio_vae_class = diffusers_class("ltx-2", "AutoencoderKLLTX2Audio", REQUIREMENT)
        from diffusers.pipelines.ltx2 import vocoder as vocoders

        vocoder_class = _vocoder_class(vocoders, vocoder_folder)
        audio_vae = audio_vae_class.from_pretrained(
            audio_vae_folder, local_files_only=True, torch_dtype=torch.float32
        )
        vocoder = vocoder_class.from_pretrained(
            vocoder_folder, local_files_only=True, torch_dtype=torch.float32
        )
        return cls(audio_vae, vocoder, device)

    def check_shape(self, shape: Sequence[int]) -> None:
        expected = f"(1, {self.latent_channels}, L, {self.latent_mel_bins})"
        if len(shape) != 4:
            raise InvalidRequestError(
                f"audio_latents must be {expected}, as LTX2Pipeline returns them (unpacked), "
                f"got {len(shape)} dimensions"
            )
        batch, channels, frames, mel_bins = (int(size) for size in shape)
        if batch != 1 or channels != self.latent_channels or mel_bins != self.latent_mel_bins:
            raise InvalidRequestError(
                f"audio_latents must be {expected} for this LTX-2 audio VAE, got "
                f"{tuple(int(size) for size in shape)}"
            )
        if frames < 1:
            raise InvalidRequestError("audio_latents need at least 1 frame in time, got 0")
        longest = int(MAX_SOUND_SECONDS * self.latents_per_second)
        if frames > longest:
            raise InvalidRequestError(
                f"audio_latents of {frames} frames are {frames / self.latents_per_second:.0f} s "
                f"of sound; at most {MAX_SOUND_SECONDS} s ({longest} frames) are decoded"
            )

    def decode(self, audio_latents: torch.Tensor) -> tuple[np.ndarray, int]:
        self.check_shape(tuple(audio_latents.shape))
        if not audio_latents.is_floating_point():
            raise InvalidRequestError("audio_latents must be floating point")
        if not torch.isfinite(audio_latents).all():
            raise InvalidRequestError("audio_latents contain NaN or infinite values")
        with self._lock, torch.inference_mode():
            # pipeline_ltx2.py's decode branch for the audio, line for line.
            latents = audio_latents.to(self.device).to(self.audio_vae.dtype)
            mel = self.audio_vae.decode(latents, return_dict=False)[0]
            waveform = self.vocoder(mel)
        samples = waveform[0].float().clamp(-1.0, 1.0).cpu().numpy()
        return np.ascontiguousarray(samples), self.sample_rate


def _vocoder_class(vocoders: Any, folder: Path) -> Any:
    """LTX-2's vocoder class, or LTX-2.3's (with bandwidth extension), by its config."""
    import json

    name = json.loads((folder / "config.json").read_text()).get("_class_name", "LTX2Vocoder")
    found = getattr(vocoders, str(name), None)
    if found is None:
        raise WeightsError(f"{folder}: unknown LTX-2 vocoder class {name!r}")
    return found
