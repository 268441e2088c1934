"""The `minimax-h3` decoder: chunks bit-identical to diffusers' `vae.decode` (windowing, blend,
trim and spatial tiling included), MiniMax-H3's chunk sizes, and loading without the hub."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.helpers import one_torch_thread

# The real temporal geometry (17-frame clips, 4x in time, 3 latents dropped), tiny widths.


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    with one_torch_thread():
        yield
