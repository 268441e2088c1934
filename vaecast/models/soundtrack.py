"""Procedural sound for the demo scenes, synchronised with what moves on screen.

A scene's moving shapes are straight-line motions reflected at the frame's edges
(`scenes._bounce`). Here the same motions are heard: every wall hit is a click at
the exact (sub-frame) moment of the hit, panned to where it happens, and the first
shape also hums a tone whose pitch follows its height and whose stereo position
follows its x. So sync can be checked by eye and ear: the click lands on the
frame where the shape touches the edge.

Pure numpy, deterministic; the waveform is (2, samples) float32 in [-1, 1].
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

DEFAULT_SAMPLE_RATE_HZ = 48_000
CLICK_SECONDS = 0.035
CLICK_AMPLITUDE = 0.5
TONE_AMPLITUDE = 0.1
TONE_LOW_HZ = 220.0  # at the bottom of the frame; two octaves higher at the top


@dataclass(frozen=True, slots=True)
class Motion:
    """A point moving at constant velocity (pixels per frame), reflected into
    [x_low, x_high] x [y_low, y_high], exactly as the scene draws it."""

    x0: float
    vx: float
    x_low: float
    x_high: float
    y0: float
    vy: float
    y_low: float
    y_high: float

    def position(self, frame: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(x, y) at (fractional) frame times."""
        return (
            _reflect(self.x0 + self.vx * frame, self.x_low, self.x_high),
            _reflect(self.y0 + self.vy * frame, self.y_low, self.y_high),
        )

    def wall_hits(self, frames: int) -> list[float]:
        """Frame times in [0, frames - 1] at which the point touches an edge."""
        hits = _axis_hits(self.x0, self.vx, self.x_low, self.x_high, frames)
        hits += _axis_hits(self.y0, self.vy, self.y_low, self.y_high, frames)
        return sorted(hits)


def _reflect(position: np.ndarray, low: float, high: float) -> np.ndarray:
    span = high - low
    if span <= 0:
        return np.full_like(position, low)
    phase = np.mod(position - low, 2 * span)
    return low + np.where(phase <= span, phase, 2 * span - phase)


def _axis_hits(start: float, velocity: float, low: float, high: float, frames: int) -> list[float]:
    span = high - low
    if span <= 0 or velocity == 0:
        return []
    # The reflected point is at an edge whenever start + v t - low is a multiple of span.
    end = start + velocity * (frames - 1)
    lowest, highest = sorted((start - low, end - low))
    first, last = math.ceil(lowest / span), math.floor(highest / span)
    times = [(low + m * span - start) / velocity for m in range(first, last + 1)]
    return [t for t in times if 0 < t <= frames - 1]


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
