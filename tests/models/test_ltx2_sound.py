"""LTX-2's sound decoder: the pipeline's audio decode step, exactly, and what it refuses."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers import one_torch_thread
from tests.helpers.tiny_pipelines import run_case
from tests.helpers.tiny_pipelines.ltx import CASES
from vaecast.errors import InvalidRequestError
from vaecast.models.ltx2_sound import LTX2Sound
from vaecast.models.sound import MAX_SOUND_SECONDS, decode_sound

CASE = next(case for case in CASES if case.model == "ltx-2")


def test_the_waveform_is_the_pipelines_audio_output() -> None:
    with one_torch_thread():
        run = run_case(CASE)
        pipeline = run.pipeline
        sound = LTX2Sound(pipeline.audio_vae, pipeline.vocoder)
        assert run.audio_latents is not None and run.audio is not None
        waveform, rate = sound.decode(run.audio_latents)
    expected = run.audio
    assert rate == pipeline.vocoder.config.output_sampling_rate == 16_000
    assert waveform.shape == expected.shape and waveform.shape[0] == 2
    np.testing.assert_array_equal(waveform, expected)
    # 25 latent frames a second (16 kHz / hop 160 / 4): 1 s of sound for 1 s of video.
    assert sound.latents_per_second == 25
    assert abs(waveform.shape[1] / rate - 1.0) < 0.05


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        ((1, 2, 26), "audio_latents must be (1, 2, L, 2), as LTX2Pipeline returns them"),
        ((2, 2, 26, 2), "audio_latents must be (1, 2, L, 2) for this LTX-2 audio VAE, got"),
        ((1, 3, 26, 2), "audio_latents must be (1, 2, L, 2) for this LTX-2 audio VAE, got"),
        ((1, 2, 0, 2), "audio_latents need at least 1 frame in time, got 0"),
        ((1, 2, 25 * MAX_SOUND_SECONDS + 1, 2), "at most 600 s (15000 frames) are decoded"),
    ],
)
def test_audio_latents_of_another_shape_are_refused(shape: tuple[int, ...], message: str) -> None:
    pipeline = CASE.build()
    sound = LTX2Sound(pipeline.audio_vae, pipeline.vocoder)
    with pytest.raises(InvalidRequestError, match=message.replace("(", r"\(").replace(")", r"\)")):
        sound.check_shape(shape)
    with pytest.raises(InvalidRequestError, match="contain NaN"):
        sound.decode(torch.full((1, 2, 4, 2), float("nan")))


def test_a_model_without_a_sound_decoder_says_so() -> None:
    with pytest.raises(InvalidRequestError, match="model 'tiny' decodes no audio_latents here"):
        decode_sound(None, "tiny", torch.zeros(1, 2, 4, 2))
