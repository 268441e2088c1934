"""Demo requests checked before anything is rendered; scene latents in tiny's space."""

from __future__ import annotations

from fractions import Fraction

import pytest

from vaecast.demo.sources import (
    DEMO_DEFAULTS,
    MAX_SEED,
    SceneSpec,
    parse_scene_spec,
    scene_audio,
    scene_latents,
)
from vaecast.errors import InvalidRequestError


def test_missing_fields_take_the_defaults():
    assert parse_scene_spec({}) == SceneSpec(**DEMO_DEFAULTS)
    assert parse_scene_spec({"scene": "text", "frames": 5, "colour": "red"}).frames == 5


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"seed": True}, "seed must be an integer, got True"),
        ({"width": 64.0}, "width must be an integer, got 64.0"),
        ({"seed": MAX_SEED + 1}, f"seed must be an integer from 0 to {MAX_SEED}"),
        ({"seed": -1}, f"seed must be an integer from 0 to {MAX_SEED}"),
        ({"frames": 0}, "frames must be 1 + 4k (1, 5, 9, ..., 81), got 0"),
        ({"height": 0}, "width and height must be positive multiples of 8, got 832x0"),
    ],
)
def test_bad_fields_are_refused_with_what_is_wrong(body: dict, message: str):
    with pytest.raises(InvalidRequestError) as caught:
        parse_scene_spec(body)
    assert caught.value.message == message


def test_scene_latents_and_audio_have_the_scene_geometry():
    spec = parse_scene_spec({"scene": "shapes", "frames": 5, "width": 64, "height": 48})
    latents = scene_latents(spec)
    assert latents.shape == (1, 16, 2, 6, 8)
    audio = scene_audio(spec, Fraction(16), sample_rate=16_000)
    assert audio.shape == (2, 5_000)
