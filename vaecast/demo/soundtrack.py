"""The demo scenes' sound, synchronised with what moves on screen.

It hears the motions the picture draws (`motion`): every wall hit is a click at the
exact, sub-frame moment of the hit, panned to where it happens, each shape with its
own pitch; the first shape also hums a tone whose pitch follows its height and whose
stereo position follows its x. So sync can be checked by eye and ear: the click lands
on the frame where the shape touches the wall.

Pure numpy, deterministic; the waveform is (2, samples) float32 in [-1, 1].
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from vaecast.demo.motion import Motion
from vaecast.demo.scenes import scene_motions

DEFAULT_SAMPLE_RATE_HZ = 48_000
CLICK_SECONDS = 0.035
CLICK_AMPLITUDE = 0.5
TONE_AMPLITUDE = 0.1
TONE_LOW_HZ = 220.0  # at the bottom of the frame; two octaves higher at the top


def scene_soundtrack(
    name: str,
    frames: int,
    height: int,
    width: int,
    fps: Fraction,
    seed: int = 0,
    sample_rate: int = DEFAULT_SAMPLE_RATE_HZ,
) -> np.ndarray:
    """The named scene's sound, (2, samples) float32. Same seed, same motions as
    `scenes.render_scene`, so what is heard is what is seen."""
    motions = scene_motions(name, frames, height, width, seed)
    return synthesize(motions, frames, width, fps, sample_rate)


def synthesize(
    motions: list[Motion],
    frames: int,
    width: int,
    fps: Fraction,
    sample_rate: int = DEFAULT_SAMPLE_RATE_HZ,
) -> np.ndarray:
    """The soundtrack of `frames` frames at `fps`: clicks on wall hits, a tone on motion 0."""
    samples = round(Fraction(frames) / fps * sample_rate)
    left_right = np.zeros((2, samples), np.float64)
    click_length = round(CLICK_SECONDS * sample_rate)
    click_time = np.arange(click_length) / sample_rate
    envelope = np.exp(-click_time / (CLICK_SECONDS / 5))
    for number, motion in enumerate(motions):
        pitch_hz = 900.0 * 2 ** (number / 4)  # each shape its own click
        click = CLICK_AMPLITUDE * envelope * np.sin(2 * math.pi * pitch_hz * click_time)
        for hit in motion.wall_hits(frames):
            start = round(hit / float(fps) * sample_rate)
            stop = min(samples, start + click_length)
            x, _ = motion.position(np.array([hit]))
            pan = float(np.clip(x[0] / max(width, 1), 0.0, 1.0))
            left_right[0, start:stop] += (1 - pan) * click[: stop - start]
            left_right[1, start:stop] += pan * click[: stop - start]
    if motions:
        left_right += _tone(motions[0], samples, width, fps, sample_rate)
    return np.clip(left_right, -1.0, 1.0).astype(np.float32)


def _tone(motion: Motion, samples: int, width: int, fps: Fraction, sample_rate: int) -> np.ndarray:
    frame_time = np.arange(samples) / sample_rate * float(fps)
    x, y = motion.position(frame_time)
    height = motion.y_high + motion.y_low  # the y range is symmetric inside the frame
    up = 1.0 - np.clip(y / max(height, 1e-9), 0.0, 1.0)
    frequency = TONE_LOW_HZ * 2.0 ** (2.0 * up)
    phase = 2 * math.pi * np.cumsum(frequency) / sample_rate  # continuous through glides
    tone = TONE_AMPLITUDE * np.sin(phase)
    pan = np.clip(x / max(width, 1), 0.0, 1.0)
    return np.stack([(1 - pan) * tone, pan * tone])
