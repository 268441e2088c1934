"""The generators that push as they go, of tiny random components: the examples' own
(`examples/tiny_random.py`, loaded from its path), so that what the tests prove is what
the examples run. SkyReels-V2's diffusion-forcing pipeline is the transformer of
diffusers' own SkyReels-V2 tests over the `wan2.1` tiny case's VAE (one served folder
decodes both); HunyuanVideo FramePack is diffusers' own FramePack test components, with
a random SigLIP image encoder in place of the one they download."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _example_module(name: str) -> ModuleType:
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


tiny_random = _example_module("tiny_random")
skyreels_df = tiny_random.skyreels_df
framepack = tiny_random.framepack


def skyreels_call(**changes: Any) -> dict[str, Any]:
    """17 frames (5 latent frames, one window) in causal blocks of 1, each 2 rows behind
    the one before: the first block is final at row 2, the last at row 10."""
    one_window = {"num_frames": 17, "base_num_frames": 97, "overlap_history": None}
    return tiny_random.skyreels_call(**{**one_window, **changes})


# Two windows of 5 latent frames overlapping by 3: 7 latent frames, 25 frames (the
# example's own call).
SKYREELS_LONG = {"num_frames": 25, "base_num_frames": 17, "overlap_history": 9}
# Three windows of 6 in blocks of 2, overlapping by 3 (cut to 2, a whole block): 10
# latent frames; the last window is 4 frames, its first block the prefix.
SKYREELS_LONG_BLOCKS = {
    "num_frames": 37,
    "base_num_frames": 21,
    "overlap_history": 9,
    "causal_block_size": 2,
    "ar_step": 1,
}


def framepack_call(**changes: Any) -> dict[str, Any]:
    """3 sections of 3 latent frames: 37 frames, pushed 4, 12 and 21 at a time (the
    last 9 of each section wait for the next one's cross-fade)."""
    return tiny_random.framepack_call(**changes)
