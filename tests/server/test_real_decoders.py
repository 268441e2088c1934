"""The real decoders end to end: random small weights saved to files, loaded through vaecast's
loaders, served, and streamed as MP4 that FFmpeg decodes to the planned frames."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.helpers import one_torch_thread

MIN_GREY_PSNR_DB = 28.0


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    with one_torch_thread():
        yield
