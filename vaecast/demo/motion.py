"""The demo's one law of motion: straight lines reflected off the frame's walls.

Everything that moves in a scene (shapes, text, a gradient's centre) moves at a
constant velocity in pixels per frame and bounces off the walls of its box. The
picture asks where a thing is at whole frames; the soundtrack asks where it is at
every audio sample and exactly when it hits a wall, between frames. Both ask this
module, so a click cannot drift from the bounce it belongs to.

Positions are computed in float64 with the same operations at any frame time, so a
position at a whole frame is bit-identical whether the picture or the sound asks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


def reflect(position: np.ndarray, low: float, high: float) -> np.ndarray:
    """Fold positions on an unbounded line back into [low, high], as a bounce does."""
    span = high - low
    if span <= 0:
        return np.full_like(position, low)
    phase = np.mod(position - low, 2 * span)
    return low + np.where(phase <= span, phase, 2 * span - phase)


@dataclass(frozen=True, slots=True)
class Bounce:
    """One coordinate: starts at `start`, moves `velocity` per frame, reflected into
    [low, high]."""

    start: float
    velocity: float
    low: float
    high: float

    def along(self, frames: np.ndarray) -> np.ndarray:
        """Positions at (fractional) frame times."""
        return reflect(self.start + self.velocity * frames, self.low, self.high)

    def at(self, frame: float) -> float:
        """The position at one frame time."""
        return float(self.along(np.asarray(frame, dtype=np.float64)))

    def hits(self, frames: int) -> list[float]:
        """Frame times in (0, frames - 1] at which the coordinate reaches `low` or `high`."""
        span = self.high - self.low
        if span <= 0 or self.velocity == 0:
            return []
        # The reflected point is at a wall whenever start + v t - low is a multiple of span.
        end = self.start + self.velocity * (frames - 1)
        lowest, highest = sorted((self.start - self.low, end - self.low))
        first, last = math.ceil(lowest / span), math.floor(highest / span)
        times = [(self.low + m * span - self.start) / self.velocity for m in range(first, last + 1)]
        return [t for t in times if 0 < t <= frames - 1]


@dataclass(frozen=True, slots=True)
class Motion:
    """A point moving at constant velocity (pixels per frame), reflected into
    [x_low, x_high] x [y_low, y_high]."""

    x0: float
    vx: float
    x_low: float
    x_high: float
    y0: float
    vy: float
    y_low: float
    y_high: float

    @property
    def x(self) -> Bounce:
        return Bounce(self.x0, self.vx, self.x_low, self.x_high)

    @property
    def y(self) -> Bounce:
        return Bounce(self.y0, self.vy, self.y_low, self.y_high)

    def at(self, frame: float) -> tuple[float, float]:
        """(x, y) at one frame time: what the picture draws."""
        return self.x.at(frame), self.y.at(frame)

    def position(self, frame: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(x, y) at (fractional) frame times: what the soundtrack follows."""
        return self.x.along(frame), self.y.along(frame)

    def wall_hits(self, frames: int) -> list[float]:
        """Frame times in (0, frames - 1] at which the point touches a wall, sorted."""
        return sorted(self.x.hits(frames) + self.y.hits(frames))
