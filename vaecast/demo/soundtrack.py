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
    span: tuple[int, int] | None = None,
) -> np.ndarray:
    """The named scene's sound, (2, samples) float32. Same seed, same motions as
    `scenes.render_scene`, so what is heard is what is seen. `span`: see `synthesize`."""
    motions = scene_motions(name, frames, height, width, seed)
    return synthesize(motions, frames, width, fps, sample_rate, span)


def synthesize(
    motions: list[Motion],
    frames: int,
    width: int,
    fps: Fraction,
    sample_rate: int = DEFAULT_SAMPLE_RATE_HZ,
    span: tuple[int, int] | None = None,
) -> np.ndarray:
    """The soundtrack of `frames` frames at `fps`: clicks on wall hits, a tone on motion 0.

    `span` (first frame, frame count) gives only the samples of those video frames,
    from `sample_at(first)` to `sample_at(first + count)`: the same values as that
    slice of the whole track, bit for bit, so consecutive spans concatenate to it.
    """
    first, count = (0, frames) if span is None else span
    if first < 0 or count < 0 or first + count > frames:
        raise ValueError(f"frames {first}..{first + count} are not within the {frames} frames")
    low, high = sample_at(first, fps, sample_rate), sample_at(first + count, fps, sample_rate)
    samples = sample_at(frames, fps, sample_rate)
    left_right = np.zeros((2, high - low), np.float64)
    click_length = round(CLICK_SECONDS * sample_rate)
    click_time = np.arange(click_length) / sample_rate
    envelope = np.exp(-click_time / (CLICK_SECONDS / 5))
    for number, motion in enumerate(motions):
        pitch_hz = 900.0 * 2 ** (number / 4)  # each shape its own click
        click = CLICK_AMPLITUDE * envelope * np.sin(2 * math.pi * pitch_hz * click_time)
        for hit in motion.wall_hits(frames):
            start = round(hit / float(fps) * sample_rate)
            # The part of this click inside the span (and inside the whole track).
            begin, end = max(start, low), min(samples, start + click_length, high)
            if begin >= end:
                continue
            x, _ = motion.position(np.array([hit]))
            pan = float(np.clip(x[0] / max(width, 1), 0.0, 1.0))
            part = click[begin - start : end - start]
            left_right[0, begin - low : end - low] += (1 - pan) * part
            left_right[1, begin - low : end - low] += pan * part
    if motions:
        left_right += _tone(motions[0], low, high, width, fps, sample_rate)
    return np.clip(left_right, -1.0, 1.0).astype(np.float32)


def sample_at(frame: int, fps: Fraction, sample_rate: int) -> int:
    """The first audio sample of video frame `frame` (one rounding rule for whole and spans)."""
    return round(Fraction(frame) / fps * sample_rate)


def _tone(
    motion: Motion, low: int, high: int, width: int, fps: Fraction, sample_rate: int
) -> np.ndarray:
    """Samples low..high of the tone. Its phase is the running sum of every earlier
    sample's frequency, so the sum starts at sample 0 whatever `low` is: np.cumsum adds
    in order, which makes a span's phase that of the whole track, bit for bit."""
    frame_time = np.arange(high) / sample_rate * float(fps)
    x, y = motion.position(frame_time)
    height = motion.y_high + motion.y_low  # the y range is symmetric inside the frame
    up = 1.0 - np.clip(y / max(height, 1e-9), 0.0, 1.0)
    frequency = TONE_LOW_HZ * 2.0 ** (2.0 * up)
    phase = 2 * math.pi * np.cumsum(frequency)[low:] / sample_rate  # continuous through glides
    tone = TONE_AMPLITUDE * np.sin(phase)
    pan = np.clip(x[low:] / max(width, 1), 0.0, 1.0)
    return np.stack([(1 - pan) * tone, pan * tone])
