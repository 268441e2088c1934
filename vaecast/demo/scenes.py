"""The named demo scenes and random training clips: which ingredients, in which order.

A scene is a recipe over the ingredients of `layers` (a background, moving shapes and
text, fades and grain). All randomness comes from one seeded `torch.Generator`, so a
(name, frames, size, seed) always renders the same pixels and the same motions.

`render_scene` gives the named scenes that the server and CLI encode into latents,
`scene_reel` the same frames a range at a time (the live demo's way), and
`scene_motions` how their shapes move, which is what the soundtrack follows;
`random_clip` draws a clip from the whole ingredient space and is what
`tools/fit_tiny.py` trains on and what the quality benchmark holds out.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from vaecast.demo.layers import Ingredients, Layer, Reel, render
from vaecast.demo.motion import Motion
from vaecast.demo.scene_names import SCENE_NAMES
from vaecast.errors import InvalidRequestError

# Largest clip one render may produce (frames * height * width), ~4x a Wan 2.1
# 81-frame 1280x720 video: a bound on memory, not a quality limit.
MAX_RENDER_PIXELS = 81 * 1280 * 720 * 4


def render_scene(name: str, frames: int, height: int, width: int, seed: int = 0) -> torch.Tensor:
    """Render the named scene as a (1, 3, frames, height, width) float32 clip in [0, 1]."""
    _, layers = _compose(name, frames, height, width, seed)
    return render(layers, frames, height, width)


def scene_reel(name: str, frames: int, height: int, width: int, seed: int = 0) -> Reel:
    """The named scene drawn a range of frames at a time, in order (a live producer's way):
    its `render` calls concatenate to `render_scene`'s clip bit for bit."""
    _, layers = _compose(name, frames, height, width, seed)
    return Reel(layers, frames, height, width)


def scene_motions(name: str, frames: int, height: int, width: int, seed: int = 0) -> list[Motion]:
    """How the scene's shapes move (what its soundtrack follows), without rendering."""
    ingredients, _ = _compose(name, frames, height, width, seed)
    return ingredients.motions


def random_clip(generator: torch.Generator, frames: int, height: int, width: int) -> torch.Tensor:
    """A clip mixing every scene ingredient with random parameters, (1, 3, T, H, W) in [0, 1]."""
    _check_size(frames, height, width)
    d = Ingredients(generator, frames, height, width)
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
    return render(layers, frames, height, width)


def _compose(
    name: str, frames: int, height: int, width: int, seed: int
) -> tuple[Ingredients, list[Layer]]:
    try:
        compose = _SCENES[name]
    except KeyError:
        known = ", ".join(SCENE_NAMES)
        raise InvalidRequestError(f"unknown scene {name!r}; known scenes: {known}") from None
    _check_size(frames, height, width)
    ingredients = Ingredients(torch.Generator().manual_seed(seed), frames, height, width)
    return ingredients, compose(ingredients)


def _check_size(frames: int, height: int, width: int) -> None:
    if frames < 1 or height < 1 or width < 1:
        raise InvalidRequestError(
            f"a scene needs at least 1 frame of 1x1 pixels, got {frames} frames of {width}x{height}"
        )
    if frames * height * width > MAX_RENDER_PIXELS:
        raise InvalidRequestError(
            f"{frames} frames of {width}x{height} is over the {MAX_RENDER_PIXELS} pixel limit"
        )


def _showcase(d: Ingredients) -> list[Layer]:
    return [
        d.landscape(),
        *(d.shape() for _ in range(4)),
        d.text("VAECAST"),
        d.fade("in"),
        d.grain(0.01),
    ]


_SCENES: dict[str, Callable[[Ingredients], list[Layer]]] = {
    "showcase": _showcase,
    "shapes": lambda d: [d.gradient(), *(d.shape() for _ in range(7))],
    "gradient": lambda d: [d.gradient(), d.texture(0.3, blobs=True)],
    "texture": lambda d: [d.texture(), d.texture(0.5, blobs=True)],
    "text": lambda d: [d.gradient(), *(d.text() for _ in range(3)), d.text("VAECAST")],
    "landscape": lambda d: [d.landscape()],
    "fade": lambda d: [d.gradient(), *(d.shape() for _ in range(4)), d.fade("dip")],
    "noise": lambda d: [d.texture(kind="clouds"), d.grain(0.08)],
}
