"""The `taehv` decoder: published weight layout, the chunk contract, causality, and agreement
with TAEHV's parallel formulation, on random weights at tiny widths."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.helpers import one_torch_thread
from vaecast.models.taehv import TAEHVConfig

TINY = TAEHVConfig(latent_channels=16, widths=(8, 8, 4, 4))


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    with one_torch_thread():
        yield
