"""Session-wide: every `vaecast serve` a test starts keeps its default store in a
temporary folder, never in the user's data directory."""

from __future__ import annotations

import os
import tempfile

import pytest


def pytest_configure(config: pytest.Config) -> None:
    # Subprocesses inherit the environment: `vaecast serve` without --store uses
    # $XDG_DATA_HOME/vaecast.
    os.environ["XDG_DATA_HOME"] = tempfile.mkdtemp(prefix="vaecast-test-data-")
