"""The names of the demo scenes, apart from their recipes (`vaecast.demo.scenes`), so
that what only lists them (the CLI's `--help`) does not import torch."""

from __future__ import annotations

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
