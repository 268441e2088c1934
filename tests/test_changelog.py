"""CHANGELOG.md names, as its newest entry, the version that vaecast reports and
pyproject.toml declares."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from vaecast.version import VERSION

ROOT = Path(__file__).resolve().parents[1]
ENTRY = re.compile(r"^## \[?(\d+\.\d+\.\d+[^\]\s]*)\]? - (\d{4}-\d{2}-\d{2}|Unreleased)$", re.M)


def test_the_newest_entry_is_the_version_reported():
    entries = ENTRY.findall((ROOT / "CHANGELOG.md").read_text())
    assert entries, "no '## X.Y.Z - date' entry"
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert entries[0][0] == declared == VERSION
