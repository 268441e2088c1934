"""The one law of motion, and the picture and the sound both following it."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import torch

from vaecast.demo.layers import Ingredients, render
from vaecast.demo.motion import Bounce, Motion
from vaecast.demo.soundtrack import synthesize


def test_wall_hits_are_the_moments_the_point_touches_an_edge():
    motion = Motion(x0=10, vx=7, x_low=5, x_high=60, y0=30, vy=-3, y_low=5, y_high=40)
    hits = motion.wall_hits(frames=40)
    assert hits == sorted(hits) and hits
    for hit in hits:
        x, y = motion.position(np.array([hit]))
        at_x_edge = min(abs(x[0] - 5), abs(x[0] - 60)) < 1e-6
        at_y_edge = min(abs(y[0] - 5), abs(y[0] - 40)) < 1e-6
        assert at_x_edge or at_y_edge, hit
    # Between hits the point moves in a straight line: no edge is touched.
    dense = np.linspace(0, 39, 20_000)
    x, _ = motion.position(dense)
    turning = dense[1:-1][np.diff(np.sign(np.diff(x))) != 0]
    for turn in turning:
        assert min(abs(turn - hit) for hit in hits) < 39 / 20_000 * 2


def test_a_still_point_never_hits():
    assert Motion(10, 0, 0, 20, 10, 0, 0, 20).wall_hits(100) == []


def test_a_position_at_one_frame_is_the_same_as_along_many():
    motion = Motion(x0=10, vx=7.3, x_low=5, x_high=60, y0=30, vy=-3.1, y_low=5, y_high=40)
    frames = np.arange(50, dtype=np.float64)
    x, y = motion.position(frames)
    assert [motion.at(int(f)) for f in frames] == list(zip(x.tolist(), y.tolist(), strict=True))
    assert Bounce(start=3, velocity=1, low=4, high=4).at(7) == 4.0


FRAMES, HEIGHT, WIDTH, FPS, RATE = 49, 96, 128, Fraction(16), 48_000


def drawn_centre(seed: int) -> tuple[Motion, np.ndarray, np.ndarray]:
    """One random shape alone on black: its motion and where the picture puts it."""
    ingredients = Ingredients(torch.Generator().manual_seed(seed), FRAMES, HEIGHT, WIDTH)
    video = render([ingredients.shape()], FRAMES, HEIGHT, WIDTH)[0].sum(0).numpy()
    mass = video.sum((1, 2))
    x = (video.sum(1) * (np.arange(WIDTH) + 0.5)).sum(1) / mass
    y = (video.sum(2) * (np.arange(HEIGHT) + 0.5)).sum(1) / mass
    return ingredients.motions[0], x, y


def turns(positions: np.ndarray) -> list[int]:
    """Frames at which a drawn coordinate reverses: where the picture bounces."""
    steps = np.sign(np.diff(positions))
    return [i + 1 for i in range(len(steps) - 1) if steps[i] * steps[i + 1] < 0]


def click_onsets(wave: np.ndarray) -> list[float]:
    """Frame times at which a click starts (the tone alone stays quieter)."""
    loud = np.abs(wave).sum(0) > 0.3
    rising = np.flatnonzero(loud[1:] & ~loud[:-1]) + 1
    onsets = [i for n, i in enumerate(rising) if n == 0 or i - rising[n - 1] > RATE // 100]
    return [onset / RATE * float(FPS) for onset in onsets]


def test_the_picture_bounces_and_the_click_sounds_at_the_same_wall_hit():
    checked = 0
    for seed in range(8):
        motion, drawn_x, drawn_y = drawn_centre(seed)
        for axis, drawn in ((motion.x, drawn_x), (motion.y, drawn_y)):
            hits = [t for t in axis.hits(FRAMES) if 1 <= t <= FRAMES - 2]
            seen = turns(drawn)
            assert len(seen) == len(hits), (seed, hits, seen)
            for hit, turn in zip(hits, seen, strict=True):
                assert abs(hit - turn) <= 1, (seed, hit, turn)
                # At the frame nearest the hit the shape is against the wall it bounces off.
                wall = min((axis.low, axis.high), key=lambda w: abs(w - drawn[round(hit)]))
                assert abs(drawn[round(hit)] - wall) <= abs(axis.velocity) / 2 + 0.5
                checked += 1
        heard = click_onsets(synthesize([motion], FRAMES, WIDTH, FPS, RATE))
        hits = motion.wall_hits(FRAMES)
        assert len(heard) == len(hits), seed
        for hit, onset in zip(hits, heard, strict=True):
            assert abs(hit - onset) < 1, (seed, hit, onset)
    assert checked >= 5  # the seeds do bounce
