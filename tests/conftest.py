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
    """The files whose slow tests may take longest first, the rest in their own order.

    The suite runs in two processes that each take a whole file at a time
    (`--dist loadfile`), in collection order: started last, a long file (the
    reliability suite, the Ray cluster, the store's kill tests) would keep one process
    busy minutes after the other has run out of files. A slow test weighs what its
    timeout allows it (`pytest.mark.timeout`, else the configured one).
    """
    default_s = float(config.getini("timeout") or 0)
    weights: dict[str, float] = {}
    for item in items:
        if item.get_closest_marker("slow") is None:
            continue
        marker = item.get_closest_marker("timeout")
        allowed = float(marker.args[0]) if marker is not None and marker.args else default_s
        weights[str(item.path)] = weights.get(str(item.path), 0.0) + max(allowed, 1.0)
    items.sort(key=lambda item: -weights.get(str(item.path), 0.0))
