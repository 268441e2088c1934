"""The demo soundtrack: clicks exactly when shapes touch an edge, a tone that follows one."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from vaecast.demo.motion import Motion
from vaecast.demo.soundtrack import synthesize

FPS = Fraction(16)
RATE = 48_000


def test_each_click_sounds_at_its_hit():
    motion = Motion(x0=10, vx=9, x_low=5, x_high=60, y0=20, vy=0, y_low=5, y_high=40)
    frames = 49
    wave = synthesize([motion], frames, width=64, fps=FPS, sample_rate=RATE)
    assert wave.shape == (2, round(frames / 16 * RATE))
    assert wave.dtype == np.float32 and np.abs(wave).max() <= 1.0
    loud = np.abs(wave).sum(0) > 0.3  # the tone alone stays below this
    rising = np.flatnonzero(loud[1:] & ~loud[:-1]) + 1
    # A click oscillates: keep the first crossing of each burst (bursts are > 10 ms apart).
    onsets = [i for n, i in enumerate(rising) if n == 0 or i - rising[n - 1] > RATE // 100]
    expected = [hit / 16 * RATE for hit in motion.wall_hits(frames)]
    assert len(onsets) == len(expected)
    for onset, hit in zip(onsets, expected, strict=True):
        assert abs(onset - hit) < RATE / 1000  # within a millisecond


@pytest.mark.parametrize(("x0", "louder"), [(6, 0), (58, 1)])
def test_sound_comes_from_where_the_shape_is(x0: float, louder: int):
    still = Motion(x0=x0, vx=0, x_low=5, x_high=60, y0=20, vy=0, y_low=5, y_high=40)
    wave = synthesize([still], 16, width=64, fps=FPS, sample_rate=RATE)
    energy = (wave.astype(np.float64) ** 2).sum(axis=1)
    assert energy[louder] > 10 * energy[1 - louder]


def test_the_tone_rises_as_the_shape_rises():
    rising = Motion(x0=30, vx=0, x_low=5, x_high=60, y0=39, vy=-1, y_low=5, y_high=40)
    wave = synthesize([rising], 33, width=64, fps=FPS, sample_rate=RATE)[0]

    def pitch(segment: np.ndarray) -> float:
        spectrum = np.abs(np.fft.rfft(segment * np.hanning(len(segment))))
        return float(np.argmax(spectrum) * RATE / len(segment))

    early, late = wave[RATE // 8 : RATE // 4], wave[-RATE // 4 : -RATE // 8]
    assert pitch(late) > 1.5 * pitch(early)
