"""The one version vaecast reports: `vaecast --version`, `/healthz` and `/metrics`.

Read from the installed package's metadata (pyproject.toml's `version`), so a release
changes it in one place; a source tree run without installing says so.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    VERSION = version("vaecast")
except PackageNotFoundError:  # run from a source tree that was never installed
    VERSION = "0+unknown"
