"""Procedural demo video: named scenes and random training clips, rendered in torch.

Every clip is composed from a few ingredients drawn on a canvas one frame at a time:
a background (an animated gradient, a camera panning over a parallax landscape,
a scrolling texture), shapes that move, bounce off the frame edges and rotate,
text drawn from a built-in 5x7 bitmap font, then fades and film grain. Geometry is
anti-aliased and measured relative to the frame size, so a scene looks the same at
any resolution. All randomness comes from one seeded `torch.Generator`, so a
(name, frames, size, seed) always renders the same pixels.

`render_scene` gives the named demo scenes that the server and CLI encode into
latents; `random_clip` draws a clip from the whole ingredient space and is what
`tools/fit_tiny.py` trains on and what the quality benchmark holds out.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import torch
import torch.nn.functional as F

from vaecast.errors import InvalidRequestError
from vaecast.models import soundtrack

SCENE_NAMES: tuple[str, ...] = (
    "showcase",
    "shapes",
    "gradient",
    "texture",
    "text",
    "landscape",
    "fade",
    "noise",
)

# Largest clip one render may produce (frames * height * width), ~4x a Wan 2.1
# 81-frame 1280x720 video: a bound on memory, not a quality limit.
MAX_RENDER_PIXELS = 81 * 1280 * 720 * 4

# Rows of a 5x7 font, most significant of 5 bits on the left.
_FONT_5X7: dict[str, tuple[int, ...]] = {
    "A": (0x0E, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11),
    "B": (0x1E, 0x11, 0x11, 0x1E, 0x11, 0x11, 0x1E),
    "C": (0x0E, 0x11, 0x10, 0x10, 0x10, 0x11, 0x0E),
    "D": (0x1C, 0x12, 0x11, 0x11, 0x11, 0x12, 0x1C),
    "E": (0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x1F),
    "F": (0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x10),
    "G": (0x0E, 0x11, 0x10, 0x17, 0x11, 0x11, 0x0F),
    "H": (0x11, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11),
    "I": (0x0E, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E),
    "J": (0x07, 0x02, 0x02, 0x02, 0x02, 0x12, 0x0C),
    "K": (0x11, 0x12, 0x14, 0x18, 0x14, 0x12, 0x11),
    "L": (0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x1F),
    "M": (0x11, 0x1B, 0x15, 0x15, 0x11, 0x11, 0x11),
    "N": (0x11, 0x11, 0x19, 0x15, 0x13, 0x11, 0x11),
    "O": (0x0E, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E),
    "P": (0x1E, 0x11, 0x11, 0x1E, 0x10, 0x10, 0x10),
    "Q": (0x0E, 0x11, 0x11, 0x11, 0x15, 0x12, 0x0D),
    "R": (0x1E, 0x11, 0x11, 0x1E, 0x14, 0x12, 0x11),
    "S": (0x0F, 0x10, 0x10, 0x0E, 0x01, 0x01, 0x1E),
    "T": (0x1F, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04),
    "U": (0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E),
    "V": (0x11, 0x11, 0x11, 0x11, 0x11, 0x0A, 0x04),
    "W": (0x11, 0x11, 0x11, 0x15, 0x15, 0x15, 0x0A),
    "X": (0x11, 0x11, 0x0A, 0x04, 0x0A, 0x11, 0x11),
    "Y": (0x11, 0x11, 0x0A, 0x04, 0x04, 0x04, 0x04),
    "Z": (0x1F, 0x01, 0x02, 0x04, 0x08, 0x10, 0x1F),
    "0": (0x0E, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0E),
    "1": (0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E),
    "2": (0x0E, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1F),
    "3": (0x1F, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0E),
    "4": (0x02, 0x06, 0x0A, 0x12, 0x1F, 0x02, 0x02),
    "5": (0x1F, 0x10, 0x1E, 0x01, 0x01, 0x11, 0x0E),
    "6": (0x06, 0x08, 0x10, 0x1E, 0x11, 0x11, 0x0E),
    "7": (0x1F, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08),
    "8": (0x0E, 0x11, 0x11, 0x0E, 0x11, 0x11, 0x0E),
    "9": (0x0E, 0x11, 0x11, 0x0F, 0x01, 0x02, 0x0C),
    " ": (0x00,) * 7,
    ".": (0x00, 0x00, 0x00, 0x00, 0x00, 0x0C, 0x0C),
    ",": (0x00, 0x00, 0x00, 0x00, 0x0C, 0x04, 0x08),
    "!": (0x04, 0x04, 0x04, 0x04, 0x04, 0x00, 0x04),
    "?": (0x0E, 0x11, 0x01, 0x02, 0x04, 0x00, 0x04),
    "-": (0x00, 0x00, 0x00, 0x1F, 0x00, 0x00, 0x00),
    ":": (0x00, 0x0C, 0x0C, 0x00, 0x0C, 0x0C, 0x00),
    "'": (0x04, 0x04, 0x08, 0x00, 0x00, 0x00, 0x00),
    "/": (0x01, 0x01, 0x02, 0x04, 0x08, 0x10, 0x10),
    "+": (0x00, 0x04, 0x04, 0x1F, 0x04, 0x04, 0x00),
    "=": (0x00, 0x00, 0x1F, 0x00, 0x1F, 0x00, 0x00),
}
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

Layer = Callable[[torch.Tensor, int], None]
"""Draws frame `index` onto a (3, H, W) canvas in place."""


def render_scene(name: str, frames: int, height: int, width: int, seed: int = 0) -> torch.Tensor:
    """Render the named scene as a (1, 3, frames, height, width) float32 clip in [0, 1]."""
    _, layers = _compose(name, frames, height, width, seed)
    return _render(layers, frames, height, width)


def scene_soundtrack(
    name: str,
    frames: int,
    height: int,
    width: int,
    fps: Fraction,
    seed: int = 0,
    sample_rate: int = soundtrack.DEFAULT_SAMPLE_RATE_HZ,
) -> np.ndarray:
    """The scene's sound, (2, samples) float32: a click whenever a shape touches an
    edge, a tone following the first shape (see `soundtrack`). Same seed, same motions
    as `render_scene`, so what is heard is what is seen."""
    motions = scene_motions(name, frames, height, width, seed)
    return soundtrack.synthesize(motions, frames, width, fps, sample_rate)


def scene_motions(
    name: str, frames: int, height: int, width: int, seed: int = 0
) -> list[soundtrack.Motion]:
    """How the scene's shapes move (what its soundtrack follows), without rendering."""
    draw, _ = _compose(name, frames, height, width, seed)
    return draw.motions


def _compose(
    name: str, frames: int, height: int, width: int, seed: int
) -> tuple[_Draw, list[Layer]]:
    try:
        compose = _SCENES[name]
    except KeyError:
        known = ", ".join(SCENE_NAMES)
        raise InvalidRequestError(f"unknown scene {name!r}; known scenes: {known}") from None
    _check_size(frames, height, width)
    draw = _Draw(torch.Generator().manual_seed(seed), frames, height, width)
    return draw, compose(draw)


def random_clip(generator: torch.Generator, frames: int, height: int, width: int) -> torch.Tensor:
    """A clip mixing every scene ingredient with random parameters, (1, 3, T, H, W) in [0, 1]."""
    _check_size(frames, height, width)
    d = _Draw(generator, frames, height, width)
    layers: list[Layer] = [d.choice((d.gradient, d.landscape, d.texture, d.solid), (3, 3, 3, 1))()]
    if d.uniform(0, 1) < 0.35:
        layers.append(d.texture(opacity=d.uniform(0.3, 0.8), blobs=True))
    layers += [d.shape() for _ in range(d.integer(0, 6))]
    if d.uniform(0, 1) < 0.4:
        layers.append(d.text())
    if d.uniform(0, 1) < 0.3:
        layers.append(d.fade())
    if d.uniform(0, 1) < 0.3:
        layers.append(d.grain(d.uniform(0.003, 0.02)))
    return _render(layers, frames, height, width)


def _check_size(frames: int, height: int, width: int) -> None:
    if frames < 1 or height < 1 or width < 1:
        raise InvalidRequestError(
            f"a scene needs at least 1 frame of 1x1 pixels, got {frames} frames of {width}x{height}"
        )
    if frames * height * width > MAX_RENDER_PIXELS:
        raise InvalidRequestError(
            f"{frames} frames of {width}x{height} is over the {MAX_RENDER_PIXELS} pixel limit"
        )


def _render(layers: list[Layer], frames: int, height: int, width: int) -> torch.Tensor:
    video = torch.empty(1, 3, frames, height, width)
    canvas = torch.zeros(3, height, width)
    for index in range(frames):
        canvas.zero_()
        for layer in layers:
            layer(canvas, index)
        video[0, :, index] = canvas.clamp_(0.0, 1.0)
    return video


def _bounce(position: float, low: float, high: float) -> float:
    """Reflect a position that moves in a straight line back into [low, high]."""
    span = high - low
    if span <= 0:
        return low
    phase = (position - low) % (2 * span)
    return low + (phase if phase <= span else 2 * span - phase)


def _hsv(h: float, s: float, v: float) -> torch.Tensor:
    k = torch.tensor([5.0, 3.0, 1.0])
    k = (k + h * 6.0) % 6.0
    return v - v * s * torch.clamp(torch.minimum(k, 4.0 - k), 0.0, 1.0)


def _text_mask(text: str) -> torch.Tensor:
    """A (7, 6 * len(text) - 1) 0/1 mask of `text` in the built-in font."""
    columns = []
    for char in text.upper():
        rows = _FONT_5X7.get(char, _FONT_5X7["?"])
        glyph = torch.tensor([[(row >> (4 - bit)) & 1 for bit in range(5)] for row in rows])
        columns += [glyph.float(), torch.zeros(7, 1)]
    return torch.cat(columns[:-1], dim=1)


@dataclass
class _Draw:
    """Draws random ingredients for one clip; every layer is a closure over its parameters."""

    g: torch.Generator
    frames: int
    height: int
    width: int

    def __post_init__(self) -> None:
        self.motions: list[soundtrack.Motion] = []  # of the shapes, for the soundtrack
        self.size = float(min(self.height, self.width))
        self.ys = torch.arange(self.height, dtype=torch.float32).view(-1, 1) + 0.5
        self.xs = torch.arange(self.width, dtype=torch.float32).view(1, -1) + 0.5

    # Random numbers, all from the one generator.
    def uniform(self, low: float, high: float) -> float:
        return low + (high - low) * float(torch.rand((), generator=self.g))

    def integer(self, low: int, high: int) -> int:
        """Uniform in [low, high] inclusive."""
        return int(torch.randint(low, high + 1, (), generator=self.g))

    def choice(self, options, weights=None):
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

        def draw(canvas: torch.Tensor, index: int) -> None:
            x = self.xs - _bounce(cx + vx * index, 0, self.width)
            y = self.ys - _bounce(cy + vy * index, 0, self.height)
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
        self.motions.append(
            soundtrack.Motion(
                x0, vx, radius, self.width - radius, y0, vy, radius, self.height - radius
            )
        )

        def draw(canvas: torch.Tensor, index: int) -> None:
            cx = _bounce(x0 + vx * index, radius, self.width - radius)
            cy = _bounce(y0 + vy * index, radius, self.height - radius)
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
        mask = _text_mask(words)
        scale = max(1, round(self.uniform(0.015, 0.05) * self.size))
        glyphs = mask.repeat_interleave(scale, 0).repeat_interleave(scale, 1)
        box_h, box_w = glyphs.shape
        colour = self.colour((0.0, 1.0)).view(3, 1, 1)
        shadow = self.uniform(0, 1) < 0.5
        x0, y0 = self.uniform(0, self.width), self.uniform(0, self.height)
        vx, vy = self.velocity(0.02), self.velocity(0.01)

        def draw(canvas: torch.Tensor, index: int) -> None:
            left = round(_bounce(x0 + vx * index, 0, self.width - box_w))
            top = round(_bounce(y0 + vy * index, 0, self.height - box_h))
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


def _showcase(d: _Draw) -> list[Layer]:
    return [
        d.landscape(),
        *(d.shape() for _ in range(4)),
        d.text("VAECAST"),
        d.fade("in"),
        d.grain(0.01),
    ]


_SCENES: dict[str, Callable[[_Draw], list[Layer]]] = {
    "showcase": _showcase,
    "shapes": lambda d: [d.gradient(), *(d.shape() for _ in range(7))],
    "gradient": lambda d: [d.gradient(), d.texture(0.3, blobs=True)],
    "texture": lambda d: [d.texture(), d.texture(0.5, blobs=True)],
    "text": lambda d: [d.gradient(), *(d.text() for _ in range(3)), d.text("VAECAST")],
    "landscape": lambda d: [d.landscape()],
    "fade": lambda d: [d.gradient(), *(d.shape() for _ in range(4)), d.fade("dip")],
    "noise": lambda d: [d.texture(kind="clouds"), d.grain(0.08)],
}
