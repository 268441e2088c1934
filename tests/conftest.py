"""Session-wide: every `vaecast serve` a test starts keeps its default store in a
temporary folder, never in the user's data directory; the longest files start first."""

from __future__ import annotations

import os
import tempfile

import pytest


def pytest_configure(config: pytest.Config) -> None:
    # Subprocesses inherit the environment: `vaecast serve` without --store uses
    # $XDG_DATA_HOME/vaecast.
    os.environ["XDG_DATA_HOME"] = tempfile.mkdtemp(prefix="vaecast-test-data-")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The files with the most slow tests first, the rest in their own order.

    The suite runs in two processes that each take a whole file at a time
    (`--dist loadfile`), in collection order: started last, a long file (the
    reliability suite, the Ray cluster, the diffusers pipelines) would keep one
    process busy minutes after the other has run out of files.
    """
    slow_tests: dict[str, int] = {}
    for item in items:
        if item.get_closest_marker("slow") is not None:
            slow_tests[str(item.path)] = slow_tests.get(str(item.path), 0) + 1
    items.sort(key=lambda item: -slow_tests.get(str(item.path), 0))
