"""What a demo clip is drawn from: backgrounds, moving overlays and whole-frame effects.

Each ingredient is a `Layer`, a closure over random parameters that draws one frame
onto a (3, H, W) canvas in place; a clip is a list of layers drawn in order on every
frame. Backgrounds fill the canvas (a solid colour, an animated gradient, a camera
panning over a parallax landscape, a scrolling texture); overlays touch only their
bounding box (shapes that move, bounce and rotate, text in the built-in font);
effects act on what is under them (fades, film grain). Geometry is anti-aliased and
measured relative to the frame size, so a clip looks the same at any resolution.
Everything that moves follows `motion`, the law the soundtrack also hears.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.nn.functional as F

from vaecast.demo.font import text_mask
from vaecast.demo.motion import Motion

_WORDS = (
    "VAECAST",
    "HELLO",
    "STREAM",
    "LATENT",
    "DECODE",
    "VIDEO",
    "FRAME",
    "CHUNK",
    "TINY VAE",
    "WAN 2.1",
    "24 FPS",
    "MP4",
    "CAUSAL",
    "PIXELS",
    "READY?",
    "GO!",
)

T = TypeVar("T")

Layer = Callable[[torch.Tensor, int], None]
"""Draws frame `index` onto a (3, H, W) canvas in place."""


def render(layers: list[Layer], frames: int, height: int, width: int) -> torch.Tensor:
    """Draw `layers` on every frame: a (1, 3, frames, height, width) clip in [0, 1]."""
    return Reel(layers, frames, height, width).render(frames)


class Reel:
    """A clip's frames drawn in order, a range at a time.

    Consecutive `render` calls concatenate to the whole clip bit for bit: `render` above
    is one call for every frame. The order is the contract, not a convenience: film
    grain draws from the clip's generator frame after frame, so frame k's noise is
    only known once the noise of the frames before it has been drawn.
    """

    def __init__(self, layers: list[Layer], frames: int, height: int, width: int) -> None:
        self.layers, self.frames, self.height, self.width = layers, frames, height, width
        self.next_frame = 0  # also the number of frames drawn so far

    def render(self, count: int) -> torch.Tensor:
        """The next `count` frames, (1, 3, count, height, width) in [0, 1]."""
        if not 0 <= count <= self.frames - self.next_frame:
            raise ValueError(
                f"cannot draw {count} frames from frame {self.next_frame} of {self.frames}"
            )
        video = torch.empty(1, 3, count, self.height, self.width)
        canvas = torch.zeros(3, self.height, self.width)
        for offset in range(count):
            canvas.zero_()
            for layer in self.layers:
                layer(canvas, self.next_frame + offset)
            video[0, :, offset] = canvas.clamp_(0.0, 1.0)
        self.next_frame += count
        return video


def _hsv(h: float, s: float, v: float) -> torch.Tensor:
    k = torch.tensor([5.0, 3.0, 1.0])
    k = (k + h * 6.0) % 6.0
    return v - v * s * torch.clamp(torch.minimum(k, 4.0 - k), 0.0, 1.0)


@dataclass
class Ingredients:
    """Draws random ingredients for one clip; every layer is a closure over its parameters."""

    g: torch.Generator
    frames: int
    height: int
    width: int

    def __post_init__(self) -> None:
        self.motions: list[Motion] = []  # of the shapes, for the soundtrack
        self.size = float(min(self.height, self.width))
        self.ys = torch.arange(self.height, dtype=torch.float32).view(-1, 1) + 0.5
        self.xs = torch.arange(self.width, dtype=torch.float32).view(1, -1) + 0.5

    # Random numbers, all from the one generator.
    def uniform(self, low: float, high: float) -> float:
        return low + (high - low) * float(torch.rand((), generator=self.g))

    def integer(self, low: int, high: int) -> int:
        """Uniform in [low, high] inclusive."""
        return int(torch.randint(low, high + 1, (), generator=self.g))

    def choice(self, options: Sequence[T], weights: Sequence[float] | None = None) -> T:
        w = (
            torch.ones(len(options))
            if weights is None
            else torch.tensor(weights, dtype=torch.float)
        )
        return options[int(torch.multinomial(w, 1, generator=self.g))]

    def colour(self, saturation: tuple[float, float] = (0.4, 1.0)) -> torch.Tensor:
        return _hsv(self.uniform(0, 1), self.uniform(*saturation), self.uniform(0.25, 1.0))

    def velocity(self, fastest: float) -> float:
        """Pixels per frame, up to `fastest` of the frame's smaller side."""
        return self.uniform(-fastest, fastest) * self.size

    # Backgrounds: each fills the whole canvas.
    def solid(self) -> Layer:
        colour = self.colour((0.0, 0.8)).view(3, 1, 1)

        def draw(canvas: torch.Tensor, index: int) -> None:
            canvas.copy_(colour.expand_as(canvas))

        return draw

    def gradient(self) -> Layer:
        c0, c1 = self.colour().view(3, 1, 1), self.colour().view(3, 1, 1)
        radial = self.uniform(0, 1) < 0.3
        angle0, spin = self.uniform(0, 2 * math.pi), self.uniform(-0.03, 0.03)
        cx, cy = self.uniform(0, self.width), self.uniform(0, self.height)
        vx, vy = self.velocity(0.01), self.velocity(0.01)
        length = self.uniform(0.5, 1.5) * math.hypot(self.height, self.width)
        shift = self.uniform(-0.01, 0.01)
        centre = Motion(cx, vx, 0, self.width, cy, vy, 0, self.height)

        def draw(canvas: torch.Tensor, index: int) -> None:
            ox, oy = centre.at(index)
            x, y = self.xs - ox, self.ys - oy
            if radial:
                s = torch.sqrt(x * x + y * y) / (0.5 * length)
            else:
                a = angle0 + spin * index
                s = 0.5 + (x * math.cos(a) + y * math.sin(a)) / length
            s = (s + shift * index).clamp_(0.0, 1.0)
            torch.lerp(c0, c1, s.unsqueeze(0), out=canvas)

        return draw

    def landscape(self) -> Layer:
        """A camera panning over sky, a sun and parallax mountain ranges."""
        sky_top, sky_low = (
            _hsv(self.uniform(0.5, 0.7), 0.6, 0.9),
            _hsv(self.uniform(0, 0.15), 0.4, 1.0),
        )
        sun = _hsv(self.uniform(0.1, 0.17), 0.6, 1.0).view(3, 1, 1)
        sun_x, sun_y = self.uniform(0, self.width), self.uniform(0.1, 0.4) * self.height
        sun_r = self.uniform(0.05, 0.12) * self.size
        pan = self.uniform(0.003, 0.02) * self.size * self.choice((-1.0, 1.0))
        hue = self.uniform(0, 1)
        ranges = []
        count = self.integer(2, 4)
        for k in range(count):
            depth = (k + 1) / count
            waves = [
                (
                    self.uniform(0.02, 0.12) * self.height / (1 + i),
                    self.uniform(1, 4) * (1 + i) * 2 * math.pi / self.width,
                    self.uniform(0, 2 * math.pi),
                )
                for i in range(3)
            ]
            base = (0.35 + 0.45 * depth + self.uniform(-0.05, 0.05)) * self.height
            shade = _hsv(
                (hue + self.uniform(-0.08, 0.08)) % 1, self.uniform(0.3, 0.7), 0.85 - 0.55 * depth
            )
            ranges.append((base, waves, shade.view(3, 1, 1), depth))
        sky = torch.lerp(
            sky_top.view(3, 1, 1), sky_low.view(3, 1, 1), (self.ys / self.height).unsqueeze(0)
        )

        def draw(canvas: torch.Tensor, index: int) -> None:
            canvas.copy_(sky.expand_as(canvas))
            r = torch.sqrt((self.xs - sun_x + 0.2 * pan * index) ** 2 + (self.ys - sun_y) ** 2)
            canvas.lerp_(sun, (sun_r - r + 0.5).clamp_(0, 1).unsqueeze(0))
            for base, waves, shade, depth in ranges:
                x = self.xs + pan * index * (0.3 + depth)
                top = sum(a * torch.sin(f * x + p) for a, f, p in waves) + base
                canvas.lerp_(shade, (self.ys - top + 0.5).clamp_(0, 1).unsqueeze(0))

        return draw

    def texture(self, opacity: float = 1.0, blobs: bool = False, kind: str | None = None) -> Layer:
        """Scrolling stripes, a rotating checkerboard or drifting clouds (`blobs`: cut out)."""
        kind = "clouds" if blobs else kind or self.choice(("stripes", "checker", "clouds"))
        c0, c1 = self.colour().view(3, 1, 1), self.colour().view(3, 1, 1)
        vx, vy = self.velocity(0.02), self.velocity(0.02)
        period = self.uniform(0.05, 0.3) * self.size
        angle, spin = self.uniform(0, math.pi), self.uniform(-0.02, 0.02) * (kind == "checker")
        sharp = self.uniform(1.0, 6.0)
        if kind == "clouds":
            cell = max(2, int(period / 2))
            pad_y, pad_x = abs(vy) * self.frames + 2, abs(vx) * self.frames + 2
            grid = torch.rand(
                int((self.height + pad_y) / cell) + 3,
                int((self.width + pad_x) / cell) + 3,
                generator=self.g,
            )
            field = F.interpolate(
                grid[None, None], scale_factor=cell, mode="bicubic", align_corners=False
            )[0, 0]
            field = ((field - 0.5) * self.uniform(1.0, 2.0) + 0.5).clamp_(0, 1)
            if blobs:
                field = ((field - 0.55) * 8).clamp_(0, 1)

        def draw(canvas: torch.Tensor, index: int) -> None:
            if kind == "clouds":
                ox, oy = (
                    (vx * index) % (abs(vx) * self.frames + 1),
                    (vy * index) % (abs(vy) * self.frames + 1),
                )
                ix, iy, fx, fy = int(ox), int(oy), ox - int(ox), oy - int(oy)
                win = field[iy : iy + self.height + 1, ix : ix + self.width + 1]
                top = torch.lerp(win[:-1, :-1], win[:-1, 1:], fx)
                low = torch.lerp(win[1:, :-1], win[1:, 1:], fx)
                s = torch.lerp(top, low, fy)
            else:
                a = angle + spin * index
                x, y = self.xs - vx * index, self.ys - vy * index
                u = (x * math.cos(a) + y * math.sin(a)) * (2 * math.pi / period)
                s = torch.tanh(sharp * torch.sin(u))
                if kind == "checker":
                    v = (-x * math.sin(a) + y * math.cos(a)) * (2 * math.pi / period)
                    s = s * torch.tanh(sharp * torch.sin(v))
                s = 0.5 + 0.5 * s
            layer = torch.lerp(c0, c1, s.unsqueeze(0))
            if blobs:
                canvas.lerp_(layer, s.unsqueeze(0) * opacity)
            else:
                canvas.lerp_(layer, opacity) if opacity < 1 else canvas.copy_(layer)

        return draw

    # Overlays: each touches only its bounding box.
    def shape(self) -> Layer:
        kind = self.choice(("circle", "rect", "polygon"))
        colour = self.colour().view(3, 1, 1)
        radius = self.uniform(0.04, 0.2) * self.size
        aspect = self.uniform(0.4, 1.0) if kind == "rect" else 1.0
        sides = self.integer(3, 6)
        x0, y0 = self.uniform(0, self.width), self.uniform(0, self.height)
        vx, vy = self.velocity(0.025), self.velocity(0.025)
        angle, spin = self.uniform(0, 2 * math.pi), self.uniform(-0.1, 0.1)
        opacity = 1.0 if self.uniform(0, 1) < 0.7 else self.uniform(0.4, 0.9)
        reach = radius * math.sqrt(2) + 2
        # The centre turns a radius from each wall, where the shape's outline meets it.
        motion = Motion(x0, vx, radius, self.width - radius, y0, vy, radius, self.height - radius)
        self.motions.append(motion)

        def draw(canvas: torch.Tensor, index: int) -> None:
            cx, cy = motion.at(index)
            top, left = max(0, int(cy - reach)), max(0, int(cx - reach))
            bottom, right = (
                min(self.height, int(cy + reach) + 1),
                min(self.width, int(cx + reach) + 1),
            )
            if top >= bottom or left >= right:
                return
            x, y = self.xs[:, left:right] - cx, self.ys[top:bottom] - cy
            a = angle + spin * index
            u, v = x * math.cos(a) + y * math.sin(a), -x * math.sin(a) + y * math.cos(a)
            if kind == "circle":
                distance = torch.sqrt(u * u + v * v) - radius
            elif kind == "rect":
                distance = torch.maximum(u.abs() - radius * 0.75, v.abs() - radius * 0.75 * aspect)
            else:
                distance = torch.stack(
                    [
                        (
                            u * math.cos(2 * math.pi * k / sides)
                            + v * math.sin(2 * math.pi * k / sides)
                        ).expand(bottom - top, -1)
                        for k in range(sides)
                    ]
                ).amax(0) - radius * math.cos(math.pi / sides)
            cover = (0.5 - distance).clamp_(0, 1) * opacity
            canvas[:, top:bottom, left:right].lerp_(colour, cover.unsqueeze(0))

        return draw

    def text(self, words: str | None = None) -> Layer:
        words = words or self.choice(_WORDS)
        mask = text_mask(words)
        scale = max(1, round(self.uniform(0.015, 0.05) * self.size))
        glyphs = mask.repeat_interleave(scale, 0).repeat_interleave(scale, 1)
        box_h, box_w = glyphs.shape
        colour = self.colour((0.0, 1.0)).view(3, 1, 1)
        shadow = self.uniform(0, 1) < 0.5
        x0, y0 = self.uniform(0, self.width), self.uniform(0, self.height)
        vx, vy = self.velocity(0.02), self.velocity(0.01)
        corner = Motion(x0, vx, 0, self.width - box_w, y0, vy, 0, self.height - box_h)

        def draw(canvas: torch.Tensor, index: int) -> None:
            left, top = (round(position) for position in corner.at(index))
            offsets = ((scale, scale, 0.6, torch.zeros(3, 1, 1)),) if shadow else ()
            for dy, dx, alpha, ink in (*offsets, (0, 0, 1.0, colour)):
                t, lft = top + dy, left + dx
                b, r = min(self.height, t + box_h), min(self.width, lft + box_w)
                t0, l0 = max(0, t), max(0, lft)
                if t0 >= b or l0 >= r:
                    continue
                cover = glyphs[t0 - t : b - t, l0 - lft : r - lft] * alpha
                canvas[:, t0:b, l0:r].lerp_(ink, cover.unsqueeze(0))

        return draw

    # Whole-frame effects, applied after the layers before them.
    def fade(self, kind: str | None = None) -> Layer:
        """Fade "in" from, "out" to, or "dip" through black or white."""
        to = torch.zeros(3, 1, 1) if self.uniform(0, 1) < 0.6 else torch.ones(3, 1, 1)
        kind = kind or self.choice(("in", "out", "dip"))
        length = max(1, round(self.uniform(0.2, 0.6) * self.frames))
        middle = self.integer(0, max(0, self.frames - 1))

        def draw(canvas: torch.Tensor, index: int) -> None:
            if kind == "in":
                shown = min(1.0, index / length)
            elif kind == "out":
                shown = min(1.0, (self.frames - 1 - index) / length)
            else:
                shown = min(1.0, abs(index - middle) / (0.5 * length))
            canvas.lerp_(to.expand_as(canvas), 1.0 - shown)

        return draw

    def grain(self, sigma: float) -> Layer:
        def draw(canvas: torch.Tensor, index: int) -> None:
            canvas.add_(torch.randn(canvas.shape, generator=self.g), alpha=sigma)

        return draw
