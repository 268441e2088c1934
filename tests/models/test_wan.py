"""The `wan2.1` decoder: chunks bit-identical to diffusers' `vae.decode`, loading without the
hub, one decode per VAE at a time, and the diffusers internals it drives."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.helpers import one_torch_thread

# diffusers' own tiny Wan test configuration.
WAIT_S = 30.0


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    with one_torch_thread():
        yield
