"""Installing vaecast keeps the torch a user already has (a CUDA build, or the CPU one).

torch is a range in pyproject.toml, not a pin: `pip install -e .` into a fresh venv that
sees the torch the tests run with installs vaecast alone, and the venv's python then
imports that same torch. Offline (`--no-index`, the build backend the tests run with): a
resolver that wanted another torch fails the test rather than downloading one.

The nested venv sees the *running* interpreter's packages through a `.pth` file, not
through `--system-site-packages`: run from a venv, that flag would show the base
interpreter's packages (an old setuptools, no torch), not the ones the suite runs with.
"""

from __future__ import annotations

import json
import site
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
INSTALL_TIMEOUT_S = 300


@pytest.mark.slow
def test_pip_install_keeps_the_torch_already_installed(tmp_path: Path):
    env_dir = tmp_path / "venv"
    # pip, setuptools and torch come from the running environment: nothing is copied or
    # fetched. The nested venv's own site-packages come first, so vaecast installs there.
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    nested_site = Path(
        sysconfig.get_path("purelib", vars={"base": str(env_dir), "platbase": str(env_dir)})
    )
    (nested_site / "running-environment.pth").write_text("\n".join(running_site_packages()))
    report = tmp_path / "report.json"
    offline = ["--no-index", "--no-build-isolation", "--disable-pip-version-check"]
    installed = subprocess.run(
        [str(python), "-m", "pip", "install", *offline, "--report", str(report), "-e", str(ROOT)],
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT_S,
        cwd=tmp_path,
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    names = [item["metadata"]["name"] for item in json.loads(report.read_text())["install"]]
    assert names == ["vaecast"], names
    # The venv's python imports the system's torch and this checkout's vaecast.
    probe = "import torch, vaecast, sys; print(torch.__version__, torch.__file__, vaecast.__file__)"
    seen = subprocess.run(
        [str(python), "-c", probe],
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT_S,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin"},  # no PYTHONPATH: what the venv itself imports
    )
    assert seen.returncode == 0, seen.stderr
    version, torch_file, vaecast_file = seen.stdout.split()
    assert (version, torch_file) == (torch.__version__, torch.__file__)
    assert Path(vaecast_file) == ROOT / "vaecast" / "__init__.py"


def running_site_packages() -> list[str]:
    """The site-packages folders this interpreter imports from, in its order: a venv's
    own (and, with --system-site-packages, its base's), or the system's."""
    folders = [*site.getsitepackages(), site.getusersitepackages()]
    return [folder for folder in folders if folder in sys.path]
